//! The leader's side of the read fence's calls: one `ReadFence` request to
//! each voter, outside openraft (`service::read_fence` runs the rounds).
//!
//! Each voter has at most one call in flight, owned here and outliving the
//! round that made it: a dial to a dead peer sleeps in its turn
//! ([`super::redial::Redial`]) and a cut can hold a dial for a second, so a
//! round must never await one peer. It waits for a quorum of answers, up to
//! its own deadline, and a call still running then finishes later; its
//! answer is tagged with its round and never counts for another.
//!
//! A single group's fence calls get connections of their own (a `PeerConn`
//! of its own per voter), never queued behind appends; a shard of a
//! multi-shard node shares its Raft link, which routes answers by id (and
//! whose receiver answers a fence before the shard's queue, `demux`).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use openraft::network::RaftNetworkFactory;
use rdkv_storage::raft::rpc::RpcError;
use rdkv_storage::raft::{NodeAddr, Vote};

use super::network::{PeerConn, PeerNetwork};

/// A generous limit for one call: a timed-out call drops its connection,
/// so the round's deadline (a heartbeat) must not be the call's.
pub const FENCE_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// One finished call: who answered, for which round, and what.
#[derive(Debug)]
pub struct Answered {
    pub from: u64,
    pub round: u64,
    pub vote: Result<Option<Vote>, RpcError>,
}

/// A finished call and the connection it hands back.
struct Finished {
    answered: Answered,
    addr: String,
    conn: PeerConn,
}

/// The fence's connections to the voters, idle or busy with one call each.
pub struct FenceClients {
    network: PeerNetwork,
    /// Each voter's connection between calls, with the address it was made for.
    idle: HashMap<u64, (String, PeerConn)>,
    /// The calls in flight; each holds its connection.
    busy: FuturesUnordered<BoxFuture<'static, Finished>>,
    /// The voters with a call in `busy`.
    asked: BTreeSet<u64>,
}

impl std::fmt::Debug for FenceClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceClients")
            .field("idle", &self.idle.keys().collect::<Vec<_>>())
            .field("asked", &self.asked)
            .finish()
    }
}

impl FenceClients {
    pub fn new(network: PeerNetwork) -> Self {
        FenceClients {
            network,
            idle: HashMap::new(),
            busy: FuturesUnordered::new(),
            asked: BTreeSet::new(),
        }
    }

    /// Asks `target` (at `node`) for its persisted vote, for `round`.
    /// Returns `false` when a call to it is still in flight (an older
    /// round's): ask again when it comes back.
    pub async fn ask(&mut self, round: u64, target: u64, node: &NodeAddr) -> bool {
        if self.asked.contains(&target) {
            return false;
        }
        let mut conn = match self.idle.remove(&target) {
            Some((addr, conn)) if addr == node.peer_addr => conn,
            _ => self.network.new_client(target, node).await,
        };
        let addr = node.peer_addr.clone();
        self.asked.insert(target);
        self.busy.push(Box::pin(async move {
            let vote = conn.read_fence(FENCE_CALL_TIMEOUT).await;
            Finished {
                answered: Answered {
                    from: target,
                    round,
                    vote,
                },
                addr,
                conn,
            }
        }));
        true
    }

    /// The next call to finish, its connection back to idle; `None` when
    /// none is in flight. Cancel-safe.
    pub async fn next(&mut self) -> Option<Answered> {
        let finished = self.busy.next().await?;
        self.asked.remove(&finished.answered.from);
        self.idle
            .insert(finished.answered.from, (finished.addr, finished.conn));
        Some(finished.answered)
    }

    /// Whether a call is in flight (`next` would wait rather than return
    /// `None`).
    pub fn is_busy(&self) -> bool {
        !self.busy.is_empty()
    }

    /// Drops the idle connections of nodes that are no longer voters.
    pub fn retain(&mut self, voters: &BTreeSet<u64>) {
        self.idle.retain(|id, _| voters.contains(id));
    }
}
