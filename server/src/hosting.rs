//! [`Hosting`]: opens and closes this node's shard replicas while it runs
//! (a replica move, docs/sharding.md, section 8), and keeps the data
//! directory's record of them (`HOSTED`, `layout`) in step, so that a
//! restart hosts the same set.
//!
//! Crash safety: a replica's directories exist before `HOSTED` names it,
//! and `HOSTED` stops naming it before they are removed. A restart removes
//! directories `HOSTED` does not name, and drops a replica `HOSTED` names
//! that holds nothing and was not placed here (opened for a move that
//! never added it: the move's leader removes the learner again).

use std::collections::BTreeSet;
use std::sync::Arc;

use rdkv_proto::shard::ShardId;
use rdkv_storage::RegionConfig;
use tokio::sync::watch;

use crate::config::Config;
use crate::layout::{Layout, LayoutError};
use crate::node::{Stores, spawn_leader_tasks, start_raft};
use crate::peer::PeerLinks;
use crate::replica::Replica;
use crate::shards::Shards;
use crate::tls::NodeTls;

/// Why a replica could not be opened or closed here.
#[derive(Debug, thiserror::Error)]
pub enum HostingError {
    #[error("a single group's node hosts shard 0 only")]
    SingleGroup,
    #[error("shard {0} is not in this cluster's map")]
    UnknownShard(ShardId),
    #[error(
        "this node is still a voter of shard {0} in its own view: \
         remove it from the shard first"
    )]
    StillVoter(ShardId),
    #[error("shard {0} is this node's last replica")]
    LastReplica(ShardId),
    #[error("opening shard {shard}'s replica: {reason}")]
    Open { shard: ShardId, reason: String },
    #[error("stopping shard {shard}'s raft: {reason}")]
    Stop { shard: ShardId, reason: String },
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// What opening a replica needs: the node's settings, as at start.
#[derive(Debug)]
pub struct Hosting {
    config: Config,
    layout: Layout,
    /// The node's per-shard region (`--region-mib`), as at start.
    region: RegionConfig,
    tls: Arc<NodeTls>,
    /// The node's shared peer connections, which a new replica's Raft
    /// sends through.
    links: Arc<PeerLinks>,
    quota_bytes: u64,
    shards: Shards,
    shutdown: watch::Receiver<bool>,
    /// One open or close at a time: `HOSTED` is rewritten whole.
    turn: tokio::sync::Mutex<()>,
}

/// [`Hosting`]'s parts that come from the node's start.
#[derive(Debug)]
pub struct HostingParts {
    pub config: Config,
    pub layout: Layout,
    pub region: RegionConfig,
    pub tls: Arc<NodeTls>,
    pub links: Arc<PeerLinks>,
    pub quota_bytes: u64,
    pub shards: Shards,
    pub shutdown: watch::Receiver<bool>,
}

impl Hosting {
    pub fn new(parts: HostingParts) -> Hosting {
        Hosting {
            config: parts.config,
            layout: parts.layout,
            region: parts.region,
            tls: parts.tls,
            links: parts.links,
            quota_bytes: parts.quota_bytes,
            shards: parts.shards,
            shutdown: parts.shutdown,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// This node's member entry as a shard's leader records it: its peer
    /// address (as `--initial-cluster` names it) and client address.
    pub fn own_member(&self) -> rdkv_proto::wire::MemberInfo {
        let peer_addr = self
            .config
            .initial_cluster
            .get(&self.config.id)
            .cloned()
            .unwrap_or_else(|| self.config.peer_listen.to_string());
        rdkv_proto::wire::MemberInfo {
            id: self.config.id,
            peer_addr,
            client_addr: self.config.listen.to_string(),
            voter: false,
        }
    }

    /// The options of this node's own client of other nodes.
    pub fn client_options(&self) -> rdkv_client::ClientOptions {
        crate::node::own_client_options(&self.config, &self.tls)
    }

    /// Opens a new, empty replica of `shard` (kept if it is open already):
    /// its directories, region and Raft, served to peers and clients from
    /// now on and recorded in `HOSTED`. It joins the shard when the shard's
    /// leader adds it as a learner.
    pub async fn open(&self, shard: ShardId) -> Result<Replica, HostingError> {
        let _turn = self.turn.lock().await;
        if let Some(replica) = self.shards.get(shard) {
            return Ok(replica);
        }
        let map = self.shards.map().ok_or(HostingError::SingleGroup)?;
        if map.shard(shard).is_none() {
            return Err(HostingError::UnknownShard(shard));
        }
        let open = |e: anyhow::Error| HostingError::Open {
            shard,
            reason: format!("{e:#}"),
        };
        let stores =
            Stores::open(&self.config, &self.layout, shard, self.region.clone()).map_err(open)?;
        let replica = start_raft(&self.config, stores, Some(shard), &self.tls, &self.links)
            .await
            .map_err(open)?;
        let mut hosted = self.hosted();
        hosted.insert(shard);
        if let Err(e) = self.layout.record_hosted(&self.config.data_dir, &hosted) {
            // Not recorded: nothing of it may stay (a restart would remove
            // its directories anyway).
            let _ = replica.raft.shutdown().await;
            let _ = self.layout.remove_shard_dir(&self.config.data_dir, shard);
            return Err(e.into());
        }
        // Detached: they end with the node's shutdown or this replica's Raft.
        drop(spawn_leader_tasks(
            &replica,
            &self.config,
            self.quota_bytes,
            &self.shutdown,
        ));
        self.shards.insert(shard, replica.clone());
        tracing::info!(shard = shard.0, "opened a replica for a move");
        Ok(replica)
    }

    /// Closes this node's replica of `shard` and removes its files, once
    /// this node is no voter of the shard in its own view (a learner left
    /// by the move, or removed): its data is then not needed for the
    /// shard's durability. A shard not hosted here is closed already.
    pub async fn close(&self, shard: ShardId) -> Result<(), HostingError> {
        let _turn = self.turn.lock().await;
        if self.shards.map().is_none() {
            return Err(HostingError::SingleGroup);
        }
        let Some(replica) = self.shards.get(shard) else {
            return Ok(());
        };
        let own = replica.node_id();
        if replica
            .metrics()
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == own)
        {
            return Err(HostingError::StillVoter(shard));
        }
        // Requests of the shard are answered `WrongShard` from here on.
        let replica = self
            .shards
            .remove(shard)
            .ok_or(HostingError::LastReplica(shard))?;
        if let Err(e) = replica.sm.retire() {
            tracing::warn!(shard = shard.0, "retiring the region: {e}");
        }
        replica
            .raft
            .shutdown()
            .await
            .map_err(|e| HostingError::Stop {
                shard,
                reason: e.to_string(),
            })?;
        let hosted = self.hosted();
        self.layout.record_hosted(&self.config.data_dir, &hosted)?;
        self.layout.remove_shard_dir(&self.config.data_dir, shard)?;
        tracing::info!(shard = shard.0, "closed the replica and removed its files");
        Ok(())
    }

    fn hosted(&self) -> BTreeSet<ShardId> {
        self.shards.iter().map(|(shard, _)| shard).collect()
    }
}
