//! The receiving side: accepts peer connections, checks who they are, and
//! hands their RPCs to the local Raft.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::future::BoxFuture;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::RaftError;
use openraft::raft::AppendEntriesResponse;
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{FrameKind, tokens_match};
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::SnapshotMeta;
use rdkv_storage::state_machine::snapshot_store::NewSnapshot;
use rdkv_storage::state_machine::{RegionStateMachine, Snapshot};
use rdkv_tls::Stream;
use tokio::sync::{mpsc, watch};

use super::append_in::Inbound;
use super::demux::{self, Incoming, Outgoing};
use super::{
    PEER_MAGIC, PEER_MAX_FRAME_BYTES, PEER_PROTOCOL_VERSION_NO_IDENTITY,
    PEER_PROTOCOL_VERSION_SHARDS, PeerContext, PeerHello, PeerHelloReply, PeerRequest,
    PeerResponse, SnapshotPiece,
};
use crate::Raft;
use crate::accept::{TcpFront, accept_until};
use crate::framed::{FrameReader, FrameWriter};
use crate::shards::Shards;
use crate::telemetry::{RateLimitedLog, RequestStats};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const HANDSHAKE_MAX_FRAME_BYTES: u32 = 64 * 1024;

/// The shard replicas a node's peer port serves: each shard's Raft and its
/// peer context (docs/sharding.md, section 3), as hosted now: a replica
/// opened later is served from then on, one closed no longer.
#[derive(Debug, Clone)]
pub struct PeerShards {
    shards: Shards,
}

impl PeerShards {
    pub fn new(shards: Shards) -> PeerShards {
        PeerShards { shards }
    }

    /// Who this node is (id, token, client address): the same in every
    /// shard's context.
    fn own(&self) -> Arc<PeerContext> {
        Arc::clone(&self.shards.primary().peers)
    }

    fn contexts(&self) -> impl Iterator<Item = Arc<PeerContext>> + use<> {
        self.shards
            .all()
            .map(|(_, replica)| Arc::clone(&replica.peers))
    }

    fn sharded(&self) -> bool {
        self.shards.is_sharded()
    }

    /// Whether `ctx` is the context of the replica of `shard` hosted now.
    fn hosts(&self, shard: ShardId, ctx: &Arc<PeerContext>) -> bool {
        self.shards
            .any(shard)
            .is_some_and(|replica| Arc::ptr_eq(&replica.peers, ctx))
    }

    /// A multi-shard node's cluster identity: its metadata group's.
    fn identity(&self) -> Option<ClusterId> {
        self.shards.any(ShardId::META)?.peers.cluster_id()
    }
}

pub async fn serve_peers(listener: TcpFront, shards: PeerShards, shutdown: watch::Receiver<bool>) {
    accept_until(listener, "peer", shutdown, move |stream, _| {
        handle(stream, shards.clone())
    })
    .await;
}

/// Why a peer is refused at its hello, if it is: a wrong token or protocol,
/// another cluster, or (hellos 1-2, which carry shard 0 only) not a member
/// of shard 0. A version-3 peer's membership is checked per shard, when its
/// frames name one ([`admit`]).
fn refusal(hello: &PeerHello, shards: &PeerShards) -> Option<String> {
    let versions = PEER_PROTOCOL_VERSION_NO_IDENTITY..=PEER_PROTOCOL_VERSION_SHARDS;
    if hello.magic != PEER_MAGIC || !versions.contains(&hello.version) {
        return Some("not an rdkv peer of this protocol version".into());
    }
    let own = shards.own();
    if let Some(expected) = &own.token {
        let presented = hello.token.as_deref().unwrap_or("");
        if !tokens_match(expected.as_bytes(), presented.as_bytes()) {
            return Some("wrong or missing token".into());
        }
    }
    let tagged = hello.version >= PEER_PROTOCOL_VERSION_SHARDS;
    match (tagged, shards.sharded()) {
        // A shared connection carries every shard: its identity is the
        // node's (the metadata group's), checked once here.
        (true, true) => other_cluster(hello.cluster_id, shards.identity()),
        (true, false) => Some("this node serves a single group (peer versions 1-2)".into()),
        (false, true) => Some("this node serves several shards (peer version 3)".into()),
        (false, false) => admit(hello, ShardId(0), shards).err(),
    }
}

/// Shard `shard`'s Raft and context for the peer of `hello`, if this node
/// hosts the shard and the peer may send it Raft traffic: a member of it
/// (any peer while this replica is in no cluster yet, about to be added or
/// initialized) of the same cluster.
fn admit(hello: &PeerHello, shard: ShardId, shards: &PeerShards) -> Result<Bound, String> {
    let Some(replica) = shards.shards.any(shard) else {
        return Err(format!("this node does not host shard {}", shard.0));
    };
    let (raft, ctx) = (&replica.raft, &replica.peers);
    let metrics = raft.metrics().borrow_watched().clone();
    let membership = metrics.membership_config.membership();
    let uninitialized = membership.nodes().next().is_none();
    let member = membership.nodes().any(|(id, _)| *id == hello.from_id);
    if !uninitialized && !member {
        return Err(format!(
            "node {} is not a member of shard {}",
            hello.from_id, shard.0
        ));
    }
    // A shared connection's identity was checked at its hello.
    let tagged = hello.version >= PEER_PROTOCOL_VERSION_SHARDS;
    if let Some(message) = other_cluster(hello.cluster_id, ctx.cluster_id()).filter(|_| !tagged) {
        return Err(message);
    }
    Ok(Bound {
        shard,
        raft: raft.clone(),
        ctx: Arc::clone(ctx),
        appends: Inbound::new(raft.clone()),
        incoming: IncomingSnapshot::default(),
    })
}

/// Why a peer of cluster `theirs` is refused by a node of cluster `ours`:
/// both known and different. A side that has none yet (a fresh node, a
/// cluster upgraded from a version without identities whose leader has not
/// proposed one) is not refused for it.
fn other_cluster(theirs: Option<ClusterId>, ours: Option<ClusterId>) -> Option<String> {
    match (theirs, ours) {
        (Some(theirs), Some(ours)) if theirs != ours => Some(format!(
            "it belongs to cluster {theirs}, this node to cluster {ours} \
             (a node restored from a backup forms a new cluster)"
        )),
        _ => None,
    }
}

/// See `service::AUTH_FAILURE_LOG`.
static PEER_REFUSAL_LOG: RateLimitedLog = RateLimitedLog::new(10);

/// The shard a connection's frames go to now, with its state: appends
/// being answered and a snapshot being received.
struct Bound {
    shard: ShardId,
    raft: Raft,
    ctx: Arc<PeerContext>,
    appends: Inbound,
    incoming: IncomingSnapshot,
}

/// Where a connection's answers go: straight to its writer (a single
/// group's connection: untagged, shard 0), or to the writer task of a
/// shared connection, which tags them with their shard (`demux`).
enum Answers {
    Direct(FrameWriter<rdkv_tls::WriteHalf>),
    Queued(mpsc::Sender<Outgoing>),
}

impl Answers {
    async fn send(
        &mut self,
        shard: ShardId,
        request_id: u64,
        response: PeerResponse,
    ) -> Result<()> {
        match self {
            Answers::Direct(writer) => {
                writer
                    .send(FrameKind::Response, request_id, &response)
                    .await?;
            }
            Answers::Queued(answers) => {
                demux::send_answer(answers, shard, request_id, response).await?;
            }
        }
        Ok(())
    }

    /// Sends one of `bound`'s answers; an accepted append (any answer but a
    /// higher vote) means the sender leads that shard now. (`bound` itself
    /// is not `Sync`: its append stream is borrowed mutably elsewhere.)
    async fn answer(
        &mut self,
        (shard, ctx): (ShardId, &PeerContext),
        request_id: u64,
        response: PeerResponse,
    ) -> Result<()> {
        if let PeerResponse::Append(Ok(r)) = &response
            && !matches!(r, AppendEntriesResponse::HigherVote(_))
        {
            ctx.leader_contact();
        }
        self.send(shard, request_id, response).await
    }

    /// Answers every append `bound` still has waiting, in order.
    async fn drain(&mut self, bound: &mut Bound) -> Result<()> {
        while let Some((request_id, response)) = bound.appends.next_answer().await {
            self.answer((bound.shard, &bound.ctx), request_id, response)
                .await?;
        }
        Ok(())
    }
}

/// Waits for what `incoming` brings (the next frame of a connection, or of
/// a shard's queue), answering meanwhile, and first, the appends of
/// `bound` as they complete: a connection and a shard's worker both serve
/// pipelined appends so.
async fn answer_until<F>(
    out: &mut Answers,
    bound: &mut Bound,
    incoming: impl Future<Output = F>,
) -> Result<F> {
    tokio::pin!(incoming);
    loop {
        let waiting = bound.appends.has_waiting();
        tokio::select! {
            biased;
            Some((request_id, response)) = bound.appends.next_answer(), if waiting => {
                out.answer((bound.shard, &bound.ctx), request_id, response)
                    .await?;
            }
            item = &mut incoming => return Ok(item),
        }
    }
}

async fn handle(stream: Stream, shards: PeerShards) -> Result<()> {
    let (read, write) = stream.into_split();
    // Nothing large is read before the peer has proven it holds the token.
    let mut reader = FrameReader::new(read, HANDSHAKE_MAX_FRAME_BYTES);
    let mut writer = FrameWriter::new(write, PEER_MAX_FRAME_BYTES);
    let (hello, own) = handshake(&mut reader, &mut writer, &shards).await?;
    reader.set_max_frame_bytes(PEER_MAX_FRAME_BYTES);
    let from = hello.from_id;
    if hello.version < PEER_PROTOCOL_VERSION_SHARDS {
        // Hellos 1-2 carry shard 0 only, admitted with the hello.
        let bound = admit(&hello, ShardId(0), &shards).map_err(anyhow::Error::msg)?;
        return serve_single(reader, Answers::Direct(writer), bound, &own, from).await;
    }
    let mut start = |shard: ShardId, queue, answers| {
        let bound = admit(&hello, shard, &shards).inspect_err(|message| {
            PEER_REFUSAL_LOG.warn(format_args!("refused a frame of node {from}: {message}"));
        })?;
        let admitted = Arc::clone(&bound.ctx);
        let worker: BoxFuture<'static, ()> = Box::pin(serve_shard(
            bound,
            shards.clone(),
            queue,
            Answers::Queued(answers),
        ));
        Ok((admitted, worker))
    };
    // A fence is answered by the replica the peer was admitted to, while it
    // is the one hosted; a replaced one's fences go to its worker, which
    // ends the connection (the sender's next one admits the new replica).
    // See `serve_frame` for why a fence is answered out of order.
    let at_once = |shard: ShardId, admitted: &Arc<PeerContext>, request: &PeerRequest| {
        let fence = matches!(request, PeerRequest::ReadFence) && shards.hosts(shard, admitted);
        fence.then(|| PeerResponse::ReadFence(admitted.persisted_vote()))
    };
    let cut_off = || own.is_isolated_from(from);
    demux::serve(reader, writer, &mut start, &at_once, cut_off).await
}

/// A single group's connection (hellos 1-2): one task reads, serves and
/// answers, with no hand-over on the way (issue 15's one-write latency).
async fn serve_single(
    mut reader: FrameReader<rdkv_tls::ReadHalf>,
    mut out: Answers,
    mut bound: Bound,
    own: &PeerContext,
    from: u64,
) -> Result<()> {
    loop {
        let Some(frame) = answer_until(&mut out, &mut bound, reader.next()).await?? else {
            return Ok(());
        };
        if own.is_isolated_from(from) {
            // As if the network lost it: no answer, and the sender's
            // connection goes away.
            bail!("node {from} is cut off by fault injection");
        }
        let decoded = rdkv_proto::wire::decode_payload::<PeerRequest>(&frame);
        serve_frame(&mut out, &mut bound, frame.request_id, decoded).await?;
    }
}

/// One shard's worker on a shared connection: serves the requests its
/// queue brings in order (appends pipelined), until the queue closes, the
/// connection's writer ends, or the replica it serves is no longer the
/// one hosted (closed, or closed and opened again by replica moves: its
/// Raft is stopped). Then the connection ends with it, and the sender's
/// next connection admits the shard's current replica.
async fn serve_shard(
    mut bound: Bound,
    shards: PeerShards,
    mut queue: mpsc::Receiver<Incoming>,
    mut out: Answers,
) {
    let served: Result<()> = async {
        loop {
            let Some(incoming) = answer_until(&mut out, &mut bound, queue.recv()).await? else {
                return Ok(());
            };
            if !shards.hosts(bound.shard, &bound.ctx) {
                bail!("shard {}'s replica here was replaced", bound.shard.0);
            }
            serve_frame(&mut out, &mut bound, incoming.request_id, incoming.request).await?;
        }
    }
    .await;
    if let Err(e) = served {
        tracing::debug!(shard = bound.shard.0, "serving peer requests: {e:#}");
    }
}

/// Reads and checks the peer's hello and answers it: the peer is refused
/// (and the connection ends) unless [`refusal`] finds nothing wrong.
/// Returns the hello and this node's own context.
async fn handshake(
    reader: &mut FrameReader<rdkv_tls::ReadHalf>,
    writer: &mut FrameWriter<rdkv_tls::WriteHalf>,
    shards: &PeerShards,
) -> Result<(PeerHello, Arc<PeerContext>)> {
    let frame = tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.next())
        .await
        .context("peer handshake timed out")??
        .context("peer closed before its handshake")?;
    let hello = PeerHello::decode(&frame.payload).context("decoding the peer handshake")?;
    let own = shards.own();
    if let Some(message) = refusal(&hello, shards) {
        RequestStats::auth_failure("peer");
        PEER_REFUSAL_LOG.warn(format_args!(
            "refused a peer connection from node {}: {message}",
            hello.from_id
        ));
        let rejected = PeerHelloReply::Rejected {
            message: message.clone(),
        };
        writer.send(FrameKind::ServerHello, 0, &rejected).await?;
        bail!("refused: {message}");
    }
    for ctx in shards.contexts() {
        ctx.learn_client_addr(hello.from_id, hello.from_client_addr.clone());
    }
    let accepted = PeerHelloReply::Accepted {
        node_id: own.node_id,
        client_addr: own.client_addr.clone(),
    };
    writer.send(FrameKind::ServerHello, 0, &accepted).await?;
    Ok((hello, own))
}

/// Serves one decoded request of the bound shard: appends are pipelined,
/// anything else is answered in request order after them.
async fn serve_frame(
    out: &mut Answers,
    b: &mut Bound,
    request_id: u64,
    decoded: Result<PeerRequest, rdkv_proto::wire::WireError>,
) -> Result<()> {
    match decoded {
        Ok(PeerRequest::Append(rpc)) => {
            // A leader keeps at most `MAX_APPENDS_IN_FLIGHT` appends
            // unanswered; past that, the oldest is answered before
            // another is taken (bounded, and never waiting on a queue
            // that only our own answering drains).
            while b.appends.is_full() {
                if let Some((answered_id, response)) = b.appends.next_answer().await {
                    out.answer((b.shard, &b.ctx), answered_id, response).await?;
                }
            }
            b.appends.submit(request_id, rpc).await;
        }
        Ok(PeerRequest::ReadFence) => {
            // Read fence: this node's persisted vote, from the log's cell
            // (no RaftCore, no lock), answered at once rather than after
            // the appends queued before it, which would make the fence wait
            // for this node's fsync. On a shared link `demux`'s reader
            // answers the fences of a shard whose worker runs (which could
            // be waiting on one of those appends; safe out of order: the
            // link routes answers by request id); a shard's first frame, or
            // a replaced replica's, reaches the worker. A connection of its own
            // answers in request order: the leader sends fences on
            // connections that carry nothing else (`peer::fence`), where
            // this drain has nothing to wait for. Not a leader contact (it
            // says nothing about this node's log), so `send`, not `answer`.
            if matches!(out, Answers::Direct(_)) {
                out.drain(b).await?;
            }
            let vote = b.ctx.persisted_vote();
            out.send(b.shard, request_id, PeerResponse::ReadFence(vote))
                .await?;
        }
        decoded => {
            // Answers keep request order: the appends before this
            // request are answered first.
            out.drain(b).await?;
            let response = match decoded {
                Err(e) => PeerResponse::Failed(format!("undecodable request: {e}")),
                Ok(request) => dispatch(request, &b.raft, &b.ctx, &mut b.incoming).await,
            };
            out.answer((b.shard, &b.ctx), request_id, response).await?;
        }
    }
    Ok(())
}

async fn dispatch(
    request: PeerRequest,
    raft: &Raft,
    ctx: &PeerContext,
    incoming: &mut IncomingSnapshot,
) -> PeerResponse {
    match request {
        // `handle` pipelines appends (`append_in`); one that reaches here
        // is served alone.
        PeerRequest::Append(rpc) => PeerResponse::Append(raft.append_entries(rpc).await),
        PeerRequest::Vote(rpc) => PeerResponse::Vote(raft.vote(rpc).await),
        PeerRequest::PreVote(rpc) => PeerResponse::Vote(raft.pre_vote(rpc).await),
        PeerRequest::TransferLeader(rpc) => PeerResponse::TransferLeader(
            raft.handle_transfer_leader(rpc)
                .await
                .map_err(RaftError::Fatal),
        ),
        PeerRequest::SnapshotChunk(piece) => {
            let vote = piece.vote;
            let installed = match incoming.accept(piece, ctx).await {
                Ok(Some(snapshot)) => raft
                    .install_full_snapshot(vote, snapshot)
                    .await
                    .map(Some)
                    .map_err(|e| e.to_string()),
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            PeerResponse::SnapshotChunk(installed)
        }
        // `serve_frame` answers fences itself; the same answer if one
        // reaches here.
        PeerRequest::ReadFence => PeerResponse::ReadFence(ctx.persisted_vote()),
    }
}

/// A snapshot being received, chunk by chunk, in order, into a new file of
/// the node's snapshot directory (removed if the transfer is given up or
/// the snapshot refused); the whole file is then installed by streaming it.
#[derive(Debug, Default)]
struct IncomingSnapshot {
    /// What the first chunk announced, and the file so far.
    received: Option<(SnapshotMeta, NewSnapshot)>,
}

impl IncomingSnapshot {
    /// Adds `piece`; the whole snapshot once its last chunk is in. A chunk
    /// out of order (or past the announced size) drops what was received.
    async fn accept(
        &mut self,
        piece: SnapshotPiece,
        ctx: &PeerContext,
    ) -> Result<Option<Snapshot>, String> {
        let SnapshotPiece {
            meta,
            total_bytes,
            offset,
            data,
            ..
        } = piece;
        if total_bytes > ctx.max_snapshot_bytes {
            self.received = None;
            return Err(format!(
                "snapshot of {total_bytes} bytes exceeds this node's limit of {}",
                ctx.max_snapshot_bytes
            ));
        }
        if offset == 0 {
            self.received = Some((meta.clone(), new_file(&ctx.state)?));
        }
        let Some((expected_meta, file)) = self.received.take() else {
            return Err("snapshot chunk without a first chunk".into());
        };
        if expected_meta != meta || file.len() != offset {
            return Err("snapshot chunk out of order".into());
        }
        if offset + data.len() as u64 > total_bytes {
            return Err("snapshot chunk past the announced size".into());
        }
        // File writes and the final fsync run off the runtime's threads.
        let file = blocking(move || {
            let mut file = file;
            file.append(&data).map(|()| file)
        })
        .await?;
        if file.len() < total_bytes {
            self.received = Some((meta, file));
            return Ok(None);
        }
        let snapshot = blocking(move || file.finish()).await?;
        Ok(Some(Snapshot { meta, snapshot }))
    }
}

fn new_file(sm: &RegionStateMachine) -> Result<NewSnapshot, String> {
    sm.new_snapshot_file()
        .map_err(|e| format!("receiving a snapshot: {e}"))
}

/// Runs a file operation of a received snapshot on a blocking thread.
async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("receiving a snapshot: {e}"))?
        .map_err(|e| format!("receiving a snapshot: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PEER_PROTOCOL_VERSION;

    #[test]
    fn only_a_known_other_cluster_is_refused() {
        let (a, b) = (ClusterId([1; 16]), ClusterId([2; 16]));
        assert!(other_cluster(Some(a), Some(b)).is_some());
        assert!(other_cluster(Some(b), Some(a)).is_some());
        assert_eq!(other_cluster(Some(a), Some(a)), None);
        // A fresh node, or a cluster upgraded from before identities.
        assert_eq!(other_cluster(None, Some(a)), None);
        assert_eq!(other_cluster(Some(a), None), None);
    }

    #[test]
    fn hellos_of_both_versions_decode_and_say_their_cluster() {
        let hello = |cluster_id| PeerHello {
            magic: PEER_MAGIC,
            version: match cluster_id {
                Some(_) => PEER_PROTOCOL_VERSION,
                None => PEER_PROTOCOL_VERSION_NO_IDENTITY,
            },
            token: Some("t".into()),
            from_id: 3,
            from_client_addr: "127.0.0.1:1".into(),
            cluster_id,
        };
        for cluster_id in [None, Some(ClusterId([7; 16]))] {
            let bytes = postcard::to_allocvec(&hello(cluster_id).into_wire()).unwrap();
            let decoded = PeerHello::decode(&bytes).unwrap();
            assert_eq!(decoded.cluster_id, cluster_id);
            assert_eq!(decoded.from_id, 3);
            assert_eq!(decoded.version, hello(cluster_id).version);
        }
        // Version 1's hello is exactly what version 1 nodes sent.
        let v1 = postcard::to_allocvec(&hello(None).into_wire()).unwrap();
        let v2 = postcard::to_allocvec(&hello(Some(ClusterId([7; 16]))).into_wire()).unwrap();
        assert_eq!(v2.len(), v1.len() + 1 + 16);
        assert!(PeerHello::decode(&v2[..v2.len() - 1]).is_err());
    }
}
