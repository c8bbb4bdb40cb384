//! `endpoint status` and `endpoint health` of this node.

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use rdkv_proto::wire::{Health, NodeStatus, RegionFill, ReplicationLag, Role};

use super::Handler;

/// A node that has applied everything but this many committed entries is
/// healthy; more means it is falling behind.
pub const HEALTHY_APPLY_LAG_ENTRIES: u64 = 1000;

fn role(state: ServerState) -> Role {
    match state {
        ServerState::Leader => Role::Leader,
        ServerState::Follower => Role::Follower,
        ServerState::Candidate => Role::Candidate,
        ServerState::Learner => Role::Learner,
        ServerState::Shutdown => Role::Shutdown,
    }
}

impl Handler {
    pub fn status(&self) -> NodeStatus {
        let metrics = self.raft().metrics().borrow_watched().clone();
        let stats = self.sm().region_stats();
        let last_log_index = metrics.last_log_index.unwrap_or(0);
        let leader_client_addr = metrics.current_leader.and_then(|id| {
            let node = metrics
                .membership_config
                .membership()
                .get_node(&id)
                .cloned();
            self.client_addr_of(id, node.as_ref())
        });
        let replication = metrics
            .replication
            .iter()
            .flatten()
            .filter(|(id, _)| **id != metrics.id)
            .map(|(id, matched)| {
                let matched_index = matched.map(|l| l.index);
                ReplicationLag {
                    id: *id,
                    matched_index,
                    lag_entries: last_log_index.saturating_sub(matched_index.unwrap_or(0)),
                }
            })
            .collect();
        let me = metrics
            .membership_config
            .membership()
            .get_node(&metrics.id)
            .cloned();
        NodeStatus {
            id: metrics.id,
            client_addr: self.peers().client_addr.clone(),
            peer_addr: me.map(|n| n.peer_addr).unwrap_or_default(),
            role: role(metrics.state),
            term: metrics.current_term,
            leader_id: metrics.current_leader,
            leader_client_addr,
            last_log_index,
            commit_index: metrics.cluster_committed.map_or(0, |l| l.index),
            applied_index: self.sm().applied_index(),
            snapshot_index: metrics.snapshot.map_or(0, |l| l.index),
            region: RegionFill {
                capacity_bytes: stats.data_capacity_bytes,
                used_bytes: stats.used_bytes,
                pending_reclaim_bytes: stats.pending_reclaim_bytes,
                live_keys: stats.live_keys,
            },
            members: self.members(),
            replication,
            shm_socket: self.shm_socket(),
            served: self.served(),
            rpc_socket: self.rpc_socket(),
            region_epoch: self.sm().region_epoch(),
            rdma: self.rdma().status().to_owned(),
        }
    }

    pub fn health(&self) -> Health {
        let metrics = self.raft().metrics().borrow_watched().clone();
        let reason = if let Err(e) = &metrics.running_state {
            format!("raft stopped: {e}")
        } else if metrics.current_leader.is_none() {
            "no leader known".to_owned()
        } else {
            let committed = metrics.cluster_committed.map_or(0, |l| l.index);
            let lag = committed.saturating_sub(self.sm().applied_index());
            if lag > HEALTHY_APPLY_LAG_ENTRIES {
                format!("applied index trails the commit index by {lag} entries")
            } else {
                String::new()
            }
        };
        Health {
            healthy: reason.is_empty(),
            reason,
        }
    }
}
