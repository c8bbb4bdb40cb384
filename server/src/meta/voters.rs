//! Which voters the metadata group should have (docs/sharding.md, section
//! 2, "Voters"): a pure function of what its leader sees, so that every
//! rule is a table test; `tasks::keep_voters` carries the answer out.
//!
//! The group keeps [`target`] voters: as many as the live nodes of the map
//! allow, odd (an even count tolerates no more failures than one fewer),
//! at most [`MAX_VOTERS`]. A learner is promoted only when it is a node of
//! the map, alive and caught up; a voter silent for [`DEAD_AFTER`] is
//! replaced by such a learner. Nothing changes without a quorum of live
//! voters (the change could not commit) or while a change is under way,
//! and the leader never demotes itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkv_proto::shard::NodeId;

/// The most voters the group has: five tolerate two failures, and every
/// voter more slows each map commit for no use (etcd's and PD's advice).
pub const MAX_VOTERS: usize = 5;
/// How long a voter may leave the leader without an acknowledgement
/// before it counts as dead and is replaced: well above an election
/// timeout and a restart, so a node being restarted keeps its vote.
pub const DEAD_AFTER: Duration = Duration::from_secs(10);
/// How far behind the leader's commit index a learner may be and still
/// count as caught up: the group's log moves by a few entries per map
/// version, so this is "no snapshot or long catch-up pending".
pub const CAUGHT_UP_LAG_ENTRIES: u64 = 16;

/// What the leader of the group sees, all a decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    /// This node, the leader.
    pub leader: NodeId,
    pub voters: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    /// The nodes of the map this node serves.
    pub map_nodes: BTreeSet<NodeId>,
    /// Per member: how long since it last acknowledged this leader (or,
    /// never having done so, since this node became leader).
    pub silent_for: BTreeMap<NodeId, Duration>,
    /// Per member: the last log index it is known to hold.
    pub matched: BTreeMap<NodeId, u64>,
    /// The group's commit index.
    pub committed: u64,
    /// The effective membership is committed and not a joint one: no
    /// other change is under way.
    pub settled: bool,
}

/// One membership change of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoterChange {
    /// Make these learners voters.
    Promote(BTreeSet<NodeId>),
    /// Make `with` voters and `dead` learners, in one change.
    Replace {
        dead: BTreeSet<NodeId>,
        with: BTreeSet<NodeId>,
    },
}

/// The number of voters for `live` live nodes: the largest odd number not
/// above it, at most [`MAX_VOTERS`] (at least one).
pub fn target(live: usize) -> usize {
    let odd = if live.is_multiple_of(2) {
        live.saturating_sub(1)
    } else {
        live
    };
    odd.clamp(1, MAX_VOTERS)
}

impl GroupView {
    /// Whether `node` acknowledged the leader within [`DEAD_AFTER`]; the
    /// leader is alive to itself.
    fn alive(&self, node: NodeId) -> bool {
        node == self.leader
            || self
                .silent_for
                .get(&node)
                .is_some_and(|silent| *silent < DEAD_AFTER)
    }

    /// A majority of the voters is alive: a change can commit.
    fn has_quorum(&self) -> bool {
        let alive = self.voters.iter().filter(|&&v| self.alive(v)).count();
        alive * 2 > self.voters.len()
    }

    /// Learners fit to vote: nodes of the map, alive, caught up; by id.
    fn candidates(&self) -> Vec<NodeId> {
        self.learners
            .iter()
            .copied()
            .filter(|&l| self.map_nodes.contains(&l) && self.alive(l))
            .filter(|l| {
                self.matched
                    .get(l)
                    .is_some_and(|&m| m + CAUGHT_UP_LAG_ENTRIES >= self.committed)
            })
            .collect()
    }

    /// Voters to replace: silent too long, never the leader.
    fn dead_voters(&self) -> Vec<NodeId> {
        self.voters
            .iter()
            .copied()
            .filter(|&v| !self.alive(v))
            .collect()
    }

    /// Live members of the group that are nodes of the map.
    fn live_nodes(&self) -> usize {
        self.voters
            .union(&self.learners)
            .filter(|&&n| self.map_nodes.contains(&n) && self.alive(n))
            .count()
    }
}

/// The change the group needs now, if any. Replacing a dead voter comes
/// first (it restores the failures the group tolerates); then learners are
/// promoted up to [`target`].
pub fn decide(view: &GroupView) -> Option<VoterChange> {
    if !view.settled || !view.has_quorum() {
        return None;
    }
    let candidates = view.candidates();
    let dead = view.dead_voters();
    let replaced = dead.len().min(candidates.len());
    if replaced > 0 {
        return Some(VoterChange::Replace {
            dead: dead[..replaced].iter().copied().collect(),
            with: candidates[..replaced].iter().copied().collect(),
        });
    }
    let wanted = target(view.live_nodes()).saturating_sub(view.voters.len());
    let promoted = wanted.min(candidates.len());
    (promoted > 0).then(|| VoterChange::Promote(candidates[..promoted].iter().copied().collect()))
}

/// The learner to promote in place of a voter that leaves the cluster
/// (`remove`): the first learner fit to vote, if any.
pub fn replacement(view: &GroupView) -> Option<NodeId> {
    view.candidates().first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALIVE: Duration = Duration::from_millis(100);
    const SILENT: Duration = Duration::from_secs(11);

    /// Leader 1, voters 1-3, learners as given; every node of the map,
    /// alive and caught up unless a test says otherwise.
    fn view(voters: &[NodeId], learners: &[NodeId]) -> GroupView {
        let all: Vec<NodeId> = voters.iter().chain(learners).copied().collect();
        GroupView {
            leader: 1,
            voters: voters.iter().copied().collect(),
            learners: learners.iter().copied().collect(),
            map_nodes: all.iter().copied().collect(),
            silent_for: all.iter().map(|&n| (n, ALIVE)).collect(),
            matched: all.iter().map(|&n| (n, 100)).collect(),
            committed: 100,
            settled: true,
        }
    }

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn the_target_is_the_largest_odd_count_up_to_five() {
        let targets: Vec<usize> = (0..=8).map(target).collect();
        assert_eq!(targets, [1, 1, 1, 3, 3, 5, 5, 5, 5]);
    }

    #[test]
    fn learners_are_promoted_up_to_the_target() {
        // Four live nodes: three voters are the target.
        assert_eq!(decide(&view(&[1, 2, 3], &[4])), None);
        // Five: both learners at once.
        assert_eq!(
            decide(&view(&[1, 2, 3], &[4, 5])),
            Some(VoterChange::Promote(set(&[4, 5])))
        );
        // Seven: five voters, the two lowest ids.
        assert_eq!(
            decide(&view(&[1, 2, 3], &[4, 5, 6, 7])),
            Some(VoterChange::Promote(set(&[4, 5])))
        );
        // A one-voter group of a three-node cluster grows to three.
        assert_eq!(
            decide(&view(&[1], &[2, 3])),
            Some(VoterChange::Promote(set(&[2, 3])))
        );
        assert_eq!(decide(&view(&[1, 2, 3, 4, 5], &[6, 7])), None);
    }

    #[test]
    fn only_live_caught_up_learners_of_the_map_are_promoted() {
        let mut behind = view(&[1, 2, 3], &[4, 5]);
        behind.matched.insert(5, 100 - CAUGHT_UP_LAG_ENTRIES - 1);
        // Node 5 is live (the target is five) but not caught up.
        assert_eq!(decide(&behind), Some(VoterChange::Promote(set(&[4]))));
        let mut silent = view(&[1, 2, 3], &[4, 5, 6]);
        silent.silent_for.insert(6, SILENT);
        assert_eq!(decide(&silent), Some(VoterChange::Promote(set(&[4, 5]))));
        // Node 5 is being removed: out of the map, never promoted (and
        // not counted: four live nodes keep three voters).
        let mut removed = view(&[1, 2, 3], &[4, 5]);
        removed.map_nodes.remove(&5);
        assert_eq!(decide(&removed), None);
    }

    #[test]
    fn a_dead_voter_is_replaced_by_a_caught_up_learner() {
        let mut dead = view(&[1, 2, 3], &[4]);
        dead.silent_for.insert(2, SILENT);
        assert_eq!(
            decide(&dead),
            Some(VoterChange::Replace {
                dead: set(&[2]),
                with: set(&[4]),
            })
        );
        // A voter that never answered this leader counts the same.
        dead.silent_for.remove(&2);
        assert!(matches!(decide(&dead), Some(VoterChange::Replace { .. })));
        // Two dead voters of five, two learners: both replaced at once.
        let mut two = view(&[1, 2, 3, 4, 5], &[6, 7]);
        two.silent_for.insert(2, SILENT);
        two.silent_for.insert(3, SILENT);
        assert_eq!(
            decide(&two),
            Some(VoterChange::Replace {
                dead: set(&[2, 3]),
                with: set(&[6, 7]),
            })
        );
    }

    #[test]
    fn nothing_changes_without_a_caught_up_learner() {
        let mut dead = view(&[1, 2, 3], &[4]);
        dead.silent_for.insert(2, SILENT);
        dead.matched.insert(4, 0);
        assert_eq!(decide(&dead), None);
        let mut alone = view(&[1, 2, 3], &[]);
        alone.silent_for.insert(3, SILENT);
        assert_eq!(decide(&alone), None);
    }

    #[test]
    fn nothing_changes_without_a_quorum_or_during_a_change() {
        let mut lost = view(&[1, 2, 3], &[4, 5]);
        lost.silent_for.insert(2, SILENT);
        lost.silent_for.insert(3, SILENT);
        assert_eq!(decide(&lost), None);
        let mut changing = view(&[1, 2, 3], &[4, 5]);
        changing.settled = false;
        assert_eq!(decide(&changing), None);
    }

    #[test]
    fn a_leaving_voter_is_replaced_by_a_learner_fit_to_vote() {
        let mut leaving = view(&[1, 2, 3], &[4, 5]);
        // Node 3 leaves (out of the map); node 4 is behind.
        leaving.map_nodes.remove(&3);
        leaving.matched.insert(4, 0);
        assert_eq!(replacement(&leaving), Some(5));
        leaving.silent_for.insert(5, SILENT);
        assert_eq!(replacement(&leaving), None);
    }

    #[test]
    fn the_leader_is_never_demoted() {
        // The leader's own entry says silent (openraft keeps no ack of
        // itself): it is alive to itself and never replaced.
        let mut own = view(&[1, 2, 3], &[4]);
        own.silent_for.insert(1, SILENT);
        assert_eq!(decide(&own), None);
        let mut also_dead = own.clone();
        also_dead.silent_for.insert(3, SILENT);
        // Only node 3 goes (and the quorum is 1 and 2 alive of 3).
        also_dead.silent_for.insert(2, ALIVE);
        assert_eq!(
            decide(&also_dead),
            Some(VoterChange::Replace {
                dead: set(&[3]),
                with: set(&[4]),
            })
        );
    }
}
