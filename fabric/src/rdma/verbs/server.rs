//! What a node holds: the opened device, its region registered for remote
//! READs (one registration per region epoch), and a queue pair per client
//! connection.
//!
//! Region retirement: a region is replaced when a snapshot is installed (new
//! epoch) and retired when the node stops. The old registration is kept for
//! the region's grace period after it stops being current, so a client READ
//! already in flight completes against valid memory (and then fails
//! validation, as over shm); only then is it deregistered, after which READs
//! with its rkey fail with a remote access error, i.e. `BadKey`, and the
//! client asks for the new grant.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkv_proto::wire::{QpEndpoint, RdmaRegionGrant};
use sideway::ibverbs::AccessFlags;
use tokio::task::JoinHandle;

use super::connection::{Prepared, QpConnection};
use super::context::{RdmaContext, Registered};
use super::rpc::serve;
use crate::memory::RegionMemory;
use crate::rdma::error::RdmaError;
use crate::rpc::RpcHandler;

#[derive(Debug)]
struct RegionRegistration {
    node_id: u64,
    epoch: u64,
    registered: Registered,
    /// When it stopped being the current region.
    retired_at: Option<Instant>,
}

#[derive(Debug)]
pub struct RdmaServer {
    ctx: Arc<RdmaContext>,
    regions: Mutex<Vec<RegionRegistration>>,
    grace: Duration,
}

/// A client's queue pair and its request loop; dropping it (the client's
/// TCP control connection closed) tears both down.
#[derive(Debug)]
pub struct ServerConnection {
    task: JoinHandle<()>,
    _connection: QpConnection,
}

impl Drop for ServerConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RdmaServer {
    /// Opens the device; `grace` is the region's grace period.
    pub fn open(wanted: Option<&str>, grace: Duration) -> Result<RdmaServer, RdmaError> {
        Ok(RdmaServer {
            ctx: RdmaContext::open(wanted)?,
            regions: Mutex::new(Vec::new()),
            grace,
        })
    }

    /// The device line for the log.
    pub fn describe(&self) -> String {
        self.ctx.choice.to_string()
    }

    fn regions(&self) -> MutexGuard<'_, Vec<RegionRegistration>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The grant of the current region (`memory`, `epoch`), registering it
    /// with remote-read access on first use; every other registration
    /// starts its grace period.
    pub fn grant(
        &self,
        memory: &Arc<RegionMemory>,
        node_id: u64,
        epoch: u64,
    ) -> Result<RdmaRegionGrant, RdmaError> {
        let now = Instant::now();
        let mut regions = self.regions();
        for r in regions.iter_mut() {
            let current = r.epoch == epoch && Arc::ptr_eq(&r.registered.memory, memory);
            if !current && r.retired_at.is_none() {
                r.retired_at = Some(now);
            }
        }
        let existing = regions
            .iter()
            .find(|r| r.retired_at.is_none())
            .map(|r| (r.registered.addr(), r.registered.rkey()));
        let (addr, rkey) = match existing {
            Some(found) => found,
            None => {
                // Read-only for the NIC: clients can READ, never write.
                let registered = self
                    .ctx
                    .register(Arc::clone(memory), AccessFlags::RemoteRead)?;
                let found = (registered.addr(), registered.rkey());
                tracing::info!(
                    epoch,
                    bytes = memory.len_bytes(),
                    "region registered for rdma reads"
                );
                regions.push(RegionRegistration {
                    node_id,
                    epoch,
                    registered,
                    retired_at: None,
                });
                found
            }
        };
        Ok(RdmaRegionGrant {
            node_id,
            region_epoch: epoch,
            addr,
            rkey,
            len_bytes: memory.len_bytes() as u64,
        })
    }

    /// Deregisters regions retired longer than the grace period ago.
    pub fn sweep(&self) {
        let now = Instant::now();
        self.regions().retain(|r| {
            let keep = r
                .retired_at
                .is_none_or(|at| now.duration_since(at) < self.grace);
            if !keep {
                tracing::info!(
                    node_id = r.node_id,
                    epoch = r.epoch,
                    "retired region deregistered after its grace period"
                );
            }
            keep
        });
    }

    /// Accepts a client's endpoint: a queue pair in RTS towards it, serving
    /// its requests with `handler`.
    pub fn accept(
        &self,
        client: QpEndpoint,
        handler: Arc<dyn RpcHandler>,
        max_frame_bytes: u32,
        max_in_flight: u32,
    ) -> Result<(QpEndpoint, ServerConnection), RdmaError> {
        let prepared = Prepared::new(&self.ctx, true)?;
        let local = prepared.local();
        let (connection, incoming) = prepared.connect(client)?;
        let task = tokio::spawn(serve(
            Arc::clone(&connection.shared),
            incoming,
            handler,
            max_frame_bytes,
            max_in_flight,
        ));
        Ok((
            local,
            ServerConnection {
                task,
                _connection: connection,
            },
        ))
    }
}
