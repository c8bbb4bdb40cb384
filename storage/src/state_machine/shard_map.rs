//! The metadata group's applied state (docs/sharding.md, section 2): the
//! shard map, kept as one record of the group's own small region, and the
//! compare-and-set on its version that `Command::PublishShardMap` applies.
//!
//! A record in the region rather than a state of its own: the metadata
//! group then runs on the same log, snapshots, restarts and peer network as
//! every data shard, and its map survives them as any pair does.

use rdkv_proto::shard::ShardMap;
use rdkv_proto::wire::{ErrorCode, ErrorReply, Response};
use thiserror::Error;

use super::keyed::KeyedRegion;
use crate::region::RegionError;

/// The key of the map's record in the metadata group's region. No client
/// request reaches that region (no slot routes to the metadata group), so
/// the key cannot collide with a client's.
pub const SHARD_MAP_KEY: &[u8] = b"\0rdkv/meta/shard-map";

/// Why the applied map could not be read.
#[derive(Debug, Error)]
pub enum AppliedMapError {
    #[error("reading the shard map record: {0}")]
    Region(#[from] RegionError),
    /// Only apply writes the record, from a valid map: a record that does
    /// not decode is a damaged region.
    #[error("the shard map record does not decode: {0}")]
    Decode(#[from] postcard::Error),
}

/// The map recorded in `region`, if any.
pub(super) fn recorded(region: &KeyedRegion) -> Result<Option<ShardMap>, AppliedMapError> {
    match region.live_get(SHARD_MAP_KEY)? {
        Some((versioned, _)) => Ok(Some(decode(&versioned.value)?)),
        None => Ok(None),
    }
}

/// A record's bytes as a map (the decoder validates it).
pub(super) fn decode(bytes: &[u8]) -> Result<ShardMap, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// What applying `map` decides: the record to write, or the refusal of a
/// map that is not exactly one version above `applied` (a proposal built
/// from a map older than the applied one, or a repeated one).
pub(super) fn next_record(applied: Option<&ShardMap>, map: &ShardMap) -> Result<Vec<u8>, Response> {
    let applied_version = applied.map_or(0, ShardMap::version);
    if Some(map.version()) != applied_version.checked_add(1) {
        return Err(Response::Error(stale(applied_version, map.version())));
    }
    postcard::to_allocvec(map).map_err(|e| {
        Response::Error(ErrorReply::new(
            ErrorCode::Internal,
            format!("encoding shard map version {}: {e}", map.version()),
        ))
    })
}

/// The refusal of a map version that does not follow the applied one.
pub fn stale(applied_version: u64, proposed: u64) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        format!(
            "{STALE_MAP_PREFIX} version {proposed} proposed, the applied map is version \
             {applied_version}: a new map must be exactly one above it"
        ),
    )
}

/// How a stale map's refusal starts, so that a proposer can tell it from
/// other refusals and build again from the newer map.
pub const STALE_MAP_PREFIX: &str = "stale shard map:";
