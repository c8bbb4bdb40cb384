//! What a client holds: one opened device ([`RdmaClient`]) with its pool of
//! registered read slots, and one [`RdmaSession`] (queue pair, RPC channel,
//! the server's region grant) per server.
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
use super::context::RdmaContext;
use super::read::RdmaFabric;
use super::rpc::RdmaChannel;
use crate::rdma::error::RdmaError;
use crate::rpc::{CallFuture, RpcChannel};

/// Read slots: 256 x 64 KiB = 16 MiB registered once per client, enough for
/// a default-size value (1 MiB) sixteen times over, or an MGet's batch.
pub const READ_POOL_SLOTS: u32 = 256;
pub const READ_SLOT_BYTES: u32 = 64 * 1024;

#[derive(Debug)]
pub struct RdmaClient {
    ctx: Arc<RdmaContext>,
    pool: Arc<ReadPool>,
}

impl RdmaClient {
    /// Opens the device (`wanted` or the first with an active port) and
    /// registers the read pool; the error says why RDMA is off.
    pub fn open(wanted: Option<&str>) -> Result<Arc<RdmaClient>, RdmaError> {
        let ctx = RdmaContext::open(wanted)?;
        let buffers = ctx.register_buffers((READ_POOL_SLOTS * READ_SLOT_BYTES) as usize)?;
        let pool = Arc::new(ReadPool::new(buffers, READ_POOL_SLOTS, READ_SLOT_BYTES));
        Ok(Arc::new(RdmaClient { ctx, pool }))
    }

    pub fn context(&self) -> &Arc<RdmaContext> {
        &self.ctx
    }

    /// A queue pair in INIT with its receive buffers posted.
    pub fn prepare(self: &Arc<Self>) -> Result<PendingSession, RdmaError> {
        Ok(PendingSession {
            client: Arc::clone(self),
            prepared: Prepared::new(&self.ctx, false)?,
        })
    }
}

#[derive(Debug)]
pub struct PendingSession {
    client: Arc<RdmaClient>,
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
            client: self.client,
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
    client: Arc<RdmaClient>,
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
        &self.client.pool
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
