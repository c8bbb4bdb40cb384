use rdkv_proto::region::{BlockError, HeaderError, SlotError};
use thiserror::Error;

/// Errors of the region writer. None of them leaves the region changed: a
/// failed put or delete has no effect.
#[derive(Debug, Error)]
pub enum RegionError {
    #[error("key is {len} bytes, the limit is {max}")]
    KeyTooLarge { len: usize, max: u32 },
    #[error("value is {len} bytes, the limit is {max}")]
    ValueTooLarge { len: usize, max: u32 },
    #[error("version must be a Raft log index >= 1")]
    ZeroVersion,
    /// `needed_bytes`: the block's size class, plus a new overflow table's
    /// when the key needed one.
    #[error(
        "region full: a {needed_bytes}-byte block (with the overflow table it needs, if any) does not fit \
         ({free_bytes} bytes free, largest free extent {largest_free_bytes}, \
         {pending_reclaim_bytes} bytes waiting for the grace period)"
    )]
    RegionFull {
        needed_bytes: u64,
        free_bytes: u64,
        largest_free_bytes: u64,
        pending_reclaim_bytes: u64,
    },
    /// The key's neighbourhood and every table of its home bucket's overflow
    /// chain, up to the chain's bound, are full.
    #[error(
        "index full: all {slots} slots of the key's neighbourhood and overflow chain are in use"
    )]
    IndexFull { slots: usize },
    #[error(transparent)]
    Memory(#[from] rdkv_fabric::MemoryError),
    #[error("region corrupted: {0}")]
    CorruptSlot(#[from] SlotError),
    #[error("region corrupted: block of a published slot: {0}")]
    CorruptBlock(#[from] BlockError),
    #[error("region header: {0}")]
    Header(#[from] HeaderError),
    #[error("invalid region config: {0}")]
    Config(String),
    #[error("mapping the region: {0}")]
    Map(#[from] std::io::Error),
}
