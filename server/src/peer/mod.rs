//! Raft peer traffic: a TCP connection per (leader, follower) pair carrying
//! openraft's RPCs as postcard payloads in rdkv frames. The connection opens
//! with a [`PeerHello`] carrying the cluster token, the sender's id and its
//! cluster identity; a peer that is not a member, presents the wrong token,
//! or belongs to another cluster is refused.

mod append_in;
mod append_out;
mod demux;
mod fence;
mod link;
mod network;
mod redial;
mod service;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use rdkv_tls::ClientTls;

use bytes::Bytes;
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{Frame, WireError, decode_exact, decode_payload};
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::rpc::{
    AppendEntriesRequest, AppendEntriesResponse, RaftError, SnapshotResponse,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use rdkv_storage::raft::{SnapshotMeta, Vote};
use rdkv_storage::raft_log::PersistedVote;
use rdkv_storage::state_machine::RegionStateMachine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use fence::{Answered, FenceClients};
pub use link::PeerLinks;
pub use network::PeerNetwork;
pub use service::{PeerShards, serve_peers};

pub const PEER_MAGIC: [u8; 4] = *b"RDKP";
/// Version 2 adds the cluster identity to the hello. A node that has no
/// identity yet (an upgraded cluster before its leader proposed one, a
/// fresh node) still sends version 1's hello, which older nodes accept.
pub const PEER_PROTOCOL_VERSION: u16 = 2;
/// The hello of nodes that know no cluster identity.
pub const PEER_PROTOCOL_VERSION_NO_IDENTITY: u16 = 1;
/// Connections of this hello version carry shard-tagged frames: every
/// payload is prefixed by its shard id (docs/sharding.md, section 3). Sent
/// by the nodes of a multi-shard cluster only (each shard's Raft has its own
/// connection per target for now); a single group keeps versions 1-2.
pub const PEER_PROTOCOL_VERSION_SHARDS: u16 = 3;
/// Appends carry up to `max_payload_entries` entries of up to a max value
/// each; peers are authenticated members, and this still bounds a frame.
pub const PEER_MAX_FRAME_BYTES: u32 = 256 * 1024 * 1024;
/// Snapshots travel in chunks of this size.
pub const SNAPSHOT_CHUNK_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerHello {
    pub magic: [u8; 4],
    pub version: u16,
    pub token: Option<String>,
    pub from_id: u64,
    /// So that followers can point clients at this node when it leads.
    pub from_client_addr: String,
    /// The sender's cluster (version 2); a member refuses a peer of another.
    pub cluster_id: Option<ClusterId>,
}

/// Version 1's hello: version 2's without the identity (postcard writes
/// fields in order, so it is version 2's bytes without the last field).
#[derive(Debug, Serialize, Deserialize)]
pub struct PeerHelloV1 {
    magic: [u8; 4],
    version: u16,
    token: Option<String>,
    from_id: u64,
    from_client_addr: String,
}

/// A hello as sent: either layout, encoded as the layout alone (no tag).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum WireHello {
    V2(PeerHello),
    V1(PeerHelloV1),
}

impl PeerHello {
    /// The hello `ctx` sends: version 3 for a shard of a multi-shard
    /// cluster; else version 2 with its identity, version 1 while it has
    /// none.
    pub fn of(ctx: &PeerContext) -> PeerHello {
        let cluster_id = ctx.cluster_id();
        PeerHello {
            magic: PEER_MAGIC,
            version: match (ctx.shard, cluster_id) {
                (Some(_), _) => PEER_PROTOCOL_VERSION_SHARDS,
                (None, Some(_)) => PEER_PROTOCOL_VERSION,
                (None, None) => PEER_PROTOCOL_VERSION_NO_IDENTITY,
            },
            token: ctx.token.clone(),
            from_id: ctx.node_id,
            from_client_addr: ctx.client_addr.clone(),
            cluster_id,
        }
    }

    /// What goes on the wire: version 1's layout when there is no identity
    /// (version 3 always has version 2's layout: no older node reads it).
    pub fn into_wire(self) -> WireHello {
        if self.version >= PEER_PROTOCOL_VERSION_SHARDS {
            return WireHello::V2(self);
        }
        match self.cluster_id {
            Some(_) => WireHello::V2(self),
            None => WireHello::V1(PeerHelloV1 {
                magic: self.magic,
                version: self.version,
                token: self.token,
                from_id: self.from_id,
                from_client_addr: self.from_client_addr,
            }),
        }
    }

    /// A hello of either version (each layout fills the payload exactly,
    /// so one cannot be taken for the other).
    pub fn decode(payload: &[u8]) -> Result<PeerHello, WireError> {
        if let Ok(hello) = decode_exact::<PeerHello>(payload) {
            return Ok(hello);
        }
        let old: PeerHelloV1 = decode_exact(payload)?;
        Ok(PeerHello {
            magic: old.magic,
            version: old.version,
            token: old.token,
            from_id: old.from_id,
            from_client_addr: old.from_client_addr,
            cluster_id: None,
        })
    }
}

/// A peer message and the shard it is for, from a frame of a connection
/// whose hello had `hello_version`: version 3 prefixes every payload with
/// the shard id (encoded as the pair `(shard, message)`), older versions
/// carry shard 0 only.
pub fn decode_for_shard<T: DeserializeOwned>(
    hello_version: u16,
    frame: &Frame,
) -> Result<(ShardId, T), WireError> {
    if hello_version >= PEER_PROTOCOL_VERSION_SHARDS {
        decode_payload(frame)
    } else {
        Ok((ShardId(0), decode_payload(frame)?))
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum PeerHelloReply {
    Accepted { node_id: u64, client_addr: String },
    Rejected { message: String },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    Append(AppendEntriesRequest),
    Vote(VoteRequest),
    PreVote(VoteRequest),
    TransferLeader(TransferLeaderRequest),
    SnapshotChunk(SnapshotPiece),
    /// The answering node's persisted vote, for a read fence. Last, so that
    /// the indexes before it keep their encoding: an older node cannot
    /// decode it and answers `Failed`, which the leader counts as no.
    ReadFence,
}

/// One chunk of a snapshot the leader sends (encoded exactly as the struct
/// variant it replaced: postcard writes the fields in order either way).
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotPiece {
    pub vote: Vote,
    pub meta: SnapshotMeta,
    /// Size of the whole snapshot.
    pub total_bytes: u64,
    /// Where `data` starts in it.
    pub offset: u64,
    pub data: Bytes,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    Append(Result<AppendEntriesResponse, RaftError>),
    Vote(Result<VoteResponse, RaftError>),
    TransferLeader(Result<TransferLeaderResponse, RaftError>),
    /// `Some` once the last chunk has been installed.
    SnapshotChunk(Result<Option<SnapshotResponse>, String>),
    /// The request could not be handled at all (decode error, bad chunk).
    Failed(String),
    /// The answer to `PeerRequest::ReadFence` (last for the same reason):
    /// `None` when the node has saved no vote.
    ReadFence(Option<Vote>),
}

/// Who this node is on the peer network, and what it has learned of others.
#[derive(Debug)]
pub struct PeerContext {
    pub node_id: u64,
    /// The shard this context's Raft serves in a multi-shard cluster: its
    /// connections send hello version 3 and tag every frame with it.
    /// `None`: a single group (versions 1-2, untagged frames, shard 0).
    pub shard: Option<ShardId>,
    pub client_addr: String,
    pub token: Option<String>,
    /// Where this node's cluster identity is kept (applied state).
    state: RegionStateMachine,
    /// Max bytes of a snapshot this node accepts (bounded by its region).
    pub max_snapshot_bytes: u64,
    /// Mutual TLS to the other members' peer ports (`None`: plain TCP).
    tls: Option<Arc<ClientTls>>,
    client_addrs: Mutex<HashMap<u64, String>>,
    /// Members this node must not talk to (fault injection, tests only).
    isolated_from: Mutex<BTreeSet<u64>>,
    /// When a leader's AppendEntries (heartbeats included) was last
    /// accepted: how fresh this follower's view of the commit index is.
    last_leader_contact: Mutex<Option<std::time::Instant>>,
    /// The longest wait between two dials to a peer that cannot be reached
    /// (`redial`).
    max_dial_wait: std::time::Duration,
    /// The vote this node's log last made durable: what a read fence is
    /// answered with, read without the log's lock or RaftCore.
    persisted_vote: PersistedVote,
}

impl PeerContext {
    /// Fault injection: from now on, drop all Raft traffic with `peers`.
    pub fn isolate_from(&self, peers: impl IntoIterator<Item = u64>) {
        *self
            .isolated_from
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = peers.into_iter().collect();
    }

    /// Records that a current leader's AppendEntries was just accepted.
    pub fn leader_contact(&self) {
        *self
            .last_leader_contact
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(std::time::Instant::now());
    }

    /// Time since a leader's AppendEntries was last accepted (`None`: never).
    pub fn since_leader_contact(&self) -> Option<std::time::Duration> {
        self.last_leader_contact
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .map(|at| at.elapsed())
    }

    /// The TLS peer connections are made with, if any.
    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_deref()
    }

    /// The vote this node last made durable (`None`: it saved none); never
    /// one the disk may not hold, unlike the in-memory vote of the metrics.
    pub fn persisted_vote(&self) -> Option<Vote> {
        self.persisted_vote.get()
    }

    /// Whether traffic with node `id` is being dropped (fault injection).
    pub fn is_isolated_from(&self, id: u64) -> bool {
        self.isolated_from
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains(&id)
    }

    // Each argument is a distinct piece of the node's identity or state,
    // with one caller (`node::start_raft`); a builder would only hide that
    // the persisted vote is required.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node_id: u64,
        shard: Option<ShardId>,
        client_addr: String,
        token: Option<String>,
        state: RegionStateMachine,
        max_snapshot_bytes: u64,
        tls: Option<Arc<ClientTls>>,
        persisted_vote: PersistedVote,
    ) -> Self {
        PeerContext {
            node_id,
            shard,
            client_addr,
            token,
            state,
            max_snapshot_bytes,
            tls,
            client_addrs: Mutex::new(HashMap::new()),
            isolated_from: Mutex::new(BTreeSet::new()),
            last_leader_contact: Mutex::new(None),
            max_dial_wait: redial::MAX_WAIT,
            persisted_vote,
        }
    }

    /// Dials to a peer that cannot be reached wait at most `heartbeat`
    /// (never more than `redial::MAX_WAIT`).
    #[must_use]
    pub fn with_heartbeat(mut self, heartbeat: std::time::Duration) -> Self {
        self.max_dial_wait = heartbeat.min(redial::MAX_WAIT);
        self
    }

    /// The dials to `target` as `redial` paces them.
    fn dial_peer(&self, target: u64) -> redial::DialPeer {
        redial::DialPeer {
            shard: self.shard,
            target,
            max_wait: self.max_dial_wait,
        }
    }

    /// This node's cluster identity, once it has one (`None` until the
    /// first leader's `SetClusterId` is applied, or on a fresh node).
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.state.cluster_id()
    }

    /// Records a peer's client address, learned from a handshake.
    pub fn learn_client_addr(&self, node_id: u64, client_addr: String) {
        if client_addr.is_empty() {
            return;
        }
        self.client_addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node_id, client_addr);
    }

    pub fn client_addr_of(&self, node_id: u64) -> Option<String> {
        if node_id == self.node_id {
            return Some(self.client_addr.clone());
        }
        self.client_addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node_id)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use rdkv_proto::wire::{FrameDecoder, FrameKind, encoded_frame};

    use super::*;

    fn frame_of<T: Serialize>(message: &T) -> Frame {
        let mut bytes: BytesMut =
            encoded_frame(FrameKind::Request, 7, message, PEER_MAX_FRAME_BYTES).unwrap();
        FrameDecoder::new(PEER_MAX_FRAME_BYTES)
            .decode(&mut bytes)
            .unwrap()
            .unwrap()
    }

    fn failed(frame: &Frame, version: u16) -> Result<(ShardId, String), WireError> {
        decode_for_shard::<PeerResponse>(version, frame).map(|(shard, response)| match response {
            PeerResponse::Failed(message) => (shard, message),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn older_connections_carry_shard_0_and_version_3_names_the_shard() {
        let plain = frame_of(&PeerResponse::Failed("x".into()));
        for version in [PEER_PROTOCOL_VERSION_NO_IDENTITY, PEER_PROTOCOL_VERSION] {
            assert_eq!(failed(&plain, version).unwrap(), (ShardId(0), "x".into()));
        }
        let tagged = frame_of(&(ShardId(300), PeerResponse::Failed("y".into())));
        assert_eq!(
            failed(&tagged, PEER_PROTOCOL_VERSION_SHARDS).unwrap(),
            (ShardId(300), "y".into())
        );
        // A tagged payload is not an untagged one, and the reverse: neither
        // is taken for the other's shard.
        assert!(failed(&tagged, PEER_PROTOCOL_VERSION).is_err());
        assert!(failed(&plain, PEER_PROTOCOL_VERSION_SHARDS).is_err());
    }

    /// `PeerRequest` as it was before `ReadFence`: what an older node
    /// decodes requests as.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only decoded, to see what an older node refuses
    enum OldPeerRequest {
        Append(AppendEntriesRequest),
        Vote(VoteRequest),
        PreVote(VoteRequest),
        TransferLeader(TransferLeaderRequest),
        SnapshotChunk(SnapshotPiece),
    }

    #[test]
    fn the_read_fence_is_appended_and_older_nodes_refuse_it() {
        // Postcard writes the variant index first: appending keeps the
        // indexes (and so the encoding) of the variants before.
        let fence = postcard::to_allocvec(&PeerRequest::ReadFence).unwrap();
        assert_eq!(fence, [5]);
        let failed = postcard::to_allocvec(&PeerResponse::Failed("x".into())).unwrap();
        assert_eq!(failed[0], 4, "Failed keeps its index");
        let vote = Vote::new_committed(3, 2);
        let answer = postcard::to_allocvec(&PeerResponse::ReadFence(Some(vote))).unwrap();
        assert_eq!(answer[0], 5);
        match decode_exact::<PeerResponse>(&answer).unwrap() {
            PeerResponse::ReadFence(decoded) => assert_eq!(decoded, Some(vote)),
            other => panic!("{other:?}"),
        }
        // An older node cannot decode it, so answers `Failed` (which the
        // leader counts as no) rather than something else.
        let old = decode_exact::<OldPeerRequest>(&fence);
        assert!(old.is_err(), "{old:?}");
    }
}
