//! The upkeep both one-sided transports' servers (RDMA, libfabric) give
//! their region grants: once a second, register every hosted shard's
//! current region (a new epoch after a snapshot install) and release
//! retired registrations after their grace period, on the blocking pool (a
//! registration may pin the whole region). A single group is the one
//! shard 0: the same path.

use std::sync::Arc;
use std::time::Duration;

use rdkv_proto::shard::ShardId;
use rdkv_storage::state_machine::RegionStateMachine;

/// A one-sided transport's server, as the upkeep sees it.
pub trait Grants: Send + Sync + 'static {
    /// Registers the current region of `sm`, shard `shard`'s, unless it is
    /// registered (a new epoch after a snapshot install); the shard's
    /// other registrations start their grace period.
    fn keep_current(
        &self,
        sm: &RegionStateMachine,
        node_id: u64,
        shard: ShardId,
    ) -> Result<(), String>;
    /// Releases registrations retired longer than the grace period ago.
    fn sweep(&self);
}

/// Keeps `server`'s grants of every region of `regions` current and
/// sweeps its retired registrations every second until `shutdown` changes;
/// `transport` names it in the log.
pub async fn run_every_second<G: Grants>(
    transport: &'static str,
    server: Arc<G>,
    regions: Vec<(ShardId, RegionStateMachine)>,
    node_id: u64,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let regions = Arc::new(regions);
    let step = move || {
        for (shard, sm) in regions.iter() {
            if let Err(e) = server.keep_current(sm, node_id, *shard) {
                tracing::warn!(%shard, "registering the region for {transport}: {e}");
            }
        }
        server.sweep();
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = tokio::task::spawn_blocking(step.clone()).await {
            tracing::warn!("{transport} region maintenance: {e}");
        }
    }
}
