//! Where a replica move of a shard stands (docs/sharding.md, section 8): a
//! pure function of the shard's Raft voters, the members its map names,
//! and the move asked. A leader killed in the middle of a move leaves the
//! shard in one of these states; the same move sent again finishes it
//! from there. A state only this move could have left is resumed: voters
//! and map must differ exactly by the steps the move had taken, so that a
//! move between two legitimate members (which would shrink the shard) is
//! still refused.

use std::collections::BTreeSet;

/// How far the move `from -> to` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveState {
    /// `from` a voter, `to` not: the whole move (a learner `to` left by an
    /// earlier try is added again).
    Fresh,
    /// `to` was promoted, `from` not removed yet: the voters are the map's
    /// members and `to`.
    Promoted,
    /// `from` was removed, the map not published yet: the voters are the
    /// map's members with `to` in place of `from`.
    Removed,
    /// The voters and the map both name the move's result.
    Done,
}

/// Why the move `from -> to` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    SameNode,
    /// `to` is a voter, and not one this move promoted.
    AlreadyMember,
    /// `from` is no voter, and not one this move removed.
    NotMember,
}

/// The state of the move `from -> to` given the shard's Raft `voters` and
/// the members its map `named`.
pub fn classify(
    voters: &BTreeSet<u64>,
    named: &BTreeSet<u64>,
    from: u64,
    to: u64,
) -> Result<MoveState, Refusal> {
    if from == to {
        return Err(Refusal::SameNode);
    }
    // The map as it was before this move: names `from`, not `to`.
    let before = named.contains(&from) && !named.contains(&to);
    let with_to = |set: &BTreeSet<u64>| {
        let mut set = set.clone();
        set.insert(to);
        set
    };
    match (voters.contains(&from), voters.contains(&to)) {
        (true, false) => Ok(MoveState::Fresh),
        (true, true) if before && *voters == with_to(named) => Ok(MoveState::Promoted),
        (true, true) => Err(Refusal::AlreadyMember),
        (false, true) => {
            let mut moved = with_to(named);
            moved.remove(&from);
            if before && *voters == moved {
                Ok(MoveState::Removed)
            } else if !named.contains(&from) && voters == named {
                Ok(MoveState::Done)
            } else {
                Err(Refusal::NotMember)
            }
        }
        (false, false) => Err(Refusal::NotMember),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case: its name, the voters, the map's members, from, to, the state.
    type Case = (
        &'static str,
        &'static [u64],
        &'static [u64],
        u64,
        u64,
        Result<MoveState, Refusal>,
    );

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn states_of_a_move_from_1_to_3() {
        use MoveState::{Done, Fresh, Promoted, Removed};
        use Refusal::{AlreadyMember, NotMember, SameNode};
        #[rustfmt::skip]
        let table: [Case; 17] = [
            ("nothing done yet", &[1, 2], &[1, 2], 1, 3, Ok(Fresh)),
            ("a stale map does not stop a fresh move", &[1, 2], &[2, 4], 1, 3, Ok(Fresh)),
            ("promoted, source still a voter", &[1, 2, 3], &[1, 2], 1, 3, Ok(Promoted)),
            ("source removed, map not published", &[2, 3], &[1, 2], 1, 3, Ok(Removed)),
            ("published: done", &[2, 3], &[2, 3], 1, 3, Ok(Done)),
            ("same node", &[1, 2], &[1, 2], 1, 1, Err(SameNode)),
            // Both members of the map: moving would shrink the shard.
            ("between two members", &[1, 2, 3], &[1, 2, 3], 1, 3, Err(AlreadyMember)),
            ("between two members of two", &[1, 3], &[1, 3], 1, 3, Err(AlreadyMember)),
            ("to named by the map", &[1, 2, 3], &[1, 3], 1, 3, Err(AlreadyMember)),
            ("from not named by the map", &[1, 2, 3], &[2, 4], 1, 3, Err(AlreadyMember)),
            ("two voters more than the map", &[1, 2, 3, 4], &[1, 2], 1, 3, Err(AlreadyMember)),
            ("neither a voter", &[2, 4], &[2, 4], 1, 3, Err(NotMember)),
            ("from never a member", &[2, 4], &[1, 2], 1, 3, Err(NotMember)),
            ("removed, and another voter missing", &[3], &[1, 2], 1, 3, Err(NotMember)),
            ("removed, and another voter more", &[2, 3, 4], &[1, 2], 1, 3, Err(NotMember)),
            ("to a voter the map names, from still named", &[2, 3], &[1, 2, 3], 1, 3, Err(NotMember)),
            ("voters differ from the published map", &[3, 4], &[2, 3], 1, 3, Err(NotMember)),
        ];
        for (case, voters, named, from, to, expected) in table {
            assert_eq!(
                classify(&set(voters), &set(named), from, to),
                expected,
                "{case}"
            );
        }
    }
}
