//! `Request::AddNode` on the metadata group's leader: a node started with
//! `--join` becomes a learner of the group and a node of the map
//! (docs/sharding.md, section 8, "Adding a node").
//!
//! Every step checks the state it expects, so a join cut short (the new
//! node, or the leader, killed half-way) is completed by sending the same
//! request again: a node already in the group with the same peer address
//! is not added twice, and a map already listing it with the same
//! addresses is not edited again.

use std::time::Duration;

use rdkv_proto::shard::NodeInfo;
use rdkv_proto::wire::{ErrorCode, ErrorReply, LeaderHint, Response};
use rdkv_storage::raft::NodeAddr;

use super::Meta;
use super::edit::propose_map_change;
use crate::service::Reply;
use crate::service::write::write_error;

/// How long the new learner may take to catch up with the group's log
/// (a snapshot of the map included: kilobytes).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// The node asking to join, as `Request::AddNode` names it.
#[derive(Debug, Clone)]
pub struct NewNode {
    pub id: u64,
    pub peer_addr: String,
    pub client_addr: String,
    pub resp_addr: Option<String>,
}

/// Adds `node` to the metadata group as a learner (unless it is in it with
/// the same peer address already), waits until it caught up, and lists it
/// with its addresses in the map; answers the map listing it.
pub async fn add_node(meta: &Meta, node: NewNode) -> Reply {
    require_leader(meta)?;
    if node.id == 0 {
        return Err(refusal("node ids start at 1".into()));
    }
    let replica = meta.replica();
    let metrics = replica.metrics();
    let membership = metrics.membership_config.membership();
    match membership.get_node(&node.id) {
        Some(known) if known.peer_addr != node.peer_addr => {
            return Err(refusal(format!(
                "node {} is in the cluster already, with peer address {} (not {}): \
                 give the new node an id of its own",
                node.id, known.peer_addr, node.peer_addr
            )));
        }
        // A repeat (the joining node restarted before it recorded the join).
        Some(_) => {}
        None if meta.map().node(node.id).is_some() => {
            return Err(refusal(format!(
                "node {} is a node of the shard map already (one of the cluster's own): \
                 give the new node an id of its own",
                node.id
            )));
        }
        None => {
            tracing::info!(
                node = node.id,
                peer_addr = %node.peer_addr,
                client_addr = %node.client_addr,
                "adding a node to the metadata group as a learner"
            );
            let addr = NodeAddr {
                peer_addr: node.peer_addr.clone(),
                client_addr: node.client_addr.clone(),
            };
            replica
                .raft
                .add_learner(node.id, addr, false)
                .await
                .map_err(|e| write_error(replica, e))?;
        }
    }
    caught_up(meta, node.id).await?;
    let info = NodeInfo {
        id: node.id,
        client_addr: Some(node.client_addr),
        resp_addr: node.resp_addr,
    };
    let version = propose_map_change(meta, |parts| *parts.node_mut(info.id) = info.clone())
        .await
        .map_err(|e| {
            ErrorReply::new(
                ErrorCode::Unavailable,
                format!(
                    "node {} is a learner now, but listing it failed: {e}",
                    info.id
                ),
            )
        })?;
    tracing::info!(node = info.id, version, "a node joined the cluster");
    Ok(Response::ShardMap(Box::new((*meta.map()).clone())))
}

/// Waits until `node`'s log matches this leader's committed index of now.
async fn caught_up(meta: &Meta, node: u64) -> Result<(), ErrorReply> {
    let raft = &meta.replica().raft;
    let committed = meta
        .replica()
        .metrics()
        .cluster_committed
        .map_or(0, |log_id| log_id.index);
    raft.wait(Some(CATCH_UP_TIMEOUT))
        .metrics(
            |m| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&node).cloned().flatten())
                    .is_some_and(|matched| matched.index >= committed)
            },
            "the new node caught up with the metadata group",
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            ErrorReply::new(
                ErrorCode::Timeout,
                format!(
                    "node {node} did not catch up with the metadata group within \
                     {CATCH_UP_TIMEOUT:?} (is its peer address reachable from here?): {e}"
                ),
            )
        })
}

/// `NotLeader` naming the group's leader by the client address the map
/// gives it (the membership's may be unknown for a node of
/// `--initial-cluster`, which is initialized without the others').
pub(super) fn require_leader(meta: &Meta) -> Result<(), ErrorReply> {
    let replica = meta.replica();
    if replica.raft.is_leader() {
        return Ok(());
    }
    let leader = replica.metrics().current_leader;
    let hint = leader.and_then(|node_id| {
        let client_addr = meta
            .map()
            .node(node_id)
            .and_then(|node| node.client_addr.clone())
            .or_else(|| replica.client_addr_of(node_id, None))?;
        Some(LeaderHint {
            node_id,
            client_addr,
        })
    });
    Err(ErrorReply::not_leader(hint))
}

pub(super) fn refusal(message: String) -> ErrorReply {
    ErrorReply::new(ErrorCode::InvalidRequest, message)
}
