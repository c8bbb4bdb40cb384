//! Reads served by RPC: GET, MGET and SCAN from this node's region (its
//! lock-free reader), once the read's consistency allows it here.

use openraft::ReadPolicy;
use openraft::errors::{LinearizableReadError, RaftError};
use rdkv_fabric::clock::unix_now_ms;
use rdkv_proto::wire::{
    Consistency, ErrorCode, ErrorReply, KeyExpiry, Response, SINGLE_ENTRY_OVERHEAD_BYTES, Versioned,
};
use rdkv_storage::state_machine::{LocalReads, ScanRange, StateMachineError};

use super::read_rounds::{CONFIRM_TIMEOUT, Confirmed, ReadError};
use super::{Reply, within};
use crate::lease;
use crate::replica::Replica;

pub async fn get(replica: &Replica, key: &[u8], consistency: Consistency) -> Reply {
    barrier(replica, consistency).await?;
    Ok(Response::Value(local(replica, key)?))
}

pub async fn mget(
    replica: &Replica,
    keys: &[bytes::Bytes],
    consistency: Consistency,
    max_frame_bytes: u32,
) -> Reply {
    barrier(replica, consistency).await?;
    Ok(Response::Values(local_values(
        &mut replica.sm.local_reads(),
        keys.iter(),
        max_frame_bytes,
    )?))
}

/// The values of `keys` in this node's region, once the read's consistency
/// allows it here. Stops as soon as the reply could not fit a frame: a
/// batch of large values must not be gathered in memory just to be refused.
pub fn local_values<K: AsRef<[u8]>>(
    reads: &mut LocalReads<'_>,
    keys: impl ExactSizeIterator<Item = K>,
    max_frame_bytes: u32,
) -> Result<Vec<Option<Versioned>>, ErrorReply> {
    let budget = u64::from(max_frame_bytes);
    let mut bytes = 0u64;
    let mut values = Vec::with_capacity(keys.len());
    for key in keys {
        let value = reads.get(key.as_ref()).map_err(internal)?;
        bytes += value.as_ref().map_or(0, |v| v.value.len() as u64);
        if bytes > budget {
            return Err(ErrorReply::new(
                ErrorCode::FrameTooLarge,
                format!("the values exceed the {budget}-byte frame limit; ask for fewer keys"),
            ));
        }
        values.push(value);
    }
    Ok(values)
}

pub async fn scan(
    replica: &Replica,
    range: ScanRange<'_>,
    consistency: Consistency,
    max_frame_bytes: u32,
) -> Reply {
    barrier(replica, consistency).await?;
    let budget = u64::from(max_frame_bytes).saturating_sub(u64::from(SINGLE_ENTRY_OVERHEAD_BYTES));
    let page = replica.sm.scan_local(range, budget).map_err(internal)?;
    Ok(Response::Pairs {
        pairs: page.pairs,
        more: page.more,
    })
}

/// The key's deadline (TTL, PTTL, EXPIRETIME), once the read's consistency
/// allows it here; the node's clock goes with it.
pub async fn ttl(replica: &Replica, key: &[u8], consistency: Consistency) -> Reply {
    barrier(replica, consistency).await?;
    let found = replica.sm.get_local_with_deadline(key).map_err(internal)?;
    Ok(Response::Expiry(found.map(|(value, deadline)| {
        KeyExpiry::of_block(value.version, deadline, unix_now_ms())
    })))
}

fn local(replica: &Replica, key: &[u8]) -> Result<Option<Versioned>, ErrorReply> {
    replica.sm.get_local(key).map_err(internal)
}

/// A failed read of this node's region, as the client hears of it.
fn internal(error: StateMachineError) -> ErrorReply {
    ErrorReply::new(ErrorCode::Internal, error.to_string())
}

/// Waits until this node may serve a read at `consistency`.
async fn barrier(replica: &Replica, consistency: Consistency) -> Result<(), ErrorReply> {
    if let Consistency::Follower { max_lag_entries } = consistency {
        return follower_barrier(replica, max_lag_entries);
    }
    if consistency == Consistency::Lease && lease::serves_lease_reads(replica) {
        return Ok(());
    }
    match confirm(replica, lease::leader_read_policy(consistency, &replica.sm)).await? {
        Ok(()) => Ok(()),
        // The lease has lapsed (no quorum contact lately): a ReadIndex
        // round confirms leadership instead.
        Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)))
            if consistency == Consistency::Lease =>
        {
            confirm(replica, ReadPolicy::ReadIndex)
                .await?
                .map_err(|e| read_error(replica, e))
        }
        Err(e) => Err(read_error(replica, e)),
    }
}

/// A follower read needs recent contact with the leader (or a quorum) and
/// at most `max_lag_entries` committed entries not yet applied here.
fn follower_barrier(replica: &Replica, max_lag_entries: u64) -> Result<(), ErrorReply> {
    let metrics = replica.metrics();
    lease::follower_contact(replica, &metrics)?;
    let committed = metrics.cluster_committed.map_or(0, |l| l.index);
    let lag = committed.saturating_sub(replica.sm.applied_index());
    if lag > max_lag_entries {
        return Err(ErrorReply::new(
            ErrorCode::StaleFollower,
            format!("this node is {lag} entries behind, over the {max_lag_entries} allowed"),
        ));
    }
    Ok(())
}

/// Confirms leadership by `policy`; the outer error is the timeout.
/// ReadIndex reads share rounds ([`super::read_rounds`]).
async fn confirm(replica: &Replica, policy: ReadPolicy) -> Confirmed {
    if policy == ReadPolicy::ReadIndex {
        return replica.reads.confirm().await;
    }
    let confirmed = within(
        CONFIRM_TIMEOUT,
        ErrorCode::Unavailable,
        "leadership not confirmed",
        // Boxed for the reason given in `write::commit`.
        Box::pin(replica.raft.ensure_linearizable(policy)),
    )
    .await?;
    Ok(confirmed.map(|_| ()))
}

fn read_error(replica: &Replica, error: ReadError) -> ErrorReply {
    match error {
        RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => {
            replica.not_leader(f.leader_id, f.leader_node.as_ref())
        }
        RaftError::APIError(LinearizableReadError::QuorumNotEnough(e)) => {
            ErrorReply::new(ErrorCode::Unavailable, e.to_string())
        }
        RaftError::Fatal(e) => ErrorReply::new(ErrorCode::Unavailable, e.to_string()),
    }
}
