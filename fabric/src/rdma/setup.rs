//! A connection between creation and connect: its queue pair is in INIT
//! with every receive buffer posted, and each posted receive's entry in the
//! context's work-request table holds a reference to the connection (a
//! cycle only teardown breaks). [`Unconnected`] owns it until it is
//! connected; dropped before that (the server refused, the control call
//! failed), it tears the connection down, which drains those entries, so
//! the queue pair, its pinned buffers and its admission ticket are freed
//! instead of filling the table one refused attach at a time.

use std::sync::Arc;

use super::error::RdmaError;

/// What a half set-up connection does when its setup is given up.
pub trait Abandon {
    /// Moves the queue pair to the error state and drains its requests.
    fn abandon(&self, reason: RdmaError);
}

/// Tears `C` down when dropped, unless [`Unconnected::connected`] took it.
#[derive(Debug)]
pub struct Unconnected<C: Abandon> {
    conn: Option<Arc<C>>,
}

impl<C: Abandon> Unconnected<C> {
    pub fn new(conn: Arc<C>) -> Unconnected<C> {
        Unconnected { conn: Some(conn) }
    }

    pub fn conn(&self) -> Option<&Arc<C>> {
        self.conn.as_ref()
    }

    /// The setup succeeded: what owns the connection now tears it down.
    pub fn connected(mut self) -> Option<Arc<C>> {
        self.conn.take()
    }
}

impl<C: Abandon> Drop for Unconnected<C> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.abandon(RdmaError::Closed(
                "setup abandoned before connecting".into(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::admission::ENTRIES_PER_CONNECTION;
    use crate::rdma::fake::{FakeConn, FakeContext};
    use crate::rdma::qp_params::RECV_BUFFERS;

    /// A client retrying against a node that refuses RDMA: every refused
    /// attach drops its half set-up connection. The table, the buffer pool
    /// and the admissions stay flat, and each connection is freed (its
    /// receive entries no longer keep it alive).
    #[test]
    fn refused_attaches_release_their_table_entries_and_buffers() {
        let ctx = FakeContext::new(8 * ENTRIES_PER_CONNECTION);
        let free_before = ctx.free_buffers();
        for attempt in 0..1_000 {
            let conn = FakeConn::prepare(&ctx)
                .unwrap_or_else(|e| panic!("attempt {attempt} refused: {e}"));
            assert_eq!(ctx.table_len(), RECV_BUFFERS);
            let weak = Arc::downgrade(&conn);
            let pending = Unconnected::new(conn);
            // The server refused: the pending session is dropped.
            drop(pending);
            assert_eq!(ctx.table_len(), 0, "attempt {attempt}");
            assert_eq!(ctx.free_buffers(), free_before, "attempt {attempt}");
            assert_eq!(ctx.reserved(), 0, "attempt {attempt}");
            assert!(weak.upgrade().is_none(), "attempt {attempt}: leaked");
        }
    }

    #[test]
    fn a_connected_session_is_not_torn_down_by_its_guard() {
        let ctx = FakeContext::new(ENTRIES_PER_CONNECTION);
        let conn = FakeConn::prepare(&ctx).unwrap();
        let conn = Unconnected::new(conn).connected().unwrap();
        assert!(conn.failure().is_none());
        assert_eq!(ctx.table_len(), RECV_BUFFERS);
        conn.abandon_setup();
        assert_eq!(ctx.table_len(), 0);
    }
}
