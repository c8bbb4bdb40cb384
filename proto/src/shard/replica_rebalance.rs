//! The replica rebalance plan (docs/sharding.md, section 8): which shard
//! replicas to move so that every node hosts floor or ceil of
//! (replicas / nodes), a node hosting none counted (a newly added node
//! receives replicas). A pure function of each shard's members and leader;
//! `rdkvctl rebalance` carries the moves out one at a time
//! (`ShardRequest::MoveReplica`) before it evens the leaders
//! ([`super::rebalance::leader_moves`]).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::map::{NodeId, ShardId};
use super::rebalance::ShardLeadership;

/// Move `shard`'s replica from node `from` (a member) to node `to` (not a
/// member): the shard keeps its member count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaMove {
    pub shard: ShardId,
    pub from: NodeId,
    pub to: NodeId,
}

/// The fewest and the most replicas a node of a balanced cluster hosts:
/// floor and ceil of `replicas / nodes` (0 nodes: `(0, 0)`).
pub fn replica_bounds(replicas: usize, nodes: usize) -> (usize, usize) {
    match nodes {
        0 => (0, 0),
        n => (replicas / n, replicas.div_ceil(n)),
    }
}

/// How many replicas each node hosts: every node of `nodes` (hosting
/// none: 0) and any member `nodes` does not list (a valid map has none).
pub fn replicas_per_node(shards: &[ShardLeadership], nodes: &[NodeId]) -> BTreeMap<NodeId, usize> {
    let mut counts: BTreeMap<NodeId, usize> = nodes.iter().map(|&n| (n, 0)).collect();
    for member in shards.iter().flat_map(|s| &s.members) {
        *counts.entry(*member).or_default() += 1;
    }
    counts
}

/// The moves that bring every node to floor or ceil of
/// (replicas / nodes), nodes as [`replicas_per_node`] counts them.
///
/// Each move takes a replica from the most loaded node that can shed one
/// to the least loaded node not hosting that shard, and only where the
/// source hosts at least two more than the target (so every move narrows
/// the spread, no node ends up with two replicas of a shard, and the plan
/// ends). Among equally good moves it prefers a replica that is not the
/// shard's leader (no leadership hand-off), then the lowest source, target
/// and shard ids: the same input gives the same plan.
///
/// A shard of one member is never moved: the move hands the leadership to
/// another voter first, and it has none. With every shard of two members
/// or more the plan always ends balanced (the most loaded node hosts more
/// shards than the least loaded, so one of them is not on the latter).
///
/// The leader the plan assumes after moving a leading replica is the
/// shard's lowest other member, the one the server hands the leadership
/// to (`replica_move::Move::lead_elsewhere`); it only steers the later
/// moves' preference.
pub fn replica_moves(shards: &[ShardLeadership], nodes: &[NodeId]) -> Vec<ReplicaMove> {
    let mut state = shards.to_vec();
    let mut moves = Vec::new();
    while let Some(next) = next_move(&state, nodes) {
        apply(&mut state, next);
        moves.push(next);
    }
    moves
}

/// `shards` after `moves` (each a valid move of [`replica_moves`]): the
/// source replaced by the target in its place among the members, a moved
/// leader replaced by the shard's lowest other member.
pub fn after_replica_moves(
    shards: &[ShardLeadership],
    moves: &[ReplicaMove],
) -> Vec<ShardLeadership> {
    let mut state = shards.to_vec();
    for m in moves {
        apply(&mut state, *m);
    }
    state
}

fn apply(shards: &mut [ShardLeadership], m: ReplicaMove) {
    let Some(shard) = shards.iter_mut().find(|s| s.shard == m.shard) else {
        return;
    };
    for member in &mut shard.members {
        if *member == m.from {
            *member = m.to;
        }
    }
    if shard.leader == Some(m.from) {
        shard.leader = shard.members.iter().copied().filter(|&n| n != m.to).min();
    }
}

/// The best move out of the current counts, or `None` when no node can
/// shed a replica to one hosting two fewer.
fn next_move(shards: &[ShardLeadership], nodes: &[NodeId]) -> Option<ReplicaMove> {
    let counts = replicas_per_node(shards, nodes);
    // Least loaded first, then by id: a shard's best target is the first
    // node here that is not one of its members.
    let mut by_load: Vec<(usize, NodeId)> = counts.iter().map(|(&n, &c)| (c, n)).collect();
    by_load.sort_unstable();
    let mut best: Option<(Candidate, ReplicaMove)> = None;
    for shard in shards.iter().filter(|s| s.members.len() > 1) {
        let Some(&(to_count, to)) = by_load.iter().find(|(_, n)| !shard.members.contains(n)) else {
            continue;
        };
        for &from in &shard.members {
            let from_count = counts[&from];
            if from_count < to_count + 2 {
                continue;
            }
            let rank = (
                Reverse(from_count),
                to_count,
                shard.leader == Some(from),
                from,
                to,
                shard.shard,
            );
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                let m = ReplicaMove {
                    shard: shard.shard,
                    from,
                    to,
                };
                best = Some((rank, m));
            }
        }
    }
    best.map(|(_, m)| m)
}

/// How [`next_move`] ranks a move, lowest first: the most loaded source,
/// the least loaded target, not the leader, then the ids.
type Candidate = (Reverse<usize>, usize, bool, NodeId, NodeId, ShardId);

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn shard(id: u32, members: &[NodeId], leader: Option<NodeId>) -> ShardLeadership {
        ShardLeadership {
            shard: ShardId(id),
            members: members.to_vec(),
            leader,
        }
    }

    /// Shards numbered from 0 with `(members, leader)`.
    fn shards(given: &[(&[NodeId], NodeId)]) -> Vec<ShardLeadership> {
        given
            .iter()
            .enumerate()
            .map(|(i, (members, leader))| shard(i as u32, members, Some(*leader)))
            .collect()
    }

    fn moves(given: &[(u32, NodeId, NodeId)]) -> Vec<ReplicaMove> {
        given
            .iter()
            .map(|&(s, from, to)| ReplicaMove {
                shard: ShardId(s),
                from,
                to,
            })
            .collect()
    }

    /// Replays `plan` on `shards`, checking every step: the source a
    /// member, the target a node and no member, the shard more than one
    /// member, and after the step the same member count with no node twice.
    fn replay(
        shards: &[ShardLeadership],
        nodes: &[NodeId],
        plan: &[ReplicaMove],
    ) -> Result<Vec<ShardLeadership>, String> {
        let mut state = shards.to_vec();
        for (i, m) in plan.iter().enumerate() {
            let at = state
                .iter()
                .position(|s| s.shard == m.shard)
                .ok_or(format!("move {i} {m:?}: no such shard"))?;
            let before = state[at].members.clone();
            if !before.contains(&m.from) || before.contains(&m.to) || before.len() < 2 {
                return Err(format!("move {i} {m:?} of a shard with members {before:?}"));
            }
            if !nodes.contains(&m.to) {
                return Err(format!("move {i} {m:?} to a node not listed"));
            }
            apply(&mut state, *m);
            let after = &state[at].members;
            let distinct: BTreeSet<_> = after.iter().collect();
            if after.len() != before.len() || distinct.len() != after.len() {
                return Err(format!("move {i} {m:?}: {before:?} -> {after:?}"));
            }
            if state[at].leader.is_some_and(|l| !after.contains(&l)) {
                return Err(format!("move {i} {m:?}: leader outside {after:?}"));
            }
        }
        Ok(state)
    }

    #[test]
    fn the_bounds_are_floor_and_ceiling_of_replicas_per_node() {
        assert_eq!(replica_bounds(6, 3), (2, 2));
        assert_eq!(replica_bounds(7, 3), (2, 3));
        assert_eq!(replica_bounds(18, 4), (4, 5));
        assert_eq!(replica_bounds(2, 3), (0, 1));
        assert_eq!(replica_bounds(4, 0), (0, 0));
    }

    #[test]
    fn plans_as_the_table_says() {
        let all: &[NodeId] = &[1, 2, 3];
        // (shards as (members, leader), nodes, expected moves as (shard, from, to))
        type Case<'a> = (
            Vec<(&'a [NodeId], NodeId)>,
            Vec<NodeId>,
            Vec<(u32, NodeId, NodeId)>,
        );
        let cases: Vec<Case> = vec![
            // The initial placement of 3 shards x 2 replicas: balanced.
            (
                vec![(&[1, 2], 1), (&[2, 3], 2), (&[3, 1], 3)],
                all.to_vec(),
                vec![],
            ),
            // Shard 0 moved 1 -> 3: node 3 hosts 3, node 1 one. Shard 1 is
            // led by 2, so its replica on 3 goes (shard 0's 3 leads).
            (
                vec![(&[3, 2], 3), (&[2, 3], 2), (&[3, 1], 1)],
                all.to_vec(),
                vec![(1, 3, 1)],
            ),
            // As above with node 3 leading every shard it hosts: one of
            // its leaders must go, the lowest shard's.
            (
                vec![(&[3, 2], 3), (&[2, 3], 3), (&[3, 1], 3)],
                all.to_vec(),
                vec![(0, 3, 1)],
            ),
            // A new node 4 beside 6 shards on every one of 3 nodes: 18
            // replicas, 4 or 5 per node: node 4 receives four, none of
            // them a leading replica, the most loaded sources in id order.
            (
                (0..6).map(|i| (all, 1 + i % 3)).collect(),
                vec![1, 2, 3, 4],
                vec![(1, 1, 4), (0, 2, 4), (3, 3, 4), (2, 1, 4)],
            ),
            // Shards of one member never move.
            (vec![(&[1], 1), (&[1], 1), (&[1], 1)], all.to_vec(), vec![]),
        ];
        for (i, (given, nodes, expected)) in cases.into_iter().enumerate() {
            let shards = shards(&given);
            let plan = replica_moves(&shards, &nodes);
            assert_eq!(plan, moves(&expected), "case {i}");
            replay(&shards, &nodes, &plan).unwrap_or_else(|e| panic!("case {i}: {e}"));
        }
    }

    #[test]
    fn a_new_node_receives_its_share() {
        let all: &[NodeId] = &[1, 2, 3];
        let given: Vec<(&[NodeId], NodeId)> = (0..6).map(|i| (all, 1 + i % 3)).collect();
        let shards = shards(&given);
        let nodes = [1, 2, 3, 4];
        let plan = replica_moves(&shards, &nodes);
        let after = replay(&shards, &nodes, &plan).unwrap();
        let counts = replicas_per_node(&after, &nodes);
        assert!(counts.values().all(|&c| (4..=5).contains(&c)), "{counts:?}");
        assert!(counts[&4] >= 4, "{counts:?}");
        assert_eq!(after, after_replica_moves(&shards, &plan));
    }

    /// `extra` nodes hosting nothing beside 1 to 5 nodes hosting shards
    /// (1 to 12 of them, each of `min_members` or more members among the
    /// hosting nodes, a leader among them or none).
    fn any_cluster(
        min_members: usize,
    ) -> impl Strategy<Value = (Vec<ShardLeadership>, Vec<NodeId>)> {
        (min_members.max(1)..=5usize, 0..=2usize, 1..=12usize)
            .prop_flat_map(move |(hosting, extra, count)| {
                let pool: Vec<NodeId> = (1..=hosting as u64).collect();
                let one = (
                    proptest::sample::subsequence(pool, min_members.max(1)..=hosting),
                    any::<prop::sample::Index>(),
                    any::<bool>(),
                    any::<bool>(),
                )
                    .prop_map(|(mut members, pick, known, reversed)| {
                        if reversed {
                            members.reverse();
                        }
                        let leader = known.then(|| members[pick.index(members.len())]);
                        (members, leader)
                    });
                let nodes: Vec<NodeId> = (1..=(hosting + extra) as u64).collect();
                (proptest::collection::vec(one, count), Just(nodes))
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
        fn with_two_members_or_more_the_plan_ends_balanced_through_valid_steps(
            (shards, nodes) in any_cluster(2)
        ) {
            let plan = replica_moves(&shards, &nodes);
            let after = replay(&shards, &nodes, &plan).map_err(TestCaseError::fail)?;
            let total: usize = shards.iter().map(|s| s.members.len()).sum();
            let (floor, ceil) = replica_bounds(total, nodes.len());
            let counts = replicas_per_node(&after, &nodes);
            prop_assert!(
                counts.values().all(|&c| (floor..=ceil).contains(&c)),
                "{counts:?} not within {floor}..={ceil} after {plan:?}"
            );
            prop_assert_eq!(&replica_moves(&shards, &nodes), &plan, "not deterministic");
            prop_assert!(replica_moves(&after, &nodes).is_empty(), "a second plan moves");
            // A balanced cluster moves nothing.
            let before = replicas_per_node(&shards, &nodes);
            if before.values().all(|&c| (floor..=ceil).contains(&c)) {
                prop_assert!(plan.is_empty(), "{plan:?}");
            }
        }

        #[test]
        fn any_plan_takes_valid_steps_never_raises_the_peak_and_is_final(
            (shards, nodes) in any_cluster(1)
        ) {
            let plan = replica_moves(&shards, &nodes);
            let after = replay(&shards, &nodes, &plan).map_err(TestCaseError::fail)?;
            let peak = |s: &[ShardLeadership]| {
                replicas_per_node(s, &nodes).into_values().max().unwrap_or(0)
            };
            prop_assert!(peak(&after) <= peak(&shards));
            prop_assert!(replica_moves(&after, &nodes).is_empty(), "a second plan moves");
            prop_assert_eq!(after, after_replica_moves(&shards, &plan));
        }
    }
}
