//! The node's side of the `ofi` (libfabric) transport: whether it is on
//! (and why not), and the region grant handed to authenticated clients
//! (`Request::OfiRegion`). Clients read the region with `fi_read`; the node
//! only keeps its endpoint progressing and its registrations current.
//!
//! One binary runs everywhere: without the cargo feature, without
//! libfabric.so.1, or without a provider that opens, the node logs one line
//! saying why and serves over the other transports; `Request::OfiRegion`
//! then gets an `InvalidRequest` reply, on which clients fall back.

use std::sync::Arc;
#[cfg(feature = "ofi")]
use std::time::Duration;

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{ErrorCode, ErrorReply, OfiRegionGrant};
use rdkv_storage::state_machine::RegionStateMachine;

#[derive(Debug)]
pub struct OfiState {
    /// `on: <provider (libfabric version)>` or `off: <reason>`, as logged
    /// and reported in the node's status.
    status: String,
    #[cfg(feature = "ofi")]
    server: Option<Arc<rdkv_fabric::ofi::server::OfiServer>>,
}

impl OfiState {
    /// Opens an endpoint of `provider` (`None`: the first of
    /// `AUTO_PROVIDERS` that opens; `Some("off")` disables the transport)
    /// bound to `listen_ip`, and logs the outcome.
    #[cfg_attr(not(feature = "ofi"), allow(unused_variables))]
    pub fn start(
        provider: Option<&str>,
        listen_ip: std::net::IpAddr,
        grace_period_ms: u64,
    ) -> OfiState {
        if provider == Some("off") {
            tracing::info!("ofi transport off: disabled by --ofi-provider off");
            return OfiState::disabled("disabled by --ofi-provider off");
        }
        #[cfg(feature = "ofi")]
        {
            let grace = Duration::from_millis(grace_period_ms);
            // An unspecified address would be granted as such: let the
            // provider pick its interface then.
            let node = (!listen_ip.is_unspecified()).then(|| listen_ip.to_string());
            match rdkv_fabric::ofi::server::OfiServer::open(provider, node.as_deref(), grace) {
                Ok(server) => {
                    let line = server.describe();
                    tracing::info!(provider = %line, "ofi transport on");
                    OfiState {
                        status: format!("on: {line}"),
                        server: Some(Arc::new(server)),
                    }
                }
                Err(e) => {
                    tracing::info!("ofi transport off: {e}");
                    OfiState::disabled(&e.to_string())
                }
            }
        }
        #[cfg(not(feature = "ofi"))]
        {
            let reason = "this binary was built without the ofi feature";
            tracing::info!("ofi transport off: {reason}");
            OfiState::disabled(reason)
        }
    }

    pub fn disabled(reason: &str) -> OfiState {
        OfiState {
            status: format!("off: {reason}"),
            #[cfg(feature = "ofi")]
            server: None,
        }
    }

    pub fn status(&self) -> &str {
        &self.status
    }

    /// The grant of shard `shard`'s current region, `sm`'s (registering it
    /// on first use).
    #[cfg_attr(not(feature = "ofi"), allow(unused_variables))]
    pub fn region_grant(
        &self,
        sm: &RegionStateMachine,
        node_id: u64,
        shard: ShardId,
    ) -> Result<OfiRegionGrant, ErrorReply> {
        #[cfg(feature = "ofi")]
        if let Some(server) = &self.server {
            return server
                .grant(&sm.region_memory(), node_id, shard, sm.region_epoch())
                .map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("ofi region: {e}")));
        }
        let reason = self.status.strip_prefix("off: ").unwrap_or(&self.status);
        Err(ErrorReply::new(
            ErrorCode::InvalidRequest,
            format!("ofi is off on this node: {reason}"),
        ))
    }

    /// Keeps every hosted shard's current region registered (a new epoch
    /// after a snapshot install, a compaction, a clear or a seed's
    /// adoption) and closes retired registrations after their grace period.
    #[cfg_attr(not(feature = "ofi"), allow(unused_variables))]
    pub async fn maintain(
        self: Arc<Self>,
        shards: crate::shards::Shards,
        node_id: u64,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        #[cfg(feature = "ofi")]
        if let Some(server) = self.server.clone() {
            crate::grant_upkeep::run_every_second("ofi", server, shards, node_id, shutdown).await;
        }
    }
}

#[cfg(feature = "ofi")]
impl crate::grant_upkeep::Grants for rdkv_fabric::ofi::server::OfiServer {
    fn keep_current(
        &self,
        sm: &RegionStateMachine,
        node_id: u64,
        shard: ShardId,
    ) -> Result<(), String> {
        self.grant(&sm.region_memory(), node_id, shard, sm.region_epoch())
            .map(|_grant| ())
            .map_err(|e| e.to_string())
    }

    fn retire_unhosted(&self, hosted: &[ShardId]) {
        rdkv_fabric::ofi::server::OfiServer::retire_unhosted(self, hosted);
    }

    fn sweep(&self) {
        rdkv_fabric::ofi::server::OfiServer::sweep(self);
    }
}
