//! Whether a member starting with an empty data directory finds its group
//! led already. Such a member waits for the leader to replicate to it
//! instead of initializing the group: openraft campaigns right after
//! `initialize`, and in term 1 the late member's vote outranks a lower-id
//! leader's, which steps down, leaving the group without a leader for an
//! election timeout.
//!
//! Each peer is asked with a pre-vote, which records nothing on it and
//! whose answer carries its vote: a committed vote means a leader was
//! elected (the leader's own, or a follower's copy of it). While the group
//! is still forming (peers with a log but only candidates, or none up) the
//! member initializes as before: there is no leader to depose, and its
//! initialization lets it take part in the first election at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use rdkv_storage::raft::rpc::VoteRequest;
use rdkv_storage::raft::{NodeAddr, Vote};

use crate::peer::{PeerContext, PeerLinks, PeerNetwork};

/// Whether any of `peers` (peer address by id; this node's own left out)
/// answers within `wait` that the group has a leader. A peer that is down,
/// not serving yet, or as new as this node does not count.
pub async fn by_peers(
    ctx: &Arc<PeerContext>,
    peers: &BTreeMap<u64, String>,
    wait: Duration,
) -> bool {
    let network = PeerNetwork::new(Arc::clone(ctx), Arc::new(PeerLinks::new()));
    let asks = peers
        .iter()
        .filter(|(id, _)| **id != ctx.node_id)
        .map(|(id, addr)| knows_a_leader(network.clone(), ctx.node_id, (*id, addr.clone()), wait));
    join_all(asks).await.into_iter().any(|led| led)
}

async fn knows_a_leader(
    mut network: PeerNetwork,
    own_id: u64,
    (target, peer_addr): (u64, String),
    wait: Duration,
) -> bool {
    let node = NodeAddr {
        peer_addr,
        client_addr: String::new(),
    };
    let ask = async move {
        let mut conn = network.new_client(target, &node).await;
        // Term 0, no log: a pre-vote only reads the peer's state.
        let probe = VoteRequest::new(Vote::new(0, own_id), None);
        conn.pre_vote(probe, RPCOption::new(wait)).await
    };
    match tokio::time::timeout(wait, ask).await {
        Ok(Ok(answer)) => {
            tracing::info!(
                target,
                vote = %answer.vote,
                last_log_id = ?answer.last_log_id,
                "a peer's state before this member's first start"
            );
            answer.vote.is_committed()
        }
        Ok(Err(e)) => {
            tracing::info!(target, "asking a peer whether the group is led: {e}");
            false
        }
        Err(_) => {
            tracing::info!(
                target,
                "asking a peer whether the group is led: no answer in {wait:?}"
            );
            false
        }
    }
}
