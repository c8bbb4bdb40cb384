//! Data blocks: self-describing, immutable once published.
//!
//! ```text
//! offset size field
//!  0     4    crc32      CRC-32 (crc32fast, IEEE) of bytes 4 .. 32 + key_len + value_len
//!  4     4    key_len    u32 LE
//!  8     4    value_len  u32 LE
//! 12     4    magic      "RKB2"
//! 16     8    version    u64 LE: the Raft log index that wrote this value, >= 1
//! 24     8    deadline   u64 LE: unix milliseconds at which the pair expires
//!                        (wall clock, chosen by the leader); 0 = never
//! 32     ..   key bytes, then value bytes, then zero padding to the size class
//! ```
//!
//! The deadline is in the block, not beside it, so that every reader (local,
//! shm, RDMA) learns it in the same copy that gives the value, and the CRC
//! vouches for it: a key is never served past its deadline because a reader
//! saw a value without the expiry that belongs to it.
//!
//! The CRC covers the lengths, the version and the deadline, so a reader that copies a block
//! while the writer reuses its space (after the grace period) sees a mismatch
//! instead of a value stitched from two writes.
//!
//! Before a slot moves away from a block, the writer clears the block's
//! invalidation word (value_len and magic, bytes 8..16) with one atomic store;
//! a reader then finds it [`BlockError::Invalidated`] and reads the slot again.
//! It then revokes the CRC word (crc and key_len, bytes 0..8: the CRC
//! inverted, [`revoked_crc_word`]): when the freed block is later reused for
//! a pair of the same lengths, the reusing writer's stores put back the same
//! value_len and magic, and a reader copying the block mid-write (an index
//! cache's old location) would otherwise find the old pair whole and valid.

use bytes::Bytes;

use crate::region::error::BlockError;
use crate::region::size_class::UNIT_BYTES;
use crate::wire::Versioned;

/// Byte offsets of the block header's fields, each defined by the one before
/// it and that one's size, so the header has no gaps by construction.
pub mod block_field {
    const U32_BYTES: usize = 4;
    pub const CRC: usize = 0;
    pub const KEY_LEN: usize = CRC + U32_BYTES;
    pub const VALUE_LEN: usize = KEY_LEN + U32_BYTES;
    pub const MAGIC: usize = VALUE_LEN + U32_BYTES;
    pub const VERSION: usize = MAGIC + U32_BYTES;
    pub const DEADLINE: usize = VERSION + size_of::<u64>();
    /// The key bytes, then the value bytes.
    pub const KEY: usize = DEADLINE + size_of::<u64>();
}

pub const BLOCK_HEADER_BYTES: usize = block_field::KEY;
/// "RKB2": layout 4 added the deadline (layout 3's blocks were "RKB1").
pub const BLOCK_MAGIC: u32 = u32::from_le_bytes(*b"RKB2");
/// The 8-aligned word (value_len and magic) the writer stores
/// [`INVALIDATED_WORD`] into to take a block out of service.
pub const INVALIDATION_WORD_OFFSET: u64 = block_field::VALUE_LEN as u64;
pub const INVALIDATED_WORD: u64 = 0;
/// The 8-aligned word (crc and key_len) that invalidation revokes second.
pub const CRC_WORD_OFFSET: u64 = block_field::CRC as u64;
/// The magic an invalidated block shows.
const INVALIDATED_MAGIC: u32 = INVALIDATED_WORD as u32;

// The documented layout: 32 header bytes, the CRC covering from byte 4.
const _: () = assert!(BLOCK_HEADER_BYTES == 32 && block_field::KEY_LEN == 4);
// The header fits the smallest block, and the invalidation word is one
// aligned atomic store (blocks are unit aligned) that covers the magic.
const _: () = assert!(BLOCK_HEADER_BYTES as u64 <= UNIT_BYTES);
const _: () = assert!(INVALIDATION_WORD_OFFSET.is_multiple_of(8));
const _: () = assert!(INVALIDATION_WORD_OFFSET <= block_field::MAGIC as u64);
const _: () = assert!(block_field::MAGIC as u64 + 4 <= INVALIDATION_WORD_OFFSET + 8);
const _: () = assert!(BLOCK_MAGIC != INVALIDATED_MAGIC);
// The CRC word holds the CRC and key_len, apart from the invalidation word.
const _: () = assert!(CRC_WORD_OFFSET == 0 && block_field::KEY_LEN == 4);
const _: () = assert!(CRC_WORD_OFFSET + 8 <= INVALIDATION_WORD_OFFSET);

/// What invalidation stores into the CRC word of a block with `header`: the
/// same key_len and the CRC inverted, which no content of the old block can
/// match, so the old pair never validates again.
pub fn revoked_crc_word(header: &BlockHeader) -> u64 {
    let mut word = [0u8; 8];
    word[..4].copy_from_slice(&(!header.crc).to_le_bytes());
    word[4..].copy_from_slice(&header.key_len.to_le_bytes());
    u64::from_le_bytes(word)
}

/// Size of the encoded block before padding to its size class.
pub fn encoded_block_bytes(key_len: usize, value_len: usize) -> u64 {
    BLOCK_HEADER_BYTES as u64 + key_len as u64 + value_len as u64
}

/// A pair's deadline: unix milliseconds on the wall clock at which it
/// expires, or [`NO_DEADLINE`].
pub type DeadlineUnixMs = u64;
/// The deadline of a pair that never expires.
pub const NO_DEADLINE: DeadlineUnixMs = 0;

/// The default bound on the clock error between two hosts (or a leader and
/// a reader) that leases and key expiry assume: a lease serves only while it
/// runs this much past now, and a pair counts as expired this much before
/// its deadline.
pub const DEFAULT_MAX_CLOCK_DRIFT_MS: u64 = 50;

/// How much before its deadline apply (on the apply clock) and the servers'
/// own reads (on their wall clocks) count a pair expired: the default clock
/// drift bound, so that every path of one host uses one rule (a read that
/// found a key gone is not followed *in time* by a write stamped later that
/// finds it there; in log order it can be, as a write is stamped when
/// proposed and ordered when committed: the linearizability model in
/// `tests/src/linearizability.rs` allows exactly that), and a reader whose
/// clock is behind the leader's by up to the bound still never serves it
/// past its deadline. Part of the apply rules: every replica must use the
/// same value.
pub const EXPIRY_MARGIN_MS: u64 = DEFAULT_MAX_CLOCK_DRIFT_MS;

/// Whether a pair with `deadline` has expired at `now_unix_ms`: from its
/// deadline on (Redis: a key with 1 ms left is still there, one at 0 is not).
pub fn expired_at(deadline: DeadlineUnixMs, now_unix_ms: u64) -> bool {
    deadline != NO_DEADLINE && deadline <= now_unix_ms
}

/// Whether a pair with `deadline` counts as expired at `now_unix_ms` on a
/// path that keeps `margin_ms` (see [`EXPIRY_MARGIN_MS`]).
pub fn expired_within(deadline: DeadlineUnixMs, now_unix_ms: u64, margin_ms: u64) -> bool {
    expired_at(deadline, now_unix_ms.saturating_add(margin_ms))
}

/// Encodes a block into `out` (cleared first). The caller pads to its class.
/// Lengths must fit u32; the writer checks its configured limits before this.
pub fn encode_block(
    key: &[u8],
    value: &[u8],
    version: u64,
    deadline: DeadlineUnixMs,
    out: &mut Vec<u8>,
) {
    debug_assert!(u32::try_from(key.len()).is_ok() && u32::try_from(value.len()).is_ok());
    out.clear();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&BLOCK_MAGIC.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&deadline.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let crc = crc32fast::hash(&out[block_field::KEY_LEN..]);
    out[..block_field::KEY_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// The fixed-size prefix of a block, enough to learn how much more to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    pub crc: u32,
    pub key_len: u32,
    pub value_len: u32,
    pub version: u64,
    pub deadline: DeadlineUnixMs,
}

impl BlockHeader {
    /// Decodes the prefix; checks magic and version, not the CRC (which needs
    /// the whole block). `max_key_bytes`/`max_value_bytes` bound what a reader
    /// will agree to fetch next.
    pub fn decode(
        bytes: &[u8],
        max_key_bytes: u32,
        max_value_bytes: u32,
    ) -> Result<BlockHeader, BlockError> {
        let Some(head) = bytes.get(..BLOCK_HEADER_BYTES) else {
            return Err(BlockError::Truncated {
                len: bytes.len(),
                need: BLOCK_HEADER_BYTES,
            });
        };
        let word32 = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&head[at..at + 4]);
            u32::from_le_bytes(b)
        };
        match word32(block_field::MAGIC) {
            BLOCK_MAGIC => {}
            INVALIDATED_MAGIC => return Err(BlockError::Invalidated),
            found => return Err(BlockError::BadMagic { found }),
        }
        let word64 = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let header = BlockHeader {
            crc: word32(block_field::CRC),
            key_len: word32(block_field::KEY_LEN),
            value_len: word32(block_field::VALUE_LEN),
            version: word64(block_field::VERSION),
            deadline: word64(block_field::DEADLINE),
        };
        if header.key_len > max_key_bytes || header.value_len > max_value_bytes {
            return Err(BlockError::Length {
                key_len: header.key_len,
                value_len: header.value_len,
                available: bytes.len(),
            });
        }
        if header.version == 0 {
            return Err(BlockError::ZeroVersion);
        }
        Ok(header)
    }

    pub fn total_bytes(&self) -> u64 {
        encoded_block_bytes(self.key_len as usize, self.value_len as usize)
    }
}

/// A validated block borrowed from the bytes a reader copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub version: u64,
    pub deadline: DeadlineUnixMs,
}

impl<'a> BlockRef<'a> {
    /// Validates a whole block (header, lengths against what was read, CRC).
    /// `bytes` may extend past the block (the reader reads whole size classes).
    pub fn validate(
        bytes: &'a [u8],
        max_key_bytes: u32,
        max_value_bytes: u32,
    ) -> Result<BlockRef<'a>, BlockError> {
        let limits = (max_key_bytes, max_value_bytes);
        let header = match check_pieces(bytes, &[], limits)? {
            Pieces::Whole(header) => header,
            Pieces::Beyond { header } => return Err(header.length_error(bytes.len())),
        };
        let key_end = BLOCK_HEADER_BYTES + header.key_len as usize;
        let end = key_end + header.value_len as usize;
        Ok(BlockRef {
            key: &bytes[BLOCK_HEADER_BYTES..key_end],
            value: &bytes[key_end..end],
            version: header.version,
            deadline: header.deadline,
        })
    }
}

impl BlockHeader {
    fn length_error(&self, available: usize) -> BlockError {
        BlockError::Length {
            key_len: self.key_len,
            value_len: self.value_len,
            available,
        }
    }
}

/// What [`check_pieces`] found.
enum Pieces {
    /// The block ends inside the pieces and its CRC matches.
    Whole(BlockHeader),
    /// The header decodes but the block goes on past the pieces (not
    /// checked any further).
    Beyond { header: BlockHeader },
}

/// The checks of every block read, over the block's bytes given as two
/// consecutive pieces (`head` from the block's start, at least the header;
/// then `tail`): magic, lengths within the limits, version, CRC. The one
/// implementation of the rules: a contiguous copy is `(bytes, [])`.
fn check_pieces(head: &[u8], tail: &[u8], limits: (u32, u32)) -> Result<Pieces, BlockError> {
    let header = BlockHeader::decode(head, limits.0, limits.1)?;
    // In u64 so that even u32::MAX lengths cannot overflow on any target.
    let available = head.len() as u64 + tail.len() as u64;
    let end = header.total_bytes();
    if end > available {
        return Ok(Pieces::Beyond { header });
    }
    // Both fit in memory (they are within `available`).
    let end = end as usize;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[block_field::KEY_LEN..end.min(head.len())]);
    if end > head.len() {
        crc.update(&tail[..end - head.len()]);
    }
    let computed = crc.finalize();
    if computed != header.crc {
        return Err(BlockError::Checksum {
            stored: header.crc,
            computed,
        });
    }
    Ok(Pieces::Whole(header))
}

/// What a block read in two pieces turned out to be (see [`examine_split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitVerdict {
    /// A whole block of the key; its value is the first `value_len` bytes
    /// of the tail.
    Match {
        value_len: usize,
        version: u64,
        deadline: DeadlineUnixMs,
    },
    /// A whole block of another key.
    OtherKey,
    /// Not a whole block: torn or corrupt.
    Torn(BlockError),
    /// The block (if its header is true) goes on past the pieces read:
    /// read it whole to judge it.
    Unread,
}

/// Judges a block a reader copied in two pieces from consecutive region
/// bytes: `head` = the block's first `BLOCK_HEADER_BYTES + key.len()` bytes
/// (where `key` is, if this is its block), `tail` = the bytes after them
/// (where its value is). So a value can land straight in a caller's buffer
/// and still be checked by exactly the rules of [`BlockRef::validate`].
pub fn examine_split(key: &[u8], head: &[u8], tail: &[u8], limits: (u32, u32)) -> SplitVerdict {
    match check_pieces(head, tail, limits) {
        Ok(Pieces::Whole(header)) => {
            let key_matches =
                header.key_len as usize == key.len() && head.get(BLOCK_HEADER_BYTES..) == Some(key);
            if key_matches {
                SplitVerdict::Match {
                    value_len: header.value_len as usize,
                    version: header.version,
                    deadline: header.deadline,
                }
            } else {
                SplitVerdict::OtherKey
            }
        }
        Ok(Pieces::Beyond { .. }) => SplitVerdict::Unread,
        Err(error) => SplitVerdict::Torn(error),
    }
}

/// Where a validated block's value lies, so that the block's buffer becomes
/// the returned `Bytes` without a second copy.
#[derive(Debug, Clone, Copy)]
pub struct ValueShape {
    start: usize,
    len: usize,
    pub version: u64,
    pub deadline: DeadlineUnixMs,
}

impl ValueShape {
    pub fn of(block: &BlockRef<'_>) -> ValueShape {
        ValueShape {
            start: BLOCK_HEADER_BYTES + block.key.len(),
            len: block.value.len(),
            version: block.version,
            deadline: block.deadline,
        }
    }

    /// The value, sharing `block`'s allocation (`block` holds the bytes the
    /// shape was taken from).
    pub fn take(self, block: Vec<u8>) -> Versioned {
        Versioned {
            value: Bytes::from(block).slice(self.start..self.start + self.len),
            version: self.version,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(key in proptest::collection::vec(any::<u8>(), 0..64),
                      value in proptest::collection::vec(any::<u8>(), 0..512),
                      version in 1u64.., deadline in any::<u64>(), pad in 0usize..64) {
            let mut buf = Vec::new();
            encode_block(&key, &value, version, deadline, &mut buf);
            prop_assert_eq!(buf.len() as u64, encoded_block_bytes(key.len(), value.len()));
            buf.resize(buf.len() + pad, 0);
            let block = BlockRef::validate(&buf, 64, 512).unwrap();
            prop_assert_eq!(block.key, &key[..]);
            prop_assert_eq!(block.value, &value[..]);
            prop_assert_eq!(block.version, version);
            prop_assert_eq!(block.deadline, deadline);
        }

        #[test]
        fn any_flipped_bit_in_the_block_is_detected(
            key in proptest::collection::vec(any::<u8>(), 1..32),
            value in proptest::collection::vec(any::<u8>(), 0..256),
            version in 1u64..,
            deadline in any::<u64>(),
            bit in any::<proptest::sample::Index>()) {
            let mut buf = Vec::new();
            encode_block(&key, &value, version, deadline, &mut buf);
            let bit = bit.index(buf.len() * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(BlockRef::validate(&buf, 1024, 1 << 20).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = BlockRef::validate(&bytes, 1024, 1 << 20);
            let _ = BlockHeader::decode(&bytes, u32::MAX, u32::MAX);
            let _ = BlockRef::validate(&bytes, u32::MAX, u32::MAX);
        }
    }

    #[test]
    fn a_revoked_crc_word_keeps_the_key_length_and_fails_the_old_pair() {
        let mut buf = Vec::new();
        encode_block(b"key", b"value", 9, NO_DEADLINE, &mut buf);
        let header = BlockHeader::decode(&buf, 64, 64).unwrap();
        let at = CRC_WORD_OFFSET as usize;
        buf[at..at + 8].copy_from_slice(&revoked_crc_word(&header).to_le_bytes());
        let revoked = BlockHeader::decode(&buf, 64, 64).unwrap();
        assert_eq!(revoked.key_len, 3);
        assert_eq!(revoked.crc, !header.crc);
        assert_eq!(
            BlockRef::validate(&buf, 64, 64),
            Err(BlockError::Checksum {
                stored: !header.crc,
                computed: header.crc,
            })
        );
    }

    #[test]
    fn a_cleared_invalidation_word_is_the_invalidated_verdict() {
        let mut buf = Vec::new();
        encode_block(b"key", b"value", 9, NO_DEADLINE, &mut buf);
        let at = INVALIDATION_WORD_OFFSET as usize;
        buf[at..at + 8].copy_from_slice(&INVALIDATED_WORD.to_le_bytes());
        assert_eq!(
            BlockRef::validate(&buf, 64, 64),
            Err(BlockError::Invalidated)
        );
        buf[block_field::MAGIC] = 1;
        assert!(matches!(
            BlockRef::validate(&buf, 64, 64),
            Err(BlockError::BadMagic { found: 1 })
        ));
    }

    #[test]
    fn the_value_shape_takes_the_value_out_of_the_block() {
        let mut buf = Vec::new();
        encode_block(b"key", b"value", 9, NO_DEADLINE, &mut buf);
        buf.resize(64, 0);
        let shape = ValueShape::of(&BlockRef::validate(&buf, 64, 64).unwrap());
        let taken = shape.take(buf);
        assert_eq!(&taken.value[..], b"value");
        assert_eq!(taken.version, 9);
    }

    #[test]
    fn a_pair_expires_at_its_deadline_and_one_without_never() {
        assert!(!expired_at(NO_DEADLINE, u64::MAX));
        assert!(!expired_at(1_000, 999));
        assert!(expired_at(1_000, 1_000));
        assert!(expired_at(1_000, 1_001));
    }

    #[test]
    fn a_margin_makes_a_pair_expire_that_much_earlier() {
        assert!(!expired_within(1_000, 949, 50));
        assert!(expired_within(1_000, 950, 50));
        assert!(!expired_within(NO_DEADLINE, u64::MAX, 50));
        assert!(expired_within(1_000, u64::MAX, u64::MAX), "saturates");
    }

    proptest! {
        #[test]
        fn a_split_read_judges_exactly_as_a_whole_one(
            key in proptest::collection::vec(any::<u8>(), 0..16),
            asked in proptest::collection::vec(any::<u8>(), 0..16),
            value in proptest::collection::vec(any::<u8>(), 0..200),
            version in 0u64..3,
            bit in proptest::option::of(0usize..2000),
            tail_room in 0usize..260) {
            let mut buf = Vec::new();
            encode_block(&key, &value, version, NO_DEADLINE, &mut buf);
            buf.resize(buf.len() + 40, 0);
            if let Some(bit) = bit.filter(|b| b / 8 < buf.len()) {
                buf[bit / 8] ^= 1 << (bit % 8);
            }
            let split = (BLOCK_HEADER_BYTES + asked.len()).min(buf.len());
            let (head, rest) = buf.split_at(split);
            let tail = &rest[..tail_room.min(rest.len())];
            let whole = BlockRef::validate(&buf[..split + tail.len()], 64, 512);
            let verdict = examine_split(&asked, head, tail, (64, 512));
            match (whole, verdict) {
                (Ok(block), SplitVerdict::Match { value_len, version, .. }) => {
                    prop_assert_eq!(block.key, &asked[..]);
                    prop_assert_eq!(block.value, &tail[..value_len]);
                    prop_assert_eq!(block.version, version);
                }
                (Ok(block), SplitVerdict::OtherKey) => prop_assert_ne!(block.key, &asked[..]),
                (Err(BlockError::Length { .. }), SplitVerdict::Unread) => {}
                (Err(a), SplitVerdict::Torn(b)) => {
                    prop_assert_eq!(std::mem::discriminant(&a), std::mem::discriminant(&b));
                }
                (whole, split) => prop_assert!(false, "{:?} vs {:?}", whole, split),
            }
        }
    }

    #[test]
    fn lengths_beyond_the_read_are_refused() {
        let mut buf = Vec::new();
        encode_block(b"k", b"value", 3, NO_DEADLINE, &mut buf);
        buf.truncate(buf.len() - 1);
        assert!(matches!(
            BlockRef::validate(&buf, 64, 64),
            Err(BlockError::Length { .. })
        ));
        let (head, tail) = buf.split_at(BLOCK_HEADER_BYTES + 1);
        assert_eq!(
            examine_split(b"k", head, tail, (64, 64)),
            SplitVerdict::Unread
        );
    }
}
