//! The leader rebalance plan (docs/sharding.md, section 8): which shard
//! leaderships to move so that no node leads more than ceil(shards / nodes)
//! when the shards' members allow it. A pure function of who is a member
//! and who leads; `rdkvctl rebalance` carries the moves out one at a time.

use std::collections::BTreeMap;

use super::map::{NodeId, ShardId};

/// One shard as the plan sees it: its members and its current leader
/// (`None`: none known, it is left alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLeadership {
    pub shard: ShardId,
    pub members: Vec<NodeId>,
    pub leader: Option<NodeId>,
}

/// Move `shard`'s leadership from `from` to `to` (a member of the shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderMove {
    pub shard: ShardId,
    pub from: NodeId,
    pub to: NodeId,
}

/// The most shards a node should lead: ceil(shards / nodes) (0 nodes: 0).
pub fn leader_bound(shards: usize, nodes: usize) -> usize {
    shards
        .checked_div(nodes)
        .map_or(0, |_| shards.div_ceil(nodes))
}

/// The moves that bring every node of `nodes` to at most
/// [`leader_bound`] led shards, each move to the least-loaded member of the
/// shard that leads fewer than the node it leaves minus one (so every move
/// narrows the spread and the plan ends). Nothing moves when no node is
/// over the bound; a node stays over it only when none of its shards has a
/// member with room.
pub fn leader_moves(shards: &[ShardLeadership], nodes: &[NodeId]) -> Vec<LeaderMove> {
    let bound = leader_bound(shards.len(), nodes.len());
    let mut leaders: BTreeMap<ShardId, NodeId> = shards
        .iter()
        .filter_map(|s| s.leader.map(|leader| (s.shard, leader)))
        .collect();
    let mut moves = Vec::new();
    while let Some(next) = next_move(shards, nodes, &leaders, bound) {
        leaders.insert(next.shard, next.to);
        moves.push(next);
    }
    moves
}

/// How many shards each of `nodes` leads (nodes leading none: 0).
fn led_counts(nodes: &[NodeId], leaders: &BTreeMap<ShardId, NodeId>) -> BTreeMap<NodeId, usize> {
    let mut counts: BTreeMap<NodeId, usize> = nodes.iter().map(|&n| (n, 0)).collect();
    for leader in leaders.values() {
        *counts.entry(*leader).or_default() += 1;
    }
    counts
}

/// The first move out of the most loaded node over `bound` that can shed a
/// shard, or `None`.
fn next_move(
    shards: &[ShardLeadership],
    nodes: &[NodeId],
    leaders: &BTreeMap<ShardId, NodeId>,
    bound: usize,
) -> Option<LeaderMove> {
    let counts = led_counts(nodes, leaders);
    let mut over: Vec<(NodeId, usize)> = counts
        .iter()
        .filter(|(_, count)| **count > bound)
        .map(|(node, count)| (*node, *count))
        .collect();
    over.sort_by_key(|&(node, count)| (std::cmp::Reverse(count), node));
    over.into_iter().find_map(|(from, from_count)| {
        shards
            .iter()
            .filter(|s| leaders.get(&s.shard) == Some(&from))
            .find_map(|s| {
                let to = s
                    .members
                    .iter()
                    .filter(|&&m| m != from)
                    .map(|&m| (counts.get(&m).copied().unwrap_or(0), m))
                    .filter(|&(count, _)| count + 1 < from_count)
                    .min()?
                    .1;
                Some(LeaderMove {
                    shard: s.shard,
                    from,
                    to,
                })
            })
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn shard(id: u32, members: &[NodeId], leader: NodeId) -> ShardLeadership {
        ShardLeadership {
            shard: ShardId(id),
            members: members.to_vec(),
            leader: Some(leader),
        }
    }

    /// Each node's led count after `moves`.
    fn after(shards: &[ShardLeadership], nodes: &[NodeId], moves: &[LeaderMove]) -> Vec<usize> {
        let mut leaders: BTreeMap<ShardId, NodeId> = shards
            .iter()
            .filter_map(|s| s.leader.map(|l| (s.shard, l)))
            .collect();
        for m in moves {
            assert_eq!(
                leaders.get(&m.shard),
                Some(&m.from),
                "{m:?} from a non-leader"
            );
            leaders.insert(m.shard, m.to);
        }
        led_counts(nodes, &leaders).into_values().collect()
    }

    #[test]
    fn the_bound_is_the_ceiling_of_shards_per_node() {
        assert_eq!(leader_bound(6, 3), 2);
        assert_eq!(leader_bound(7, 3), 3);
        assert_eq!(leader_bound(1, 3), 1);
        assert_eq!(leader_bound(4, 0), 0);
    }

    #[test]
    fn plans_as_the_table_says() {
        let all = [1, 2, 3];
        // (shards as (members, leader), expected moves as (shard, from, to))
        type Case = (Vec<(Vec<NodeId>, NodeId)>, Vec<(u32, NodeId, NodeId)>);
        let cases: Vec<Case> = vec![
            // Already spread: nothing moves.
            ((0..6).map(|i| (all.to_vec(), 1 + i % 3)).collect(), vec![]),
            // Every leader on node 1: four move, two to each other node.
            (
                (0..6).map(|_| (all.to_vec(), 1)).collect(),
                vec![(0, 1, 2), (1, 1, 3), (2, 1, 2), (3, 1, 3)],
            ),
            // Shard 1 can only be led by 1 or 2.
            (
                vec![(all.to_vec(), 1), (vec![1, 2], 1), (all.to_vec(), 3)],
                vec![(0, 1, 2)],
            ),
            // A shard of one member cannot move.
            (vec![(vec![1], 1), (vec![1], 1)], vec![]),
        ];
        for (i, (given, expected)) in cases.into_iter().enumerate() {
            let shards: Vec<ShardLeadership> = given
                .iter()
                .enumerate()
                .map(|(id, (members, leader))| shard(id as u32, members, *leader))
                .collect();
            let expected: Vec<LeaderMove> = expected
                .into_iter()
                .map(|(s, from, to)| LeaderMove {
                    shard: ShardId(s),
                    from,
                    to,
                })
                .collect();
            assert_eq!(leader_moves(&shards, &all), expected, "case {i}");
        }
    }

    /// Shards (members: a non-empty subset of `nodes` or every node, a
    /// leader among them) over 1 to 6 nodes.
    fn any_cluster(full: bool) -> impl Strategy<Value = (Vec<ShardLeadership>, Vec<NodeId>)> {
        (1usize..=6, 1usize..=24)
            .prop_flat_map(move |(n, s)| {
                let nodes: Vec<NodeId> = (1..=n as u64).collect();
                let shard = (
                    proptest::sample::subsequence(nodes.clone(), 1..=n),
                    any::<prop::sample::Index>(),
                )
                    .prop_map(move |(subset, pick)| {
                        let members = if full {
                            (1..=n as u64).collect()
                        } else {
                            subset
                        };
                        let leader = members[pick.index(members.len())];
                        (members, leader)
                    });
                (proptest::collection::vec(shard, s), Just(nodes))
            })
            .prop_map(|(given, nodes)| {
                let shards = given
                    .into_iter()
                    .enumerate()
                    .map(|(i, (members, leader))| shard(i as u32, &members, leader))
                    .collect();
                (shards, nodes)
            })
    }

    proptest! {
        #[test]
        fn with_every_node_a_member_the_plan_meets_the_bound((shards, nodes) in any_cluster(true)) {
            let moves = leader_moves(&shards, &nodes);
            let bound = leader_bound(shards.len(), nodes.len());
            let counts = after(&shards, &nodes, &moves);
            prop_assert!(counts.iter().all(|&c| c <= bound), "{counts:?} over {bound}");
        }

        #[test]
        fn a_balanced_cluster_moves_nothing_and_a_plan_never_raises_the_peak(
            (shards, nodes) in any_cluster(false)
        ) {
            let moves = leader_moves(&shards, &nodes);
            let bound = leader_bound(shards.len(), nodes.len());
            let before = after(&shards, &nodes, &[]);
            let peak = before.iter().copied().max().unwrap_or(0);
            if peak <= bound {
                prop_assert!(moves.is_empty(), "{moves:?}");
            }
            let counts = after(&shards, &nodes, &moves);
            prop_assert!(counts.iter().copied().max().unwrap_or(0) <= peak);
            for m in &moves {
                let s = &shards[m.shard.0 as usize];
                prop_assert!(s.members.contains(&m.to), "{m:?} to a non-member");
            }
            // Idempotent: the planned state needs no further move.
            let mut moved = shards.clone();
            for m in &moves {
                moved[m.shard.0 as usize].leader = Some(m.to);
            }
            prop_assert!(leader_moves(&moved, &nodes).is_empty());
        }
    }
}
