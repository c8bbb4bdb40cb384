//! The durable Raft log, in the manner of etcd's WAL and TiKV's raft-engine:
//! segmented append-only files of CRC-framed records, group commit (many
//! appends share one `fdatasync`, done by a flusher thread), a vote and a
//! meta file replaced atomically, and recovery that cuts a torn tail off the
//! last segment but refuses any other damage.
//!
//! Only an index (log id, segment, offset, length per entry) is kept in
//! memory, plus a bounded cache of the newest entries; payloads are read
//! from the files on demand. See [`format`] for the directory layout.
//!
//! Durability contract (what openraft relies on):
//! - `append` returns once the records are in the page cache (every reader
//!   sees them); its callback completes after the fsync that covers them, or
//!   with the fsync's error (after which every later write fails too).
//! - `save_vote`, `save_committed`, `truncate_after` and `purge` are durable
//!   when they return. `purge` makes the purge point durable before deleting
//!   any segment; `truncate_after` deletes segments newest first. Neither
//!   can leave a hole, whenever it is interrupted.

mod error;
mod flusher;
pub mod format;
mod raft_impl;
pub mod segment;
mod store;

pub use error::{Damage, LogError};
pub use store::{
    DEFAULT_CACHE_BYTES, DEFAULT_MAX_RECORD_SIZE, DEFAULT_SEGMENT_SIZE, LogOptions, LogStats,
    LogStore, PersistedVote,
};
