//! Index slots: one 8-byte word per key, published with a single atomic store.
//!
//! ```text
//! bit 63..56  check        CRC-8 (poly 0x07) of bits 55..0 (7 bytes, little endian)
//! bit 55..41  fingerprint  15 bits of the key hash, never 0
//! bit 40..34  size class   index into the size-class table
//! bit 33..0   offset       block offset from the data area start, in 64-byte units
//! ```
//!
//! The all-zero word is the empty slot; a used slot is never zero because its
//! fingerprint is never zero. The check byte lets a reader tell a corrupted
//! slot from a key that is simply absent.

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

/// A decoded, check-verified, non-empty slot.
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
        let low56 = (u64::from(self.fingerprint) << FINGERPRINT_SHIFT)
            | (u64::from(self.class.index()) << CLASS_SHIFT)
            | (self.offset_units << OFFSET_SHIFT);
        (u64::from(check_byte(low56)) << CHECK_SHIFT) | low56
    }

    /// Decodes a slot word read from a region: `Ok(None)` for the empty slot.
    pub fn decode(raw: u64) -> Result<Option<Slot>, SlotError> {
        if raw == 0 {
            return Ok(None);
        }
        Slot::decode_unchecked(raw).map(Some)
    }

    /// The fingerprint of a raw word without verifying it: the hit path compares
    /// fingerprints first and verifies the check byte only of candidates.
    pub fn raw_fingerprint(raw: u64) -> u16 {
        ((raw >> FINGERPRINT_SHIFT) & u64::from(MAX_FINGERPRINT)) as u16
    }

    fn decode_unchecked(raw: u64) -> Result<Slot, SlotError> {
        let low56 = raw & ((1 << CHECK_SHIFT) - 1);
        if (raw >> CHECK_SHIFT) as u8 != check_byte(low56) {
            return Err(SlotError::Check { raw });
        }
        let fingerprint = Slot::raw_fingerprint(raw);
        if fingerprint == 0 {
            return Err(SlotError::Check { raw });
        }
        let class_index = ((low56 >> CLASS_SHIFT) & ((1 << CLASS_BITS) - 1)) as u8;
        let class = SizeClass::from_index(class_index).ok_or(SlotError::SizeClass { raw })?;
        Ok(Slot {
            fingerprint,
            class,
            offset_units: (low56 >> OFFSET_SHIFT) & (MAX_DATA_UNITS - 1),
        })
    }

    /// Byte range of the block inside the data area, bounds-checked against the
    /// data area's length so that no reader is ever sent outside the region.
    pub fn block_range(self, data_bytes: u64) -> Result<(u64, u64), SlotError> {
        let start = self.offset_units.checked_mul(UNIT_BYTES);
        let len = self.class.bytes();
        match start.and_then(|s| s.checked_add(len)) {
            Some(end) if end <= data_bytes => Ok((end - len, len)),
            _ => Err(SlotError::OutOfRange { raw: self.encode() }),
        }
    }
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
        }
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
