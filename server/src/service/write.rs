//! Writes: a command proposed to the Raft log, its outcome once applied,
//! and what a refused proposal tells the client.

use std::time::Duration;

use openraft::errors::{ClientWriteError, RaftError};
use openraft::impls::ProgressResponder;
use rdkv_fabric::clock::unix_now_ms;
use rdkv_proto::wire::{ErrorCode, ErrorReply, Response};
use rdkv_storage::raft::{Command, TypeConfig};

use super::{Reply, within};
use crate::order::Finish;
use crate::replica::Replica;

/// Longest a write may wait to commit.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Proposes `command`, stamped with this leader's wall clock (the time its
/// expiry decisions and TTLs count from, `Command::Timed`), and waits for
/// its result (the caller has checked that this node leads and the region
/// has room). `placed` is taken and dropped once the proposal is queued
/// (`proposals`): a write this node proposes after that is ordered after
/// it in the log. Left in place if the proposal could not be queued.
pub async fn commit(replica: &Replica, command: Command, placed: &mut Option<Finish>) -> Reply {
    // Past the limit the outcome is unknown: the entry may still commit.
    within(
        COMMIT_TIMEOUT,
        ErrorCode::Timeout,
        "not committed (it may or may not be applied)",
        // Boxed: openraft's write future is large, and every future that
        // awaits it inline (the whole request path, reads included) would
        // be as large and copied at each level.
        Box::pin(propose_and_wait(replica, command, placed)),
    )
    .await?
}

/// Answers once the leader applied the write (`complete_only`: openraft's
/// completion is the apply). Architecture Invariant: a write is answered
/// only after this node applied it; the read fence and the lease's reads
/// rest on it (`service::read_fence`).
async fn propose_and_wait(
    replica: &Replica,
    command: Command,
    placed: &mut Option<Finish>,
) -> Reply {
    let command = command.timed(unix_now_ms());
    let (responder, outcome) = ProgressResponder::complete_only();
    replica
        .proposals
        .propose(command, responder)
        .map_err(|_| ErrorReply::new(ErrorCode::Unavailable, "raft has stopped"))?;
    drop(placed.take());
    // The proposal reached Raft, which may have committed it before it
    // stopped: the outcome is unknown, and a client must not resend it.
    let applied = outcome.await.map_err(|_| {
        ErrorReply::new(
            ErrorCode::Timeout,
            "raft stopped before the write's outcome was known: it may or may not have been applied",
        )
    })?;
    let response = applied.map_err(|e| write_error(replica, RaftError::APIError(e)))?;
    Ok(Response::from(response.data))
}

/// A refused proposal (a write or a membership change) as an error reply.
pub fn write_error(
    replica: &Replica,
    error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
) -> ErrorReply {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            replica.not_leader(f.leader_id, f.leader_node.as_ref())
        }
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(_)) => ErrorReply::new(
            ErrorCode::Timeout,
            "leadership changed while the write was in flight: it may or may not have been applied",
        ),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ErrorReply::new(ErrorCode::InvalidRequest, e.to_string())
        }
        RaftError::APIError(other) => ErrorReply::new(ErrorCode::InvalidRequest, other.to_string()),
        RaftError::Fatal(e) => ErrorReply::new(ErrorCode::Unavailable, e.to_string()),
    }
}
