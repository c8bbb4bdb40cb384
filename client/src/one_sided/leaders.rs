//! Who leads each shard, as the one-sided path decides it from the statuses
//! a topology refresh gathers: the leader named at the highest term.
//!
//! A leader cut off from its quorum goes on naming itself at its old term
//! (it cannot hear of its successor), and a client that took the word of
//! the first node it asked would, while that node answered, keep reading
//! the deposed leader's region, whose lease has run out: every lease read
//! refused, for as long as the partition lasted. Raft elects at most one
//! leader per term, so the claim at the highest term is the newest. A
//! claim picks only which region a lease read tries; whether the read is
//! served is still decided by the lease in that region's header.

use std::collections::BTreeMap;

use rdkv_proto::shard::ShardId;

/// The newest claim per shard: `(term, leader)`.
#[derive(Debug, Default)]
pub(super) struct LeaderClaims(BTreeMap<ShardId, (u64, u64)>);

impl LeaderClaims {
    /// Notes that a node at `term` names `leader` for `shard`. No leader
    /// (an election under way, a node cut off and campaigning) claims
    /// nothing: it must not hide the leader the others agree on.
    pub(super) fn note(&mut self, shard: ShardId, term: u64, leader: Option<u64>) {
        let Some(leader) = leader else { return };
        let newest = self.0.entry(shard).or_insert((term, leader));
        if term > newest.0 {
            *newest = (term, leader);
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
        // The deposed leader (1, term 4) and the majority (term 5, leader 3).
        let claims = [(4, Some(1)), (5, Some(3)), (5, Some(3))];
        for first in 0..claims.len() {
            let mut noted = LeaderClaims::default();
            for (term, leader) in claims.iter().cycle().skip(first).take(claims.len()) {
                noted.note(SHARD, *term, *leader);
            }
            assert_eq!(noted.leaders(), BTreeMap::from([(SHARD, 3)]));
        }
    }

    #[test]
    fn a_node_without_a_leader_hides_no_claim() {
        let mut noted = LeaderClaims::default();
        noted.note(SHARD, 5, Some(3));
        // A node cut off alone, campaigning at ever higher terms.
        noted.note(SHARD, 9, None);
        assert_eq!(noted.leaders(), BTreeMap::from([(SHARD, 3)]));
        let mut none = LeaderClaims::default();
        none.note(SHARD, 9, None);
        assert!(none.leaders().is_empty());
    }

    #[test]
    fn shards_are_judged_apart() {
        let mut noted = LeaderClaims::default();
        noted.note(ShardId(1), 7, Some(2));
        noted.note(ShardId(2), 3, Some(1));
        noted.note(ShardId(1), 6, Some(1));
        assert_eq!(
            noted.leaders(),
            BTreeMap::from([(ShardId(1), 2), (ShardId(2), 1)])
        );
    }
}
