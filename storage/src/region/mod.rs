//! The region engine: one memory region laid out as `rdkv_proto::region`
//! describes, one writer (the Raft apply loop) and any number of lock-free
//! readers. See ARCHITECTURE.md, "The region", for the invariants.

pub mod alloc;
pub mod config;
pub mod error;
pub mod grace;
pub(crate) mod live;
pub mod stats;
pub mod writer;

pub use config::{DEFAULT_QUOTA_PERCENT, DEFAULT_REGION_BYTES, RegionConfig, random_seed};
pub use error::RegionError;
pub use rdkv_fabric::{
    CachedLocation, Clock, IndexCache, ManualClock, MonotonicClock, ReadError, ReadProblem,
    ReadStats, ReaderOptions, RegionReader, RetryCause,
};
pub use rdkv_fabric::{MemoryError, RegionMemory};
pub use stats::RegionStats;
pub use writer::{REGION_MEMFD_PREFIX, RegionWriter};
