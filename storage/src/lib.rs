//! rdkv-storage: the region engine (index, block allocator, grace-period
//! reclamation, lock-free reader). The durable Raft log and snapshots join it
//! in later work.

#[cfg(target_endian = "big")]
compile_error!("rdkv regions are little-endian; big-endian targets are not supported");

pub mod region;

pub use rdkv_proto::wire::Versioned;
pub use region::{
    Clock, ManualClock, MonotonicClock, ReadError, ReadProblem, ReadStats, ReaderOptions,
    RegionConfig, RegionError, RegionMemory, RegionReader, RegionStats, RegionWriter, RetryCause,
};
