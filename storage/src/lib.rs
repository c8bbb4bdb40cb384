//! rdkv-storage: the region engine (index, block allocator, grace-period
//! reclamation, lock-free reader), the Raft types, the durable Raft log and
//! the state machine with its snapshots.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod backup;
pub mod cluster_id;
pub mod durability;
pub mod failpoint;
pub mod raft;
pub mod raft_log;
pub mod record;
pub mod region;
pub mod state_machine;

pub use rdkv_proto::wire::Versioned;
pub use region::{
    Clock, ManualClock, MonotonicClock, ReadError, ReadProblem, ReadStats, ReaderOptions,
    RegionConfig, RegionError, RegionMemory, RegionReader, RegionStats, RegionWriter, RetryCause,
};
