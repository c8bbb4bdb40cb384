//! [`ShardRequest`]: a request that names no key, addressed to one shard
//! ([`Request::Sharded`], docs/sharding.md, section 4): a scan or a clear
//! of one shard, which a client runs on every shard of a sharded cluster.
//!
//! Its own enum, not a boxed [`Request`]: a sharded request cannot hold
//! another, so decoding one never recurses.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::message::{Consistency, Request};
use super::op::Op;
use super::rdma::QpEndpoint;

/// What [`Request::Sharded`] asks of its shard. Append-only, like every
/// wire enum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardRequest {
    /// [`Request::Scan`] over the shard's keys only; answered with
    /// [`Response::Pairs`](super::Response::Pairs).
    Scan {
        start_key: Bytes,
        end_key: Option<Bytes>,
        limit: u32,
        consistency: Consistency,
    },
    /// [`Request::Clear`] of the shard's keys only, one entry in its log;
    /// answered with [`Response::Cleared`](super::Response::Cleared).
    Clear,
    /// Sent by the shard's leader to a node about to be added as a learner:
    /// open a new, empty replica of the shard (its directories, region and
    /// Raft) and accept its peer frames. Answered with
    /// [`Response::Members`](super::Response::Members) naming the node
    /// (its peer and client addresses); a replica already open is kept.
    OpenReplica,
    /// Sent to a node removed from the shard: close its replica and remove
    /// its files. Refused while the node is a voter of the shard in its own
    /// view; answered [`Response::Done`](super::Response::Done).
    CloseReplica,
    /// Moves the shard's replica from node `from` to node `to`, run by the
    /// shard's leader: `to` opens a replica and is added as a learner,
    /// catches up, is promoted, and `from` is removed and closes its
    /// replica. Answered with the new
    /// [`Response::Members`](super::Response::Members).
    MoveReplica { from: u64, to: u64 },
    /// [`Request::RdmaRegion`] of the shard's region: its grant, or
    /// `WrongShard` from a node that does not host it (docs/sharding.md,
    /// section 5, "One-sided reads").
    RdmaRegion,
    /// [`Request::OfiRegion`] of the shard's region, the same way.
    OfiRegion,
    /// [`Request::RdmaConnect`] towards the shard's region: a queue pair
    /// whose grant is that shard's, or `WrongShard`. A client opens one per
    /// (node, shard) it reads: a verbs session is bound to the device of
    /// its connection, and so is the grant (docs/sharding.md, section 5).
    RdmaConnect { endpoint: QpEndpoint },
}

impl ShardRequest {
    /// The kind of request it is (a shard's scan is a scan).
    pub fn op(&self) -> Op {
        match self {
            ShardRequest::Scan { .. } => Op::Scan,
            ShardRequest::Clear => Op::Clear,
            ShardRequest::OpenReplica => Op::ShardOpenReplica,
            ShardRequest::CloseReplica => Op::ShardCloseReplica,
            ShardRequest::MoveReplica { .. } => Op::ShardMoveReplica,
            ShardRequest::RdmaRegion => Op::RdmaRegion,
            ShardRequest::OfiRegion => Op::OfiRegion,
            ShardRequest::RdmaConnect { .. } => Op::RdmaConnect,
        }
    }

    /// The unsharded request this one is, served by one shard's replica:
    /// its limits, kind and route are that request's. `None`: a shard's
    /// own operation (replica placement), which has no unsharded form.
    pub fn to_request(&self) -> Option<Request> {
        let request = match self {
            ShardRequest::Scan {
                start_key,
                end_key,
                limit,
                consistency,
            } => Request::Scan {
                start_key: start_key.clone(),
                end_key: end_key.clone(),
                limit: *limit,
                consistency: *consistency,
            },
            ShardRequest::Clear => Request::Clear,
            ShardRequest::RdmaRegion => Request::RdmaRegion,
            ShardRequest::OfiRegion => Request::OfiRegion,
            ShardRequest::RdmaConnect { endpoint } => Request::RdmaConnect {
                endpoint: *endpoint,
            },
            ShardRequest::OpenReplica
            | ShardRequest::CloseReplica
            | ShardRequest::MoveReplica { .. } => return None,
        };
        Some(request)
    }
}
