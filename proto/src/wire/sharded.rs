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
    /// [`Request::RdmaRegion`] of the shard's region: its grant, or
    /// `WrongShard` from a node that does not host it (docs/sharding.md,
    /// section 5, "One-sided reads").
    RdmaRegion,
    /// [`Request::OfiRegion`] of the shard's region, the same way.
    OfiRegion,
}

impl ShardRequest {
    /// The kind of request it is (a shard's scan is a scan).
    pub fn op(&self) -> Op {
        match self {
            ShardRequest::Scan { .. } => Op::Scan,
            ShardRequest::Clear => Op::Clear,
            ShardRequest::RdmaRegion => Op::RdmaRegion,
            ShardRequest::OfiRegion => Op::OfiRegion,
        }
    }

    /// The request this one is, served by one shard's replica: its
    /// limits, kind and route are that request's.
    pub fn to_request(&self) -> Request {
        match self {
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
        }
    }
}
