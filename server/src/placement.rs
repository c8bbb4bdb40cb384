//! Where shards start (docs/sharding.md, section 8): the initial map of a
//! cluster bootstrapped with `--shards N --replicas R`, a pure function of
//! its members, so that every node computes the same one.

use rdkv_proto::shard::{
    MAX_SHARDS, NodeInfo, SLOT_COUNT, ShardId, ShardInfo, ShardMap, ShardMapError, Slot, SlotRange,
};

/// Why no initial map could be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("no nodes to place shards on")]
    NoNodes,
    #[error("--shards must be between 1 and {max} (and at most one per slot), not {shards}")]
    Shards { shards: u32, max: usize },
    #[error("--replicas must be between 1 and the node count ({nodes}), not {replicas}")]
    Replicas { replicas: usize, nodes: usize },
    #[error("the placed map is invalid: {0}")]
    Map(#[from] ShardMapError),
}

/// The slot ranges of `shards` shards, split as `redis-cli --cluster create`
/// splits them between masters: shard i ends at slot
/// round((i + 1) * 16384 / shards - 1), the last at 16383.
pub fn even_ranges(shards: u32) -> Vec<SlotRange> {
    let n = u64::from(shards.max(1));
    let count = u64::from(SLOT_COUNT);
    let mut ranges = Vec::new();
    let mut first = 0u64;
    for i in 0..n {
        // round(x / n), x = (i + 1) * count - n, in integers (x >= 0).
        let x = (i + 1) * count - n;
        let last = if i + 1 == n {
            count - 1
        } else {
            ((2 * x + n) / (2 * n)).max(first)
        };
        ranges.push(SlotRange {
            first: slot(first),
            last: slot(last),
            shard: ShardId(i as u32),
        });
        first = last + 1;
    }
    ranges
}

/// `n` (below `SLOT_COUNT` by construction of the callers) as a slot.
fn slot(n: u64) -> Slot {
    u16::try_from(n)
        .ok()
        .and_then(Slot::new)
        .unwrap_or(rdkv_proto::shard::LAST_SLOT)
}

/// The initial map, version 1: slots split by [`even_ranges`]; shard i
/// on the `replicas` nodes i, i+1, ... (mod the node count, in id order),
/// its first node the preferred leader, so that leaders start spread.
pub fn initial(
    mut nodes: Vec<NodeInfo>,
    shards: u32,
    replicas: usize,
) -> Result<ShardMap, PlacementError> {
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    let max = MAX_SHARDS.min(usize::from(SLOT_COUNT));
    if shards == 0 || shards as usize > max {
        return Err(PlacementError::Shards { shards, max });
    }
    if replicas == 0 || replicas > nodes.len() {
        return Err(PlacementError::Replicas {
            replicas,
            nodes: nodes.len(),
        });
    }
    nodes.sort_by_key(|n| n.id);
    let infos = (0..shards)
        .map(|i| {
            let members: Vec<u64> = (0..replicas)
                .map(|j| nodes[(i as usize + j) % nodes.len()].id)
                .collect();
            ShardInfo {
                id: ShardId(i),
                leader: members.first().copied(),
                members,
            }
        })
        .collect();
    Ok(ShardMap::new(1, nodes, infos, even_ranges(shards))?)
}

#[cfg(test)]
mod tests {
    use rdkv_proto::shard::key_slot;

    use super::*;

    fn nodes(ids: &[u64]) -> Vec<NodeInfo> {
        ids.iter()
            .map(|&id| NodeInfo {
                id,
                client_addr: Some(format!("127.0.0.{id}:7000")),
                resp_addr: None,
            })
            .collect()
    }

    fn bounds(ranges: &[SlotRange]) -> Vec<(u16, u16)> {
        ranges
            .iter()
            .map(|r| (r.first.get(), r.last.get()))
            .collect()
    }

    #[test]
    fn slots_split_as_redis_cli_splits_them() {
        // `redis-cli --cluster create` with 3 masters prints these ranges.
        assert_eq!(
            bounds(&even_ranges(3)),
            [(0, 5460), (5461, 10922), (10923, 16383)]
        );
        assert_eq!(bounds(&even_ranges(1)), [(0, 16383)]);
        assert_eq!(bounds(&even_ranges(2)), [(0, 8191), (8192, 16383)]);
    }

    #[test]
    fn every_split_covers_every_slot_once_and_evenly() {
        for shards in [1, 2, 3, 5, 6, 7, 64, 1000, 4096] {
            let ranges = even_ranges(shards);
            assert_eq!(ranges.len(), shards as usize);
            let mut next = 0u32;
            for r in &ranges {
                assert_eq!(u32::from(r.first.get()), next, "{shards} shards");
                let len = u32::from(r.last.get()) - u32::from(r.first.get()) + 1;
                let even = u32::from(SLOT_COUNT) / shards;
                assert!(len == even || len == even + 1, "{shards}: {len}");
                next = u32::from(r.last.get()) + 1;
            }
            assert_eq!(next, u32::from(SLOT_COUNT));
        }
    }

    #[test]
    fn replicas_and_leaders_are_spread_over_the_nodes() {
        let map = initial(nodes(&[3, 1, 2]), 6, 2).unwrap();
        assert_eq!(map.version(), 1);
        let placed: Vec<(Vec<u64>, Option<u64>)> = map
            .shards()
            .iter()
            .map(|s| (s.members.clone(), s.leader))
            .collect();
        assert_eq!(
            placed,
            [
                (vec![1, 2], Some(1)),
                (vec![2, 3], Some(2)),
                (vec![3, 1], Some(3)),
                (vec![1, 2], Some(1)),
                (vec![2, 3], Some(2)),
                (vec![3, 1], Some(3)),
            ]
        );
        // foo is slot 12182: the fifth of six ranges.
        assert_eq!(map.shard_of_slot(key_slot(b"foo")), ShardId(4));
    }

    #[test]
    fn one_shard_on_every_node_is_the_single_group_map() {
        let map = initial(nodes(&[1, 2, 3]), 1, 3).unwrap();
        let single = ShardMap::single_group(nodes(&[1, 2, 3]), Some(1)).unwrap();
        assert_eq!(map, single);
    }

    #[test]
    fn impossible_placements_are_refused() {
        assert_eq!(initial(vec![], 1, 1), Err(PlacementError::NoNodes));
        assert!(matches!(
            initial(nodes(&[1]), 0, 1),
            Err(PlacementError::Shards { shards: 0, .. })
        ));
        assert!(matches!(
            initial(nodes(&[1]), 4097, 1),
            Err(PlacementError::Shards { shards: 4097, .. })
        ));
        assert_eq!(
            initial(nodes(&[1, 2]), 2, 3),
            Err(PlacementError::Replicas {
                replicas: 3,
                nodes: 2
            })
        );
        assert!(matches!(
            initial(nodes(&[1, 2]), 2, 0),
            Err(PlacementError::Replicas { replicas: 0, .. })
        ));
    }
}
