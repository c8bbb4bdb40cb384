//! The node's side of the `rdma` transport: whether it is on (and why not),
//! the region grant handed to authenticated clients, and the queue pairs of
//! their connections.
//!
//! One binary runs everywhere: without the cargo feature, without rdma-core,
//! or without an active device, the node logs one line saying why RDMA is
//! off and serves over tcp and shm; `Request::RdmaConnect` then gets an
//! `InvalidRequest` reply, on which clients fall back.

use std::sync::Arc;
#[cfg(feature = "rdma")]
use std::time::Duration;

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{ErrorCode, ErrorReply, QpEndpoint, RdmaRegionGrant};
use rdkv_storage::state_machine::RegionStateMachine;

/// Queue pairs one client connection may open (each pins receive and send
/// buffers on the node: a bound, not a quota anyone should reach).
pub const MAX_RDMA_SESSIONS_PER_CONNECTION: usize = 4;

/// A client connection's queue pair: dropped with the connection.
#[derive(Debug)]
pub struct RdmaConnectionGuard {
    #[cfg(feature = "rdma")]
    _connection: rdkv_fabric::rdma::verbs::ServerConnection,
}

#[derive(Debug)]
pub struct RdmaState {
    /// `on: <device line>` or `off: <reason>`, as logged and reported in
    /// the node's status.
    status: String,
    #[cfg(feature = "rdma")]
    server: Option<Arc<rdkv_fabric::rdma::verbs::RdmaServer>>,
}

fn off(reason: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        format!("rdma is off on this node: {reason}"),
    )
}

/// A client's queue-pair endpoint and the local address of the control
/// connection it came on (the route to that client: it picks the GID).
#[derive(Debug, Clone, Copy)]
pub struct RdmaClientEndpoint {
    pub endpoint: QpEndpoint,
    pub local_ip: Option<std::net::IpAddr>,
}

/// The region a queue pair's grant names: `shard`'s replica's, on node
/// `node_id`.
#[derive(Debug, Clone, Copy)]
pub struct RdmaTarget<'a> {
    pub sm: &'a RegionStateMachine,
    pub node_id: u64,
    pub shard: ShardId,
}

impl RdmaState {
    /// Opens the device (`device`: a name, or `None` for the first with an
    /// active port; `Some("off")` disables RDMA) and logs the outcome.
    #[cfg_attr(not(feature = "rdma"), allow(unused_variables))]
    pub fn start(device: Option<&str>, grace_period_ms: u64) -> RdmaState {
        if device == Some("off") {
            tracing::info!(
                "rdma transport off: disabled by --rdma-device off (serving over tcp and shm)"
            );
            return RdmaState::disabled("disabled by --rdma-device off");
        }
        #[cfg(feature = "rdma")]
        {
            let grace = Duration::from_millis(grace_period_ms);
            match rdkv_fabric::rdma::verbs::RdmaServer::open(device, grace) {
                Ok(server) => {
                    let line = server.describe();
                    tracing::info!(device = %line, "rdma transport on");
                    RdmaState {
                        status: format!("on: {line}"),
                        server: Some(Arc::new(server)),
                    }
                }
                Err(e) => {
                    tracing::info!("rdma transport off: {e} (serving over tcp and shm)");
                    RdmaState::disabled(&e.to_string())
                }
            }
        }
        #[cfg(not(feature = "rdma"))]
        {
            let reason = "this binary was built without the rdma feature";
            tracing::info!("rdma transport off: {reason} (serving over tcp and shm)");
            RdmaState::disabled(reason)
        }
    }

    pub fn disabled(reason: &str) -> RdmaState {
        RdmaState {
            status: format!("off: {reason}"),
            #[cfg(feature = "rdma")]
            server: None,
        }
    }

    pub fn status(&self) -> &str {
        &self.status
    }

    fn reason_off(&self) -> &str {
        self.status.strip_prefix("off: ").unwrap_or(&self.status)
    }

    /// The grant of shard `shard`'s current region, `sm`'s (registering it
    /// on first use).
    #[cfg_attr(not(feature = "rdma"), allow(unused_variables))]
    pub fn region_grant(
        &self,
        sm: &RegionStateMachine,
        node_id: u64,
        shard: ShardId,
    ) -> Result<RdmaRegionGrant, ErrorReply> {
        #[cfg(feature = "rdma")]
        if let Some(server) = &self.server {
            let memory = sm.region_memory();
            return server
                .grant(region_ref(&memory, sm, node_id, shard))
                .map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("rdma region: {e}")));
        }
        Err(off(self.reason_off()))
    }

    /// A queue pair towards `client`, serving its requests with `handler`,
    /// and the grant of `target`'s region.
    #[cfg_attr(not(feature = "rdma"), allow(unused_variables))]
    pub fn connect(
        &self,
        client: RdmaClientEndpoint,
        handler: Arc<dyn rdkv_fabric::RpcHandler>,
        target: RdmaTarget<'_>,
        max_frame_bytes: u32,
        max_in_flight: u32,
    ) -> Result<(QpEndpoint, RdmaRegionGrant, RdmaConnectionGuard), ErrorReply> {
        #[cfg(feature = "rdma")]
        if let Some(server) = &self.server {
            let memory = target.sm.region_memory();
            let region = region_ref(&memory, target.sm, target.node_id, target.shard);
            let (endpoint, grant, connection) = server
                .accept(
                    client.endpoint,
                    client.local_ip,
                    region,
                    handler,
                    max_frame_bytes,
                    max_in_flight,
                )
                .map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("rdma connect: {e}")))?;
            return Ok((
                endpoint,
                grant,
                RdmaConnectionGuard {
                    _connection: connection,
                },
            ));
        }
        Err(off(self.reason_off()))
    }

    /// Keeps every hosted shard's current region registered (a new epoch
    /// after a snapshot install, a compaction, a clear or a seed's
    /// adoption) and deregisters retired ones after their grace period.
    #[cfg_attr(not(feature = "rdma"), allow(unused_variables))]
    pub async fn maintain(
        self: Arc<Self>,
        shards: crate::shards::Shards,
        node_id: u64,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        #[cfg(feature = "rdma")]
        if let Some(server) = self.server.clone() {
            crate::grant_upkeep::run_every_second("rdma", server, shards, node_id, shutdown).await;
        }
    }
}

/// Shard `shard`'s region, `sm`'s, as the verbs server registers it.
#[cfg(feature = "rdma")]
fn region_ref<'a>(
    memory: &'a Arc<rdkv_fabric::RegionMemory>,
    sm: &RegionStateMachine,
    node_id: u64,
    shard: ShardId,
) -> rdkv_fabric::rdma::verbs::server::RegionRef<'a> {
    rdkv_fabric::rdma::verbs::server::RegionRef {
        memory,
        node_id,
        shard,
        epoch: sm.region_epoch(),
    }
}

#[cfg(feature = "rdma")]
impl crate::grant_upkeep::Grants for rdkv_fabric::rdma::verbs::RdmaServer {
    fn keep_current(
        &self,
        sm: &RegionStateMachine,
        node_id: u64,
        shard: ShardId,
    ) -> Result<(), String> {
        let memory = sm.region_memory();
        self.grant(region_ref(&memory, sm, node_id, shard))
            .map(|_grant| ())
            .map_err(|e| e.to_string())
    }

    fn retire_unhosted(&self, hosted: &[ShardId]) {
        rdkv_fabric::rdma::verbs::RdmaServer::retire_unhosted(self, hosted);
    }

    fn sweep(&self) {
        rdkv_fabric::rdma::verbs::RdmaServer::sweep(self);
    }
}
