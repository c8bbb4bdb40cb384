//! READs posted together ([`Batch`]) and the client's shared read slots
//! ([`ReadSlots`]), independent of the verbs backend so their accounting is
//! tested without a device.
//!
//! A batch holds its slots and its share of the connection's read queue
//! until the last reference to it goes: the waiter's, and one per posted
//! READ held by its work-request table entry until the completion (or the
//! teardown that drains it) is seen. Every path returns them, whichever
//! comes last: completed, timed out, never posted (the table was full), or
//! torn down. The waiter waits on a future the poller completes.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, oneshot};

use super::buffer_pool::SlotPool;
use super::error::RdmaError;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a batch needs from its connection.
pub trait BatchOwner: Send + Sync {
    /// A READ failed: the connection is dead (its queue pair is in error).
    fn fail(&self, error: RdmaError);
    /// `n` READs of the send queue are free again.
    fn release_reads(&self, n: u32);
}

/// The client's read slots, shared by its connections.
#[derive(Debug)]
pub struct ReadSlots {
    pool: Mutex<SlotPool>,
    freed: Notify,
}

impl ReadSlots {
    pub fn new(slot_count: u32, slot_bytes: u32) -> ReadSlots {
        ReadSlots {
            pool: Mutex::new(SlotPool::new(slot_count, slot_bytes)),
            freed: Notify::new(),
        }
    }

    pub fn slot_bytes(&self) -> u32 {
        lock(&self.pool).slot_bytes()
    }

    pub fn capacity(&self) -> u32 {
        lock(&self.pool).capacity()
    }

    pub fn free_slots(&self) -> u32 {
        lock(&self.pool).free_slots()
    }

    /// `n` slots, once that many are free.
    pub async fn acquire(&self, n: u32) -> Vec<u32> {
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(slots) = lock(&self.pool).acquire(n) {
                return slots;
            }
            freed.await;
        }
    }

    pub fn release(&self, slots: &[u32]) {
        let mut pool = lock(&self.pool);
        for &slot in slots {
            if let Err(e) = pool.release(slot) {
                tracing::error!("read pool: {e}");
            }
        }
        drop(pool);
        self.freed.notify_waiters();
    }
}

#[derive(Debug)]
struct BatchState {
    remaining: u32,
    error: Option<RdmaError>,
    done: Option<oneshot::Sender<Result<(), RdmaError>>>,
}

/// READs posted together, completed by the poller one by one.
#[derive(Debug)]
pub struct Batch<C: BatchOwner> {
    conn: Arc<C>,
    pool: Arc<ReadSlots>,
    slots: Vec<u32>,
    state: Mutex<BatchState>,
    finished: Mutex<Option<oneshot::Receiver<Result<(), RdmaError>>>>,
}

impl<C: BatchOwner> Batch<C> {
    /// A batch of one READ per slot; `slots` came from `pool` and the
    /// connection's read queue has room for them (both are returned when
    /// the batch is dropped).
    pub fn new(conn: Arc<C>, pool: Arc<ReadSlots>, slots: Vec<u32>) -> Batch<C> {
        let (tx, rx) = oneshot::channel();
        Batch {
            conn,
            pool,
            state: Mutex::new(BatchState {
                remaining: slots.len() as u32,
                error: None,
                done: Some(tx),
            }),
            slots,
            finished: Mutex::new(Some(rx)),
        }
    }

    pub fn conn(&self) -> &Arc<C> {
        &self.conn
    }

    pub fn slots(&self) -> &[u32] {
        &self.slots
    }

    /// One READ completed (or was abandoned at teardown).
    pub fn complete_one(&self, error: Option<RdmaError>) {
        if let Some(e) = &error {
            self.conn.fail(e.clone());
        }
        let mut state = lock(&self.state);
        state.remaining = state.remaining.saturating_sub(1);
        if state.error.is_none() {
            state.error = error;
        }
        if state.remaining == 0
            && let Some(done) = state.done.take()
        {
            let result = state.error.clone().map_or(Ok(()), Err);
            drop(state);
            let _ = done.send(result);
        }
    }

    /// Completes once every READ has (`Ok`: the slots hold the data). Only
    /// the first call waits; later ones report the batch closed.
    pub fn finished(&self) -> impl Future<Output = Result<(), RdmaError>> + use<C> {
        let rx = lock(&self.finished).take();
        async move {
            match rx {
                Some(rx) => rx
                    .await
                    .unwrap_or_else(|_| Err(RdmaError::Closed("read batch dropped".into()))),
                None => Err(RdmaError::Closed("read batch already waited for".into())),
            }
        }
    }
}

impl<C: BatchOwner> Drop for Batch<C> {
    fn drop(&mut self) {
        self.pool.release(&self.slots);
        self.conn.release_reads(self.slots.len() as u32);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::rdma::admission::ENTRIES_PER_CONNECTION;
    use crate::rdma::fake::{FakeConn, FakeContext};
    use crate::rdma::wait::wait_until;
    use crate::rdma::wr_table::WrTable;

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    type Fixture = (Arc<FakeConn>, Arc<ReadSlots>, Arc<Batch<FakeConn>>);

    /// A connection, a pool of `pool_slots` and a batch of `n` of them.
    fn batch_of(pool_slots: u32, n: u32) -> Fixture {
        let ctx = FakeContext::new(ENTRIES_PER_CONNECTION);
        let conn = FakeConn::prepare(&ctx).unwrap();
        let pool = Arc::new(ReadSlots::new(pool_slots, 64));
        let slots = wait_until(pool.acquire(n), far()).unwrap();
        let batch = Arc::new(Batch::new(Arc::clone(&conn), Arc::clone(&pool), slots));
        (conn, pool, batch)
    }

    /// The table is full when a batch is posted: nothing of it was posted,
    /// its slots go back to the pool at once and the connection lives on
    /// (the old code waited 2 s for completions that could never come,
    /// killed the connection and never returned the slots).
    #[test]
    fn a_batch_the_table_refused_returns_its_slots_and_keeps_the_connection() {
        let ctx = FakeContext::new(ENTRIES_PER_CONNECTION);
        let conn = FakeConn::prepare(&ctx).unwrap();
        let pool = Arc::new(ReadSlots::new(8, 64));
        let mut table: WrTable<Arc<Batch<FakeConn>>> = WrTable::new(3);
        for _ in 0..50 {
            let slots = wait_until(pool.acquire(4), far()).unwrap();
            let batch = Arc::new(Batch::new(Arc::clone(&conn), Arc::clone(&pool), slots));
            let posted = table.insert_all((0..4).map(|_| Arc::clone(&batch)));
            assert!(posted.is_err());
            assert!(table.is_empty(), "a refused batch leaves nothing behind");
            drop(batch);
            assert_eq!(pool.free_slots(), 8);
        }
        assert!(conn.failure().is_none());
        assert_eq!(conn.reads_released.load(Ordering::Relaxed), 50 * 4);
        conn.abandon_setup();
    }

    #[test]
    fn completions_finish_the_batch_and_the_last_reference_returns_the_slots() {
        let (conn, pool, batch) = batch_of(4, 3);
        let mut table: WrTable<Arc<Batch<FakeConn>>> = WrTable::new(8);
        let ids = table
            .insert_all((0..3).map(|_| Arc::clone(&batch)))
            .unwrap();
        let finished = batch.finished();
        // The poller, on another thread.
        let poller = std::thread::spawn(move || {
            for id in ids {
                if let Some(b) = table.take(id) {
                    b.complete_one(None);
                }
            }
        });
        assert_eq!(wait_until(finished, far()), Some(Ok(())));
        poller.join().unwrap();
        assert_eq!(pool.free_slots(), 1, "held while the data is copied out");
        drop(batch);
        assert_eq!(pool.free_slots(), 4);
        conn.abandon_setup();
    }

    /// A waiter that gave up (its deadline passed) drops its reference;
    /// the slots come back when teardown drains the READs still posted.
    #[test]
    fn a_timed_out_batch_returns_its_slots_after_teardown() {
        let (conn, pool, batch) = batch_of(4, 2);
        let mut table: WrTable<Arc<Batch<FakeConn>>> = WrTable::new(8);
        table
            .insert_all((0..2).map(|_| Arc::clone(&batch)))
            .unwrap();
        assert_eq!(wait_until(batch.finished(), Instant::now()), None);
        drop(batch);
        assert_eq!(pool.free_slots(), 2, "the NIC may still write them");
        for b in table.drain() {
            b.complete_one(Some(RdmaError::Closed("teardown".into())));
        }
        assert_eq!(pool.free_slots(), 4);
        conn.abandon_setup();
    }

    #[test]
    fn a_failed_read_fails_the_batch_and_the_connection() {
        let (conn, pool, batch) = batch_of(2, 2);
        let err = RdmaError::Timeout { timeout_ms: 1 };
        batch.complete_one(None);
        batch.complete_one(Some(err.clone()));
        assert_eq!(wait_until(batch.finished(), far()), Some(Err(err)));
        assert!(conn.failure().is_some());
        drop(batch);
        assert_eq!(pool.free_slots(), 2);
    }
}
