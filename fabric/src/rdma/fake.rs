//! A fake verbs backend for the tests of the pure modules: a context (a
//! work-request table, admission, a pool standing in for pinned buffers)
//! and connections that hold table entries referring back to themselves,
//! as `verbs::connection` does, so leaks and cycles show in the counts.
//! Device events are injected as `verbs::events` delivers them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::admission::{Admission, ENTRIES_PER_CONNECTION, Ticket};
use super::async_event::{DeviceEvent, apply};
use super::batch::{Batch, BatchOwner};
use super::buffer_pool::SlotPool;
use super::connections::Connections;
use super::error::RdmaError;
use super::qp_params::RECV_BUFFERS;
use super::setup::Abandon;
use super::wr_table::WrTable;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Registered buffers a connection pins (receive and send).
const BUFFERS_PER_CONNECTION: u32 = 2;

#[derive(Debug, Clone)]
pub struct FakeContext {
    table: Arc<Mutex<WrTable<Arc<FakeConn>>>>,
    admission: Arc<Admission>,
    buffers: Arc<Mutex<SlotPool>>,
    connections: Arc<Connections<FakeConn>>,
    failed: Arc<AtomicBool>,
}

impl FakeContext {
    pub fn new(cq_entries: u32) -> FakeContext {
        FakeContext {
            table: Arc::new(Mutex::new(WrTable::new(cq_entries))),
            admission: Admission::new(cq_entries),
            buffers: Arc::new(Mutex::new(SlotPool::new(1024, 4096))),
            connections: Arc::new(Connections::default()),
            failed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Delivers a device event, as the event thread of a real context
    /// does; returns how many connections it failed.
    pub fn inject(&self, event: DeviceEvent) -> usize {
        apply(&event, &self.connections, &self.failed, "fake0")
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Connections in the registry events are delivered to.
    pub fn registered(&self) -> usize {
        self.connections.len()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, WrTable<Arc<FakeConn>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn table_len(&self) -> u32 {
        self.table().len()
    }

    pub fn free_buffers(&self) -> u32 {
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free_slots()
    }

    pub fn reserved(&self) -> u32 {
        self.admission.reserved()
    }
}

#[derive(Debug)]
pub struct FakeConn {
    id: u64,
    qp_num: u32,
    ctx: FakeContext,
    /// READ batches posted and not completed (the NIC may still write
    /// their slots); teardown completes them with its error.
    reads: Mutex<Vec<Arc<Batch<FakeConn>>>>,
    buffers: Vec<u32>,
    failed: Mutex<Option<RdmaError>>,
    pub reads_released: AtomicU32,
    _ticket: Ticket,
}

impl FakeConn {
    /// Admitted, buffers pinned, every receive posted (QP in INIT).
    pub fn prepare(ctx: &FakeContext) -> Result<Arc<FakeConn>, RdmaError> {
        FakeConn::prepare_on(ctx, 1)
    }

    /// [`FakeConn::prepare`], on port `port`.
    pub fn prepare_on(ctx: &FakeContext, port: u8) -> Result<Arc<FakeConn>, RdmaError> {
        let ticket = ctx.admission.admit(ENTRIES_PER_CONNECTION)?;
        let buffers = ctx
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .acquire(BUFFERS_PER_CONNECTION)
            .ok_or_else(|| RdmaError::verbs("ibv_reg_mr", "out of pinned memory"))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(FakeConn {
            id,
            qp_num: id as u32,
            ctx: ctx.clone(),
            reads: Mutex::new(Vec::new()),
            buffers,
            failed: Mutex::new(None),
            reads_released: AtomicU32::new(0),
            _ticket: ticket,
        });
        ctx.connections.register(conn.qp_num, port, &conn);
        conn.post(RECV_BUFFERS)?;
        Ok(conn)
    }

    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Posts `n` READs of `batch` (one table entry each).
    pub fn post_reads(
        self: &Arc<FakeConn>,
        batch: &Arc<Batch<FakeConn>>,
        n: u32,
    ) -> Result<(), RdmaError> {
        self.post(n)?;
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.extend((0..n).map(|_| Arc::clone(batch)));
        Ok(())
    }

    /// Posts `n` requests, each an entry holding the connection; a full
    /// table fails the connection, as a failed re-post does.
    pub fn post(self: &Arc<FakeConn>, n: u32) -> Result<(), RdmaError> {
        for _ in 0..n {
            let inserted = self.ctx.table().insert(Arc::clone(self));
            if let Err(e) = inserted {
                self.abandon(e.into());
                return Err(e.into());
            }
        }
        Ok(())
    }

    pub fn failure(&self) -> Option<RdmaError> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn abandon_setup(&self) {
        self.abandon(RdmaError::Closed("test".into()));
    }
}

impl Abandon for FakeConn {
    fn abandon(&self, reason: RdmaError) {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(reason);
        self.ctx.connections.remove(self.qp_num);
        // Outside the table lock: dropping an entry may drop a connection.
        let drained = self.ctx.table().drain_where(|c| c.id == self.id);
        drop(drained);
        // Outside the reads lock: completing a READ with an error fails
        // the connection again (a no-op), which takes the lock.
        let reads = std::mem::take(&mut *self.reads.lock().unwrap_or_else(|p| p.into_inner()));
        for batch in reads {
            batch.complete_one(self.failure());
        }
    }
}

impl BatchOwner for FakeConn {
    fn fail(&self, error: RdmaError) {
        self.abandon(error);
    }

    fn release_reads(&self, n: u32) {
        self.reads_released.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for FakeConn {
    fn drop(&mut self) {
        let mut pool = self.ctx.buffers.lock().unwrap_or_else(|p| p.into_inner());
        for &slot in &self.buffers {
            let _ = pool.release(slot);
        }
    }
}
