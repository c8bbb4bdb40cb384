//! One native-protocol connection (TCP or Unix socket), served by one
//! task: it reads frames, runs the requests they carry as futures of its
//! own (at most `MAX_IN_FLIGHT` at once: past that the socket is not read,
//! so a client is held back by TCP instead of an unbounded queue), and
//! writes each response as it completes. No task, channel or wake-up per
//! request: every frame already buffered is started before the answers
//! that are ready go out in one write.
//!
//! Requests on different keys run at once; a request after another that
//! may observe or change its keys runs after it (`order`: a read sees every
//! earlier write of its key on the connection, and writes of one key are
//! applied in request order, a later one proposed as soon as the earlier
//! one is placed in the log). Responses carry their request's id and go
//! out as they complete: a slow write does not hold back the answers to
//! other keys' requests that share the connection (one client multiplexes
//! many callers over it).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::{Result, bail};
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{
    ErrorCode, ErrorReply, Frame, FrameKind, KeyUse, Limits, Request, Response, ShardRequest,
    WireError, decode_payload,
};
use rdkv_tls::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::handshake::{HANDSHAKE_MAX_FRAME_BYTES, handshake};
use super::{Handler, MAX_IN_FLIGHT};
use crate::accept::{TcpFront, accept_until};
use crate::framed::{FrameReader, FrameWriter, FramedError};
use crate::order::{Finish, KeyOrder, Waits, completion};
use crate::shards::NotHere;
use crate::telemetry::Via;

pub async fn serve_clients(
    listener: TcpFront,
    handler: Arc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    accept_until(listener, "client", shutdown, move |stream, peer| {
        connection(stream, peer, Arc::clone(&handler))
    })
    .await;
}

async fn connection(stream: Stream, peer: String, handler: Arc<Handler>) -> Result<()> {
    // The route to this client: an RDMA session uses the GID of this address.
    let local_ip = stream.tcp().local_addr().ok().map(|a| a.ip());
    let (read, write) = stream.into_split();
    serve_stream(read, write, &peer, Via::Tcp, local_ip, handler).await
}

/// The native protocol over a local Unix socket: same handshake, same
/// requests, no TCP (clients on this host send their writes here).
pub async fn serve_unix_clients(
    listener: tokio::net::UnixListener,
    handler: Arc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    accept_until(listener, "unix client", shutdown, move |stream, peer| {
        let (read, write) = stream.into_split();
        let handler = Arc::clone(&handler);
        async move { serve_stream(read, write, &peer, Via::Unix, None, handler).await }
    })
    .await;
}

async fn serve_stream<R, W>(
    read: R,
    write: W,
    addr: &str,
    via: Via,
    local_ip: Option<std::net::IpAddr>,
    handler: Arc<Handler>,
) -> Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits: Limits = handler.limits();
    let mut reader = FrameReader::new(read, HANDSHAKE_MAX_FRAME_BYTES);
    let mut writer = FrameWriter::new(write, limits.max_frame_bytes);
    // Held for as long as the connection is served.
    let (_slot, version) = handshake(&mut reader, &mut writer, addr, via, &handler).await?;

    let _open = handler.stats().connection(via);
    // Queue pairs opened on this connection: torn down when it closes.
    let rdma_sessions = RdmaSessions {
        local_ip,
        open: std::sync::Mutex::new(Vec::new()),
    };
    let mut connection = Connection {
        handler: &handler,
        via,
        rdma_sessions: &rdma_sessions,
        order: KeyOrder::default(),
        running: FuturesUnordered::new(),
        writer,
        version,
    };
    let served = connection.serve(&mut reader).await;
    // Let the answers to requests already read go out.
    let finished = connection.finish_all().await;
    served?;
    Ok(finished?)
}

/// A request running on its connection's task: its id and its response.
type Running<'a> = Pin<Box<dyn Future<Output = (u64, Response)> + Send + 'a>>;

/// One connection's state while it is served.
struct Connection<'a, W> {
    handler: &'a Arc<Handler>,
    via: Via,
    rdma_sessions: &'a RdmaSessions,
    order: KeyOrder,
    /// At most `MAX_IN_FLIGHT`.
    running: FuturesUnordered<Running<'a>>,
    writer: FrameWriter<W>,
    /// The protocol version the handshake agreed.
    version: u16,
}

impl<'a, W: AsyncWrite + Unpin> Connection<'a, W> {
    /// Queues a request's answer as the connection's version can decode it.
    fn answer(&mut self, request_id: u64, response: Response) -> Result<(), FramedError> {
        queue_response(
            &mut self.writer,
            request_id,
            &for_version(response, self.version),
        )
    }

    fn has_room(&self) -> bool {
        self.running.len() < MAX_IN_FLIGHT as usize
    }

    /// Reads and runs requests until the client closes the connection or
    /// breaks the framing (an error, once its reply is queued).
    async fn serve<R: AsyncRead + Unpin>(&mut self, reader: &mut FrameReader<R>) -> Result<()> {
        let mut input_open = true;
        let mut was_full = false;
        loop {
            // Start everything already buffered, then send every answer
            // that is ready in one write.
            while self.has_room() {
                match reader.next_buffered() {
                    Ok(Some(frame)) => self.start(frame).await?,
                    Ok(None) => break,
                    Err(e) => return self.framing_error(e),
                }
            }
            self.take_ready()?;
            self.flush().await?;
            if !input_open && self.running.is_empty() {
                return Ok(());
            }
            let may_read = input_open && self.has_room();
            if input_open && !may_read && !was_full {
                self.handler.stats().backpressure(self.via);
            }
            was_full = !self.has_room();
            tokio::select! {
                Some((request_id, response)) = self.running.next(), if !self.running.is_empty() => {
                    self.answer(request_id, response)?;
                }
                frame = reader.next(), if may_read => match frame {
                    Ok(Some(frame)) => self.start(frame).await?,
                    Ok(None) => input_open = false,
                    Err(e) => return self.framing_error(e),
                },
            }
        }
    }

    /// Queues the answer to every request that has finished.
    fn take_ready(&mut self) -> Result<(), FramedError> {
        while let Some(Some((request_id, response))) = self.running.next().now_or_never() {
            self.answer(request_id, response)?;
        }
        Ok(())
    }

    /// Runs every request still running to its end and sends the answers.
    async fn finish_all(&mut self) -> Result<(), FramedError> {
        while let Some((request_id, response)) = self.running.next().await {
            self.answer(request_id, response)?;
        }
        self.flush().await
    }

    /// Sends the answers queued, if any.
    async fn flush(&mut self) -> Result<(), FramedError> {
        if self.writer.has_queued() {
            self.writer.flush().await?;
        }
        Ok(())
    }

    /// The stream cannot be resynchronised: say why (the connection then
    /// closes once the requests already read are answered).
    fn framing_error(&mut self, e: FramedError) -> Result<()> {
        let reply = match &e {
            FramedError::Wire(wire) => ErrorReply::from(wire),
            FramedError::Io(_) => ErrorReply::new(ErrorCode::Malformed, e.to_string()),
        };
        queue_response(&mut self.writer, 0, &Response::Error(reply))?;
        bail!("framing: {e}");
    }

    /// Starts the request `frame` carries, in its turn among the
    /// connection's requests on its keys.
    async fn start(&mut self, frame: Frame) -> Result<()> {
        if frame.kind != FrameKind::Request {
            let reply = ErrorReply::new(ErrorCode::Malformed, "expected a request frame");
            queue_response(&mut self.writer, frame.request_id, &Response::Error(reply))?;
            bail!("unexpected frame kind {:?}", frame.kind);
        }
        let request_id = frame.request_id;
        // Large requests take from the node-wide budget before they are
        // decoded; while it is spent this connection is not read further.
        let budget = self.in_flight_permit(frame.payload.len()).await?;
        let request = decode_payload::<Request>(&frame);
        let turn = request.as_ref().map_or_else(
            |_| Turn::default(),
            |request| take_turn(&mut self.order, request),
        );
        let (handler, via, rdma_sessions) = (self.handler, self.via, self.rdma_sessions);
        let version = self.version;
        self.running.push(Box::pin(async move {
            turn.waits.start().await;
            let response = match request {
                Err(e) => {
                    handler.stats().malformed(via);
                    Response::Error(ErrorReply::new(ErrorCode::Malformed, e.to_string()))
                }
                Ok(request) if request.min_version() > version => {
                    Response::Error(needs_version("request", request.min_version(), version))
                }
                Ok(Request::RdmaConnect { endpoint }) => {
                    rdma_connect(handler, None, endpoint, rdma_sessions)
                }
                Ok(Request::Sharded {
                    shard,
                    request: ShardRequest::RdmaConnect { endpoint },
                }) => rdma_connect(handler, Some(shard), endpoint, rdma_sessions),
                Ok(request) => {
                    // Dropped here whether or not the write was queued: the
                    // client, not this connection, tries a refused one again.
                    let mut place = turn.place;
                    handler.handle_placed(request, via, &mut place).await
                }
            };
            turn.waits.finish().await;
            drop(turn.finish);
            drop(budget);
            (request_id, response)
        }));
        Ok(())
    }

    /// A permit from the node's budget for a large request (`None` for a
    /// small one). While it waits, this connection's running requests go
    /// on and are answered: they may hold the budget it waits for.
    async fn in_flight_permit(
        &mut self,
        payload_bytes: usize,
    ) -> Result<Option<OwnedSemaphorePermit>, FramedError> {
        let admission = self.handler.admission();
        let permit = match admission.try_in_flight_permit(payload_bytes) {
            Ok(permit) => return Ok(permit),
            Err(wait) => wait,
        };
        self.handler.stats().backpressure(self.via);
        tokio::pin!(permit);
        loop {
            tokio::select! {
                permit = &mut permit => return Ok(permit),
                Some((request_id, response)) = self.running.next(), if !self.running.is_empty() => {
                    self.answer(request_id, response)?;
                    self.take_ready()?;
                    self.flush().await?;
                }
            }
        }
    }
}

/// The queue pairs opened on one connection, and its local address.
struct RdmaSessions {
    local_ip: Option<std::net::IpAddr>,
    open: std::sync::Mutex<Vec<crate::rdma::RdmaConnectionGuard>>,
}

/// Opens a queue pair for this (authenticated) connection towards the
/// region of `shard` (`None`: a single group's, refused on a multi-shard
/// node; a shard not hosted here: `WrongShard`): the region's rkey is
/// handed out here only.
fn rdma_connect(
    handler: &Arc<Handler>,
    shard: Option<ShardId>,
    endpoint: rdkv_proto::wire::QpEndpoint,
    sessions: &RdmaSessions,
) -> Response {
    let (replica, shard) = match shard {
        None => match handler.one_sided_refusal() {
            Some(refusal) => return Response::Error(refusal),
            None => (handler.replica(), ShardId(0)),
        },
        Some(shard) => match handler.shards().hosted(shard) {
            Ok(replica) => (replica, shard),
            Err(NotHere::WrongShard(wrong)) => return Response::WrongShard(wrong),
            Err(cross) => return Response::Error(cross.to_error()),
        },
    };
    let local_ip = sessions.local_ip;
    let mut sessions = sessions.open.lock().unwrap_or_else(|p| p.into_inner());
    if sessions.len() >= crate::rdma::MAX_RDMA_SESSIONS_PER_CONNECTION {
        return Response::Error(ErrorReply::new(
            ErrorCode::InvalidRequest,
            format!(
                "at most {} rdma sessions per connection",
                crate::rdma::MAX_RDMA_SESSIONS_PER_CONNECTION
            ),
        ));
    }
    let rpc_handler: Arc<dyn rdkv_fabric::RpcHandler> = Arc::clone(handler) as _;
    let client = crate::rdma::RdmaClientEndpoint { endpoint, local_ip };
    let target = crate::rdma::RdmaTarget {
        sm: &replica.sm,
        node_id: replica.node_id(),
        shard,
    };
    let limits = handler.limits();
    match handler.rdma().connect(
        client,
        rpc_handler,
        target,
        limits.max_frame_bytes,
        MAX_IN_FLIGHT,
    ) {
        Ok((endpoint, region, guard)) => {
            sessions.push(guard);
            Response::RdmaConnected { endpoint, region }
        }
        Err(reply) => Response::Error(reply),
    }
}

/// `response`, or an error reply when the connection's protocol `version`
/// is too old to decode it (a version-1 client is never sent the shard
/// answers, docs/sharding.md section 5).
fn for_version(response: Response, version: u16) -> Response {
    let needed = response.min_version();
    if needed <= version {
        return response;
    }
    Response::Error(needs_version("answer", needed, version))
}

/// The refusal of a request or answer (`what`) newer than the connection.
fn needs_version(what: &str, needed: u16, version: u16) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        format!("this {what} needs protocol version {needed}; the connection speaks {version}"),
    )
}

/// Queues a response; one too large for a frame becomes an error reply.
fn queue_response<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    request_id: u64,
    response: &Response,
) -> Result<(), FramedError> {
    match writer.queue(FrameKind::Response, request_id, response) {
        Err(FramedError::Wire(WireError::FrameTooLarge {
            len_bytes,
            max_bytes,
        })) => {
            let error = Response::Error(ErrorReply::new(
                ErrorCode::FrameTooLarge,
                format!(
                    "the response would be {len_bytes} bytes, over the {max_bytes}-byte frame limit"
                ),
            ));
            writer.queue(FrameKind::Response, request_id, &error)
        }
        other => other,
    }
}

/// A request's turn among the connection's requests on its keys: what it
/// waits for, and the handles that let later ones go.
#[derive(Default)]
struct Turn {
    waits: Waits,
    /// Dropped once a write's place in the log is fixed.
    place: Option<Finish>,
    /// Dropped once the request has finished.
    finish: Option<Finish>,
}

/// `request`'s turn among the connection's requests in flight (`order`).
fn take_turn(order: &mut KeyOrder, request: &Request) -> Turn {
    let (keys, writes) = match request.key_use() {
        KeyUse::Nothing => return Turn::default(),
        KeyUse::Reads(keys) => (keys, false),
        KeyUse::Writes(keys) => (keys, true),
        KeyUse::Everything => (Vec::new(), true),
    };
    let (finish, done) = completion();
    // Every native write is one log entry: placed once it is proposed.
    let (place, placed) = completion();
    let waits = order.admit(&keys, writes, &done, &placed);
    Turn {
        waits,
        place: Some(place),
        finish: Some(finish),
    }
}
