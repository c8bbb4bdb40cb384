//! What runs around the metadata group on every node: the leader's
//! bootstrap (map version 1, every other node a learner), the watch that
//! serves each newly applied map, and the publication of this node's own
//! addresses in the map's node directory.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use rdkv_proto::shard::{NodeInfo, ShardMap};
use rdkv_storage::raft::NodeAddr;
use tokio::sync::watch;

use super::Meta;
use super::edit::{propose_map_change, publish_here};

/// Pause before trying again after a failed step.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Serves every map this node's metadata replica applies, as it applies
/// them (a restarted node: the one it applied before, once replayed).
pub async fn follow_applied(meta: Meta, mut shutdown: watch::Receiver<bool>) {
    let mut metrics = meta.replica().raft.metrics();
    let mut seen = None;
    loop {
        let applied = meta.replica().sm.applied_index();
        if seen != Some(applied) {
            seen = Some(applied);
            match meta.replica().sm.applied_shard_map() {
                Ok(Some(map)) => {
                    meta.install(map);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("reading the applied shard map: {e}"),
            }
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// What the metadata group's leader makes sure of: a map applied (the
/// placed map, version 1, if none is) and every node of `--initial-cluster`
/// in the group (the ones that do not vote as learners).
#[derive(Debug)]
pub struct Bootstrap {
    pub placed: ShardMap,
    /// `--initial-cluster`: node id -> peer address.
    pub nodes: BTreeMap<u64, String>,
}

/// Whenever this node leads the metadata group, carries out [`Bootstrap`];
/// runs until shutdown.
pub async fn lead(meta: Meta, bootstrap: Bootstrap, mut shutdown: watch::Receiver<bool>) {
    let mut metrics = meta.replica().raft.metrics();
    loop {
        let leads = metrics.borrow_watched().state.is_leader();
        let done = !leads || bootstrap_step(&meta, &bootstrap).await;
        if done {
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
        } else {
            tokio::select! {
                _ = tokio::time::sleep(RETRY_AFTER) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// One step of the bootstrap on the leader; whether nothing is left to do.
async fn bootstrap_step(meta: &Meta, bootstrap: &Bootstrap) -> bool {
    if meta.applied_version() == 0 {
        // Refused if another leader's version 1 was applied meanwhile.
        if let Err(e) = publish_here(meta, bootstrap.placed.clone()).await {
            tracing::info!("publishing shard map version 1: {}", e.message);
        }
        return false;
    }
    let replica = meta.replica();
    let metrics = replica.metrics();
    let membership = metrics.membership_config.membership();
    let missing = bootstrap
        .nodes
        .iter()
        .find(|(id, _)| membership.get_node(id).is_none());
    let Some((&id, peer_addr)) = missing else {
        return true;
    };
    let addr = NodeAddr {
        peer_addr: peer_addr.clone(),
        client_addr: String::new(),
    };
    match replica.raft.add_learner(id, addr, false).await {
        Ok(_) => tracing::info!(node = id, "added to the metadata group as a learner"),
        Err(e) => tracing::info!(node = id, "adding to the metadata group: {e}"),
    }
    false
}

/// Publishes this node's addresses (`own`) in the map's node directory
/// whenever the map served lacks them or holds others; runs until shutdown.
pub async fn publish_own_addresses(meta: Meta, own: NodeInfo, mut shutdown: watch::Receiver<bool>) {
    let mut maps = meta.subscribe();
    loop {
        let listed = meta.map().node(own.id) == Some(&own);
        let has_leader = meta.replica().metrics().current_leader.is_some();
        if !listed && has_leader {
            let edit = |parts: &mut super::MapEdit| *parts.node_mut(own.id) = own.clone();
            match propose_map_change(&meta, edit).await {
                Ok(version) => {
                    tracing::info!(version, "published this node's addresses in the shard map");
                }
                Err(e) => tracing::warn!("publishing this node's addresses: {e}"),
            }
        }
        tokio::select! {
            changed = maps.changed(), if listed => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY_AFTER), if !listed => {}
            _ = shutdown.changed() => return,
        }
    }
}
