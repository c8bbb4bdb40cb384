//! What a client holds: the devices it may use ([`RdmaClient`]), each
//! opened on first use by a session routed through it, with its pool of
//! registered read slots (memory is registered per device), and one
//! [`RdmaSession`] (queue pair, RPC channel, the server's region grant) per
//! server.
//!
//! Setup, driven by the caller over its authenticated TCP connection:
//! [`RdmaClient::prepare`] -> send the [`PendingSession::endpoint`] in
//! `Request::RdmaConnect` -> [`PendingSession::complete`] with the reply's
//! endpoint and grant.

use std::sync::{Arc, Mutex};

use rdkv_proto::wire::{QpEndpoint, RdmaRegionGrant, Request};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connection::{ConnShared, Incoming, Prepared, QpConnection, ReadPool};
use super::context::{RdmaContext, discover_ports};
use super::read::RdmaFabric;
use super::rpc::RdmaChannel;
use crate::rdma::contexts::{DeviceContexts, Health};
use crate::rdma::device::PortGids;
use crate::rdma::error::RdmaError;
use crate::rpc::{CallFuture, RpcChannel};

/// Read slots: 256 x 64 KiB = 16 MiB registered once per client, enough for
/// a default-size value (1 MiB) sixteen times over, or an MGet's batch.
pub const READ_POOL_SLOTS: u32 = 256;
pub const READ_SLOT_BYTES: u32 = 64 * 1024;

#[derive(Debug)]
pub struct RdmaClient {
    devices: DeviceContexts<ClientDevice>,
}

/// One opened device of a client and its read pool.
#[derive(Debug)]
pub(crate) struct ClientDevice {
    ctx: Arc<RdmaContext>,
    pool: Arc<ReadPool>,
}

impl ClientDevice {
    fn open(port: &PortGids) -> Result<Arc<ClientDevice>, RdmaError> {
        let ctx = RdmaContext::open_port(port)?;
        let buffers = ctx.register_buffers((READ_POOL_SLOTS * READ_SLOT_BYTES) as usize)?;
        let pool = Arc::new(ReadPool::new(buffers, READ_POOL_SLOTS, READ_SLOT_BYTES));
        Ok(Arc::new(ClientDevice { ctx, pool }))
    }
}

impl Health for ClientDevice {
    fn has_failed(&self) -> bool {
        self.ctx.has_failed()
    }
}

impl RdmaClient {
    /// Finds the devices (`wanted` only, if named); the error says why RDMA
    /// is off. Each device is opened, and its read pool registered, when
    /// the first session routed through it is prepared.
    pub fn open(wanted: Option<&str>) -> Result<Arc<RdmaClient>, RdmaError> {
        let devices = DeviceContexts::new(discover_ports()?, wanted)?;
        Ok(Arc::new(RdmaClient { devices }))
    }

    /// A queue pair in INIT with its receive buffers posted, for a control
    /// connection whose local address is `local_ip`: it picks the device
    /// and port (the one holding that address) and the GID.
    /// Dropping the pending session unconnected tears the queue pair down.
    pub fn prepare(
        self: &Arc<Self>,
        local_ip: Option<std::net::IpAddr>,
    ) -> Result<PendingSession, RdmaError> {
        let device = self.devices.context_for(local_ip, ClientDevice::open)?;
        let prepared = Prepared::new(&device.ctx, false, local_ip)?;
        Ok(PendingSession { device, prepared })
    }
}

#[derive(Debug)]
pub struct PendingSession {
    device: Arc<ClientDevice>,
    prepared: Prepared,
}

impl PendingSession {
    pub fn endpoint(&self) -> QpEndpoint {
        self.prepared.local()
    }

    /// Connects to the server's endpoint (RTR, RTS); must run inside a tokio
    /// runtime (the RPC channel's reader is a task).
    pub fn complete(
        self,
        remote: QpEndpoint,
        grant: RdmaRegionGrant,
        max_frame_bytes: u32,
    ) -> Result<Arc<RdmaSession>, RdmaError> {
        let (connection, incoming): (QpConnection, mpsc::UnboundedReceiver<Incoming>) =
            self.prepared.connect(remote)?;
        let channel = RdmaChannel::start(Arc::clone(&connection.shared), incoming, max_frame_bytes);
        Ok(Arc::new(RdmaSession {
            device: self.device,
            connection,
            channel,
            grant: Mutex::new(grant),
            max_frame_bytes,
        }))
    }
}

/// One server, over RDMA: READs of its region and RPCs.
#[derive(Debug)]
pub struct RdmaSession {
    device: Arc<ClientDevice>,
    channel: RdmaChannel,
    grant: Mutex<RdmaRegionGrant>,
    max_frame_bytes: u32,
    // Dropped last: tears the queue pair down.
    connection: QpConnection,
}

impl RdmaSession {
    pub fn grant(&self) -> RdmaRegionGrant {
        *self.grant.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The server re-registered its region (a new epoch).
    pub fn set_grant(&self, grant: RdmaRegionGrant) {
        *self.grant.lock().unwrap_or_else(|p| p.into_inner()) = grant;
    }

    pub fn is_closed(&self) -> bool {
        self.connection.shared.is_closed()
    }

    /// Why the session closed, if it did.
    pub fn failure(&self) -> Option<RdmaError> {
        self.connection.shared.failure()
    }

    /// Tears the session down now (the client retired it): its channel
    /// reports closed at once, so nothing is sent into a queue pair whose
    /// peer is gone.
    pub fn close(&self) {
        self.connection
            .shared
            .fail(RdmaError::Closed("session retired by the client".into()));
    }

    pub fn channel(&self) -> &RdmaChannel {
        &self.channel
    }

    pub fn fabric(self: &Arc<Self>) -> Arc<RdmaFabric> {
        Arc::new(RdmaFabric::new(Arc::clone(self)))
    }

    pub(crate) fn shared(&self) -> &Arc<ConnShared> {
        &self.connection.shared
    }

    pub(crate) fn pool(&self) -> &Arc<ReadPool> {
        &self.device.pool
    }
}

/// Writes and control requests of a client go over the session's SEND/RECV
/// channel like over any other [`RpcChannel`].
impl RpcChannel for RdmaSession {
    fn call_boxed<'a>(&'a self, request: &'a Request, deadline: Instant) -> CallFuture<'a> {
        Box::pin(self.channel.call(request, deadline))
    }

    fn is_closed(&self) -> bool {
        RdmaSession::is_closed(self)
    }

    fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }
}
