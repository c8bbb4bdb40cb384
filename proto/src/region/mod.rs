//! The region layout: a protocol shared by the writer (the server's apply loop)
//! and every reader (local, `mem`, `shm`, RDMA). See ARCHITECTURE.md for the
//! byte-by-byte tables.
//!
//! A region is one contiguous mapping:
//!
//! | bytes | part |
//! |---|---|
//! | `0 .. 4096` | [`header`]: static geometry (CRC-protected) + dynamic words |
//! | `4096 .. data_offset` | index: `bucket_count` buckets of 64 bytes, 8 [`slot`]s each |
//! | `data_offset .. data_offset + data_bytes` | data area: [`block`]s and [`overflow`] tables at 64-byte units |
//!
//! Readers never trust what they read: every function here that takes bytes read
//! from a region validates them and returns a typed error instead of panicking.

pub mod block;
pub mod charge;
pub mod error;
pub mod hash;
pub mod header;
pub mod lookup;
pub mod neighbourhood;
pub mod overflow;
pub mod size_class;
pub mod slot;

pub use block::{
    BLOCK_HEADER_BYTES, BLOCK_MAGIC, BlockHeader, BlockRef, CRC_WORD_OFFSET,
    DEFAULT_MAX_CLOCK_DRIFT_MS, DeadlineUnixMs, EXPIRY_MARGIN_MS, INVALIDATED_WORD,
    INVALIDATION_WORD_OFFSET, NO_DEADLINE, SplitVerdict, ValueShape, block_field, encode_block,
    encoded_block_bytes, examine_split, expired_at, expired_within, revoked_crc_word,
};
pub use charge::charged_bytes;
pub use error::{BlockError, HeaderError, SlotError};
pub use hash::{HashSeed, KeyHash};
pub use header::{
    DYNAMIC_WORDS, DynamicHeader, DynamicWords, HEADER_BYTES, HEADER_USED_BYTES, LayoutParams,
    LeaseDeadline, REGION_LAYOUT_VERSION, REGION_MAGIC, RegionLayout, RegionState,
    STATIC_ENCODED_BYTES, STATIC_HEADER_BYTES, bucket_count_for, dynamic_word, static_word,
};
pub use lookup::{
    BlockVerdict, ChainWalk, anchor_link, examine_block, examine_block_split, neighbourhood_slots,
    verify_neighbourhood, verify_table,
};
pub use neighbourhood::{
    MAX_NEIGHBOURHOOD_BUCKETS, MAX_NEIGHBOURHOOD_BYTES, MAX_NEIGHBOURHOOD_SLOTS,
    NeighbourhoodWords, SlotWords,
};
pub use overflow::{
    ANCHOR_SLOT, MAX_OVERFLOW_TABLE_BYTES, MAX_OVERFLOW_TABLE_SLOTS, MAX_OVERFLOW_TABLES,
    TableWords, chain_capacity, free_neighbourhood_slot, free_table_slot, is_anchor, may_hold_key,
    overflow_table_units,
};
pub use size_class::{MAX_BLOCK_UNITS, SizeClass, UNIT_BYTES};
pub use slot::{
    BUCKET_BYTES, LINK_CLASS_BASE, MAX_DATA_UNITS, MAX_OVERFLOW_TABLE_UNITS, OverflowLink,
    SLOT_BYTES, SLOTS_PER_BUCKET, Slot, SlotWord,
};
