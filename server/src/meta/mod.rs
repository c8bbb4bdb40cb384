//! The metadata group of a multi-shard cluster (docs/sharding.md, section
//! 2): a small Raft group (`ShardId::META`) whose applied state is the
//! shard map, run by every node (up to three voters, the others learners),
//! so that every node answers `ShardMap` from its own applied copy.
//!
//! - [`Meta`]: the group's replica on this node and the map this node
//!   serves (the applied one; the placed version 1 until one is applied).
//! - [`edit`]: [`MapEdit`] and `propose_map_change`, the one way a new map
//!   version is made (on the group's leader, forwarded there from any node).
//! - [`tasks`]: the leader's bootstrap (version 1, learners), every node's
//!   watch of its applied map and the publication of its own addresses.
//! - [`join`]: `Request::AddNode` on the leader: a node started with
//!   `--join` made a learner of the group and a node of the map.
//! - [`remove`]: `Request::RemoveNode` on the leader: a node hosting no
//!   replica leaves the map and the group.
//! - [`voters`]: which voters the group keeps (a pure decision its
//!   leader's upkeep, `tasks::keep_voters`, carries out).
//!
//! The group runs on the same machinery as a data shard (`Replica`: its
//! log, snapshots and a small region holding the map as one record,
//! `Command::PublishShardMap`), under `meta/` in the data directory.

pub mod edit;
pub mod join;
pub mod remove;
pub mod tasks;
pub mod voters;

use std::sync::Arc;

use rdkv_proto::shard::{NodeId, ShardMap};
use rdkv_storage::RegionConfig;
use tokio::sync::watch;

use crate::replica::Replica;

pub use edit::{MapEdit, MetaError};

/// Voters of the metadata group: the first nodes of `--initial-cluster`
/// (in id order), at most this many; every other node is a learner.
pub const MAX_META_VOTERS: usize = 3;

/// The metadata group's region: the map record (at most about 1.4 MB at
/// every bound of the map, docs/sharding.md section 2) and room for its
/// next version beside it while the old one waits out the grace period.
const META_REGION_BYTES: u64 = 16 * 1024 * 1024;
/// The largest record: a map at every bound, with margin.
const META_MAX_VALUE_BYTES: u32 = 2 * 1024 * 1024;

/// The voters of the metadata group of a cluster of `nodes`.
pub fn voters(nodes: impl IntoIterator<Item = NodeId>) -> Vec<NodeId> {
    let mut nodes: Vec<NodeId> = nodes.into_iter().collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes.truncate(MAX_META_VOTERS);
    nodes
}

/// The metadata group's region settings, from a data shard's: small, and
/// not shared with local readers (no client reads it one-sided).
pub fn region_config(data: &RegionConfig) -> RegionConfig {
    RegionConfig {
        region_bytes: META_REGION_BYTES,
        max_value_bytes: META_MAX_VALUE_BYTES,
        shared_memory: false,
        ..data.clone()
    }
}

/// This node's part of the metadata group. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Meta {
    replica: Replica,
    /// The map this node serves: only ever replaced by a higher version.
    map: Arc<watch::Sender<Arc<ShardMap>>>,
    /// What forwarding a proposal to the leader connects with.
    forward: rdkv_client::ClientOptions,
}

impl Meta {
    /// `replica` of the metadata group, serving `map` (the placed version
    /// 1, or the one applied before a restart) until it applies a newer one.
    pub fn new(replica: Replica, map: ShardMap, forward: rdkv_client::ClientOptions) -> Meta {
        let (map, _) = watch::channel(Arc::new(map));
        Meta {
            replica,
            map: Arc::new(map),
            forward,
        }
    }

    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The map this node serves now.
    pub fn map(&self) -> Arc<ShardMap> {
        Arc::clone(&self.map.borrow())
    }

    /// Serves `map` from now on if it is newer than the one served; whether
    /// it was.
    pub fn install(&self, map: ShardMap) -> bool {
        self.map.send_if_modified(|served| {
            let newer = map.version() > served.version();
            if newer {
                tracing::info!(version = map.version(), "serving shard map");
                *served = Arc::new(map);
            }
            newer
        })
    }

    /// Wakes on every map installed.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ShardMap>> {
        self.map.subscribe()
    }

    /// The version of the map this replica applied (0: none yet), as
    /// opposed to the one served, which may come from a leader's answer
    /// or the placement.
    pub fn applied_version(&self) -> u64 {
        match self.replica.sm.applied_shard_map() {
            Ok(map) => map.map_or(0, |m| m.version()),
            Err(e) => {
                tracing::warn!("reading the applied shard map: {e}");
                0
            }
        }
    }

    pub(crate) fn forward_options(&self) -> &rdkv_client::ClientOptions {
        &self.forward
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_three_nodes_by_id_vote() {
        assert_eq!(voters([5, 1, 4, 2, 3]), [1, 2, 3]);
        assert_eq!(voters([2, 1]), [1, 2]);
        assert_eq!(voters([7]), [7]);
    }

    #[test]
    fn the_region_holds_a_map_at_every_bound() {
        let config = region_config(&RegionConfig::default());
        assert!(config.layout().is_ok());
        // docs/sharding.md section 2: a map at every bound is about 1.4 MB.
        assert!(config.max_value_bytes >= 1_500_000);
        assert!(!config.shared_memory);
    }
}
