//! Who leads each shard, as the one-sided path decides it from the statuses
//! a topology refresh gathers: the newest leader named, by (term, node id).
//!
//! A leader cut off from its quorum goes on naming itself at its old term
//! (it cannot hear of its successor), and a client that took the word of
//! the first node it asked would, while that node answered, keep reading
//! the deposed leader's region, whose lease has run out: every lease read
//! refused, for as long as the partition lasted. rdkv's Raft orders leaders
//! as openraft's `leader_id_adv` does, by term and then node id (two
//! leaders may hold one term, the later with the higher id), so the
//! greatest (term, leader) claimed is the newest. A claim picks only which
//! region a lease read tries; whether the read is served is still decided
//! by the lease in that region's header.

use std::collections::BTreeMap;

use rdkv_proto::shard::ShardId;

/// The newest claim per shard: `(term, leader)`; a shard map's hint, which
/// carries no term, as `(None, leader)`, below every replica's claim.
#[derive(Debug, Default)]
pub(super) struct LeaderClaims(BTreeMap<ShardId, (Option<u64>, u64)>);

impl LeaderClaims {
    /// Notes that a node at `term` (`None`: a map's hint) names `leader`
    /// for `shard`. No leader (an election under way, a node cut off and
    /// campaigning) claims nothing: it must not hide the leader the others
    /// agree on.
    pub(super) fn note(&mut self, shard: ShardId, term: Option<u64>, leader: Option<u64>) {
        let Some(leader) = leader else { return };
        let claim = (term, leader);
        let newest = self.0.entry(shard).or_insert(claim);
        if claim > *newest {
            *newest = claim;
        }
    }

    /// Each shard's leader, by the newest claim.
    pub(super) fn leaders(&self) -> BTreeMap<ShardId, u64> {
        self.0
            .iter()
            .map(|(shard, (_, leader))| (*shard, *leader))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARD: ShardId = ShardId(0);

    #[test]
    fn the_leader_named_at_the_highest_term_wins_in_any_order() {
        // The deposed leader (1, term 4) and the majority (term 5, leader
        // 3); a map's hint, without a term, naming the deposed one.
        let claims = [(Some(4), Some(1)), (Some(5), Some(3)), (None, Some(1))];
        for first in 0..claims.len() {
            let mut noted = LeaderClaims::default();
            for (term, leader) in claims.iter().cycle().skip(first).take(claims.len()) {
                noted.note(SHARD, *term, *leader);
            }
            assert_eq!(noted.leaders(), BTreeMap::from([(SHARD, 3)]));
        }
    }

    /// Under `leader_id_adv` node 3 may lead term 5 after node 1 did (it
    /// campaigned at 5 and won): the greater id of one term is the newer.
    #[test]
    fn of_two_leaders_of_one_term_the_greater_id_is_the_newer() {
        for (first, second) in [(1, 3), (3, 1)] {
            let mut noted = LeaderClaims::default();
            noted.note(SHARD, Some(5), Some(first));
            noted.note(SHARD, Some(5), Some(second));
            assert_eq!(noted.leaders(), BTreeMap::from([(SHARD, 3)]));
        }
    }

    #[test]
    fn a_node_without_a_leader_hides_no_claim() {
        let mut noted = LeaderClaims::default();
        noted.note(SHARD, Some(5), Some(3));
        // A node cut off alone, campaigning at ever higher terms.
        noted.note(SHARD, Some(9), None);
        assert_eq!(noted.leaders(), BTreeMap::from([(SHARD, 3)]));
        let mut none = LeaderClaims::default();
        none.note(SHARD, Some(9), None);
        assert!(none.leaders().is_empty());
    }

    #[test]
    fn shards_are_judged_apart() {
        let mut noted = LeaderClaims::default();
        noted.note(ShardId(1), Some(7), Some(2));
        noted.note(ShardId(2), Some(3), Some(1));
        noted.note(ShardId(1), Some(6), Some(1));
        assert_eq!(
            noted.leaders(),
            BTreeMap::from([(ShardId(1), 2), (ShardId(2), 1)])
        );
    }
}
