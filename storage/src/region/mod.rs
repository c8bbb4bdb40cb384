//! The region engine: one memory region laid out as `rdkv_proto::region`
//! describes, one writer (the Raft apply loop) and any number of lock-free
//! readers. See ARCHITECTURE.md, "The region", for the invariants.

pub mod alloc;
pub mod clock;
pub mod config;
pub mod error;
pub mod grace;
pub mod memory;
pub mod reader;
pub mod stats;
pub mod writer;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::{DEFAULT_REGION_BYTES, RegionConfig, random_seed};
pub use error::RegionError;
pub use memory::RegionMemory;
pub use reader::{ReadError, ReadProblem, ReaderOptions, RegionReader};
pub use stats::{ReadStats, RegionStats, RetryCause};
pub use writer::RegionWriter;
