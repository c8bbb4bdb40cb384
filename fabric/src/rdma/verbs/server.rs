//! What a node holds: the devices it serves through (each client
//! connection goes through the device holding its control connection's
//! local address, opened on first use), on each its region registered for
//! remote READs (one registration per device, shard and region epoch: an
//! rkey is valid on its own device only; a node hosting several shards has
//! a current region per shard), and a queue pair per client connection.
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

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{QpEndpoint, RdmaRegionGrant};
use sideway::ibverbs::AccessFlags;
use tokio::task::JoinHandle;

use super::connection::{Prepared, QpConnection};
use super::context::{RdmaContext, Registered, discover_ports};
use super::rpc::serve;
use crate::memory::RegionMemory;
use crate::rdma::contexts::{DeviceContexts, Health};
use crate::rdma::device::PortGids;
use crate::rdma::error::RdmaError;
use crate::rpc::RpcHandler;

#[derive(Debug)]
struct RegionRegistration {
    node_id: u64,
    /// The shard whose region it is: each shard has its own current one.
    shard: ShardId,
    epoch: u64,
    registered: Registered,
    /// When it stopped being the current region.
    retired_at: Option<Instant>,
}

#[derive(Debug)]
pub struct RdmaServer {
    devices: DeviceContexts<ServerDevice>,
    /// What `describe` reports: the device of the default route, as
    /// opened at start (not the context itself: one the device failed is
    /// dropped once its connections are).
    description: String,
    grace: Duration,
}

/// One opened device of a node and its region registrations.
#[derive(Debug)]
struct ServerDevice {
    ctx: Arc<RdmaContext>,
    regions: Mutex<Vec<RegionRegistration>>,
}

impl Health for ServerDevice {
    fn has_failed(&self) -> bool {
        self.ctx.has_failed()
    }
}

/// The region a grant is for.
#[derive(Debug, Clone, Copy)]
pub struct RegionRef<'a> {
    pub memory: &'a Arc<RegionMemory>,
    pub node_id: u64,
    /// Whose region: only this shard's other registrations are retired.
    pub shard: ShardId,
    pub epoch: u64,
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

impl ServerDevice {
    fn open(port: &PortGids) -> Result<Arc<ServerDevice>, RdmaError> {
        Ok(Arc::new(ServerDevice {
            ctx: RdmaContext::open_port(port)?,
            regions: Mutex::new(Vec::new()),
        }))
    }

    fn regions(&self) -> MutexGuard<'_, Vec<RegionRegistration>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The grant of the shard's current region on this device, registering
    /// it with remote-read access on first use; the shard's other
    /// registrations start their grace period.
    fn grant(&self, region: RegionRef<'_>) -> Result<RdmaRegionGrant, RdmaError> {
        let RegionRef {
            memory,
            node_id,
            shard,
            epoch,
        } = region;
        let now = Instant::now();
        let mut regions = self.regions();
        for r in regions.iter_mut().filter(|r| r.shard == shard) {
            let current = r.epoch == epoch && Arc::ptr_eq(&r.registered.memory, memory);
            if !current && r.retired_at.is_none() {
                r.retired_at = Some(now);
            }
        }
        let existing = regions
            .iter()
            .find(|r| r.shard == shard && r.retired_at.is_none())
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
                    device = %self.ctx.choice.device,
                    epoch,
                    bytes = memory.len_bytes(),
                    "region registered for rdma reads"
                );
                regions.push(RegionRegistration {
                    node_id,
                    shard,
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

    /// Starts the grace period of the current registrations of shards not
    /// in `hosted`.
    fn retire_unhosted(&self, hosted: &[ShardId], now: Instant) {
        let mut regions = self.regions();
        let unhosted = regions.iter_mut().filter(|r| !hosted.contains(&r.shard));
        unhosted.for_each(|r| r.retired_at = r.retired_at.or(Some(now)));
    }

    /// Deregisters regions retired longer than `grace` ago.
    fn sweep(&self, grace: Duration) {
        let now = Instant::now();
        self.regions().retain(|r| {
            let keep = r.retired_at.is_none_or(|at| now.duration_since(at) < grace);
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
}

impl RdmaServer {
    /// Finds the devices (`wanted` only, if named) and opens the default
    /// one (the first with an active port), so a node without a usable
    /// device says why at start; `grace` is the region's grace period.
    pub fn open(wanted: Option<&str>, grace: Duration) -> Result<RdmaServer, RdmaError> {
        let devices = DeviceContexts::new(discover_ports()?, wanted)?;
        let description = devices
            .context_for(None, ServerDevice::open)?
            .ctx
            .choice
            .to_string();
        Ok(RdmaServer {
            devices,
            description,
            grace,
        })
    }

    /// The default device's line for the log.
    pub fn describe(&self) -> String {
        self.description.clone()
    }

    /// Keeps `region` registered as its shard's current one on every
    /// opened device and returns its grant on the default route's device
    /// (`RdmaRegion`).
    pub fn grant(&self, region: RegionRef<'_>) -> Result<RdmaRegionGrant, RdmaError> {
        for device in self.devices.opened() {
            device.grant(region)?;
        }
        self.devices
            .context_for(None, ServerDevice::open)?
            .grant(region)
    }

    /// Starts the grace period of every device's current registrations of
    /// shards not in `hosted`: a replica moved away or closed releases its
    /// region after the grace period, as an old epoch's does.
    pub fn retire_unhosted(&self, hosted: &[ShardId]) {
        let now = Instant::now();
        for device in self.devices.opened() {
            device.retire_unhosted(hosted, now);
        }
    }

    /// Deregisters regions retired longer than the grace period ago.
    pub fn sweep(&self) {
        for device in self.devices.opened() {
            device.sweep(self.grace);
        }
    }

    /// Accepts a client's endpoint: a queue pair in RTS towards it on the
    /// device holding `local_ip` (the control connection's local address:
    /// it picks device, port and GID), serving its requests with
    /// `handler`, and the grant of `region` on that device. Refused when no
    /// device holds the address or the completion queue has no room for
    /// another connection.
    pub fn accept(
        &self,
        client: QpEndpoint,
        local_ip: Option<std::net::IpAddr>,
        region: RegionRef<'_>,
        handler: Arc<dyn RpcHandler>,
        max_frame_bytes: u32,
        max_in_flight: u32,
    ) -> Result<(QpEndpoint, RdmaRegionGrant, ServerConnection), RdmaError> {
        let device = self.devices.context_for(local_ip, ServerDevice::open)?;
        let grant = device.grant(region)?;
        let prepared = Prepared::new(&device.ctx, true, local_ip)?;
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
            grant,
            ServerConnection {
                task,
                _connection: connection,
            },
        ))
    }
}
