//! The validation steps of a one-sided GET, shared by every reader (the
//! server's local reader, the `mem`/`shm` transports, RDMA clients) so that they
//! all accept and reject exactly the same bytes.
//!
//! A GET: read the key's neighbourhood (one contiguous read of
//! `neighbourhood_buckets` buckets), take the slots whose fingerprint matches
//! ([`neighbourhood_slots`]), read each candidate's block and judge it with
//! [`examine_block`]. When no candidate is the key, [`verify_neighbourhood`]
//! tells a true miss from a corrupted slot.

use crate::region::block::BlockRef;
use crate::region::error::{BlockError, SlotError};
use crate::region::header::RegionLayout;
use crate::region::slot::Slot;

/// Candidate slots for `fingerprint` among the words of a neighbourhood read,
/// with their position (needed to re-read a slot). Only candidates pay for the
/// check-byte verification.
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

/// Verifies every used slot of a neighbourhood: run on a miss so that a slot
/// whose fingerprint was corrupted is reported rather than taken for absence.
pub fn verify_neighbourhood(words: &[u64]) -> Result<(), SlotError> {
    words
        .iter()
        .try_for_each(|&raw| Slot::decode(raw).map(drop))
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
}
