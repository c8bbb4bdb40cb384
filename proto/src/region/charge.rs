//! What a pair costs against the cluster's quota: the bytes the writer
//! allocates for it, its block's size class plus its index slot. Every
//! replica computes the same charge from the pair's lengths alone, so the
//! quota decides identically everywhere, whatever each region's layout
//! history (fragmentation, overflow tables, blocks in their grace period).

use crate::region::block::encoded_block_bytes;
use crate::region::size_class::SizeClass;
use crate::region::slot::SLOT_BYTES;

/// The charge of a pair of these lengths, `None` when no size class holds
/// it (the writer refuses such a pair anyway).
pub fn charged_bytes(key_len: usize, value_len: usize) -> Option<u64> {
    let class = SizeClass::for_bytes(encoded_block_bytes(key_len, value_len))?;
    Some(class.bytes() + SLOT_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charge_is_the_block_class_plus_a_slot() {
        // 32-byte header + 1 + 31 = 64 bytes: one unit.
        assert_eq!(charged_bytes(1, 31), Some(64 + 8));
        assert_eq!(charged_bytes(1, 32), Some(128 + 8));
        assert_eq!(charged_bytes(0, usize::MAX / 2), None);
    }
}
