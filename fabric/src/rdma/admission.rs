//! Admission of connections to a shared completion queue. Every queue pair
//! of a context completes into one CQ, and every posted work request holds
//! one entry of the work-request table (the CQ's depth). A connection
//! reserves its worst case (all receives posted, a full send queue, a full
//! read queue) when it is created: a new connection that would not fit is
//! refused, so an admitted one never finds the table full (which would tear
//! it down) and the CQ can never overrun (each posted request completes
//! into it at most once).

use std::sync::{Arc, Mutex};

use thiserror::Error;

use super::qp_params::{READ_QUEUE_DEPTH, RECV_BUFFERS, SEND_QUEUE_DEPTH};

/// Table entries one connection can hold at once: every receive buffer
/// posted, every send slot and every READ of its queue in flight.
pub const ENTRIES_PER_CONNECTION: u32 = RECV_BUFFERS + SEND_QUEUE_DEPTH + READ_QUEUE_DEPTH;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error(
    "completion queue full: {reserved} of {capacity} entries reserved by open connections, \
     a new one needs {wanted}"
)]
pub struct AdmissionFull {
    pub capacity: u32,
    pub reserved: u32,
    pub wanted: u32,
}

/// The entries of a context's table reserved by its connections.
#[derive(Debug)]
pub struct Admission {
    capacity: u32,
    reserved: Mutex<u32>,
}

/// One connection's reservation, returned when dropped (with the last
/// reference to the connection, i.e. after its table entries are gone).
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    entries: u32,
}

impl Admission {
    pub fn new(capacity: u32) -> Arc<Admission> {
        Arc::new(Admission {
            capacity,
            reserved: Mutex::new(0),
        })
    }

    fn reserved_guard(&self) -> std::sync::MutexGuard<'_, u32> {
        self.reserved.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn reserved(&self) -> u32 {
        *self.reserved_guard()
    }

    /// Reserves `entries`, or refuses when they would not fit.
    pub fn admit(self: &Arc<Admission>, entries: u32) -> Result<Ticket, AdmissionFull> {
        let mut reserved = self.reserved_guard();
        match reserved.checked_add(entries) {
            Some(total) if total <= self.capacity => {
                *reserved = total;
                Ok(Ticket {
                    admission: Arc::clone(self),
                    entries,
                })
            }
            _ => Err(AdmissionFull {
                capacity: self.capacity,
                reserved: *reserved,
                wanted: entries,
            }),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut reserved = self.admission.reserved_guard();
        *reserved = reserved.saturating_sub(self.entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::fake::{FakeConn, FakeContext};

    #[test]
    fn reservations_fit_or_are_refused_and_come_back() {
        let admission = Admission::new(10);
        let a = admission.admit(6).unwrap();
        assert_eq!(
            admission.admit(5).unwrap_err(),
            AdmissionFull {
                capacity: 10,
                reserved: 6,
                wanted: 5
            }
        );
        let b = admission.admit(4).unwrap();
        assert_eq!(admission.reserved(), 10);
        drop(a);
        assert_eq!(admission.reserved(), 4);
        drop(b);
        assert_eq!(admission.reserved(), 0);
        assert!(admission.admit(u32::MAX).is_err());
    }

    /// A table with room for four busy connections: a fifth is refused at
    /// setup, and the four keep every receive, send and READ they may have
    /// in flight without ever finding the table full.
    #[test]
    fn a_full_table_refuses_new_sessions_and_leaves_existing_ones_alone() {
        let ctx = FakeContext::new(4 * ENTRIES_PER_CONNECTION);
        let open: Vec<Arc<FakeConn>> = (0..4)
            .map(|_| FakeConn::prepare(&ctx).expect("room for four"))
            .collect();
        assert!(
            FakeConn::prepare(&ctx).is_err(),
            "a fifth connection must be refused while four are open"
        );
        for conn in &open {
            // Beyond its posted receives: a full send queue and read queue.
            conn.post(SEND_QUEUE_DEPTH + READ_QUEUE_DEPTH)
                .expect("an admitted connection never finds the table full");
            assert!(conn.failure().is_none());
        }
        assert_eq!(ctx.table_len(), 4 * ENTRIES_PER_CONNECTION);
        // One closes: its reservation comes back and a new one fits.
        open[0].abandon_setup();
        drop(open);
        let again = FakeConn::prepare(&ctx).expect("room again after a close");
        again.abandon_setup();
    }
}
