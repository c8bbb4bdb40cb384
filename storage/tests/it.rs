//! The storage crate's integration tests, one binary for all of them: each
//! module is one suite (its file beside this one), run as
//! `cargo test -p rdkv-storage --test it <module>::` (a filter matches any
//! test path containing it: `stress::` also runs `overflow_stress::`). One binary compiles
//! and links tokio, openraft and the crate's generic code once instead of
//! once per suite: the crate's tests rebuilt in 49 s against 63 s as 15
//! binaries (`touch storage/src/lib.rs; cargo test -p rdkv-storage
//! --no-run`, this 2-core machine).
//!
//! Kept as binaries of their own: `raft_log` and `snapshot_memory` (each
//! installs a counting global allocator, which would count every suite's
//! allocations) and `power_loss` (it turns on the durability journal, test
//! mode for the whole process).

mod backup;
mod common;
mod corruption;
mod expiry;
mod full;
mod limits;
mod model;
mod overflow;
mod overflow_stress;
mod raft_log_suite;
mod scan;
mod state_machine;
mod stress;
