//! `Request::RemoveNode` on the metadata group's leader: a node leaves a
//! multi-shard cluster for good (docs/sharding.md, section 8, "Removing a
//! node").
//!
//! Refused while the map names the node a member of any shard: its
//! replicas are moved away first (`rdkvctl shard move-replica`). Then each
//! step checks the state it expects, so a removal cut short (the leader
//! killed half-way) is finished by sending the same request again:
//! 1. a node leading the group hands its leadership on (answered
//!    `NotLeader`: the request follows the new leader);
//! 2. the node leaves the map, a new version. First, so that from then on
//!    the leader's voter upkeep neither counts nor promotes it, the
//!    bootstrap does not add it back and the node does not publish itself
//!    again (`tasks`);
//! 3. a voter is demoted to a learner, in the same change as a caught-up
//!    learner is promoted when there is one (`voters::replacement`), and
//!    given a moment to learn it, so it does not campaign once cut off;
//! 4. the learner leaves the group.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::ChangeMembers;
use rdkv_proto::shard::{NodeId, ShardMap};
use rdkv_proto::wire::{ErrorCode, ErrorReply, Response};

use super::Meta;
use super::edit::propose_map_change;
use super::join::{refusal, require_leader};
use super::tasks::group_view;
use super::voters;
use crate::service::Reply;
use crate::service::admin::transfer_leadership;
use crate::service::write::write_error;

/// How long a demoted voter is given to learn its demotion before it is
/// removed (best effort: a dead one never does).
const DEMOTION_TIMEOUT: Duration = Duration::from_secs(3);

/// Removes node `id` from the map and the metadata group; answers the map
/// without it. A node the cluster does not have is answered the same.
pub async fn remove_node(meta: &Meta, id: NodeId) -> Reply {
    require_leader(meta)?;
    let hosted = hosted_shards(&meta.map(), id);
    if !hosted.is_empty() {
        return Err(refusal(format!(
            "node {id} hosts replicas of shard(s) {hosted} in the shard map: move each away \
             first (`rdkvctl shard move-replica SHARD {id} TO`), then remove the node"
        )));
    }
    if id == meta.replica().node_id() {
        return hand_over(meta, id).await;
    }
    propose_map_change(meta, |parts| parts.nodes.retain(|node| node.id != id))
        .await
        .map_err(|e| {
            ErrorReply::new(
                ErrorCode::Unavailable,
                format!("removing node {id} from the shard map failed: {e}"),
            )
        })?;
    demote(meta, id).await?;
    leave_group(meta, id).await?;
    tracing::info!(node = id, "a node left the cluster");
    Ok(Response::ShardMap(Box::new((*meta.map()).clone())))
}

/// The shards `map` names `id` a member of, as "1, 2" (empty: none).
fn hosted_shards(map: &ShardMap, id: NodeId) -> String {
    map.shards()
        .iter()
        .filter(|shard| shard.members.contains(&id))
        .map(|shard| shard.id.0.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// This leader is the node to remove: hands the leadership to the voter
/// with the longest log and answers `NotLeader` naming the new leader.
async fn hand_over(meta: &Meta, id: NodeId) -> Reply {
    let replica = meta.replica();
    let metrics = replica.metrics();
    let matched = |voter: &NodeId| {
        metrics
            .replication
            .as_ref()
            .and_then(|r| r.get(voter).cloned().flatten())
            .map_or(0, |log_id| log_id.index)
    };
    let to = metrics
        .membership_config
        .membership()
        .voter_ids()
        .filter(|&voter| voter != id)
        .max_by_key(matched)
        .ok_or_else(|| {
            refusal(format!(
                "node {id} is the metadata group's only voter: it cannot be removed"
            ))
        })?;
    tracing::info!(
        node = id,
        to,
        "handing the metadata group's leadership on before leaving"
    );
    transfer_leadership(replica, to, |leader| leader != id).await?;
    require_leader(meta)?;
    Err(ErrorReply::new(
        ErrorCode::Unavailable,
        "the metadata group's leadership did not move: try again",
    ))
}

/// Demotes voter `id` to a learner, promoting a caught-up learner in the
/// same change when there is one (the group keeps its size and one
/// joint change keeps a quorum throughout); nothing if it is no voter.
async fn demote(meta: &Meta, id: NodeId) -> Result<(), ErrorReply> {
    let replica = meta.replica();
    let metrics = replica.metrics();
    if !metrics
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v == id)
    {
        return Ok(());
    }
    // A member that has not answered this leader yet counts as alive
    // here: a replacement must be caught up anyway.
    let view = group_view(&metrics, &meta.map(), Duration::ZERO);
    let demoted = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
    let change = match voters::replacement(&view) {
        Some(learner) => ChangeMembers::Batch(vec![
            ChangeMembers::AddVoterIds(BTreeSet::from([learner])),
            demoted,
        ]),
        None => demoted,
    };
    tracing::info!(node = id, %change, "demoting a leaving node in the metadata group");
    let committed = replica
        .raft
        .change_membership(change, true)
        .await
        .map_err(|e| write_error(replica, e))?;
    let index = committed.log_id.index;
    let learned = replica
        .raft
        .wait(Some(DEMOTION_TIMEOUT))
        .metrics(
            |m| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .is_some_and(|matched| matched.index >= index)
            },
            "the leaving node learnt its demotion",
        )
        .await;
    if learned.is_err() {
        tracing::info!(
            node = id,
            "the leaving node did not learn its demotion (down?)"
        );
    }
    Ok(())
}

/// Removes learner `id` from the group; nothing if it is not in it.
async fn leave_group(meta: &Meta, id: NodeId) -> Result<(), ErrorReply> {
    let replica = meta.replica();
    let metrics = replica.metrics();
    if metrics
        .membership_config
        .membership()
        .get_node(&id)
        .is_none()
    {
        return Ok(());
    }
    replica
        .raft
        .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
        .await
        .map_err(|e| write_error(replica, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shards_a_node_hosts_are_named() {
        // Placed: shard 0 on {1, 2}, 1 on {2, 3}, 2 on {3, 1}.
        let map = crate::meta::edit::tests::placed();
        assert_eq!(hosted_shards(&map, 3), "1, 2");
        assert_eq!(hosted_shards(&map, 1), "0, 2");
        assert_eq!(hosted_shards(&map, 9), "");
    }
}
