//! Test harness: builds and starts real `rdkv-server` processes on loopback,
//! each with its own data directory, kills, restarts and stops them, and
//! hands out clients by intent; plus a fake in-process server for the client
//! and CLI tests, and the history and linearizability checkers.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod binary;
pub mod clients;
pub mod cluster;
pub mod fake_server;
pub mod flags;
pub mod garbage;
pub mod history;
pub mod lease_change;
pub mod linearizability;
pub mod nemesis;
pub mod netns;
pub mod node;
pub mod numbered;
#[cfg(feature = "ofi")]
pub mod ofi;
pub mod over;
pub mod pki;
pub mod prometheus;
pub mod raw_native;
pub mod raw_resp;
pub mod shard_view;
pub mod skip;
pub mod stress;
pub mod stress_value;
pub mod wait;

pub use binary::{binary, free_port, free_ports, rdkvctl, rdkvctl_blocking, rdkvctl_ok};
pub use clients::{Intent, Replica, client_options, ensure_linearizable_refused, lost_writes};
pub use cluster::{Cluster, LEADER_TIMEOUT, SNAPSHOT_OFTEN, check, check_with_leader};
pub use garbage::garbage;
pub use node::NodeProc;
pub use wait::eventually;
