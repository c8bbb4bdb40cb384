//! The region header: the first 4 KiB of every region.
//!
//! Static part (written once when the region is created, CRC-protected):
//!
//! | offset | field | notes |
//! |---|---|---|
//! | 0 | magic | `b"RDKVREGN"` as u64 LE |
//! | 8 | layout_version | [`REGION_LAYOUT_VERSION`] |
//! | 16 | region_epoch | changes whenever a region is rebuilt (snapshot install) |
//! | 24 | node_id | owner |
//! | 32 | region_bytes | length of the whole mapping |
//! | 40 | index_offset | always [`HEADER_BYTES`] |
//! | 48 | bucket_count | 64-byte buckets |
//! | 56 | neighbourhood_buckets | buckets a key may live in (from its home bucket) |
//! | 64 | data_offset | 4 KiB aligned |
//! | 72 | data_bytes | multiple of 64 |
//! | 80, 88 | hash_seed | SipHash-1-3 keys |
//! | 96 | max_key_bytes | |
//! | 104 | max_value_bytes | |
//! | 112 | grace_period_us | a freed block is not reused before this |
//! | 120 | static_crc | CRC-32 of bytes 0..120 (low 32 bits) |
//!
//! Dynamic part: each field is one aligned u64 updated with a single atomic
//! store, so a reader sees each field whole (but not necessarily all fields from
//! the same instant: consistency rules never need two of them to agree).
//!
//! | offset | field | notes |
//! |---|---|---|
//! | 128 | raft_term | |
//! | 136 | applied_index | last Raft log index applied to this region |
//! | 144 | applied_at_unix_us | wall clock when `applied_index` was stored |
//! | 152 | leader_lease | 0: not leader; else the lease deadline, unix µs (never 0) |
//! | 160 | region_state | 1 serving, 2 retired (re-attach) |
//! | 168 | leader_lease_boottime | 0: not leader; else the same deadline on the owner host's `CLOCK_BOOTTIME`, µs (never 0) |
//!
//! The index after the header is `bucket_count` buckets of 8 slot words
//! (`slot`); since layout version 3 a bucket's last slot may link to an
//! overflow table in the data area (`overflow`), which readers must follow
//! before they call a key absent.
//!
//! The lease is published on two clocks ([`LeaseDeadline`]): readers on
//! other hosts compare the wall-clock word with their own wall clock (safe
//! while the clocks differ by less than the drift they allow for), readers
//! on the owner's host the boottime word with the same boottime clock, which
//! a wall-clock step cannot move.

use crate::region::block::{BlockHeader, BlockRef, encoded_block_bytes};
use crate::region::error::{BlockError, HeaderError, SlotError};
use crate::region::hash::{HashSeed, KeyHash};
use crate::region::neighbourhood::MAX_NEIGHBOURHOOD_BUCKETS;
use crate::region::size_class::{SizeClass, UNIT_BYTES};
use crate::region::slot::{BUCKET_BYTES, MAX_DATA_UNITS, OverflowLink, SLOTS_PER_BUCKET, Slot};

pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"RDKVREGN");
/// 2: the boottime lease word (168).
/// 3: link slot words and overflow tables (a full neighbourhood spills into
/// its home bucket's chain; see `overflow`); a v2 reader would take a key in
/// a table for absent, so it must refuse the region.
/// 4: the block's deadline (key expiry); a v3 reader would serve expired
/// pairs, so it must refuse the region.
pub const REGION_LAYOUT_VERSION: u64 = 4;
/// The header occupies the first page; the index starts right after it.
pub const HEADER_BYTES: u64 = 4096;
/// Bytes covered by `static_crc`.
pub const STATIC_HEADER_BYTES: usize = static_word::STATIC_CRC;
/// The static part as stored: the covered bytes and the CRC word.
pub const STATIC_ENCODED_BYTES: usize = static_word::STATIC_CRC + WORD_BYTES;
/// Bytes a reader needs to decode the whole header (static + dynamic words).
pub const HEADER_USED_BYTES: usize = dynamic_word::LEADER_LEASE_BOOTTIME as usize + WORD_BYTES;
const DATA_ALIGN_BYTES: u64 = 4096;
/// Every header field is one little-endian u64.
const WORD_BYTES: usize = 8;

/// Byte offsets of the static words (written once, covered by the CRC).
pub mod static_word {
    pub const MAGIC: usize = 0;
    pub const LAYOUT_VERSION: usize = 8;
    pub const REGION_EPOCH: usize = 16;
    pub const NODE_ID: usize = 24;
    pub const REGION_BYTES: usize = 32;
    pub const INDEX_OFFSET: usize = 40;
    pub const BUCKET_COUNT: usize = 48;
    pub const NEIGHBOURHOOD_BUCKETS: usize = 56;
    pub const DATA_OFFSET: usize = 64;
    pub const DATA_BYTES: usize = 72;
    pub const HASH_SEED_0: usize = 80;
    pub const HASH_SEED_1: usize = 88;
    pub const MAX_KEY_BYTES: usize = 96;
    pub const MAX_VALUE_BYTES: usize = 104;
    pub const GRACE_PERIOD_US: usize = 112;
    /// CRC-32 of every byte before it, in the low 32 bits.
    pub const STATIC_CRC: usize = 120;
}

/// Byte offsets of the dynamic words.
pub mod dynamic_word {
    pub const RAFT_TERM: u64 = 128;
    pub const APPLIED_INDEX: u64 = 136;
    pub const APPLIED_AT_UNIX_US: u64 = 144;
    pub const LEADER_LEASE: u64 = 152;
    pub const REGION_STATE: u64 = 160;
    pub const LEADER_LEASE_BOOTTIME: u64 = 168;
}

// The CRC is the last static word; the dynamic words follow the static part,
// each aligned for a single atomic access, and all of it fits the header page.
const _: () = assert!(static_word::GRACE_PERIOD_US + WORD_BYTES == static_word::STATIC_CRC);
const _: () = assert!(STATIC_ENCODED_BYTES as u64 <= dynamic_word::RAFT_TERM);
const _: () = assert!(words_in_order(&[
    dynamic_word::RAFT_TERM,
    dynamic_word::APPLIED_INDEX,
    dynamic_word::APPLIED_AT_UNIX_US,
    dynamic_word::LEADER_LEASE,
    dynamic_word::REGION_STATE,
    dynamic_word::LEADER_LEASE_BOOTTIME,
]));
const _: () = assert!(HEADER_USED_BYTES as u64 <= HEADER_BYTES);

/// Whether each offset is word aligned and past the word before it.
const fn words_in_order(offsets: &[u64]) -> bool {
    let mut i = 0;
    while i < offsets.len() {
        let aligned = offsets[i].is_multiple_of(WORD_BYTES as u64);
        if !aligned || (i > 0 && offsets[i] < offsets[i - 1] + WORD_BYTES as u64) {
            return false;
        }
        i += 1;
    }
    true
}
const _: () = assert!(HEADER_BYTES.is_multiple_of(BUCKET_BYTES));

/// Bucket counts from which [`bucket_count_for`] adds buckets for a power
/// of two of homes (the small indexes of tests keep exactly what they ask
/// for).
const POWER_OF_TWO_HOMES_FROM: u64 = 1024;

/// The index's bucket count for a region of `region_bytes` with one slot
/// per `bytes_per_slot` and neighbourhoods of `neighbourhood_buckets`: the
/// slots' buckets (at least one neighbourhood), and, when that is a power
/// of two (the default for a region of a power-of-two size),
/// `neighbourhood_buckets - 1` more. Why: a key's home bucket is its hash
/// modulo `bucket_count - neighbourhood_buckets + 1` (the homes), and with
/// a power of two of homes every reader computes it with a mask instead of
/// a 64-bit division per GET (`KeyHash::new`). The count is the header's,
/// so readers of any version compute the same homes. The one rule: the
/// server's regions and the bench's floor take it from here.
pub fn bucket_count_for(region_bytes: u64, bytes_per_slot: u64, neighbourhood_buckets: u64) -> u64 {
    let slots = region_bytes / bytes_per_slot.max(1);
    let buckets = (slots / SLOTS_PER_BUCKET as u64).max(neighbourhood_buckets);
    if buckets >= POWER_OF_TWO_HOMES_FROM && buckets.is_power_of_two() {
        buckets.saturating_add(neighbourhood_buckets.saturating_sub(1))
    } else {
        buckets
    }
}

/// What the creator of a region chooses; [`RegionLayout::plan`] derives the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutParams {
    pub region_bytes: u64,
    pub bucket_count: u64,
    pub neighbourhood_buckets: u64,
    pub region_epoch: u64,
    pub node_id: u64,
    pub hash_seed: HashSeed,
    pub max_key_bytes: u32,
    pub max_value_bytes: u32,
    pub grace_period_us: u64,
}

impl LayoutParams {
    /// A small valid geometry (1 MiB, 512 buckets of 2-bucket neighbourhoods)
    /// for the layout tests here and in `tests/`, which cannot see
    /// `cfg(test)` items; not for real regions.
    #[doc(hidden)]
    pub const fn for_tests() -> LayoutParams {
        LayoutParams {
            region_bytes: 1 << 20,
            bucket_count: 512,
            neighbourhood_buckets: 2,
            region_epoch: 7,
            node_id: 3,
            hash_seed: HashSeed(11, 12),
            max_key_bytes: 1024,
            max_value_bytes: 64 * 1024,
            grace_period_us: 250_000,
        }
    }
}

/// The validated static header: everything a reader needs to find keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionLayout {
    pub region_epoch: u64,
    pub node_id: u64,
    pub region_bytes: u64,
    pub index_offset: u64,
    pub bucket_count: u64,
    pub neighbourhood_buckets: u64,
    pub data_offset: u64,
    pub data_bytes: u64,
    pub hash_seed: HashSeed,
    pub max_key_bytes: u32,
    pub max_value_bytes: u32,
    pub grace_period_us: u64,
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; WORD_BYTES];
    if let Some(src) = bytes.get(at..at + WORD_BYTES) {
        word.copy_from_slice(src);
    }
    u64::from_le_bytes(word)
}

impl RegionLayout {
    /// Lays out a region: index right after the header, data area after the
    /// index (page aligned) to the end of the region.
    pub fn plan(p: LayoutParams) -> Result<RegionLayout, HeaderError> {
        let index_bytes = p
            .bucket_count
            .checked_mul(BUCKET_BYTES)
            .ok_or(HeaderError::Geometry("index too large"))?;
        let data_offset = HEADER_BYTES
            .checked_add(index_bytes)
            .and_then(|end| end.checked_next_multiple_of(DATA_ALIGN_BYTES))
            .ok_or(HeaderError::Geometry("index too large"))?;
        let data_bytes = p
            .region_bytes
            .checked_sub(data_offset)
            .ok_or(HeaderError::Geometry("region too small for its index"))?
            / UNIT_BYTES
            * UNIT_BYTES;
        let layout = RegionLayout {
            region_epoch: p.region_epoch,
            node_id: p.node_id,
            region_bytes: p.region_bytes,
            index_offset: HEADER_BYTES,
            bucket_count: p.bucket_count,
            neighbourhood_buckets: p.neighbourhood_buckets,
            data_offset,
            data_bytes,
            hash_seed: p.hash_seed,
            max_key_bytes: p.max_key_bytes,
            max_value_bytes: p.max_value_bytes,
            grace_period_us: p.grace_period_us,
        };
        layout.check_geometry()?;
        Ok(layout)
    }

    fn check_geometry(&self) -> Result<(), HeaderError> {
        use HeaderError::Geometry;
        if self.index_offset != HEADER_BYTES {
            return Err(Geometry("index must start right after the header"));
        }
        if !(1..=MAX_NEIGHBOURHOOD_BUCKETS).contains(&self.neighbourhood_buckets) {
            return Err(Geometry("neighbourhood must be 1..=8 buckets"));
        }
        if self.bucket_count < self.neighbourhood_buckets {
            return Err(Geometry("fewer buckets than one neighbourhood"));
        }
        let index_end = self
            .bucket_count
            .checked_mul(BUCKET_BYTES)
            .and_then(|b| b.checked_add(self.index_offset))
            .ok_or(Geometry("index too large"))?;
        if self.data_offset < index_end || !self.data_offset.is_multiple_of(DATA_ALIGN_BYTES) {
            return Err(Geometry("data area overlaps the index or is unaligned"));
        }
        let data_end = self
            .data_offset
            .checked_add(self.data_bytes)
            .ok_or(Geometry("data area too large"))?;
        if data_end > self.region_bytes || !self.data_bytes.is_multiple_of(UNIT_BYTES) {
            return Err(Geometry("data area outside the region"));
        }
        if self.data_bytes / UNIT_BYTES > MAX_DATA_UNITS {
            return Err(Geometry("data area larger than a slot can address"));
        }
        if self.data_bytes == 0 {
            return Err(Geometry("empty data area"));
        }
        if self.max_class().is_none() {
            return Err(Geometry("max key + value exceed the largest block"));
        }
        Ok(())
    }

    /// The static part as stored in the region, CRC included.
    pub fn encode_static(&self) -> [u8; STATIC_ENCODED_BYTES] {
        use static_word as at;
        let words = [
            (at::MAGIC, REGION_MAGIC),
            (at::LAYOUT_VERSION, REGION_LAYOUT_VERSION),
            (at::REGION_EPOCH, self.region_epoch),
            (at::NODE_ID, self.node_id),
            (at::REGION_BYTES, self.region_bytes),
            (at::INDEX_OFFSET, self.index_offset),
            (at::BUCKET_COUNT, self.bucket_count),
            (at::NEIGHBOURHOOD_BUCKETS, self.neighbourhood_buckets),
            (at::DATA_OFFSET, self.data_offset),
            (at::DATA_BYTES, self.data_bytes),
            (at::HASH_SEED_0, self.hash_seed.0),
            (at::HASH_SEED_1, self.hash_seed.1),
            (at::MAX_KEY_BYTES, u64::from(self.max_key_bytes)),
            (at::MAX_VALUE_BYTES, u64::from(self.max_value_bytes)),
            (at::GRACE_PERIOD_US, self.grace_period_us),
        ];
        let mut out = [0u8; STATIC_ENCODED_BYTES];
        for (offset, word) in words {
            out[offset..offset + WORD_BYTES].copy_from_slice(&word.to_le_bytes());
        }
        let crc = crc32fast::hash(&out[..STATIC_HEADER_BYTES]);
        out[at::STATIC_CRC..].copy_from_slice(&u64::from(crc).to_le_bytes());
        out
    }

    /// Validates header bytes read from a region (at least the static part).
    pub fn decode(bytes: &[u8]) -> Result<RegionLayout, HeaderError> {
        use static_word as at;
        if bytes.len() < STATIC_ENCODED_BYTES {
            return Err(HeaderError::Truncated {
                len: bytes.len(),
                need: STATIC_ENCODED_BYTES,
            });
        }
        let magic = read_u64(bytes, at::MAGIC);
        if magic != REGION_MAGIC {
            return Err(HeaderError::BadMagic { found: magic });
        }
        let version = read_u64(bytes, at::LAYOUT_VERSION);
        if version != REGION_LAYOUT_VERSION {
            return Err(HeaderError::UnsupportedVersion {
                found: version,
                supported: REGION_LAYOUT_VERSION,
            });
        }
        let stored = read_u64(bytes, at::STATIC_CRC);
        let computed = u64::from(crc32fast::hash(&bytes[..STATIC_HEADER_BYTES]));
        if stored != computed {
            return Err(HeaderError::Checksum { stored, computed });
        }
        let narrow = |offset: usize| {
            u32::try_from(read_u64(bytes, offset))
                .map_err(|_| HeaderError::Geometry("size limit does not fit u32"))
        };
        let layout = RegionLayout {
            region_epoch: read_u64(bytes, at::REGION_EPOCH),
            node_id: read_u64(bytes, at::NODE_ID),
            region_bytes: read_u64(bytes, at::REGION_BYTES),
            index_offset: read_u64(bytes, at::INDEX_OFFSET),
            bucket_count: read_u64(bytes, at::BUCKET_COUNT),
            neighbourhood_buckets: read_u64(bytes, at::NEIGHBOURHOOD_BUCKETS),
            data_offset: read_u64(bytes, at::DATA_OFFSET),
            data_bytes: read_u64(bytes, at::DATA_BYTES),
            hash_seed: HashSeed(
                read_u64(bytes, at::HASH_SEED_0),
                read_u64(bytes, at::HASH_SEED_1),
            ),
            max_key_bytes: narrow(at::MAX_KEY_BYTES)?,
            max_value_bytes: narrow(at::MAX_VALUE_BYTES)?,
            grace_period_us: read_u64(bytes, at::GRACE_PERIOD_US),
        };
        layout.check_geometry()?;
        Ok(layout)
    }

    pub fn key_hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::new(
            self.hash_seed,
            key,
            self.bucket_count,
            self.neighbourhood_buckets,
        )
    }

    /// Region byte range holding the key's neighbourhood: one contiguous read.
    pub fn neighbourhood_range(&self, hash: KeyHash) -> (u64, u64) {
        (
            self.index_offset + hash.home_bucket * BUCKET_BYTES,
            self.neighbourhood_bytes(),
        )
    }

    /// Bytes of every neighbourhood read (at most [`MAX_NEIGHBOURHOOD_BYTES`]).
    ///
    /// [`MAX_NEIGHBOURHOOD_BYTES`]: crate::region::MAX_NEIGHBOURHOOD_BYTES
    pub fn neighbourhood_bytes(&self) -> u64 {
        self.neighbourhood_buckets * BUCKET_BYTES
    }

    /// The largest size class a block of this region can have: a slot naming
    /// a larger class is corrupt, and a reader must not fetch it.
    pub fn max_class(&self) -> Option<SizeClass> {
        SizeClass::for_bytes(encoded_block_bytes(
            self.max_key_bytes as usize,
            self.max_value_bytes as usize,
        ))
    }

    /// The byte range of a slot's block inside the region, refused when the
    /// class exceeds what this region's limits allow or the block lies outside
    /// the data area. Every reader goes through this before fetching a block,
    /// so a corrupt slot can neither send it out of bounds nor make it allocate
    /// more than one maximal block.
    pub fn block_range(&self, slot: Slot) -> Result<(u64, u64), SlotError> {
        if self.max_class().is_none_or(|max| slot.class > max) {
            return Err(SlotError::SizeClass { raw: slot.encode() });
        }
        let (start, len) = slot.block_range(self.data_bytes)?;
        Ok((self.data_offset + start, len))
    }

    /// The byte range of an overflow table inside the region, refused when
    /// it lies outside the data area: a corrupt link cannot send a reader
    /// out of bounds (and a table is at most 4 KiB by construction).
    pub fn table_range(&self, link: OverflowLink) -> Result<(u64, u64), SlotError> {
        let (start, len) = link.table_range(self.data_bytes)?;
        Ok((self.data_offset + start, len))
    }

    /// Whether a key of this length can be stored here at all: a longer key
    /// is absent without a read.
    pub fn admits_key(&self, key: &[u8]) -> bool {
        key.len() <= self.max_key_bytes as usize
    }

    /// A block's fixed prefix, within this region's key and value limits.
    pub fn decode_block_header(&self, bytes: &[u8]) -> Result<BlockHeader, BlockError> {
        BlockHeader::decode(bytes, self.max_key_bytes, self.max_value_bytes)
    }

    /// A whole block read from this region, within its key and value limits.
    pub fn validate_block<'a>(&self, bytes: &'a [u8]) -> Result<BlockRef<'a>, BlockError> {
        BlockRef::validate(bytes, self.max_key_bytes, self.max_value_bytes)
    }

    /// Total index slots.
    pub fn slot_count(&self) -> u64 {
        self.bucket_count * SLOTS_PER_BUCKET as u64
    }
}

/// Whether a region is still the one to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionState {
    Serving,
    Retired,
    Unknown(u64),
}

impl RegionState {
    pub const SERVING: u64 = 1;
    pub const RETIRED: u64 = 2;

    pub fn from_word(word: u64) -> RegionState {
        match word {
            Self::SERVING => RegionState::Serving,
            Self::RETIRED => RegionState::Retired,
            other => RegionState::Unknown(other),
        }
    }
}

/// A leader's lease deadline, published on two clocks (see the module
/// comment): the wall clock, for readers on other hosts, and the owner
/// host's `CLOCK_BOOTTIME`, for readers on that host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseDeadline {
    pub unix_us: u64,
    pub boottime_us: u64,
}

/// The dynamic header words as one reader saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicHeader {
    pub raft_term: u64,
    pub applied_index: u64,
    pub applied_at_unix_us: u64,
    /// `Some(deadline)` while this node is leader with a lease.
    pub lease_deadline_unix_us: Option<u64>,
    pub state: RegionState,
    /// The same deadline on the owner host's boottime clock.
    pub lease_deadline_boottime_us: Option<u64>,
}

/// The dynamic words in order from [`dynamic_word::RAFT_TERM`], as a
/// reader loads them one word each ([`DynamicHeader::from_words`]).
pub const DYNAMIC_WORDS: usize = 6;
pub type DynamicWords = [u64; DYNAMIC_WORDS];
const _: () = assert!(
    dynamic_word::RAFT_TERM + (DYNAMIC_WORDS as u64 - 1) * WORD_BYTES as u64
        == dynamic_word::LEADER_LEASE_BOOTTIME
);

impl DynamicHeader {
    /// The dynamic part of header bytes read from a region (from offset 0,
    /// at least [`HEADER_USED_BYTES`]).
    pub fn decode(bytes: &[u8]) -> Result<DynamicHeader, HeaderError> {
        if bytes.len() < HEADER_USED_BYTES {
            return Err(HeaderError::Truncated {
                len: bytes.len(),
                need: HEADER_USED_BYTES,
            });
        }
        let first = dynamic_word::RAFT_TERM as usize;
        let words = std::array::from_fn(|i| read_u64(bytes, first + i * WORD_BYTES));
        Ok(DynamicHeader::from_words(&words))
    }

    /// The same rules over the dynamic words already loaded (each one
    /// aligned word, read whole): a reader on the per-GET path loads them
    /// directly instead of copying bytes to decode.
    #[inline]
    pub fn from_words(words: &DynamicWords) -> DynamicHeader {
        // Offsets are the constants of `dynamic_word`: the index is in
        // range (asserted above).
        let at =
            |offset: u64| words[((offset - dynamic_word::RAFT_TERM) / WORD_BYTES as u64) as usize];
        let deadline = |offset: u64| Some(at(offset)).filter(|word| *word != 0);
        DynamicHeader {
            raft_term: at(dynamic_word::RAFT_TERM),
            applied_index: at(dynamic_word::APPLIED_INDEX),
            applied_at_unix_us: at(dynamic_word::APPLIED_AT_UNIX_US),
            lease_deadline_unix_us: deadline(dynamic_word::LEADER_LEASE),
            state: RegionState::from_word(at(dynamic_word::REGION_STATE)),
            lease_deadline_boottime_us: deadline(dynamic_word::LEADER_LEASE_BOOTTIME),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plan_encode_decode_round_trips() {
        let layout = RegionLayout::plan(LayoutParams::for_tests()).unwrap();
        assert_eq!(layout.data_offset, 4096 + 512 * 64);
        assert_eq!(layout.data_offset + layout.data_bytes, 1 << 20);
        assert_eq!(RegionLayout::decode(&layout.encode_static()), Ok(layout));
    }

    #[test]
    fn static_words_sit_at_the_documented_offsets() {
        // ARCHITECTURE.md's table: fifteen consecutive words from 0, then the CRC.
        let layout = RegionLayout::plan(LayoutParams::for_tests()).unwrap();
        let bytes = layout.encode_static();
        let word = |i: usize| read_u64(&bytes, i * 8);
        let expected = [
            REGION_MAGIC,
            REGION_LAYOUT_VERSION,
            7,
            3,
            1 << 20,
            HEADER_BYTES,
            512,
            2,
            layout.data_offset,
            layout.data_bytes,
            11,
            12,
            1024,
            64 * 1024,
            250_000,
        ];
        for (i, value) in expected.into_iter().enumerate() {
            assert_eq!(word(i), value, "word {i}");
        }
        let crc = u64::from(crc32fast::hash(&bytes[..120]));
        assert_eq!(word(15), crc);
    }

    #[test]
    fn a_flipped_static_bit_is_refused() {
        let bytes = RegionLayout::plan(LayoutParams::for_tests())
            .unwrap()
            .encode_static();
        for bit in 0..STATIC_ENCODED_BYTES * 8 {
            let mut b = bytes;
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(RegionLayout::decode(&b).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn impossible_geometry_is_refused() {
        let mut p = LayoutParams::for_tests();
        p.region_bytes = 4096;
        assert!(RegionLayout::plan(p).is_err());
        let mut p = LayoutParams::for_tests();
        p.bucket_count = 1;
        assert!(RegionLayout::plan(p).is_err());
        let mut p = LayoutParams::for_tests();
        p.max_value_bytes = u32::MAX;
        assert!(RegionLayout::plan(p).is_err());
    }

    #[test]
    fn block_range_refuses_classes_beyond_the_limits() {
        let layout = RegionLayout::plan(LayoutParams::for_tests()).unwrap();
        let max = layout.max_class().unwrap();
        let fits = Slot::new(1, max, 0);
        assert_eq!(layout.block_range(fits).unwrap().0, layout.data_offset);
        let too_big = Slot::new(1, SizeClass::from_index(max.index() + 1).unwrap(), 0);
        assert!(matches!(
            layout.block_range(too_big),
            Err(SlotError::SizeClass { .. })
        ));
        let past_end = Slot::new(1, max, layout.data_bytes / UNIT_BYTES);
        assert!(matches!(
            layout.block_range(past_end),
            Err(SlotError::OutOfRange { .. })
        ));
    }

    #[test]
    fn table_range_is_inside_the_data_area() {
        let layout = RegionLayout::plan(LayoutParams::for_tests()).unwrap();
        let last_unit = layout.data_bytes / UNIT_BYTES - 1;
        let fits = OverflowLink::new(1, last_unit);
        assert_eq!(
            layout.table_range(fits),
            Ok((layout.data_offset + last_unit * UNIT_BYTES, 64))
        );
        let past_end = OverflowLink::new(2, last_unit);
        assert!(matches!(
            layout.table_range(past_end),
            Err(SlotError::OutOfRange { .. })
        ));
    }

    proptest! {
        #[test]
        fn loaded_words_decode_as_their_bytes_do(words in proptest::array::uniform6(any::<u64>())) {
            let mut bytes = [0u8; HEADER_USED_BYTES];
            let first = dynamic_word::RAFT_TERM as usize;
            for (i, word) in words.iter().enumerate() {
                let at = first + i * WORD_BYTES;
                bytes[at..at + WORD_BYTES].copy_from_slice(&word.to_le_bytes());
            }
            prop_assert_eq!(DynamicHeader::decode(&bytes), Ok(DynamicHeader::from_words(&words)));
        }

        #[test]
        fn arbitrary_header_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = RegionLayout::decode(&bytes);
            let _ = DynamicHeader::decode(&bytes);
        }

        #[test]
        fn validated_geometry_keeps_reads_inside_the_region(
            words in proptest::collection::vec(any::<u64>(), 15)) {
            // A header with a valid CRC but arbitrary geometry: decode either
            // refuses it or every neighbourhood lies inside the index.
            let mut bytes = [0u8; STATIC_ENCODED_BYTES];
            for (chunk, w) in bytes.chunks_exact_mut(8).zip(&words) {
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            bytes[..8].copy_from_slice(&REGION_MAGIC.to_le_bytes());
            bytes[static_word::LAYOUT_VERSION..static_word::REGION_EPOCH]
                .copy_from_slice(&REGION_LAYOUT_VERSION.to_le_bytes());
            let crc = u64::from(crc32fast::hash(&bytes[..STATIC_HEADER_BYTES]));
            bytes[STATIC_HEADER_BYTES..].copy_from_slice(&crc.to_le_bytes());
            if let Ok(layout) = RegionLayout::decode(&bytes) {
                let h = layout.key_hash(b"probe");
                let (start, len) = layout.neighbourhood_range(h);
                prop_assert!(start + len <= layout.data_offset);
            }
        }
    }

    #[test]
    fn words_in_order_wants_aligned_offsets_each_past_the_last_word() {
        assert!(words_in_order(&[0, 8, 16]));
        // Gaps between words are allowed.
        assert!(words_in_order(&[0, 24]));
        assert!(words_in_order(&[]));
        // Not a multiple of the word size.
        assert!(!words_in_order(&[4]));
        assert!(!words_in_order(&[0, 12]));
        // Overlapping the word before, or before it.
        assert!(!words_in_order(&[8, 8]));
        assert!(!words_in_order(&[8, 12]));
        assert!(!words_in_order(&[16, 8]));
    }
}
