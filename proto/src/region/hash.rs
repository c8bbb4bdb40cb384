//! Where a key lives in the index. The hash is keyed by a per-region seed
//! published in the header, so a client cannot aim keys at one neighbourhood
//! without knowing the seed (which it only gets after authenticating).
//!
//! `h = SipHash-1-3(key, k0 = seed.0, k1 = seed.1)`;
//! fingerprint = bits 63..49 of `h` (0 replaced by 1);
//! home bucket = (bits 48..0 of `h`) mod (bucket_count - neighbourhood + 1).
//! The key's slot is in one of the `neighbourhood` consecutive buckets starting
//! at the home bucket, so a lookup is one contiguous read with no wrap-around.

use std::hash::Hasher;

use siphasher::sip::SipHasher13;

use crate::region::slot::MAX_FINGERPRINT;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HashSeed(pub u64, pub u64);

/// A key's fingerprint and home bucket for one region geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    pub fingerprint: u16,
    pub home_bucket: u64,
}

impl KeyHash {
    /// `bucket_count >= neighbourhood >= 1` is guaranteed by a validated
    /// [`crate::region::RegionLayout`]; the arithmetic below still cannot panic.
    pub fn new(seed: HashSeed, key: &[u8], bucket_count: u64, neighbourhood: u64) -> KeyHash {
        let mut hasher = SipHasher13::new_with_keys(seed.0, seed.1);
        hasher.write(key);
        let h = hasher.finish();
        let fingerprint = ((h >> 49) as u16) & MAX_FINGERPRINT;
        let homes = bucket_count.saturating_sub(neighbourhood).saturating_add(1);
        KeyHash {
            fingerprint: fingerprint.max(1),
            home_bucket: home_bucket(h & ((1 << 49) - 1), homes),
        }
    }
}

/// `bits mod homes`, by a mask when `homes` is a power of two (the same
/// number: a 64-bit `div` costs tens of cycles on every GET, and a region
/// whose bucket count is a power of two plus the neighbourhood less one
/// has a power of two of homes).
fn home_bucket(bits: u64, homes: u64) -> u64 {
    if homes.is_power_of_two() {
        bits & (homes - 1)
    } else {
        bits % homes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_values() {
        // The hash is part of the region protocol: remote readers compute it
        // too. These values must not change within a layout version.
        let h = |key: &[u8]| KeyHash::new(HashSeed(1, 2), key, 1 << 20, 2);
        let pinned = |fingerprint, home_bucket| KeyHash {
            fingerprint,
            home_bucket,
        };
        assert_eq!(h(b""), pinned(13784, 388510));
        assert_eq!(h(b"user1000"), pinned(17994, 830685));
        assert_eq!(h(b"a longer key with some bytes"), pinned(27076, 1019703));
        assert_ne!(
            KeyHash::new(HashSeed(3, 4), b"user1000", 1 << 20, 2),
            h(b"user1000")
        );
    }

    #[test]
    fn the_mask_is_the_remainder() {
        for homes in [1u64, 2, 3, 4, 7, 8, 1 << 17, (1 << 17) + 1, (1 << 18) - 1] {
            for bits in [0u64, 1, 5, 1 << 20, (1 << 49) - 1, 0x1234_5678_9abc] {
                assert_eq!(home_bucket(bits, homes), bits % homes, "{bits} mod {homes}");
            }
        }
        // The pinned geometry again with a power of two of homes.
        let h = KeyHash::new(HashSeed(1, 2), b"user1000", (1 << 20) + 1, 2);
        assert!(h.home_bucket < 1 << 20);
    }

    #[test]
    fn home_bucket_leaves_room_for_the_neighbourhood() {
        for i in 0..10_000u32 {
            let k = KeyHash::new(HashSeed(9, 9), &i.to_le_bytes(), 5, 2);
            assert!(k.home_bucket + 2 <= 5);
            assert!(k.fingerprint >= 1);
        }
    }
}
