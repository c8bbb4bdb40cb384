//! The validation steps of a one-sided GET, shared by every reader (the
//! server's local reader, the `mem`/`shm` transports, RDMA clients) and the
//! writer's own lookups, so that they all accept and reject exactly the same
//! bytes and follow the same chain.
//!
//! A GET: read the key's neighbourhood (one contiguous read of
//! `neighbourhood_buckets` buckets), take the slots whose fingerprint matches
//! ([`neighbourhood_slots`]), read each candidate's block and judge it with
//! [`examine_block`]. When no candidate is the key, [`ChainWalk`] verifies
//! the neighbourhood (a corrupted slot is not an absence) and names the
//! overflow tables of the key's home bucket (see `overflow`): each is read
//! whole, searched the same way, verified on a miss and followed to the
//! next, at most [`MAX_OVERFLOW_TABLES`] of them. Only a miss in all of them
//! is an absence.

use crate::region::block::{BlockRef, SplitVerdict, examine_split};
use crate::region::error::{BlockError, SlotError};
use crate::region::header::RegionLayout;
use crate::region::overflow::{ANCHOR_SLOT, MAX_OVERFLOW_TABLES, is_anchor};
use crate::region::slot::{OverflowLink, Slot, SlotWord};

/// Candidate slots for `fingerprint` among the words of a neighbourhood or
/// an overflow table, with their position (needed to re-read a slot). Only
/// candidates pay for the check-byte verification. Links have fingerprint
/// 0, which no key has, so they are never candidates.
pub fn neighbourhood_slots(
    words: &[u64],
    fingerprint: u16,
) -> impl Iterator<Item = (usize, Result<Slot, SlotError>)> + '_ {
    words
        .iter()
        .enumerate()
        .filter(move |&(_, &raw)| raw != 0 && Slot::raw_fingerprint(raw) == fingerprint)
        .map(|(position, &raw)| (position, Slot::decode(raw).and_then(present)))
}

fn present(slot: Option<Slot>) -> Result<Slot, SlotError> {
    // `decode` returns None only for 0, which the filter already removed.
    slot.ok_or(SlotError::Check { raw: 0 })
}

/// Verifies every word of a neighbourhood (or of whole buckets from a bucket
/// boundary): run on a miss so that a slot whose fingerprint was corrupted
/// is reported rather than taken for absence. A link is valid in an anchor
/// only.
pub fn verify_neighbourhood(words: &[u64]) -> Result<(), SlotError> {
    words
        .iter()
        .enumerate()
        .try_for_each(|(position, &raw)| match SlotWord::decode(raw)? {
            SlotWord::Link(_) if !is_anchor(position) => Err(SlotError::Misplaced { raw }),
            _ => Ok(()),
        })
}

/// The link in the home bucket's anchor of a neighbourhood read (its word
/// [`ANCHOR_SLOT`]): where the key's overflow chain starts, if it has one.
pub fn anchor_link(words: &[u64]) -> Result<Option<OverflowLink>, SlotError> {
    match words.get(ANCHOR_SLOT).map(|&raw| SlotWord::decode(raw)) {
        Some(Ok(SlotWord::Link(link))) => Ok(Some(link)),
        Some(Err(error)) => Err(error),
        _ => Ok(None),
    }
}

/// Verifies the words of an overflow table (entries or empty, and in the
/// last slot a link or nothing) and returns its link to the next table.
pub fn verify_table(words: &[u64]) -> Result<Option<OverflowLink>, SlotError> {
    let Some((&last, entries)) = words.split_last() else {
        return Ok(None);
    };
    for &raw in entries {
        if let SlotWord::Link(_) = SlotWord::decode(raw)? {
            return Err(SlotError::Misplaced { raw });
        }
    }
    match SlotWord::decode(last)? {
        SlotWord::Empty => Ok(None),
        SlotWord::Link(link) => Ok(Some(link)),
        SlotWord::Entry(_) => Err(SlotError::Misplaced { raw: last }),
    }
}

/// A walk along the overflow chain of one home bucket, after its
/// neighbourhood missed: which table to read next, and when to stop. Every
/// reader and the writer walk with it, so they agree on what a chain is and
/// none follows more than [`MAX_OVERFLOW_TABLES`] links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainWalk {
    next: Option<OverflowLink>,
    tables_read: usize,
}

impl ChainWalk {
    /// Verifies the words of a neighbourhood that missed (or of one bucket
    /// alone) and starts at its home anchor's link, if it has one.
    pub fn from_neighbourhood(words: &[u64]) -> Result<ChainWalk, SlotError> {
        verify_neighbourhood(words)?;
        Ok(ChainWalk {
            next: anchor_link(words)?,
            tables_read: 0,
        })
    }

    /// The table to read next; `None` once the chain has ended.
    pub fn next_table(&self) -> Option<OverflowLink> {
        self.next
    }

    /// Tables passed so far.
    pub fn tables_read(&self) -> usize {
        self.tables_read
    }

    /// After the table [`ChainWalk::next_table`] named missed too: verifies
    /// its words and moves on to the table it links to. A link out of the
    /// last table the bound allows is corruption.
    pub fn advance(&mut self, table: &[u64]) -> Result<(), SlotError> {
        debug_assert!(self.next.is_some_and(|l| l.table_slots() == table.len()));
        let next = verify_table(table)?;
        self.tables_read += 1;
        if next.is_some() && self.tables_read >= MAX_OVERFLOW_TABLES {
            return Err(SlotError::ChainTooLong {
                max_tables: MAX_OVERFLOW_TABLES,
            });
        }
        self.next = next;
        Ok(())
    }
}

/// What a candidate block turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockVerdict<'a> {
    /// A whole block of the requested key.
    Match(BlockRef<'a>),
    /// A whole block of another key: a fingerprint collision, or (if the slot
    /// changed since it was read) the block was reused; re-read the slot.
    OtherKey,
    /// Not a whole block: torn by concurrent reuse (retry) or corrupted.
    Torn(BlockError),
}

pub fn examine_block<'a>(layout: &RegionLayout, key: &[u8], bytes: &'a [u8]) -> BlockVerdict<'a> {
    match layout.validate_block(bytes) {
        Ok(block) if block.key == key => BlockVerdict::Match(block),
        Ok(_) => BlockVerdict::OtherKey,
        Err(error) => BlockVerdict::Torn(error),
    }
}

/// [`examine_block`] for a block copied in two pieces (header and key into
/// `head`, the value into `tail`): see [`examine_split`].
pub fn examine_block_split(
    layout: &RegionLayout,
    key: &[u8],
    head: &[u8],
    tail: &[u8],
) -> SplitVerdict {
    examine_split(
        key,
        head,
        tail,
        (layout.max_key_bytes, layout.max_value_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::size_class::SizeClass;

    #[test]
    fn candidates_are_fingerprint_matches_in_order() {
        let class = SizeClass::for_units(1).unwrap();
        let words = [
            0,
            Slot::new(5, class, 1).encode(),
            Slot::new(6, class, 2).encode(),
            Slot::new(5, class, 3).encode(),
        ];
        let found: Vec<_> = neighbourhood_slots(&words, 5).collect();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].0, 1);
        assert_eq!(found[1].1.unwrap().offset_units, 3);
        assert!(verify_neighbourhood(&words).is_ok());
        let mut corrupt = words;
        corrupt[2] ^= 1 << 45;
        assert!(verify_neighbourhood(&corrupt).is_err());
    }

    fn link(units: u64, offset_units: u64) -> OverflowLink {
        OverflowLink::new(units, offset_units)
    }

    fn entry(fingerprint: u16, offset_units: u64) -> u64 {
        Slot::new(fingerprint, SizeClass::for_units(1).unwrap(), offset_units).encode()
    }

    #[test]
    fn links_are_valid_in_anchors_only_and_never_candidates() {
        let mut words = [0u64; 16];
        words[0] = entry(5, 1);
        words[7] = link(1, 40).encode();
        words[15] = link(4, 80).encode();
        assert_eq!(verify_neighbourhood(&words), Ok(()));
        // A link has fingerprint 0, which is no key's: no key picks it.
        for fingerprint in 1..=3 {
            assert!(
                neighbourhood_slots(&words, fingerprint).all(|(p, _)| p == 0),
                "{fingerprint}"
            );
        }
        assert_eq!(anchor_link(&words), Ok(Some(link(1, 40))));
        // A link anywhere else is refused.
        let mut misplaced = words;
        misplaced[3] = link(2, 60).encode();
        assert_eq!(
            verify_neighbourhood(&misplaced),
            Err(SlotError::Misplaced { raw: misplaced[3] })
        );
        // Every single-bit flip of a link is caught.
        for bit in 0..64 {
            let mut flipped = words;
            flipped[7] ^= 1 << bit;
            assert!(verify_neighbourhood(&flipped).is_err(), "bit {bit}");
            assert!(
                ChainWalk::from_neighbourhood(&flipped).is_err(),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn the_anchor_is_the_home_buckets_last_word() {
        let mut words = [0u64; 16];
        words[15] = link(1, 40).encode();
        // The next bucket's link is another home's chain.
        assert_eq!(anchor_link(&words), Ok(None));
        words[7] = entry(9, 3);
        assert_eq!(anchor_link(&words), Ok(None));
        words[7] = link(8, 99).encode();
        assert_eq!(anchor_link(&words), Ok(Some(link(8, 99))));
        assert_eq!(anchor_link(&words[..7]), Ok(None));
        // A corrupted anchor is an error, not "no chain" (a miss there
        // would hide every key of the chain).
        words[7] ^= 1 << 20;
        assert!(anchor_link(&words).is_err());
    }

    #[test]
    fn a_table_holds_entries_and_its_link_last() {
        let mut table = [0u64; 8];
        assert_eq!(verify_table(&table), Ok(None));
        table[0] = entry(5, 1);
        table[7] = link(2, 30).encode();
        assert_eq!(verify_table(&table), Ok(Some(link(2, 30))));
        let mut early = table;
        early[3] = link(2, 31).encode();
        assert_eq!(
            verify_table(&early),
            Err(SlotError::Misplaced { raw: early[3] })
        );
        let mut entry_last = table;
        entry_last[7] = entry(6, 2);
        assert_eq!(
            verify_table(&entry_last),
            Err(SlotError::Misplaced { raw: entry_last[7] })
        );
        let mut corrupt = table;
        corrupt[0] ^= 1 << 50;
        assert!(verify_table(&corrupt).is_err());
        assert_eq!(verify_table(&[]), Ok(None));
    }

    #[test]
    fn a_walk_follows_links_and_stops_at_the_bound() {
        let mut words = [0u64; 8];
        let mut walk = ChainWalk::from_neighbourhood(&words).unwrap();
        assert_eq!(walk.next_table(), None);
        words[7] = link(1, 10).encode();
        walk = ChainWalk::from_neighbourhood(&words).unwrap();
        assert_eq!(walk.next_table(), Some(link(1, 10)));
        let mut table = [0u64; 8];
        table[7] = link(1, 10).encode();
        // A table that links to itself: followed until the bound, then refused.
        for hop in 1..MAX_OVERFLOW_TABLES {
            walk.advance(&table).unwrap();
            assert_eq!(
                (walk.tables_read(), walk.next_table()),
                (hop, Some(link(1, 10)))
            );
        }
        assert_eq!(
            walk.advance(&table),
            Err(SlotError::ChainTooLong {
                max_tables: MAX_OVERFLOW_TABLES
            })
        );
        // The last table the bound allows may end the chain.
        let mut walk = ChainWalk::from_neighbourhood(&words).unwrap();
        for _ in 1..MAX_OVERFLOW_TABLES {
            walk.advance(&table).unwrap();
        }
        walk.advance(&[0u64; 8]).unwrap();
        assert_eq!(
            (walk.tables_read(), walk.next_table()),
            (MAX_OVERFLOW_TABLES, None)
        );
    }
}
