//! One-sided READs as a [`Fabric`]: the region a server granted, read into
//! the client's registered slots and copied out. The existing
//! [`RegionReader`](crate::RegionReader) runs on top unchanged (CRC, version
//! and torn-read retries), exactly as over `shm`.
//!
//! A batch ([`RemoteRegion::read_batch`], used by `get_many` for MGets and by
//! every slot-then-block lookup) becomes one chain of READ work requests in
//! one post: one doorbell. Batches larger than the send queue or the slot
//! pool go out in several chains.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkv_proto::wire::RdmaRegionGrant;

use super::client::RdmaSession;
use super::connection::{READ_TIMED_OUT, ReadBatch};
use crate::rdma::buffer_pool::{ReadPiece, split_read};
use crate::rdma::error::RdmaError;
use crate::rdma::qp_params::{READ_QUEUE_DEPTH, READ_TIMEOUT_MS};
use crate::rdma::wait::wait_until;
use crate::transport::{Fabric, FabricError, ReadOp, RegionDescriptor, RemoteRegion, check_range};

/// The descriptor a reader uses for a granted region: the rkey is the key.
pub fn descriptor_of(grant: &RdmaRegionGrant) -> RegionDescriptor {
    RegionDescriptor {
        node_id: grant.node_id,
        addr: grant.addr,
        key: u64::from(grant.rkey),
        len_bytes: grant.len_bytes,
        epoch: grant.region_epoch,
    }
}

/// One server's region(s) over one RDMA session.
#[derive(Debug)]
pub struct RdmaFabric {
    session: Arc<RdmaSession>,
}

impl RdmaFabric {
    pub fn new(session: Arc<RdmaSession>) -> RdmaFabric {
        RdmaFabric { session }
    }
}

impl Fabric for RdmaFabric {
    fn open(&self, remote: &RegionDescriptor) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        let grant = self.session.grant();
        let current = descriptor_of(&grant);
        // The grant is the truth about the region: a caller cannot widen it
        // or name another rkey (the NIC would refuse, but refuse early).
        if remote.key != current.key || remote.epoch != current.epoch {
            return Err(FabricError::BadKey { key: remote.key });
        }
        if self.session.is_closed() {
            return Err(FabricError::PeerGone("rdma session closed".into()));
        }
        Ok(Arc::new(RdmaRegion {
            session: Arc::clone(&self.session),
            grant,
        }))
    }
}

/// A granted region read through a session.
#[derive(Debug)]
pub struct RdmaRegion {
    session: Arc<RdmaSession>,
    grant: RdmaRegionGrant,
}

impl RdmaRegion {
    fn key(&self) -> u64 {
        u64::from(self.grant.rkey)
    }

    /// Reads `ops` in one post; every piece must fit the queue and the pool.
    fn read_chain(
        &self,
        ops: &mut [ReadOp<'_>],
        pieces: &[(usize, ReadPiece)],
    ) -> Result<(), RdmaError> {
        if pieces.is_empty() {
            return Ok(());
        }
        let conn = self.session.shared();
        let pool = self.session.pool();
        let n = pieces.len() as u32;
        let timeout = Duration::from_millis(READ_TIMEOUT_MS);
        let deadline = Instant::now() + timeout;
        conn.reserve_reads(n, deadline)?;
        let Some(slots) = wait_until(pool.slots.acquire(n), deadline) else {
            conn.release_reads(n);
            return Err(READ_TIMED_OUT);
        };
        let slot_bytes = u64::from(pool.slots.slot_bytes());
        let base = pool.buffers.addr();
        let lkey = pool.buffers.lkey();
        let reads: Vec<(u64, u32, u64, u32, u32)> = pieces
            .iter()
            .zip(&slots)
            .map(|((_, piece), &slot)| {
                (
                    self.grant.addr + piece.remote_offset,
                    self.grant.rkey,
                    base + u64::from(slot) * slot_bytes,
                    lkey,
                    piece.len,
                )
            })
            .collect();
        // From here the slots and the read-queue room go back when the last
        // reference to the batch does (ours, or a posted READ's).
        let batch = Arc::new(ReadBatch::new(
            Arc::clone(conn),
            Arc::clone(&pool.slots),
            slots,
        ));
        let finished = batch.finished();
        conn.post_reads(&batch, &reads)?;
        match wait_until(finished, deadline) {
            Some(result) => result?,
            // Failing the connection destroys the QP (no more DMA into the
            // slots) and drains the batch's READs; our reference then goes.
            None => {
                return conn.fail_with(RdmaError::Timeout {
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
        }
        pieces
            .iter()
            .zip(batch.slots())
            .try_for_each(|((op, piece), &slot)| {
                let start = piece.buf_offset;
                let end = start + piece.len as usize;
                pool.buffers
                    .memory
                    .read_bytes(u64::from(slot) * slot_bytes, &mut ops[*op].buf[start..end])
            })
            .map_err(|e| RdmaError::verbs("copying out of the read pool", e))
    }
}

impl RemoteRegion for RdmaRegion {
    fn descriptor(&self) -> RegionDescriptor {
        descriptor_of(&self.grant)
    }

    /// Even over a loopback device: the grant says nothing of where the
    /// owner runs, so its clocks are not assumed to be ours.
    fn on_this_host(&self) -> bool {
        false
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.read_batch(&mut [ReadOp { offset, buf }])
    }

    fn read_batch(&self, reads: &mut [ReadOp<'_>]) -> Result<(), FabricError> {
        let descriptor = self.descriptor();
        for op in reads.iter() {
            check_range(&descriptor, op.offset, op.buf.len() as u64)?;
        }
        if self.session.is_closed() {
            return Err(FabricError::PeerGone("rdma session closed".into()));
        }
        let pool = self.session.pool();
        let slot_bytes = pool.slots.slot_bytes();
        let max_chain = READ_QUEUE_DEPTH.min(pool.slots.capacity()) as usize;
        let mut chain: Vec<(usize, ReadPiece)> = Vec::new();
        let mut first_op = 0;
        let plans: Vec<(usize, Vec<ReadPiece>)> = reads
            .iter()
            .map(|op| {
                let pieces = split_read(op.offset, op.buf.len(), slot_bytes)
                    .into_iter()
                    .filter(|p| p.len > 0)
                    .collect();
                (op.buf.len(), pieces)
            })
            .collect();
        for (index, (len_bytes, pieces)) in plans.into_iter().enumerate() {
            if pieces.len() > max_chain {
                return Err(
                    RdmaError::Pool(crate::rdma::buffer_pool::PoolError::TooLarge {
                        len_bytes: len_bytes as u64,
                        needed: pieces.len() as u64,
                        capacity: max_chain as u32,
                    })
                    .into_fabric(self.key()),
                );
            }
            if chain.len() + pieces.len() > max_chain {
                self.read_chain(&mut reads[first_op..], &rebase(&chain, first_op))
                    .map_err(|e| e.into_fabric(self.key()))?;
                chain.clear();
                first_op = index;
            }
            chain.extend(pieces.into_iter().map(|p| (index, p)));
        }
        self.read_chain(&mut reads[first_op..], &rebase(&chain, first_op))
            .map_err(|e| e.into_fabric(self.key()))
    }
}

/// Pieces indexed from `first_op` (the slice handed to `read_chain`).
fn rebase(chain: &[(usize, ReadPiece)], first_op: usize) -> Vec<(usize, ReadPiece)> {
    chain.iter().map(|&(op, p)| (op - first_op, p)).collect()
}
