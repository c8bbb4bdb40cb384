//! One native-protocol connection (TCP or Unix socket). One task reads
//! frames (acquiring a credit per request before reading the next, so a
//! client can never have more than `MAX_IN_FLIGHT` requests in the server:
//! backpressure instead of an unbounded queue), one task per request
//! computes the answer, one task writes responses as they complete.
//!
//! Requests on different keys run at once; a request after another that
//! may observe or change its keys runs after it (`order`: a read sees every
//! earlier write of its key on the connection, and writes of one key are
//! applied in request order, a later one proposed as soon as the earlier
//! one is placed in the log). Responses carry their request's id and go
//! out as they complete: a slow write does not hold back the answers to
//! other keys' requests that share the connection (one client multiplexes
//! many callers over it).

use std::sync::Arc;

use anyhow::{Result, bail};
use rdkv_proto::wire::{
    ErrorCode, ErrorReply, FrameKind, KeyUse, Limits, Request, Response, WireError, decode_payload,
};
use rdkv_tls::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, mpsc, watch};

use super::handshake::{HANDSHAKE_MAX_FRAME_BYTES, handshake};
use super::{Handler, MAX_IN_FLIGHT};
use crate::accept::{TcpFront, accept_until};
use crate::framed::{FrameReader, FrameWriter, FramedError};
use crate::order::{Finish, KeyOrder, Waits, completion};
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
    let credits = Arc::new(Semaphore::new(MAX_IN_FLIGHT as usize));
    let (done_tx, mut done_rx) = mpsc::channel::<(u64, Response)>(MAX_IN_FLIGHT as usize);
    let write_task = tokio::spawn(async move {
        while let Some((request_id, response)) = done_rx.recv().await {
            queue_response(&mut writer, request_id, &for_version(response, version))?;
            // Batch whatever else is ready into the same write.
            while let Ok((request_id, response)) = done_rx.try_recv() {
                queue_response(&mut writer, request_id, &for_version(response, version))?;
            }
            writer.flush().await?;
        }
        Ok::<_, FramedError>(())
    });

    // Queue pairs opened on this connection: torn down when it closes.
    let rdma_sessions = RdmaSessions {
        local_ip,
        open: Arc::new(std::sync::Mutex::new(Vec::new())),
    };
    let result = read_requests(
        &mut reader,
        &handler,
        via,
        &credits,
        &done_tx,
        &rdma_sessions,
    )
    .await;
    drop(done_tx);
    // Let the answers to requests already read go out.
    let _ = write_task.await;
    result
}

/// The queue pairs opened on one connection, and its local address.
#[derive(Clone)]
struct RdmaSessions {
    local_ip: Option<std::net::IpAddr>,
    open: Arc<std::sync::Mutex<Vec<crate::rdma::RdmaConnectionGuard>>>,
}

/// Opens a queue pair for this (authenticated) connection: the region's
/// rkey is handed out here only.
fn rdma_connect(
    handler: &Arc<Handler>,
    endpoint: rdkv_proto::wire::QpEndpoint,
    limits: &Limits,
    sessions: &RdmaSessions,
) -> Response {
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
    let replica = handler.replica();
    let client = crate::rdma::RdmaClientEndpoint { endpoint, local_ip };
    match handler.rdma().connect(
        client,
        rpc_handler,
        &replica.sm,
        replica.node_id(),
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
    Response::Error(ErrorReply::new(
        ErrorCode::InvalidRequest,
        format!("this answer needs protocol version {needed}; the connection speaks {version}"),
    ))
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

async fn read_requests<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    handler: &Arc<Handler>,
    via: Via,
    credits: &Arc<Semaphore>,
    done: &mpsc::Sender<(u64, Response)>,
    rdma_sessions: &RdmaSessions,
) -> Result<()> {
    let mut order = KeyOrder::default();
    loop {
        let permit = match Arc::clone(credits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                handler.stats().backpressure(via);
                Arc::clone(credits).acquire_owned().await?
            }
        };
        let frame = match reader.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(()),
            Err(e) => {
                // The stream cannot be resynchronised: say why, then close.
                let reply = match &e {
                    FramedError::Wire(wire) => ErrorReply::from(wire),
                    FramedError::Io(_) => ErrorReply::new(ErrorCode::Malformed, e.to_string()),
                };
                let _ = done.send((0, Response::Error(reply))).await;
                bail!("framing: {e}");
            }
        };
        if frame.kind != FrameKind::Request {
            let reply = ErrorReply::new(ErrorCode::Malformed, "expected a request frame");
            let _ = done.send((frame.request_id, Response::Error(reply))).await;
            bail!("unexpected frame kind {:?}", frame.kind);
        }
        let request_id = frame.request_id;
        // Large requests take from the node-wide budget before they are
        // decoded; while it is spent this connection is not read further.
        let mut waited = false;
        let budget = handler
            .admission()
            .in_flight_permit(frame.payload.len(), &mut waited)
            .await;
        if waited {
            handler.stats().backpressure(via);
        }
        let request = decode_payload::<Request>(&frame);
        let turn = request.as_ref().map_or_else(
            |_| Turn::default(),
            |request| take_turn(&mut order, request),
        );
        let handler = Arc::clone(handler);
        let done = done.clone();
        let rdma_sessions = rdma_sessions.clone();
        tokio::spawn(async move {
            turn.waits.start().await;
            let response = match request {
                Err(e) => {
                    handler.stats().malformed(via);
                    Response::Error(ErrorReply::new(ErrorCode::Malformed, e.to_string()))
                }
                Ok(Request::RdmaConnect { endpoint }) => {
                    rdma_connect(&handler, endpoint, &handler.limits(), &rdma_sessions)
                }
                Ok(request) => handler.handle_placed(request, via, turn.place).await,
            };
            turn.waits.finish().await;
            drop(turn.finish);
            let _ = done.send((request_id, response)).await;
            drop(permit);
            drop(budget);
        });
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
