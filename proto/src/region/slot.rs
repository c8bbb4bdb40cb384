//! Index slots: one 8-byte word per key, published with a single atomic store.
//!
//! A slot word is empty (0), an *entry* (a key's block) or a *link* (the
//! start of an overflow table, see [`OverflowLink`]):
//!
//! ```text
//! bit 63..56  check        CRC-8 (poly 0x07) of bits 55..0 (7 bytes, little endian)
//! bit 55..41  fingerprint  entry: 15 bits of the key hash, never 0;   link: 0
//! bit 40..34  class        entry: size class index (0..CLASS_COUNT); link: LINK_CLASS_BASE + log2(table units)
//! bit 33..0   offset       block (entry) or table (link) offset from the data area start, in 64-byte units
//! ```
//!
//! The all-zero word is the empty slot; an entry is never zero because its
//! fingerprint is never zero, a link because its class field is not. The
//! check byte covers both kinds, so a reader tells a corrupted word from an
//! absent key, and a flipped bit cannot turn one kind into the other. Since
//! a key's fingerprint is never 0, a lookup comparing fingerprints never
//! takes a link for a candidate.

use crate::region::error::SlotError;
use crate::region::size_class::{CLASS_COUNT, SizeClass, UNIT_BYTES};

/// A slot is one aligned u64: published and read with single atomic accesses.
pub const SLOT_BYTES: u64 = 8;
pub const SLOTS_PER_BUCKET: usize = 8;
/// One cache line: a bucket is read (and on RDMA, fetched) as a unit.
pub const BUCKET_BYTES: u64 = 64;
const _: () = assert!(SLOTS_PER_BUCKET as u64 * SLOT_BYTES == BUCKET_BYTES);
const _: () = assert!(SLOT_BYTES == u64::BITS as u64 / 8);

const FINGERPRINT_BITS: u32 = 15;
const CLASS_BITS: u32 = 7;
const OFFSET_BITS: u32 = 34;
const OFFSET_SHIFT: u32 = 0;
const CLASS_SHIFT: u32 = OFFSET_BITS;
const FINGERPRINT_SHIFT: u32 = CLASS_SHIFT + CLASS_BITS;
const CHECK_SHIFT: u32 = 56;
// The three fields fill the low 56 bits exactly; the check byte is the rest.
const _: () = assert!(FINGERPRINT_BITS + CLASS_BITS + OFFSET_BITS == CHECK_SHIFT);
const _: () = assert!(CHECK_SHIFT + 8 == u64::BITS);
// Every size class index fits the class field.
const _: () = assert!(CLASS_COUNT <= 1 << CLASS_BITS);

/// Largest data area a slot can address: 2^34 units of 64 bytes = 1 TiB.
pub const MAX_DATA_UNITS: u64 = 1 << OFFSET_BITS;
pub const MAX_FINGERPRINT: u16 = (1 << FINGERPRINT_BITS) - 1;

/// The class field of a link is this plus log2 of its table's units. Class
/// fields below it name size classes: the size-class table may grow to 112
/// classes before the two meanings would meet.
pub const LINK_CLASS_BASE: u8 = 112;
const _: () = assert!(CLASS_COUNT <= LINK_CLASS_BASE as usize);
/// Largest overflow table: 64 units (4 KiB, 512 slots), one read for a reader.
pub const MAX_OVERFLOW_TABLE_UNITS: u64 = 64;
const _: () = assert!(MAX_OVERFLOW_TABLE_UNITS.is_power_of_two());
const MAX_TABLE_UNITS_LOG2: u8 = MAX_OVERFLOW_TABLE_UNITS.trailing_zeros() as u8;
// Every table size has a class field value, and it is never 0 (a link is never empty).
const _: () = assert!(((LINK_CLASS_BASE + MAX_TABLE_UNITS_LOG2) as u32) < 1 << CLASS_BITS);
const _: () = assert!(LINK_CLASS_BASE > 0);

const CRC8_TABLE: [u8; 256] = crc8_table();

const fn crc8_table() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x80 != 0 {
                (crc << 1) ^ 0x07
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

fn check_byte(low56: u64) -> u8 {
    let mut crc = 0u8;
    for byte in &low56.to_le_bytes()[..7] {
        crc = CRC8_TABLE[usize::from(crc ^ byte)];
    }
    crc
}

/// Seals the 56 low bits of a word with their check byte.
fn seal(low56: u64) -> u64 {
    (u64::from(check_byte(low56)) << CHECK_SHIFT) | low56
}

fn fields(fingerprint: u16, class: u8, offset_units: u64) -> u64 {
    (u64::from(fingerprint) << FINGERPRINT_SHIFT)
        | (u64::from(class) << CLASS_SHIFT)
        | (offset_units << OFFSET_SHIFT)
}

/// A decoded, check-verified entry: where one key's block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub fingerprint: u16,
    pub class: SizeClass,
    /// Block offset from the start of the data area, in 64-byte units.
    pub offset_units: u64,
}

impl Slot {
    /// Builds a slot. The writer guarantees the inputs fit (fingerprint from
    /// [`crate::region::KeyHash`], offset from its own allocator); out-of-range
    /// values are a writer bug, so they are masked and caught by debug asserts.
    pub fn new(fingerprint: u16, class: SizeClass, offset_units: u64) -> Slot {
        debug_assert!(fingerprint != 0 && fingerprint <= MAX_FINGERPRINT);
        debug_assert!(offset_units < MAX_DATA_UNITS);
        Slot {
            fingerprint: fingerprint & MAX_FINGERPRINT,
            class,
            offset_units: offset_units & (MAX_DATA_UNITS - 1),
        }
    }

    pub fn encode(self) -> u64 {
        seal(fields(
            self.fingerprint,
            self.class.index(),
            self.offset_units,
        ))
    }

    /// Decodes an entry word read from a region: `Ok(None)` for the empty
    /// slot. A link is refused ([`SlotError::Misplaced`]): where links may
    /// appear, decode with [`SlotWord::decode`].
    pub fn decode(raw: u64) -> Result<Option<Slot>, SlotError> {
        match SlotWord::decode(raw)? {
            SlotWord::Empty => Ok(None),
            SlotWord::Entry(slot) => Ok(Some(slot)),
            SlotWord::Link(_) => Err(SlotError::Misplaced { raw }),
        }
    }

    /// The fingerprint of a raw word without verifying it: the hit path compares
    /// fingerprints first and verifies the check byte only of candidates.
    pub fn raw_fingerprint(raw: u64) -> u16 {
        ((raw >> FINGERPRINT_SHIFT) & u64::from(MAX_FINGERPRINT)) as u16
    }

    /// Byte range of the block inside the data area, bounds-checked against the
    /// data area's length so that no reader is ever sent outside the region.
    pub fn block_range(self, data_bytes: u64) -> Result<(u64, u64), SlotError> {
        data_range(self.offset_units, self.class.bytes(), data_bytes)
            .ok_or(SlotError::OutOfRange { raw: self.encode() })
    }
}

/// `(start, len)` of `len` bytes at `offset_units` when they end inside a
/// data area of `data_bytes`.
fn data_range(offset_units: u64, len: u64, data_bytes: u64) -> Option<(u64, u64)> {
    let start = offset_units.checked_mul(UNIT_BYTES)?;
    let end = start.checked_add(len)?;
    (end <= data_bytes).then_some((start, len))
}

/// A decoded, check-verified link: where an overflow table is. A table of
/// `U` units holds `8U` slot words; its last one is the link to the next
/// table of the chain (or 0), never an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverflowLink {
    units_log2: u8,
    /// Table offset from the start of the data area, in 64-byte units.
    pub offset_units: u64,
}

impl OverflowLink {
    /// A link to a table of `table_units` units at `offset_units`. The
    /// writer guarantees the inputs fit (a power of two up to
    /// [`MAX_OVERFLOW_TABLE_UNITS`] from the chain's schedule, an offset from
    /// its allocator); anything else is a writer bug, so it is clamped and
    /// caught by debug asserts, as in [`Slot::new`].
    pub fn new(table_units: u64, offset_units: u64) -> OverflowLink {
        debug_assert!(table_units.is_power_of_two() && table_units <= MAX_OVERFLOW_TABLE_UNITS);
        debug_assert!(offset_units < MAX_DATA_UNITS);
        OverflowLink {
            units_log2: (table_units.trailing_zeros() as u8).min(MAX_TABLE_UNITS_LOG2),
            offset_units: offset_units & (MAX_DATA_UNITS - 1),
        }
    }

    pub fn table_units(self) -> u64 {
        1 << self.units_log2
    }

    /// Slot words in the table, its final link slot included.
    pub fn table_slots(self) -> usize {
        (self.table_units() * UNIT_BYTES / SLOT_BYTES) as usize
    }

    pub fn table_bytes(self) -> u64 {
        self.table_units() * UNIT_BYTES
    }

    pub fn encode(self) -> u64 {
        seal(fields(
            0,
            LINK_CLASS_BASE + self.units_log2,
            self.offset_units,
        ))
    }

    /// Byte range of the table inside the data area, bounds-checked as
    /// [`Slot::block_range`] is.
    pub fn table_range(self, data_bytes: u64) -> Result<(u64, u64), SlotError> {
        data_range(self.offset_units, self.table_bytes(), data_bytes)
            .ok_or(SlotError::OutOfRange { raw: self.encode() })
    }
}

/// A slot word of any kind, decoded and check-verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotWord {
    Empty,
    Entry(Slot),
    Link(OverflowLink),
}

impl SlotWord {
    /// Decodes a word read from a region; whether its kind is allowed where
    /// it was read is the caller's question (see `lookup`).
    pub fn decode(raw: u64) -> Result<SlotWord, SlotError> {
        if raw == 0 {
            return Ok(SlotWord::Empty);
        }
        let low56 = raw & ((1 << CHECK_SHIFT) - 1);
        if (raw >> CHECK_SHIFT) as u8 != check_byte(low56) {
            return Err(SlotError::Check { raw });
        }
        let class_field = ((low56 >> CLASS_SHIFT) & ((1 << CLASS_BITS) - 1)) as u8;
        let offset_units = (low56 >> OFFSET_SHIFT) & (MAX_DATA_UNITS - 1);
        match Slot::raw_fingerprint(raw) {
            0 => link_of(class_field, offset_units)
                .map(SlotWord::Link)
                .ok_or(SlotError::SizeClass { raw }),
            fingerprint => SizeClass::from_index(class_field)
                .map(|class| {
                    SlotWord::Entry(Slot {
                        fingerprint,
                        class,
                        offset_units,
                    })
                })
                .ok_or(SlotError::SizeClass { raw }),
        }
    }

    pub fn encode(self) -> u64 {
        match self {
            SlotWord::Empty => 0,
            SlotWord::Entry(slot) => slot.encode(),
            SlotWord::Link(link) => link.encode(),
        }
    }
}

/// The link a fingerprint-0 word's class field names, if it names one.
fn link_of(class_field: u8, offset_units: u64) -> Option<OverflowLink> {
    let units_log2 = class_field.checked_sub(LINK_CLASS_BASE)?;
    (units_log2 <= MAX_TABLE_UNITS_LOG2).then_some(OverflowLink {
        units_log2,
        offset_units,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn encode_decode_round_trips(fp in 1u16..=MAX_FINGERPRINT, class in 0u8..88, off in 0u64..MAX_DATA_UNITS) {
            let slot = Slot::new(fp, SizeClass::from_index(class).unwrap(), off);
            let raw = slot.encode();
            prop_assert_ne!(raw, 0);
            prop_assert_eq!(Slot::decode(raw), Ok(Some(slot)));
        }

        #[test]
        fn every_single_bit_flip_is_detected(fp in 1u16..=MAX_FINGERPRINT, class in 0u8..88, off in 0u64..MAX_DATA_UNITS, bit in 0u32..64) {
            let raw = Slot::new(fp, SizeClass::from_index(class).unwrap(), off).encode();
            let flipped = raw ^ (1u64 << bit);
            // The only flip that decodes is none: a flip to zero would need 64 flips.
            prop_assert!(Slot::decode(flipped).is_err());
        }

        #[test]
        fn arbitrary_words_never_panic(raw in any::<u64>(), data_bytes in any::<u64>()) {
            if let Ok(Some(slot)) = Slot::decode(raw)
                && let Ok((start, len)) = slot.block_range(data_bytes) {
                    prop_assert!(start + len <= data_bytes);
                }
            if let Ok(SlotWord::Link(link)) = SlotWord::decode(raw)
                && let Ok((start, len)) = link.table_range(data_bytes) {
                    prop_assert!(start + len <= data_bytes);
                    prop_assert!(len <= MAX_OVERFLOW_TABLE_UNITS * UNIT_BYTES);
                }
        }

        #[test]
        fn link_encode_decode_round_trips(log2 in 0u32..=6, off in 0u64..MAX_DATA_UNITS) {
            let link = OverflowLink::new(1 << log2, off);
            let raw = link.encode();
            prop_assert_ne!(raw, 0);
            prop_assert_eq!(Slot::raw_fingerprint(raw), 0);
            prop_assert_eq!(SlotWord::decode(raw), Ok(SlotWord::Link(link)));
            prop_assert_eq!(SlotWord::Link(link).encode(), raw);
            prop_assert_eq!(link.table_units(), 1 << log2);
            prop_assert_eq!(link.table_slots() as u64, 8 << log2);
            // Where only entries may be, a link is refused, not misread.
            prop_assert_eq!(Slot::decode(raw), Err(SlotError::Misplaced { raw }));
        }

        #[test]
        fn every_single_bit_flip_of_a_link_is_detected(log2 in 0u32..=6, off in 0u64..MAX_DATA_UNITS, bit in 0u32..64) {
            let raw = OverflowLink::new(1 << log2, off).encode();
            prop_assert!(SlotWord::decode(raw ^ (1u64 << bit)).is_err());
        }

        #[test]
        fn entries_decode_as_entries(fp in 1u16..=MAX_FINGERPRINT, class in 0u8..88, off in 0u64..MAX_DATA_UNITS) {
            let slot = Slot::new(fp, SizeClass::from_index(class).unwrap(), off);
            prop_assert_eq!(SlotWord::decode(slot.encode()), Ok(SlotWord::Entry(slot)));
        }
    }

    #[test]
    fn every_table_size_has_its_class_field() {
        for log2 in 0..=6u64 {
            let link = OverflowLink::new(1 << log2, MAX_DATA_UNITS - 1);
            assert_eq!(link.table_units(), 1 << log2);
            assert_eq!(link.table_bytes(), 64 << log2);
            // The class field: the base plus log2 of the units.
            assert_eq!((link.encode() >> 34) & 0x7f, 112 + log2);
        }
    }

    #[test]
    fn fingerprint_zero_words_are_links_only_with_a_link_class() {
        for class_field in 0..128u64 {
            let raw = seal(class_field << CLASS_SHIFT | 9);
            let decoded = SlotWord::decode(raw);
            if (112..=118).contains(&class_field) {
                assert!(matches!(decoded, Ok(SlotWord::Link(_))), "{class_field}");
            } else {
                assert_eq!(decoded, Err(SlotError::SizeClass { raw }), "{class_field}");
            }
        }
    }

    #[test]
    fn out_of_range_table_is_refused() {
        let link = OverflowLink::new(2, 10);
        assert_eq!(link.table_range(12 * 64), Ok((640, 128)));
        assert!(link.table_range(12 * 64 - 1).is_err());
    }

    #[test]
    fn empty_slot_is_zero() {
        assert_eq!(Slot::decode(0), Ok(None));
    }

    #[test]
    fn out_of_range_block_is_refused() {
        let slot = Slot::new(7, SizeClass::for_units(2).unwrap(), 10);
        assert_eq!(slot.block_range(12 * 64), Ok((640, 128)));
        assert!(slot.block_range(12 * 64 - 1).is_err());
    }
}
