//! What runs around the metadata group on every node: the leader's
//! bootstrap (map version 1, every other node a learner), the leader's
//! upkeep of the group's voters, the watch that serves each newly applied
//! map, and the publication of this node's own addresses in the map's node
//! directory.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::{ChangeMembers, Precondition, RaftMetrics};
use rdkv_proto::shard::{NodeInfo, ShardMap};
use rdkv_storage::raft::{NodeAddr, TypeConfig};
use tokio::sync::watch;

use super::Meta;
use super::edit::{propose_map_change, publish_here};
use super::voters::{self, GroupView, VoterChange};
use crate::raft_watch::RaftWatch;

/// Pause before trying again after a failed step.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Serves every map this node's metadata replica applies, as it applies
/// them (a restarted node: the one it applied before, once replayed).
pub async fn follow_applied(meta: Meta, mut shutdown: watch::Receiver<bool>) {
    // Raft's data metrics, sent when they change (its whole metrics go out
    // on every loop of RaftCore, every heartbeat included).
    let mut data = meta.replica().raft.data_metrics();
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
            changed = data.changed() => if changed.is_err() { return },
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
    let mut raft_watch = RaftWatch::new(&meta.replica().raft);
    loop {
        let leads = raft_watch.read(|server, _| server.state.is_leader());
        let done = !leads || bootstrap_step(&meta, &bootstrap).await;
        if done {
            tokio::select! {
                running = raft_watch.changed() => if !running { return },
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
    // A node of `--initial-cluster` that left the map was removed
    // (`remove`): not added back.
    let map = meta.map();
    let missing = bootstrap
        .nodes
        .iter()
        .find(|(id, _)| membership.get_node(id).is_none() && map.node(**id).is_some());
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

/// How often the leader looks at the group's voters.
const VOTER_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long the upkeep waits for one change to commit before it looks
/// again (the change itself is not withdrawn).
const VOTER_CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whenever this node leads the metadata group, keeps its voters
/// (`voters::decide`) once a second; runs until shutdown. Every node runs
/// it: a joined node may come to lead the group.
pub async fn keep_voters(meta: Meta, mut shutdown: watch::Receiver<bool>) {
    // (term, when this node was first seen leading in it): a member that
    // has not answered this leader yet is silent since then.
    let mut leading: Option<(u64, tokio::time::Instant)> = None;
    let mut ticks = tokio::time::interval(VOTER_CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.changed() => return,
        }
        let metrics = meta.replica().metrics();
        if !metrics.state.is_leader() {
            leading = None;
            continue;
        }
        let term = metrics.current_term;
        if leading.is_none_or(|(t, _)| t != term) {
            leading = Some((term, tokio::time::Instant::now()));
        }
        let leading_for = leading.map_or(Duration::ZERO, |(_, since)| since.elapsed());
        let view = group_view(&metrics, &meta.map(), leading_for);
        if let Some(change) = voters::decide(&view) {
            change_voters(&meta, &metrics, change).await;
        }
    }
}

/// What `voters::decide` takes, from the leader's metrics and its map.
pub(super) fn group_view(
    metrics: &RaftMetrics<TypeConfig>,
    map: &ShardMap,
    leading_for: Duration,
) -> GroupView {
    let stored = &metrics.membership_config;
    let membership = stored.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let learners: BTreeSet<u64> = membership.learner_ids().collect();
    let heartbeat = metrics.heartbeat.as_ref();
    let silent_for = voters
        .union(&learners)
        .map(|&id| {
            let acked = heartbeat.and_then(|h| h.get(&id)).and_then(Option::as_ref);
            let silent = acked.map_or(leading_for, |at| openraft::Instant::elapsed(&**at));
            (id, silent)
        })
        .collect();
    let matched = metrics
        .replication
        .iter()
        .flatten()
        .filter_map(|(id, log_id)| log_id.as_ref().map(|l| (*id, l.index)))
        .collect();
    GroupView {
        leader: metrics.id,
        voters,
        learners,
        map_nodes: map.nodes().iter().map(|n| n.id).collect(),
        silent_for,
        matched,
        committed: metrics.cluster_committed.map_or(0, |l| l.index),
        settled: stored.log_id() == metrics.committed_membership_config.log_id()
            && membership.get_joint_config().len() == 1,
    }
}

/// Carries `change` out as one membership change, only while the
/// membership is still the one it was decided on (`metrics`'s).
async fn change_voters(meta: &Meta, metrics: &RaftMetrics<TypeConfig>, change: VoterChange) {
    let members = match &change {
        VoterChange::Promote(learners) => ChangeMembers::AddVoterIds(learners.clone()),
        // One joint change: the old voters and the new ones must each
        // reach a majority to commit it, and both have one (the old set
        // has its quorum alive, `decide` checked; the new set has the
        // same live voters plus the caught-up learners). Adding first and
        // demoting second within the batch never leaves fewer live voters
        // than before; `retain` keeps the dead voter a learner, so it
        // catches up when it returns and may be promoted again.
        VoterChange::Replace { dead, with } => ChangeMembers::Batch(vec![
            ChangeMembers::AddVoterIds(with.clone()),
            ChangeMembers::RemoveVoters(dead.clone()),
        ]),
    };
    let observed = Precondition::LastMembershipLogId {
        last_membership_log_id: *metrics.membership_config.log_id(),
    };
    let raft = &meta.replica().raft;
    let changed = raft.change_membership_if(members, true, [observed]);
    match tokio::time::timeout(VOTER_CHANGE_TIMEOUT, changed).await {
        Ok(Ok(_)) => tracing::info!(?change, "changed the metadata group's voters"),
        Ok(Err(e)) => tracing::warn!(?change, "changing the metadata group's voters: {e}"),
        // Not undone: it commits or a later leader's decision starts over.
        Err(_) => tracing::warn!(
            ?change,
            "changing the metadata group's voters: no commit within {VOTER_CHANGE_TIMEOUT:?}"
        ),
    }
}

/// Publishes this node's addresses (`own`) in the map's node directory
/// whenever the map served holds others or none; runs until shutdown. A
/// map that does not list this node at all is one it was removed from
/// (every node is listed from its start: placed, or by its join): the
/// node does not add itself back.
pub async fn publish_own_addresses(meta: Meta, own: NodeInfo, mut shutdown: watch::Receiver<bool>) {
    let mut maps = meta.subscribe();
    loop {
        let done = meta.map().node(own.id).is_none_or(|listed| *listed == own);
        let has_leader = meta.replica().metrics().current_leader.is_some();
        if !done && has_leader {
            // Only an entry the map has (a try re-run on a newer map
            // from which the node was removed adds nothing).
            let edit = |parts: &mut super::MapEdit| {
                if let Some(listed) = parts.nodes.iter_mut().find(|n| n.id == own.id) {
                    *listed = own.clone();
                }
            };
            match propose_map_change(&meta, edit).await {
                Ok(version) => {
                    tracing::info!(version, "published this node's addresses in the shard map");
                }
                Err(e) => tracing::warn!("publishing this node's addresses: {e}"),
            }
        }
        tokio::select! {
            changed = maps.changed(), if done => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY_AFTER), if !done => {}
            _ = shutdown.changed() => return,
        }
    }
}
