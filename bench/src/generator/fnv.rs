//! YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of a long,
//! then `Math.abs`. Used to scramble zipfian ranks and to build key names.

pub const FNV_OFFSET_BASIS_64: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;
pub const FNV_PRIME_64: i64 = 1_099_511_628_211;

/// Bit for bit what YCSB computes, including Java's signed arithmetic: the
/// shift is arithmetic and `Math.abs(Long.MIN_VALUE)` stays negative.
pub fn fnvhash64(mut val: i64) -> i64 {
    let mut hash = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = val & 0xff;
        val >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(FNV_PRIME_64);
    }
    hash.wrapping_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The algorithm restated on unsigned bytes, independently of the port.
    fn reference(val: i64) -> i64 {
        let mut hash: u64 = 0xcbf29ce484222325;
        for byte in val.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x100000001b3);
        }
        (hash as i64).wrapping_abs()
    }

    #[test]
    fn matches_the_fnv1a_definition() {
        for val in [0, 1, 2, 42, 999, 1_000_000, 10_000_000_000, i64::MAX] {
            assert_eq!(fnvhash64(val), reference(val), "{val}");
        }
    }

    #[test]
    fn pinned_values() {
        // FNV-1a 64 of eight zero bytes is 0xa8c7f832281a39c5, whose top bit
        // is set, so Math.abs negates it: YCSB's first key is the well-known
        // `user6284781860667377211`.
        assert_eq!(fnvhash64(0), (0xa8c7f832281a39c5_u64 as i64).wrapping_neg());
        assert_eq!(fnvhash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnvhash64(1), 8_517_097_267_634_966_620);
        assert_eq!(fnvhash64(42), 55_488_592_825_689_361);
        assert_eq!(fnvhash64(999), 2_071_219_101_098_386_137);
    }
}
