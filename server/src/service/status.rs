//! `endpoint status` and `endpoint health` of this node.

use openraft::ServerState;
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{
    Alarm, Health, NodeStatus, Op, QuotaUse, RegionFill, ReplicationLag, Role, ServedCounts,
    ShardStatus,
};

use super::Handler;
use crate::lease::quorum_ack_age;
use crate::replica::Replica;

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

/// How full `replica`'s region is.
fn region_fill(replica: &Replica) -> RegionFill {
    let stats = replica.sm.region_stats();
    RegionFill {
        capacity_bytes: stats.data_capacity_bytes,
        used_bytes: stats.used_bytes,
        pending_reclaim_bytes: stats.pending_reclaim_bytes,
        live_keys: stats.live_keys,
    }
}

/// Shard `shard`'s replica on this node, as its own Raft sees it.
pub fn shard_status(shard: ShardId, replica: &Replica) -> ShardStatus {
    let metrics = replica.metrics();
    ShardStatus {
        shard,
        role: role(metrics.state),
        term: metrics.current_term,
        leader_id: metrics.current_leader,
        members: metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect(),
        last_log_index: metrics.last_log_index.unwrap_or(0),
        commit_index: metrics.cluster_committed.map_or(0, |l| l.index),
        applied_index: replica.sm.applied_index(),
        region: region_fill(replica),
    }
}

impl Handler {
    /// Every shard replica of this node, in shard order.
    pub fn shard_statuses(&self) -> Vec<ShardStatus> {
        self.shards()
            .iter()
            .map(|(shard, replica)| shard_status(shard, &replica))
            .collect()
    }

    /// The status of the primary replica (docs/sharding.md, section 3).
    pub fn status(&self) -> NodeStatus {
        self.status_of(&self.replica())
    }

    /// The status of this node as `replica`'s Raft group sees it.
    pub fn status_of(&self, replica: &Replica) -> NodeStatus {
        let metrics = replica.metrics();
        let quota = replica.sm.quota_status();
        let last_log_index = metrics.last_log_index.unwrap_or(0);
        let leader_client_addr = metrics.current_leader.and_then(|id| {
            let node = metrics
                .membership_config
                .membership()
                .get_node(&id)
                .cloned();
            replica.client_addr_of(id, node.as_ref())
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
            client_addr: replica.peers.client_addr.clone(),
            peer_addr: me.map(|n| n.peer_addr).unwrap_or_default(),
            role: role(metrics.state),
            term: metrics.current_term,
            leader_id: metrics.current_leader,
            leader_client_addr,
            last_log_index,
            commit_index: metrics.cluster_committed.map_or(0, |l| l.index),
            applied_index: replica.sm.applied_index(),
            state_digest: replica.sm.digest_now(),
            snapshot_index: metrics.snapshot.map_or(0, |l| l.index),
            purged_index: metrics.purged.map_or(0, |l| l.index),
            region: region_fill(replica),
            members: replica.members(),
            replication,
            shm_socket: self.endpoints().shm_socket.clone(),
            served: self.served(),
            rpc_socket: self.endpoints().rpc_socket.clone(),
            region_epoch: replica.sm.region_epoch(),
            ops: self.stats().ops(),
            open_connections: self.stats().open_connections(),
            rdma: self.rdma().status().to_owned(),
            ofi: self.ofi().status().to_owned(),
            resp_addr: self.endpoints().resp.clone(),
            quota: QuotaUse {
                quota_bytes: quota.quota_bytes,
                charged_bytes: quota.charged_bytes,
            },
            alarms: quota
                .no_space_alarm
                .then_some(Alarm::NoSpace)
                .into_iter()
                .collect(),
        }
    }

    /// Requests answered over the native protocol, by kind (the older,
    /// coarser view of the request statistics).
    fn served(&self) -> ServedCounts {
        let stats = self.stats();
        let n = |op| stats.requests_of(op);
        let (tcp_connections, unix_connections) = stats.accepted();
        let data = [
            Op::Get,
            Op::MGet,
            Op::Put,
            Op::Update,
            Op::Delete,
            Op::Cas,
            Op::MPut,
            Op::Scan,
        ];
        let admin = Op::ALL
            .iter()
            .filter(|op| !data.contains(op))
            .map(|&op| n(op))
            .sum();
        ServedCounts {
            get: n(Op::Get),
            mget: n(Op::MGet),
            put: n(Op::Put) + n(Op::Update),
            delete: n(Op::Delete),
            cas: n(Op::Cas),
            mput: n(Op::MPut),
            admin,
            tcp_connections,
            unix_connections,
            scan: n(Op::Scan),
        }
    }

    pub fn health(&self) -> Health {
        let replica = self.replica();
        let metrics = replica.metrics();
        let quorum_contact_bound_ms = replica.raft.config().election_timeout_max;
        let reason = if let Err(e) = &metrics.running_state {
            format!("raft stopped: {e}")
        } else if replica.sm.quota_status().no_space_alarm {
            "alarm NOSPACE: a write was refused for the quota; delete keys or raise \
             --quota-bytes"
                .to_owned()
        } else if metrics.current_leader.is_none() {
            format!(
                "no leader known (term {}, role {:?})",
                metrics.current_term, metrics.state
            )
        } else if let Some(silent_ms) = quorum_ack_age(&metrics)
            .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
            .filter(|&ms| ms > quorum_contact_bound_ms)
        {
            format!(
                "leading without a quorum's acknowledgement for {silent_ms} ms \
                 (over the {quorum_contact_bound_ms} ms election timeout): partitioned?"
            )
        } else {
            let committed = metrics.cluster_committed.map_or(0, |l| l.index);
            let lag = committed.saturating_sub(replica.sm.applied_index());
            if lag > HEALTHY_APPLY_LAG_ENTRIES {
                format!(
                    "applied index trails the commit index by {lag} entries \
                     (over {HEALTHY_APPLY_LAG_ENTRIES})"
                )
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
