//! Hash slots: which of the [`SLOT_COUNT`] slots a key belongs to, exactly
//! as Redis Cluster computes it (`keyHashSlot` in Redis's `cluster.c`), so
//! that `CLUSTER KEYSLOT` on rdkv and on Redis agree and Redis Cluster
//! clients route to the shard rdkv would.

use core::fmt;

use serde::{Deserialize, Serialize};

/// Slots in a cluster: Redis Cluster's 16,384.
pub const SLOT_COUNT: u16 = 16_384;

/// A hash slot, `0..SLOT_COUNT`: the only way to build one is
/// [`Slot::new`] or [`key_slot`], so a `Slot` is always in range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Slot(u16);

/// The first slot.
pub const FIRST_SLOT: Slot = Slot(0);
/// The last slot.
pub const LAST_SLOT: Slot = Slot(SLOT_COUNT - 1);

impl Slot {
    /// `None` when `slot` is not below [`SLOT_COUNT`].
    pub const fn new(slot: u16) -> Option<Slot> {
        if slot < SLOT_COUNT {
            Some(Slot(slot))
        } else {
            None
        }
    }

    pub const fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Slot {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Slot, D::Error> {
        let raw = u16::deserialize(deserializer)?;
        Slot::new(raw).ok_or_else(|| {
            serde::de::Error::invalid_value(
                serde::de::Unexpected::Unsigned(u64::from(raw)),
                &"a slot below 16384",
            )
        })
    }
}

/// The slot of `key`: CRC16 of its hash tag when it has one, else of the
/// whole key, modulo [`SLOT_COUNT`].
pub fn key_slot(key: &[u8]) -> Slot {
    // SLOT_COUNT is a power of two: the mask is Redis's `& 0x3FFF`.
    Slot(crc16_xmodem(hashed_part(key)) & (SLOT_COUNT - 1))
}

/// The bytes a key's slot is computed from: between the first `{` and the
/// first `}` after it when at least one byte lies between them (the hash
/// tag), else the whole key (no `{`, no `}` after it, or `{}` first).
pub fn hashed_part(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let after_open = &key[open + 1..];
    match after_open.iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &after_open[..len],
        _ => key,
    }
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0, not reflected, no
/// final xor): the CRC Redis Cluster hashes keys with.
pub fn crc16_xmodem(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        let index = usize::from((crc >> 8) ^ u16::from(byte));
        (crc << 8) ^ CRC16_TABLE[index]
    })
}

/// The CRC of each byte value alone, from the polynomial (built at compile
/// time, so it cannot drift from it).
const CRC16_TABLE: [u16; 256] = crc16_table();

const fn crc16_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The CRC bit by bit, straight from the definition: what the table
    /// must agree with.
    fn crc16_bitwise(bytes: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &byte in bytes {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    #[test]
    fn crc16_has_the_xmodem_check_value() {
        // The catalogue's check value of CRC-16/XMODEM, also the one in
        // Redis's crc16.c.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(crc16_xmodem(b""), 0);
    }

    #[test]
    fn slots_are_the_ones_redis_gives() {
        // What `redis-cli CLUSTER KEYSLOT` answered, from a Redis 7.0.15
        // started with `--cluster-enabled yes`.
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"bar", 5061),
            (b"hello", 866),
            (b"", 0),
            (b"key:000000000000000", 7884),
            (b"{user1000}.following", 3443),
            (b"{user1000}.followers", 3443),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"{}", 15257),
        ] {
            assert_eq!(
                key_slot(key).get(),
                slot,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn a_hash_tag_is_hashed_alone() {
        assert_eq!(hashed_part(b"{user1000}.following"), b"user1000");
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"x{user1000}y"), key_slot(b"user1000"));
        // Only the first `{` counts, and the first `}` after it.
        assert_eq!(hashed_part(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hashed_part(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hashed_part(b"}x{y}"), b"y");
    }

    #[test]
    fn without_a_tag_the_whole_key_is_hashed() {
        for key in [
            &b"{}"[..],
            b"foo{}{bar}",
            b"{",
            b"foo{bar",
            b"}foo{",
            b"plain",
        ] {
            assert_eq!(hashed_part(key), key, "{}", String::from_utf8_lossy(key));
            assert_eq!(key_slot(key).get(), crc16_xmodem(key) % SLOT_COUNT);
        }
    }

    #[test]
    fn slot_bounds() {
        assert_eq!(Slot::new(0).map(Slot::get), Some(0));
        assert_eq!(Slot::new(SLOT_COUNT - 1), Some(LAST_SLOT));
        assert_eq!(Slot::new(SLOT_COUNT), None);
        assert_eq!(Slot::new(u16::MAX), None);
    }

    #[test]
    fn a_slot_out_of_range_does_not_decode() {
        let bytes = postcard::to_allocvec(&SLOT_COUNT).unwrap();
        assert!(crate::wire::decode_exact::<Slot>(&bytes).is_err());
        let bytes = postcard::to_allocvec(&LAST_SLOT).unwrap();
        assert_eq!(
            crate::wire::decode_exact::<Slot>(&bytes).unwrap(),
            LAST_SLOT
        );
    }

    proptest! {
        #[test]
        fn the_table_agrees_with_the_definition(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(crc16_xmodem(&bytes), crc16_bitwise(&bytes));
        }

        #[test]
        fn keys_sharing_a_tag_share_a_slot(
            tag in proptest::collection::vec(any::<u8>().prop_filter("no brace", |b| *b != b'}'), 1..16),
            prefix in proptest::collection::vec(any::<u8>().prop_filter("no brace", |b| *b != b'{'), 0..16),
            suffix in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut key = prefix;
            key.push(b'{');
            key.extend_from_slice(&tag);
            key.push(b'}');
            key.extend_from_slice(&suffix);
            prop_assert_eq!(key_slot(&key), key_slot(&tag));
        }
    }
}
