//! The upkeep both one-sided transports' servers (RDMA, libfabric) give
//! their region grants: once a second, register every hosted shard's
//! current region (a new epoch after a snapshot install), retire the
//! registrations of shards no longer hosted (a replica moved away or
//! closed), and release retired registrations after their grace period,
//! on the blocking pool (a registration may pin the whole region). The
//! hosted shards are read from `Shards` at each turn: replicas opened or
//! closed while the node runs are seen. A single group is the one shard 0:
//! the same path.

use std::sync::Arc;
use std::time::Duration;

use rdkv_proto::shard::ShardId;
use rdkv_storage::state_machine::RegionStateMachine;

use crate::shards::Shards;

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
    /// Starts the grace period of the current registrations of shards not
    /// in `hosted`.
    fn retire_unhosted(&self, hosted: &[ShardId]);
    /// Releases registrations retired longer than the grace period ago.
    fn sweep(&self);
}

/// Keeps `server`'s grants of every shard `shards` hosts current, retires
/// the others' and sweeps its retired registrations every second until
/// `shutdown` changes; `transport` names it in the log.
pub async fn run_every_second<G: Grants>(
    transport: &'static str,
    server: Arc<G>,
    shards: Shards,
    node_id: u64,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let step = move || {
        for (shard, replica) in shards.iter() {
            if let Err(e) = server.keep_current(&replica.sm, node_id, shard) {
                tracing::warn!(%shard, "registering the region for {transport}: {e}");
            }
        }
        // Read again: a replica opened since the first read (and granted
        // to a client) is not retired. One opened between this read and
        // the retirement would be, and re-registered by its next grant
        // request after its readers fail over: a window of microseconds.
        let hosted: Vec<ShardId> = shards.iter().map(|(shard, _)| shard).collect();
        server.retire_unhosted(&hosted);
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
