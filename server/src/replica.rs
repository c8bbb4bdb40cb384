//! This node's replica: the Raft instance, the log and region it runs on,
//! the peer context, and what they tell about the cluster (its members, who
//! leads, where each member serves clients).

use std::collections::BTreeSet;
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use openraft::{Membership, RaftMetrics};
use rdkv_proto::shard::{NodeInfo, ShardMap, ShardMapError};
use rdkv_proto::wire::{ErrorCode, ErrorReply, LeaderHint, MemberInfo};
use rdkv_storage::raft::{NodeAddr, TypeConfig};
use rdkv_storage::raft_log::LogStore;
use rdkv_storage::state_machine::RegionStateMachine;

use crate::Raft;
use crate::peer::PeerContext;
use crate::service::proposals::Proposals;
use crate::service::read_rounds::ReadRounds;

/// Raft and the stores it runs on, started. Cheap to clone: one shared
/// handle to its parts. (It was the parts themselves, each a handle: a
/// clone took about ten reference counts, and every request clones the
/// replica it is routed to; a RESP GET profile had 5% of the leader's CPU
/// in those clones and drops.)
#[derive(Debug, Clone)]
pub struct Replica(Arc<ReplicaParts>);

/// What a [`Replica`] is made of.
#[derive(Debug)]
pub struct ReplicaParts {
    pub raft: Raft,
    pub sm: RegionStateMachine,
    pub log: LogStore,
    pub peers: Arc<PeerContext>,
    /// Linearizable reads share confirmation rounds (a read fence, else
    /// ReadIndex) through it.
    pub reads: ReadRounds,
    /// Client writes are proposed through it, batched.
    pub proposals: Proposals,
}

impl std::ops::Deref for Replica {
    type Target = ReplicaParts;

    fn deref(&self) -> &ReplicaParts {
        &self.0
    }
}

impl Replica {
    pub fn new(parts: ReplicaParts) -> Replica {
        Replica(Arc::new(parts))
    }

    pub fn node_id(&self) -> u64 {
        self.peers.node_id
    }

    /// The cluster's shared secret, if it has one.
    pub fn token(&self) -> Option<&str> {
        self.peers.token.as_deref()
    }

    /// A copy of Raft's current view (term, leader, membership, indexes).
    pub fn metrics(&self) -> RaftMetrics<TypeConfig> {
        self.raft.metrics().borrow_watched().clone()
    }

    /// The client address of node `id`: from the membership, or learned from
    /// its peer handshake.
    pub fn client_addr_of(&self, id: u64, node: Option<&NodeAddr>) -> Option<String> {
        node.map(|n| n.client_addr.clone())
            .filter(|a| !a.is_empty())
            .or_else(|| self.peers.client_addr_of(id))
    }

    /// The refusal of a request only the leader serves, naming the leader
    /// when it is known (`node`: its address, when the caller has it).
    pub fn not_leader(&self, leader: Option<u64>, node: Option<&NodeAddr>) -> ErrorReply {
        let hint = leader.and_then(|node_id| {
            let node = node.cloned().or_else(|| {
                self.metrics()
                    .membership_config
                    .membership()
                    .get_node(&node_id)
                    .cloned()
            });
            let client_addr = self.client_addr_of(node_id, node.as_ref())?;
            Some(LeaderHint {
                node_id,
                client_addr,
            })
        });
        ErrorReply::not_leader(hint)
    }

    /// Writes and membership changes are the leader's: elsewhere, say who leads.
    pub fn require_leader(&self) -> Result<(), ErrorReply> {
        if self.raft.is_leader() {
            Ok(())
        } else {
            Err(self.not_leader(self.metrics().current_leader, None))
        }
    }

    /// The configuration this node knows, voters and learners.
    pub fn members(&self) -> Vec<MemberInfo> {
        let metrics = self.metrics();
        self.members_of(metrics.membership_config.membership())
    }

    /// `membership`'s voters and learners, with their client addresses
    /// where known.
    pub fn members_of(&self, membership: &Membership<u64, NodeAddr>) -> Vec<MemberInfo> {
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                peer_addr: node.peer_addr.clone(),
                client_addr: self.client_addr_of(*id, Some(node)).unwrap_or_default(),
                voter: voters.contains(id),
            })
            .collect()
    }

    /// This group as a shard map ([`ShardMap::single_group`]): its members
    /// with their client addresses where known, `own_resp_addr` for this
    /// node (other nodes' RESP ports are not known here), and the leader.
    pub fn shard_map(&self, own_resp_addr: Option<String>) -> Result<ShardMap, ErrorReply> {
        let own_id = self.node_id();
        let nodes: Vec<NodeInfo> = self
            .members()
            .into_iter()
            .map(|member| NodeInfo {
                id: member.id,
                client_addr: Some(member.client_addr).filter(|addr| !addr.is_empty()),
                resp_addr: own_resp_addr.clone().filter(|_| member.id == own_id),
            })
            .collect();
        let leader = self
            .metrics()
            .current_leader
            .filter(|leader| nodes.iter().any(|node| node.id == *leader));
        ShardMap::single_group(nodes, leader).map_err(|e| {
            // A node that has not joined a cluster yet knows no members.
            let code = match e {
                ShardMapError::NoMembers(_) => ErrorCode::Unavailable,
                _ => ErrorCode::Internal,
            };
            ErrorReply::new(code, format!("this node's shard map: {e}"))
        })
    }

    /// Keys held by this node's region (DBSIZE, INFO keyspace).
    pub fn live_keys(&self) -> u64 {
        self.sm.region_stats().live_keys
    }
}
