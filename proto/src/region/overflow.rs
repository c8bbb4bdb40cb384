//! Overflow chains: where a key goes when its neighbourhood is full, so that
//! the index never refuses a key because of how this replica happened to
//! place earlier ones (replicas with different histories lay out the same
//! keys differently, and must still accept the same writes).
//!
//! - The *anchor* of bucket `b` is its last slot ([`ANCHOR_SLOT`]). It holds
//!   an entry of a key whose home bucket is `b`, the link to `b`'s overflow
//!   chain, or nothing. Every other slot of a neighbourhood may hold an
//!   entry of any key whose neighbourhood covers it. So a key's home anchor
//!   is word [`ANCHOR_SLOT`] of its neighbourhood read, and a full anchor can
//!   always become a link: its entry belongs in the same chain.
//! - The chain of home `h`: anchor -> table 0 (1 unit) -> table 1 (2 units)
//!   -> ... doubling up to [`MAX_OVERFLOW_TABLE_UNITS`], then that size
//!   ([`overflow_table_units`]), at most [`MAX_OVERFLOW_TABLES`] tables. A
//!   table of `U` units is `8U` slot words in the data area; its last word
//!   is the link to the next table (or 0), the others entries of keys whose
//!   home is `h` (or 0).
//! - A lookup reads the neighbourhood; on a miss whose home anchor is a
//!   link, it reads each table in turn (one read per table), looking for
//!   candidates by fingerprint as in the neighbourhood. Only when the whole
//!   chain misses is the key absent (`lookup::ChainWalk`).
//!
//! Tables are never freed while the region lives (a region rebuilt from
//! its pairs has none until it needs them), so a reader can never read a
//! table that was reused for something else.

use crate::region::neighbourhood::SlotWords;
use crate::region::size_class::UNIT_BYTES;
use crate::region::slot::{MAX_OVERFLOW_TABLE_UNITS, SLOT_BYTES, SLOTS_PER_BUCKET};

/// The anchor's position in its bucket: the last slot.
pub const ANCHOR_SLOT: usize = SLOTS_PER_BUCKET - 1;
/// Most tables in one chain. Readers treat a longer chain as corrupt (a
/// cycle cannot make them loop); the writer refuses a key (`IndexFull`)
/// only when its home's chain has this many tables, all full.
pub const MAX_OVERFLOW_TABLES: usize = 64;
/// Bytes of the largest table: the size of a reader's table buffer.
pub const MAX_OVERFLOW_TABLE_BYTES: usize = (MAX_OVERFLOW_TABLE_UNITS * UNIT_BYTES) as usize;
/// Slot words of the largest table.
pub const MAX_OVERFLOW_TABLE_SLOTS: usize = MAX_OVERFLOW_TABLE_BYTES / SLOT_BYTES as usize;
const _: () =
    assert!(MAX_OVERFLOW_TABLE_SLOTS as u64 * SLOT_BYTES == MAX_OVERFLOW_TABLE_BYTES as u64);
// A table is whole buckets, so its last word is an anchor position too.
const _: () = assert!(MAX_OVERFLOW_TABLE_SLOTS.is_multiple_of(SLOTS_PER_BUCKET));

/// The slot words of one overflow table, in a fixed buffer.
pub type TableWords = SlotWords<MAX_OVERFLOW_TABLE_SLOTS>;

/// Whether `position`, counted from the start of a bucket, is an anchor.
pub fn is_anchor(position: usize) -> bool {
    position % SLOTS_PER_BUCKET == ANCHOR_SLOT
}

/// Whether a key may take `position` of its neighbourhood: any slot but
/// the anchors of the buckets after its home bucket (those belong to other
/// homes).
pub fn may_hold_key(position: usize) -> bool {
    position < SLOTS_PER_BUCKET || !is_anchor(position)
}

/// Units of table `index` (from 0) of a chain: 1, 2, 4, ... up to the largest.
pub fn overflow_table_units(index: usize) -> u64 {
    let log2 = index.min(MAX_OVERFLOW_TABLE_UNITS.trailing_zeros() as usize);
    1 << log2
}

/// Slots a key may take in a full chain of `tables` tables: what a key
/// refused at the bound was denied.
pub fn chain_capacity(tables: usize) -> usize {
    (0..tables)
        .map(|index| (overflow_table_units(index) * UNIT_BYTES / SLOT_BYTES) as usize - 1)
        .sum()
}

/// The empty slot a new key should take in its neighbourhood `words`: the
/// first one it may take in the bucket with the most such slots (spreading
/// keys keeps room for the neighbours), or `None` when there is none.
pub fn free_neighbourhood_slot(words: &[u64]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (bucket, slots) in words.chunks(SLOTS_PER_BUCKET).enumerate() {
        let base = bucket * SLOTS_PER_BUCKET;
        let mut free = (0..slots.len())
            .filter(|&i| slots[i] == 0 && may_hold_key(base + i))
            .map(|i| base + i);
        let Some(first) = free.next() else {
            continue;
        };
        let room = 1 + free.count();
        if best.is_none_or(|(most, _)| room > most) {
            best = Some((room, first));
        }
    }
    best.map(|(_, position)| position)
}

/// The first empty slot of table `words` that may hold an entry (any but
/// the last, which is the link slot).
pub fn free_table_slot(words: &[u64]) -> Option<usize> {
    let entries = words.len().saturating_sub(1);
    words[..entries].iter().position(|&raw| raw == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_the_last_slot_of_every_bucket() {
        let anchors: Vec<usize> = (0..24).filter(|&p| is_anchor(p)).collect();
        assert_eq!(anchors, [7, 15, 23]);
        // The home anchor is the key's; the later ones are not.
        assert!(may_hold_key(7));
        assert!(!may_hold_key(15) && !may_hold_key(23));
        assert!((0..24).filter(|&p| p != 15 && p != 23).all(may_hold_key));
    }

    #[test]
    fn tables_double_up_to_64_units() {
        let units: Vec<u64> = (0..9).map(overflow_table_units).collect();
        assert_eq!(units, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(overflow_table_units(usize::MAX), 64);
        assert_eq!(chain_capacity(0), 0);
        assert_eq!(chain_capacity(2), 7 + 15);
        assert_eq!(
            chain_capacity(MAX_OVERFLOW_TABLES),
            7 + 15 + 31 + 63 + 127 + 255 + 58 * 511
        );
    }

    #[test]
    fn a_new_key_goes_to_the_roomiest_bucket_but_never_a_foreign_anchor() {
        let used = 1u64;
        // Home bucket: 2 free (positions 3, 7); next bucket: 3 free (9, 10, 15),
        // but 15 is the next bucket's anchor: only 2 count, the tie keeps home.
        let mut words = [used; 16];
        for p in [3, 7, 9, 10, 15] {
            words[p] = 0;
        }
        assert_eq!(free_neighbourhood_slot(&words), Some(3));
        words[11] = 0;
        assert_eq!(free_neighbourhood_slot(&words), Some(9));
        // Only foreign anchors left: no room.
        let mut words = [used; 16];
        words[15] = 0;
        assert_eq!(free_neighbourhood_slot(&words), None);
        // The home anchor is room.
        words[7] = 0;
        assert_eq!(free_neighbourhood_slot(&words), Some(7));
        assert_eq!(free_neighbourhood_slot(&[]), None);
    }

    #[test]
    fn a_table_offers_every_slot_but_its_link_slot() {
        let mut words = [1u64; 8];
        words[7] = 0;
        assert_eq!(free_table_slot(&words), None);
        words[5] = 0;
        words[2] = 0;
        assert_eq!(free_table_slot(&words), Some(2));
        assert_eq!(free_table_slot(&[]), None);
    }
}
