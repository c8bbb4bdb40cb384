//! The sending side: openraft's `RaftNetworkFactory`/`RaftNetworkV2` over TCP.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::OptionalSend;
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, ReplicationClosed, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{Frame, FrameKind, decode_payload};
use rdkv_storage::raft::rpc::{
    AppendEntriesRequest, AppendEntriesResponse, RaftError, RpcError, SnapshotResponse,
    StreamAppendResult, StreamingError, TransferLeaderRequest, TransferLeaderResponse, VoteRequest,
    VoteResponse,
};
use rdkv_storage::raft::{NodeAddr, TypeConfig, Vote};
use rdkv_storage::state_machine::Snapshot;
use rdkv_tls::{ReadHalf, Stream, WriteHalf};
use tokio::net::TcpStream;

use super::append_out;
use super::link::{PeerLink, PeerLinks, Purpose};
use super::redial::Redial;
use super::{
    PEER_MAX_FRAME_BYTES, PEER_PROTOCOL_VERSION, PEER_PROTOCOL_VERSION_SHARDS, PeerContext,
    PeerHello, PeerHelloReply, PeerRequest, PeerResponse, SNAPSHOT_CHUNK_BYTES, SnapshotPiece,
    WireHello,
};
use crate::framed::{FrameReader, FrameWriter};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// openraft does not time out appends itself; a dead follower must not
/// hold a replication stream for long.
const MIN_APPEND_TIMEOUT: Duration = Duration::from_secs(2);
const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct PeerNetwork {
    ctx: Arc<PeerContext>,
    /// The node's shared connections, used by a shard of a multi-shard
    /// cluster (`ctx.shard` set); a single group keeps a connection per
    /// target of its own (docs/sharding.md, section 3).
    links: Arc<PeerLinks>,
}

impl PeerNetwork {
    pub fn new(ctx: Arc<PeerContext>, links: Arc<PeerLinks>) -> Self {
        PeerNetwork { ctx, links }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConn;

    async fn new_client(&mut self, target: u64, node: &NodeAddr) -> PeerConn {
        let links = self.ctx.shard.map(|shard| Links {
            shard,
            raft: self.links.get(target, &node.peer_addr, Purpose::Raft),
            snapshot: self.links.get(target, &node.peer_addr, Purpose::Snapshot),
        });
        // Registered once per connection, not per append stream: a
        // ReadIndex round is a stream of its own (one heartbeat), thousands
        // a second under a read load, and a lookup takes the registry's lock.
        let append_round_trip = metrics::histogram!(
            "rdkv_peer_append_round_trip_seconds",
            "shard" => self.ctx.shard.unwrap_or(ShardId(0)).to_string(),
            "peer" => target.to_string()
        );
        PeerConn {
            links,
            ctx: Arc::clone(&self.ctx),
            target,
            append_round_trip,
            addr: node.peer_addr.clone(),
            conn: None,
            redial: Redial::default(),
            next_request_id: 1,
        }
    }
}

/// What a Raft RPC to a peer returns.
type RpcResult<T> = Result<T, RpcError>;

pub(super) type Conn = (FrameReader<ReadHalf>, FrameWriter<WriteHalf>);

#[derive(Debug)]
pub struct PeerConn {
    pub(super) ctx: Arc<PeerContext>,
    pub(super) target: u64,
    addr: String,
    /// The open connection between calls (none while a call or an append
    /// stream holds it, or after a failure).
    pub(super) conn: Option<Conn>,
    /// Paces the dials to the target after failures.
    redial: Redial,
    next_request_id: u64,
    /// A shard's links to the target (multi-shard clusters): its calls
    /// and appends go through them instead of `conn`.
    pub(super) links: Option<Links>,
    /// `rdkv_peer_append_round_trip_seconds` of this target.
    pub(super) append_round_trip: metrics::Histogram,
}

/// A shard's links to one target, and the shard its frames name.
#[derive(Debug)]
pub(super) struct Links {
    pub(super) shard: ShardId,
    pub(super) raft: Arc<PeerLink>,
    snapshot: Arc<PeerLink>,
}

pub(super) fn unreachable(message: String) -> RpcError {
    RpcError::Unreachable(Unreachable::from_string(message))
}

/// What a call to `target` gets while fault injection cuts it off.
pub(super) fn cut_off_error(target: u64) -> RpcError {
    unreachable(format!("node {target} is cut off by fault injection"))
}

pub(super) fn network(message: String) -> RpcError {
    RpcError::Network(NetworkError::from_string(message))
}

/// Mutual TLS over `tcp` when peers use it.
async fn secure(ctx: &PeerContext, target: u64, addr: &str, tcp: TcpStream) -> RpcResult<Stream> {
    let Some(tls) = ctx.tls() else {
        return Ok(Stream::Tcp(tcp));
    };
    tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(tcp, addr))
        .await
        .map_err(|_| unreachable(format!("TLS with node {target} at {addr}: timed out")))?
        .map_err(|e| unreachable(format!("TLS with node {target} at {addr}: {e}")))
}

/// A connection to node `target` at `addr`, opened with `hello` and
/// accepted by that node.
pub(super) async fn connect(
    ctx: &PeerContext,
    target: u64,
    addr: &str,
    hello: WireHello,
) -> RpcResult<Conn> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(format!("connect to node {target} at {addr}: timed out")))?
        .map_err(|e| unreachable(format!("connect to node {target} at {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let stream = secure(ctx, target, addr, stream).await?;
    let (read, write) = stream.into_split();
    let mut reader = FrameReader::new(read, PEER_MAX_FRAME_BYTES);
    let mut writer = FrameWriter::new(write, PEER_MAX_FRAME_BYTES);
    let handshake = async {
        writer
            .send(FrameKind::ClientHello, 0, &hello)
            .await
            .map_err(|e| network(format!("handshake with node {target}: {e}")))?;
        let frame = reader
            .next()
            .await
            .map_err(|e| network(format!("handshake with node {target}: {e}")))?
            .ok_or_else(|| network(format!("node {target} closed during handshake")))?;
        decode_payload::<PeerHelloReply>(&frame)
            .map_err(|e| network(format!("handshake with node {target}: {e}")))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
        Err(_) => Err(unreachable(format!(
            "handshake with node {target}: timed out"
        ))),
        Ok(Err(e)) => Err(e),
        Ok(Ok(PeerHelloReply::Rejected { message })) => Err(unreachable(format!(
            "node {target} refused this node: {message}"
        ))),
        Ok(Ok(PeerHelloReply::Accepted {
            node_id,
            client_addr,
        })) => {
            if node_id != target {
                return Err(unreachable(format!(
                    "{addr} is node {node_id}, not node {target}"
                )));
            }
            ctx.learn_client_addr(node_id, client_addr);
            Ok((reader, writer))
        }
    }
}

impl PeerConn {
    /// The shard this connection's frames are tagged with (`None`: untagged).
    pub(super) fn shard(&self) -> Option<ShardId> {
        self.ctx.shard
    }

    /// Whether fault injection has cut this node off from the target.
    pub(super) fn cut_off(&self) -> bool {
        self.ctx.is_isolated_from(self.target)
    }

    pub(super) fn next_request_id(&mut self) -> u64 {
        let id = self.next_request_id;
        self.next_request_id += 1;
        id
    }

    /// The connection for a call or a stream: the open one, or a new one.
    /// Whoever takes it gives it back only when nothing is left unread.
    /// A new one is dialed in its turn ([`Redial`]); fault injection's cut
    /// counts as a failed dial.
    pub(super) async fn open(&mut self) -> RpcResult<Conn> {
        if self.cut_off() {
            self.conn = None;
        } else if let Some(conn) = self.conn.take() {
            return Ok(conn);
        }
        let hello = PeerHello::of(&self.ctx).into_wire();
        let (ctx, target, addr) = (&self.ctx, self.target, self.addr.as_str());
        let dial = async {
            if ctx.is_isolated_from(target) {
                return Err(cut_off_error(target));
            }
            connect(ctx, target, addr, hello).await
        };
        self.redial.dial(ctx.dial_peer(target), dial).await
    }

    /// The link of `purpose` of a shard of a multi-shard cluster, unless
    /// fault injection cut this node off from the target (which drops the
    /// link's connection, as it drops a single group's).
    pub(super) async fn link(&self, purpose: Purpose) -> RpcResult<Option<(ShardId, &PeerLink)>> {
        let Some(links) = &self.links else {
            return Ok(None);
        };
        let link = match purpose {
            Purpose::Raft => &links.raft,
            Purpose::Snapshot => &links.snapshot,
        };
        if self.cut_off() {
            return Err(link.refuse_cut(self.ctx.dial_peer(self.target)).await);
        }
        Ok(Some((links.shard, link)))
    }

    /// One request, one response, on the link of `purpose` (a multi-shard
    /// cluster) or on the target's own connection.
    async fn call(
        &mut self,
        purpose: Purpose,
        request: &PeerRequest,
        timeout: Duration,
    ) -> RpcResult<PeerResponse> {
        let Some((shard, link)) = self.link(purpose).await? else {
            return self.call_alone(request, timeout).await;
        };
        let target = self.target;
        let exchange = async {
            let mut pending = link.send(&self.ctx, shard, request).await?;
            let frame = pending.answer(target).await?;
            decode_response(Some(shard), &frame)
                .map_err(|e| network(format!("decode from node {target}: {e}")))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| network(format!("node {target} did not answer within {timeout:?}")))?
    }

    /// One request, one response on the target's own connection; any
    /// failure drops the connection so the next call starts clean.
    async fn call_alone(
        &mut self,
        request: &PeerRequest,
        timeout: Duration,
    ) -> RpcResult<PeerResponse> {
        let (mut reader, mut writer) = self.open().await?;
        let request_id = self.next_request_id();
        let target = self.target;
        let exchange = async {
            send_request(self.ctx.shard, &mut writer, request_id, request)
                .await
                .map_err(|e| network(format!("send to node {target}: {e}")))?;
            let frame = reader
                .next()
                .await
                .map_err(|e| network(format!("receive from node {target}: {e}")))?
                .ok_or_else(|| network(format!("node {target} closed the connection")))?;
            if frame.request_id != request_id {
                return Err(network(format!(
                    "node {target} answered request {} out of turn",
                    frame.request_id
                )));
            }
            decode_response(self.ctx.shard, &frame)
                .map_err(|e| network(format!("decode from node {target}: {e}")))
        };
        let response = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| network(format!("node {target} did not answer within {timeout:?}")))??;
        self.conn = Some((reader, writer));
        Ok(response)
    }
}

impl PeerConn {
    /// The target's persisted vote, for a read fence (`peer::fence`). An
    /// older node cannot decode the request and answers `Failed`, an error
    /// here, which the fence counts as no.
    pub(super) async fn read_fence(&mut self, timeout: Duration) -> RpcResult<Option<Vote>> {
        match self
            .call(Purpose::Raft, &PeerRequest::ReadFence, timeout)
            .await?
        {
            PeerResponse::ReadFence(vote) => Ok(vote),
            other => Err(unexpected(self.target, other)),
        }
    }
}

/// Sends `request`, tagged with `shard` when there is one (hello version 3).
pub(super) async fn send_request(
    shard: Option<ShardId>,
    writer: &mut FrameWriter<WriteHalf>,
    request_id: u64,
    request: &PeerRequest,
) -> Result<(), crate::framed::FramedError> {
    match shard {
        Some(shard) => {
            writer
                .send(FrameKind::Request, request_id, &(shard, request))
                .await
        }
        None => writer.send(FrameKind::Request, request_id, request).await,
    }
}

/// The answer in `frame`, which must be for the connection's `shard`.
pub(super) fn decode_response(
    shard: Option<ShardId>,
    frame: &Frame,
) -> Result<PeerResponse, String> {
    let version = match shard {
        Some(_) => PEER_PROTOCOL_VERSION_SHARDS,
        None => PEER_PROTOCOL_VERSION,
    };
    let (answered, response) =
        super::decode_for_shard::<PeerResponse>(version, frame).map_err(|e| e.to_string())?;
    let asked = shard.unwrap_or(ShardId(0));
    if answered != asked {
        return Err(format!(
            "an answer for shard {} on shard {}'s connection",
            answered.0, asked.0
        ));
    }
    Ok(response)
}

pub(super) fn unexpected(target: u64, response: PeerResponse) -> RpcError {
    match response {
        PeerResponse::Failed(message) => network(format!("node {target}: {message}")),
        other => network(format!(
            "node {target} sent an unexpected response: {other:?}"
        )),
    }
}

/// A remote Raft error means the peer cannot serve Raft right now (it is
/// shutting down or broken): back off like an unreachable peer.
pub(super) fn remote<T>(target: u64, result: Result<T, RaftError>) -> RpcResult<T> {
    result.map_err(|e| unreachable(format!("node {target}: {e}")))
}

/// Sends `PeerRequest::$request($rpc)` on a `PeerConn` and returns the Raft
/// result carried by the `PeerResponse::$answer` it expects (a macro, not a
/// function: the variants are patterns).
macro_rules! raft_call {
    ($conn:ident, $request:ident($rpc:expr), $timeout:expr, $answer:ident) => {
        match $conn
            .call(Purpose::Raft, &PeerRequest::$request($rpc), $timeout)
            .await?
        {
            PeerResponse::$answer(result) => remote($conn.target, result),
            other => Err(unexpected($conn.target, other)),
        }
    };
}

impl RaftNetworkV2<TypeConfig> for PeerConn {
    type SnapshotData = rdkv_storage::state_machine::SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse> {
        let timeout = option.hard_ttl().max(MIN_APPEND_TIMEOUT);
        raft_call!(self, Append(rpc), timeout, Append)
    }

    /// Pipelined: see `append_out`.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, RpcResult<BoxStream<'s, RpcResult<StreamAppendResult>>>>
    where
        S: futures::Stream<Item = AppendEntriesRequest> + OptionalSend + Unpin + 'static,
    {
        let timeout = option.hard_ttl().max(MIN_APPEND_TIMEOUT);
        append_out::stream(self, input, timeout)
    }

    async fn vote(&mut self, rpc: VoteRequest, option: RPCOption) -> RpcResult<VoteResponse> {
        raft_call!(self, Vote(rpc), option.hard_ttl(), Vote)
    }

    async fn pre_vote(&mut self, rpc: VoteRequest, option: RPCOption) -> RpcResult<VoteResponse> {
        raft_call!(self, PreVote(rpc), option.hard_ttl(), Vote)
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest,
        option: RPCOption,
    ) -> RpcResult<TransferLeaderResponse> {
        raft_call!(self, TransferLeader(req), option.hard_ttl(), TransferLeader)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse, StreamingError> {
        let send = async {
            let file = snapshot.snapshot.clone();
            let total_bytes = file.len();
            let mut offset = 0u64;
            loop {
                // Read from the file chunk by chunk: a snapshot is as large
                // as the region's live data, and never held whole.
                let data = file
                    .read_chunk(offset, SNAPSHOT_CHUNK_BYTES)
                    .await
                    .map_err(|e| {
                        network(format!(
                            "reading the snapshot for node {}: {e}",
                            self.target
                        ))
                    })?;
                let end = offset + data.len() as u64;
                let chunk = PeerRequest::SnapshotChunk(SnapshotPiece {
                    vote,
                    meta: snapshot.meta.clone(),
                    total_bytes,
                    offset,
                    data,
                });
                match self
                    .call(Purpose::Snapshot, &chunk, SNAPSHOT_CHUNK_TIMEOUT)
                    .await?
                {
                    PeerResponse::SnapshotChunk(Ok(Some(done))) => return Ok(done),
                    PeerResponse::SnapshotChunk(Ok(None)) if end < total_bytes => offset = end,
                    PeerResponse::SnapshotChunk(Ok(None)) => {
                        return Err(network(format!(
                            "node {} did not install the last chunk",
                            self.target
                        )));
                    }
                    PeerResponse::SnapshotChunk(Err(message)) => {
                        return Err(network(format!(
                            "node {} refused the snapshot: {message}",
                            self.target
                        )));
                    }
                    other => return Err(unexpected(self.target, other)),
                }
            }
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => Ok(result?),
        }
    }
}
