//! Whether a member starting with an empty data directory finds its group
//! formed already by its peers. Such a member joins as a follower instead
//! of initializing the group: openraft campaigns right after `initialize`,
//! and in term 1 the late member's vote outranks a lower-id leader's, which
//! steps down, leaving the group without a leader for an election timeout.
//!
//! Each peer is asked with a pre-vote, which changes nothing on it (it
//! neither grants a vote nor persists anything) and whose answer carries
//! its last log id: a peer that formed or joined the group has one.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use rdkv_storage::raft::rpc::VoteRequest;
use rdkv_storage::raft::{NodeAddr, Vote};

use crate::peer::{PeerContext, PeerLinks, PeerNetwork};

/// Whether any of `peers` (id, peer address; this node's own left out)
/// answers within `wait` with a log of the group. A peer that is down, not
/// serving yet, or as new as this node does not count.
pub async fn by_peers(ctx: &Arc<PeerContext>, peers: &[(u64, String)], wait: Duration) -> bool {
    let network = PeerNetwork::new(Arc::clone(ctx), Arc::new(PeerLinks::new()));
    let asks = peers
        .iter()
        .filter(|(id, _)| *id != ctx.node_id)
        .map(|(id, addr)| has_log(network.clone(), ctx.node_id, (*id, addr.clone()), wait));
    join_all(asks).await.into_iter().any(|has| has)
}

async fn has_log(
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
        // Term 0, no log: the lowest vote there is, granted by no one.
        let probe = VoteRequest::new(Vote::new(0, own_id), None);
        conn.pre_vote(probe, RPCOption::new(wait)).await
    };
    match tokio::time::timeout(wait, ask).await {
        Ok(Ok(answer)) => answer.last_log_id.is_some(),
        Ok(Err(e)) => {
            tracing::debug!(target, "asking a peer whether the group is formed: {e}");
            false
        }
        Err(_) => false,
    }
}
