//! Operator requests: membership changes, leadership transfer, snapshot
//! reads, and (for fault tests) fault injection.

use std::collections::BTreeSet;
use std::time::Duration;

use openraft::ChangeMembers;
use rdkv_proto::wire::{ErrorCode, ErrorReply, Fault, MemberInfo, Response, SnapshotChunk};
use rdkv_storage::raft::NodeAddr;

use super::Reply;
use super::write::write_error;
use crate::replica::Replica;
use crate::{lease, stop_snapshot};

/// Largest snapshot piece one `SnapshotRead` returns.
const MAX_SNAPSHOT_CHUNK_BYTES: u32 = 4 * 1024 * 1024;
const MOVE_LEADER_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn add_member(replica: &Replica, id: u64, node: NodeAddr, learner: bool) -> Reply {
    replica.require_leader()?;
    if id == 0 {
        return Err(ErrorReply::new(
            ErrorCode::InvalidRequest,
            "member ids start at 1",
        ));
    }
    tracing::info!(id, peer_addr = %node.peer_addr, client_addr = %node.client_addr, learner, "adding a member");
    // Blocking: returns once the learner has caught up (by snapshot if
    // the log it needs was purged).
    replica
        .raft
        .add_learner(id, node, true)
        .await
        .map_err(|e| write_error(replica, e))?;
    if learner {
        return Ok(Response::Members(replica.members()));
    }
    make_voter(replica, id).await
}

pub async fn promote_member(replica: &Replica, id: u64) -> Reply {
    replica.require_leader()?;
    member(replica, id)?;
    make_voter(replica, id).await
}

pub async fn remove_member(replica: &Replica, id: u64) -> Reply {
    replica.require_leader()?;
    let member = member(replica, id)?;
    tracing::info!(id, "removing a member");
    let change = if member.voter {
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    } else {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    };
    change_membership(replica, change, false).await
}

/// Makes member `id` a voter (learners stay learners).
async fn make_voter(replica: &Replica, id: u64) -> Reply {
    change_membership(
        replica,
        ChangeMembers::AddVoterIds(BTreeSet::from([id])),
        true,
    )
    .await
}

/// Member `id`, or the `NotFound` reply.
fn member(replica: &Replica, id: u64) -> Result<MemberInfo, ErrorReply> {
    replica
        .members()
        .into_iter()
        .find(|m| m.id == id)
        .ok_or_else(|| ErrorReply::new(ErrorCode::NotFound, format!("node {id} is not a member")))
}

/// Commits a configuration change and answers with the new members: the
/// configuration the change committed, not the node's metrics, which may
/// not show it yet when the call returns (seen under load: a removed
/// member still listed).
async fn change_membership(
    replica: &Replica,
    change: ChangeMembers<u64, NodeAddr>,
    retain: bool,
) -> Reply {
    let committed = replica
        .raft
        .change_membership(change, retain)
        .await
        .map_err(|e| write_error(replica, e))?;
    let members = match committed.membership() {
        Some(membership) => replica.members_of(membership),
        None => replica.members(),
    };
    Ok(Response::Members(members))
}

pub async fn move_leader(replica: &Replica, to: u64) -> Reply {
    replica.require_leader()?;
    if !replica.members().iter().any(|m| m.id == to && m.voter) {
        return Err(ErrorReply::new(
            ErrorCode::NotFound,
            format!("node {to} is not a voter"),
        ));
    }
    if to == replica.node_id() {
        return Ok(Response::Done);
    }
    transfer_leadership(replica, to, move |leader| leader == to).await?;
    Ok(Response::Done)
}

/// Hands this leader's leadership to voter `to` (its lease suspended
/// first) and waits until this node knows a leader that `taken` accepts;
/// returns that leader. `move_leader` accepts `to` only; a move of the
/// leader's own replica any other voter, since the transfer's election may
/// be won by another one than `to` (seen with slow disks).
pub async fn transfer_leadership(
    replica: &Replica,
    to: u64,
    taken: impl Fn(u64) -> bool + Send + Sync,
) -> Result<u64, ErrorReply> {
    tracing::info!(to, "transferring leadership");
    lease::suspend_for_transfer(replica)?;
    replica
        .raft
        .trigger()
        .transfer_leader(to)
        .await
        .map_err(|e| ErrorReply::new(ErrorCode::Unavailable, e.to_string()))?;
    let metrics = replica
        .raft
        .wait(Some(MOVE_LEADER_TIMEOUT))
        .metrics(|m| m.current_leader.is_some_and(&taken), "leadership moved")
        .await
        .map_err(|e| {
            ErrorReply::new(
                ErrorCode::Timeout,
                format!("node {to} did not take over: {e}"),
            )
        })?;
    Ok(metrics.current_leader.unwrap_or(to))
}

/// Longest the first piece of a backup waits for a fresh snapshot.
const BACKUP_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn snapshot_read(replica: &Replica, offset: u64, max_bytes: u32) -> Reply {
    if offset == 0 {
        // A backup starts here: it gets everything applied by now. (The
        // client checks that every later piece is of the same snapshot.)
        stop_snapshot::snapshot_of_applied(&replica.raft, BACKUP_SNAPSHOT_TIMEOUT)
            .await
            .map_err(|e| {
                ErrorReply::new(ErrorCode::Unavailable, format!("no fresh snapshot: {e}"))
            })?;
    }
    let (meta, file) = replica
        .sm
        .snapshot_file()
        .await
        .map_err(|e| ErrorReply::new(ErrorCode::Internal, e.to_string()))?;
    let total_bytes = file.len();
    let start = offset.min(total_bytes);
    let len = max_bytes.clamp(1, MAX_SNAPSHOT_CHUNK_BYTES) as usize;
    let data = file
        .read_chunk(start, len)
        .await
        .map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("reading the snapshot: {e}")))?;
    Ok(Response::Snapshot(SnapshotChunk {
        last_log_index: meta.last_log_id.map_or(0, |l| l.index),
        total_bytes,
        offset: start,
        data,
    }))
}

/// `enabled`: the node was started with `--fault-injection`.
pub fn inject_fault(replica: &Replica, enabled: bool, fault: Fault) -> Reply {
    if !enabled {
        return Err(ErrorReply::new(
            ErrorCode::InvalidRequest,
            "fault injection is disabled (start the node with --fault-injection)",
        ));
    }
    tracing::warn!(?fault, "fault injected");
    match fault {
        Fault::Isolate { peers } => replica.peers.isolate_from(peers),
        Fault::Heal => {
            replica.peers.isolate_from([]);
            replica.log.set_fsync_delay(Duration::ZERO);
        }
        Fault::SlowFsync { delay_ms } => {
            replica.log.set_fsync_delay(Duration::from_millis(delay_ms));
        }
    }
    Ok(Response::Done)
}
