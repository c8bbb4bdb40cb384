//! The client service: the native protocol over TCP. One task reads frames
//! (acquiring a credit per request before reading the next, so a client can
//! never have more than `max_in_flight` requests in the server: backpressure
//! instead of an unbounded queue), one task per request computes the answer,
//! one task writes responses as they complete (pipelining, any order).

mod handlers;
mod status;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkv_proto::wire::{
    ClientHello, ErrorCode, ErrorReply, FrameKind, Limits, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
    Request, Response, ServerHello, WireError, decode_payload, negotiate, tokens_match,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::accept::accept_until;
use crate::framed::{FrameReader, FrameWriter, FramedError};
use crate::telemetry::{RateLimitedLog, RequestStats, Via};

/// Refused handshakes are logged at most once per this period (with a count
/// of the ones not logged): a client retrying a bad token must not flood
/// the log.
static AUTH_FAILURE_LOG: RateLimitedLog = RateLimitedLog::new(10);

pub use handlers::{Endpoints, Handler, HandlerSettings};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const HANDSHAKE_MAX_FRAME_BYTES: u32 = 64 * 1024;
/// Requests one connection may have in the server at once.
pub const MAX_IN_FLIGHT: u32 = 128;

pub async fn serve_clients(
    listener: TcpListener,
    handler: Arc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    accept_until(listener, "client", shutdown, |stream, peer| {
        connection(stream, peer, Arc::clone(&handler))
    })
    .await;
}

fn rejected(code: ErrorCode, message: impl Into<String>) -> ServerHello {
    ServerHello::Rejected {
        code,
        message: message.into(),
    }
}

/// Checks the hello; `Err` is the rejection to send.
fn accept_hello(hello: &ClientHello, handler: &Handler) -> Result<u16, ServerHello> {
    let version = negotiate(hello, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
        .map_err(|e| rejected(ErrorCode::UnsupportedVersion, e.to_string()))?;
    if let Some(expected) = handler.token() {
        let presented = hello.token.as_deref().unwrap_or("");
        if !tokens_match(expected.as_bytes(), presented.as_bytes()) {
            return Err(rejected(
                ErrorCode::Unauthenticated,
                "wrong or missing token",
            ));
        }
    }
    Ok(version)
}

async fn connection(stream: TcpStream, peer: String, handler: Arc<Handler>) -> Result<()> {
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    serve_stream(read, write, &peer, Via::Tcp, handler).await
}

/// The native protocol over a local Unix socket: same handshake, same
/// requests, no TCP (clients on this host send their writes here).
pub async fn serve_unix_clients(
    listener: tokio::net::UnixListener,
    handler: Arc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    accept_until(listener, "unix client", shutdown, |stream, peer| {
        let (read, write) = stream.into_split();
        let handler = Arc::clone(&handler);
        async move { serve_stream(read, write, &peer, Via::Unix, handler).await }
    })
    .await;
}

async fn serve_stream<R, W>(
    read: R,
    write: W,
    addr: &str,
    via: Via,
    handler: Arc<Handler>,
) -> Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits: Limits = handler.limits();
    // The hello is read under a small limit: nothing large is buffered for a
    // client that has not authenticated.
    let mut reader = FrameReader::new(read, HANDSHAKE_MAX_FRAME_BYTES);
    let mut writer = FrameWriter::new(write, limits.max_frame_bytes);

    let frame = tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.next())
        .await
        .context("handshake timed out")??
        .context("closed before the handshake")?;
    let hello = match frame
        .expect_kind(FrameKind::ClientHello)
        .and_then(|()| decode_payload::<ClientHello>(&frame))
    {
        Ok(hello) => hello,
        Err(e) => {
            let reply = rejected(
                ErrorCode::Malformed,
                format!("expected a client hello: {e}"),
            );
            writer.send(FrameKind::ServerHello, 0, &reply).await?;
            bail!("bad handshake: {e}");
        }
    };
    // The connection limit is checked after the token: an unauthenticated
    // client learns nothing, not even that the node is full.
    let decision =
        accept_hello(&hello, &handler).and_then(|version| match handler.connection_slot() {
            Some(slot) => Ok((version, slot)),
            None => {
                RequestStats::connection_refused(via);
                Err(rejected(
                    ErrorCode::Unavailable,
                    format!(
                        "too many client connections (limit {}); try again later",
                        handler.max_client_connections()
                    ),
                ))
            }
        });
    // Held for as long as the connection is served.
    let _slot = match decision {
        Ok((version, slot)) => {
            let accepted = ServerHello::Accepted {
                version,
                node_id: handler.node_id(),
                cluster_id: 0,
                max_frame_bytes: limits.max_frame_bytes,
                max_in_flight: MAX_IN_FLIGHT,
            };
            writer.send(FrameKind::ServerHello, 0, &accepted).await?;
            reader.set_max_frame_bytes(limits.max_frame_bytes);
            slot
        }
        Err(reply) => {
            if matches!(
                reply,
                ServerHello::Rejected {
                    code: ErrorCode::Unauthenticated,
                    ..
                }
            ) {
                RequestStats::auth_failure("client");
            }
            AUTH_FAILURE_LOG.warn(format_args!(
                "refused a client from {addr} ({}): {reply:?}",
                hello.client_name
            ));
            writer.send(FrameKind::ServerHello, 0, &reply).await?;
            bail!("handshake refused");
        }
    };

    let _open = handler.stats().connection(via);
    let credits = Arc::new(Semaphore::new(MAX_IN_FLIGHT as usize));
    let (done_tx, mut done_rx) = mpsc::channel::<(u64, Response)>(MAX_IN_FLIGHT as usize);
    let write_task = tokio::spawn(async move {
        while let Some((request_id, response)) = done_rx.recv().await {
            queue_response(&mut writer, request_id, &response)?;
            // Batch whatever else is ready into the same write.
            while let Ok((request_id, response)) = done_rx.try_recv() {
                queue_response(&mut writer, request_id, &response)?;
            }
            writer.flush().await?;
        }
        Ok::<_, FramedError>(())
    });

    // Queue pairs opened on this connection: torn down when it closes.
    let rdma_sessions = Arc::new(std::sync::Mutex::new(Vec::new()));
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

type RdmaSessions = Arc<std::sync::Mutex<Vec<crate::rdma::RdmaConnectionGuard>>>;

/// Opens a queue pair for this (authenticated) connection: the region's
/// rkey is handed out here only.
fn rdma_connect(
    handler: &Arc<Handler>,
    endpoint: rdkv_proto::wire::QpEndpoint,
    limits: &Limits,
    sessions: &RdmaSessions,
) -> Response {
    let mut sessions = sessions.lock().unwrap_or_else(|p| p.into_inner());
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
    match handler.rdma().connect(
        endpoint,
        rpc_handler,
        handler.sm(),
        handler.node_id(),
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
            .in_flight_permit(frame.payload.len(), &mut waited)
            .await;
        if waited {
            handler.stats().backpressure(via);
        }
        let request = decode_payload::<Request>(&frame);
        let handler = Arc::clone(handler);
        let done = done.clone();
        let rdma_sessions = Arc::clone(rdma_sessions);
        tokio::spawn(async move {
            let response = match request {
                Err(e) => {
                    handler.stats().malformed(via);
                    Response::Error(ErrorReply::new(ErrorCode::Malformed, e.to_string()))
                }
                Ok(Request::RdmaConnect { endpoint }) => {
                    rdma_connect(&handler, endpoint, &handler.limits(), &rdma_sessions)
                }
                Ok(request) => handler.handle(request, via).await,
            };
            let _ = done.send((request_id, response)).await;
            drop(permit);
            drop(budget);
        });
    }
}
