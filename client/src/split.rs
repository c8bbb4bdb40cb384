//! Multi-key calls over several shards (docs/sharding.md, section 6): the
//! keys are grouped by the shard the client's map gives them, each group
//! goes to its shard as one request, all at once, and the answers are put
//! back in the caller's order. Each part is what one shard gives: one
//! consistent read, one atomic write; the whole is neither. `clear` goes
//! to every shard alike.

use bytes::Bytes;
use futures::future::join_all;
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{Consistency, Request, ShardRequest, Versioned};

use crate::client::Client;
use crate::error::{Error, PartialMPut, Result};
use crate::outcome::{Cleared, MWritten};

/// The positions of `items` grouped by the shard of each one's key, shards
/// in order of first appearance, positions in the caller's order.
pub(crate) fn by_shard<T>(
    map: &ShardMap,
    items: &[T],
    key: impl Fn(&T) -> &[u8],
) -> Vec<(ShardId, Vec<usize>)> {
    map.positions_by_shard(items.iter().map(key))
}

/// `keys` read shard by shard, answers in the order of `keys`.
pub(crate) async fn mget(
    client: &Client,
    map: &ShardMap,
    keys: Vec<Bytes>,
    consistency: Consistency,
) -> Result<Vec<Option<Versioned>>> {
    let groups = by_shard(map, &keys, |key| key);
    let parts = groups.iter().map(|(_, positions)| {
        let keys = positions.iter().map(|&at| keys[at].clone()).collect();
        client.call::<Vec<Option<Versioned>>>(Request::MGet { keys, consistency })
    });
    let answers = join_all(parts).await;
    let mut out = vec![None; keys.len()];
    for ((_, positions), answer) in groups.iter().zip(answers) {
        // `call` checked that a shard's answer has one entry per key asked.
        for (&at, value) in positions.iter().zip(answer?) {
            out[at] = value;
        }
    }
    Ok(out)
}

/// `pairs` written shard by shard, each shard's part one atomic write.
/// Returns the highest of the parts' versions; if a part fails, the call
/// fails with [`Error::PartialMPut`] naming what was and was not written
/// (or, if no part was written, with the first part's error).
pub(crate) async fn mput(
    client: &Client,
    map: &ShardMap,
    pairs: Vec<(Bytes, Bytes)>,
) -> Result<u64> {
    let groups = by_shard(map, &pairs, |(key, _)| key);
    let parts = groups.iter().map(|(_, positions)| {
        let pairs = positions.iter().map(|&at| pairs[at].clone()).collect();
        client.call::<MWritten>(Request::MPut { pairs })
    });
    let answers = join_all(parts).await;
    let keys_of = |positions: &[usize]| positions.iter().map(|&at| pairs[at].0.clone()).collect();
    let mut written = Vec::new();
    let mut failed = Vec::new();
    for ((_, positions), answer) in groups.iter().zip(answers) {
        match answer {
            Ok(MWritten(version)) => written.push((keys_of(positions), version)),
            Err(error) => failed.push((keys_of(positions), error)),
        }
    }
    match (written.iter().map(|(_, v)| *v).max(), failed.is_empty()) {
        (Some(highest), true) => Ok(highest),
        // Nothing written: the first error says why, as for one shard. An
        // unknown outcome stays one (and names its node).
        (None, _) => Err(failed.swap_remove(0).1),
        (Some(_), false) => Err(Error::PartialMPut(Box::new(PartialMPut {
            written,
            failed,
        }))),
    }
}

/// Every shard of `map` cleared through its leader, all at once, each
/// shard one entry in its own log (not atomic across shards,
/// docs/sharding.md, section 6). Returns the keys removed in all and the
/// highest of the shards' versions; if a shard fails, the call fails with
/// its error (the others may have been cleared).
pub(crate) async fn clear(client: &Client, map: &ShardMap) -> Result<(u64, u64)> {
    let parts = map.shards().iter().map(|shard| {
        client.call::<Cleared>(Request::Sharded {
            shard: shard.id,
            request: ShardRequest::Clear,
        })
    });
    let mut removed_in_all = 0u64;
    let mut highest = 0u64;
    for answer in join_all(parts).await {
        let Cleared { removed, version } = answer?;
        removed_in_all = removed_in_all.saturating_add(removed);
        highest = highest.max(version);
    }
    Ok((removed_in_all, highest))
}

#[cfg(test)]
mod tests {
    use rdkv_proto::shard::{NodeInfo, SLOT_COUNT, ShardInfo, Slot, SlotRange, key_slot};

    use super::*;

    /// Two shards split at slot 8192.
    fn two_shards() -> ShardMap {
        let shard = |id| ShardInfo {
            id: ShardId(id),
            members: vec![1],
            leader: Some(1),
        };
        let range = |first, last, shard| SlotRange {
            first: Slot::new(first).unwrap(),
            last: Slot::new(last).unwrap(),
            shard: ShardId(shard),
        };
        let node = NodeInfo {
            id: 1,
            client_addr: None,
            resp_addr: None,
        };
        ShardMap::new(
            2,
            vec![node],
            vec![shard(0), shard(1)],
            vec![range(0, 8191, 0), range(8192, SLOT_COUNT - 1, 1)],
        )
        .unwrap()
    }

    #[test]
    fn keys_are_grouped_by_shard_in_the_callers_order() {
        // foo is slot 12182 (shard 1), bar 5061 (shard 0).
        assert_eq!(key_slot(b"foo").get(), 12182);
        let keys: Vec<&[u8]> = vec![b"foo", b"bar", b"{foo}x", b"{bar}y", b"foo"];
        let groups = by_shard(&two_shards(), &keys, |k| k);
        assert_eq!(
            groups,
            [(ShardId(1), vec![0, 2, 4]), (ShardId(0), vec![1, 3])]
        );
    }
}
