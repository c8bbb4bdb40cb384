//! rdkv-server: one node of an rdkv cluster.
//!
//! - [`config`]: flags, env and TOML file.
//! - [`node`]: starts Raft (durable log, region state machine, peer network)
//!   and the listeners.
//! - [`replica`]: Raft and the stores it runs on, and what they tell about
//!   the cluster (members, who leads).
//! - [`layout`]: the data directory's layout, one group or `shards/<k>/`.
//! - [`placement`]: where shards start (`--shards`, docs/sharding.md).
//! - [`meta`]: the metadata group of a multi-shard cluster: the replicated,
//!   versioned shard map every node serves.
//! - `lease`: the lease rules (quorum acknowledgement, the lease published
//!   for one-sided readers, read confirmation, follower freshness).
//! - [`peer`]: Raft traffic between nodes.
//! - [`service`]: the native client protocol, by concern.
//! - [`http`]: health, status and metrics for probes.
//! - [`resp`]: the RESP (Redis protocol) front end.
//! - [`restore`]: `--restore FILE`, a data directory built from a backup
//!   before the node starts.
//! - [`telemetry`]: Prometheus metrics, per-op statistics, Raft event logs.
//! - `tls`: the node's TLS (listeners, peer connections, its own clients),
//!   reloaded on SIGHUP and when the certificate files change.
//! - [`rdma`]: the RDMA transport's node side (feature `rdma`): device,
//!   region grant, a queue pair per client connection.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod accept;
pub mod config;
mod expiry;
mod formed;
mod framed;
#[cfg(any(feature = "rdma", feature = "ofi"))]
mod grant_upkeep;
pub mod hosting;
pub mod http;
mod join;
pub mod layout;
mod lease;
pub mod meta;
pub mod node;
pub mod ofi;
mod order;
pub mod peer;
pub mod placement;
mod raft_watch;
pub mod rdma;
pub mod replica;
pub mod resp;
pub mod restore;
pub mod service;
mod settings;
pub mod shards;
mod stop_snapshot;
pub mod telemetry;
mod tls;

use rdkv_storage::raft::TypeConfig;
use rdkv_storage::state_machine::RegionStateMachine;

pub type Raft = openraft::Raft<TypeConfig, RegionStateMachine>;
