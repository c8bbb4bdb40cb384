//! Scans larger than one reply: pages of at most `DEFAULT_MAX_BATCH_KEYS`
//! pairs, each continuing after the last key of the one before; in a
//! sharded cluster, every shard's pages merged in key order
//! (docs/sharding.md, section 6).

use bytes::Bytes;
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{Consistency, DEFAULT_MAX_BATCH_KEYS, Op, Request, ShardRequest, Versioned};

use crate::error::{Error, Result};
use crate::merge::merge;
use crate::outcome::{ScanPage, answer};
use crate::routing::Router;

/// What [`range`] scans: `start_key` (inclusive) to `end_key` (exclusive;
/// `None`: no end), at most `limit` pairs.
pub(crate) struct ScanRange {
    pub(crate) start_key: Bytes,
    pub(crate) end_key: Option<Bytes>,
    pub(crate) limit: usize,
    pub(crate) consistency: Consistency,
}

/// The pairs of `range` in key order, page by page (each page one consistent
/// view of one shard, the pages not with each other). Under a map of
/// several shards every shard is scanned and the pages merged; else the
/// one group is.
pub(crate) async fn range(router: &Router, range: ScanRange) -> Result<Vec<(Bytes, Versioned)>> {
    router.learn_map().await;
    let map = router.shard_map().filter(|map| map.shards().len() > 1);
    let sources: Vec<Option<ShardId>> = match &map {
        Some(map) => map.shards().iter().map(|shard| Some(shard.id)).collect(),
        None => vec![None],
    };
    let fetch = |source: Option<ShardId>, start_key: Bytes, page_limit: usize| {
        let request = page_request(source, start_key, &range, page_limit);
        let map = map.as_deref();
        async move {
            let page = answer(Op::Scan, router.send(request).await?)?;
            match (map, source) {
                (Some(map), Some(shard)) => of_shard(page, map, shard),
                _ => Ok(page),
            }
        }
    };
    merge(sources, range.start_key.clone(), range.limit, fetch).await
}

/// The request for one page of `source` (a shard, or `None`: the one
/// group) from `start_key` on.
fn page_request(
    source: Option<ShardId>,
    start_key: Bytes,
    range: &ScanRange,
    page_limit: usize,
) -> Request {
    let limit = u32::try_from(page_limit).unwrap_or(DEFAULT_MAX_BATCH_KEYS);
    let (end_key, consistency) = (range.end_key.clone(), range.consistency);
    match source {
        None => Request::Scan {
            start_key,
            end_key,
            limit,
            consistency,
        },
        Some(shard) => Request::Sharded {
            shard,
            request: ShardRequest::Scan {
                start_key,
                end_key,
                limit,
                consistency,
            },
        },
    }
}

/// `page` if every key in it is `shard`'s in the client's map: another
/// shard's key would come again from its own shard.
fn of_shard(page: ScanPage, map: &ShardMap, shard: ShardId) -> Result<ScanPage> {
    match page
        .pairs
        .iter()
        .find(|(key, _)| map.shard_of_key(key) != shard)
    {
        None => Ok(page),
        Some((key, _)) => Err(Error::UnexpectedResponse {
            request: Op::Scan.name(),
            response: format!("shard {} answered key {key:?} of another shard", shard.0),
        }),
    }
}
