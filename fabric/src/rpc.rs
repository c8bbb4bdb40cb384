//! Two-sided request/response (RPC): the [`RpcChannel`] trait, and its
//! implementations: [`Connection`] (the native protocol over TCP, with or
//! without TLS, or a local Unix socket) and [`MemChannel`] (in process, straight to a handler).
//!
//! A [`Connection`] is one pipelined connection to one server.
//!
//! A writer task drains a queue of encoded frames (coalescing what is queued into
//! one `write_all`); a reader task decodes response frames and completes the
//! waiting call through a map `request_id -> oneshot`. A semaphore sized by the
//! server's `max_in_flight` bounds the requests outstanding: a call holds its
//! credit until the server has answered (even when the caller stopped waiting),
//! so the server never sees more than it allowed.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Bytes, BytesMut};
use rdkv_proto::wire::{
    ClientHello, DEFAULT_MAX_FRAME_BYTES, ErrorCode, Frame, FrameDecoder, FrameKind, Request,
    Response, ServerHello, ServerInfo, WireError, decode_payload, encoded_frame,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};

use std::future::Future;
use std::pin::Pin;

use thiserror::Error;

/// Bytes the writer coalesces into one write.
const MAX_COALESCE_BYTES: usize = 256 * 1024;
/// Spare room kept in the read buffer before each read.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Why a connection could not be opened.
#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("{addr} rejected the handshake ({code:?}): {message}")]
    Handshake {
        addr: String,
        code: ErrorCode,
        message: String,
    },
    #[error("protocol error: {0}")]
    Protocol(#[from] WireError),
    /// The TLS handshake failed: the server's certificate does not chain
    /// to the CA or does not name the address, or the server refused this
    /// client's certificate (or its lack of one).
    #[error("TLS with {addr} failed: {source}")]
    Tls {
        addr: String,
        #[source]
        source: io::Error,
    },
    /// A plain connection reached a port that speaks TLS.
    #[error("{addr} speaks TLS: connect with the cluster's CA (a TLS CA file)")]
    ServerWantsTls { addr: String },
}

/// The first bytes of a TLS alert record (type 21, version 3.x, length 2):
/// what a TLS port answers a plain hello with. Read as a frame it would be
/// a hello of over 64 KiB, which no server sends.
fn is_tls_alert(buf: &[u8]) -> bool {
    matches!(buf, [0x15, 0x03, 0x01..=0x04, 0x00, 0x02, ..])
}

/// A TLS error that surfaced while the rdkv handshake was read (with TLS
/// 1.3 the server judges a client certificate after the client's side of
/// the TLS handshake is done) is reported as a TLS failure.
fn tls_failure(addr: &str, error: ConnectError) -> ConnectError {
    match error {
        ConnectError::Connect { addr: _, source }
            if source
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rdkv_tls::rustls::Error>().is_some()) =>
        {
            ConnectError::Tls {
                addr: addr.to_owned(),
                source,
            }
        }
        other => other,
    }
}

/// What a server's hello accepted: its limits, and the version of its shard
/// map if it serves several shards.
struct Accepted {
    info: ServerInfo,
    shard_map_version: Option<u64>,
}

/// Sends the hello and reads the server's answer before `deadline`. Returns
/// the accepted server's limits and whatever arrived after its hello.
async fn handshake<R, W>(
    addr: &str,
    rd: &mut R,
    wr: &mut W,
    hello: &ClientHello,
    deadline: Instant,
) -> Result<(Accepted, BytesMut), ConnectError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let connect_err = |source: io::Error| ConnectError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "connect timed out");

    let out = encoded_frame(FrameKind::ClientHello, 0, hello, DEFAULT_MAX_FRAME_BYTES)?;
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let frame = timeout_at(deadline, async {
        wr.write_all(&out).await.map_err(connect_err)?;
        loop {
            if let Some(frame) = decoder.decode(&mut buf)? {
                return Ok::<_, ConnectError>(frame);
            }
            buf.reserve(READ_CHUNK_BYTES);
            let n = rd.read_buf(&mut buf).await.map_err(connect_err)?;
            if is_tls_alert(&buf) {
                return Err(ConnectError::ServerWantsTls {
                    addr: addr.to_owned(),
                });
            }
            if n == 0 {
                return Err(connect_err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed during the handshake",
                )));
            }
        }
    })
    .await
    .map_err(|_| connect_err(timed_out()))??;
    frame.expect_kind(FrameKind::ServerHello)?;
    let (info, shard_map_version) = match decode_payload::<ServerHello>(&frame)? {
        ServerHello::Accepted(info) => (info, None),
        ServerHello::AcceptedSharded {
            info,
            shard_map_version,
        } => (info, Some(shard_map_version)),
        ServerHello::Rejected { code, message } => {
            return Err(ConnectError::Handshake {
                addr: addr.to_owned(),
                code,
                message,
            });
        }
    };
    if info.max_in_flight == 0 || info.max_frame_bytes < rdkv_proto::wire::MIN_BODY_BYTES {
        return Err(ConnectError::Handshake {
            addr: addr.to_owned(),
            code: rdkv_proto::wire::ErrorCode::Malformed,
            message: format!(
                "server advertised max_in_flight = {}, max_frame_bytes = {}",
                info.max_in_flight, info.max_frame_bytes
            ),
        });
    }
    Ok((
        Accepted {
            info,
            shard_map_version,
        },
        buf,
    ))
}

/// The frame of one request, as every client channel sends it.
pub(crate) fn request_frame(
    request_id: u64,
    request: &Request,
    max_frame_bytes: u32,
) -> Result<BytesMut, CallError> {
    encoded_frame(FrameKind::Request, request_id, request, max_frame_bytes)
        .map_err(CallError::Encode)
}

/// The answer to one call, boxed so that [`RpcChannel`] stays object safe.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<Response, CallError>> + Send + 'a>>;

/// A two-sided transport: one request, one response, before a deadline.
/// The error says whether the request may have reached the server.
pub trait RpcChannel: Send + Sync + std::fmt::Debug {
    fn call_boxed<'a>(&'a self, request: &'a Request, deadline: Instant) -> CallFuture<'a>;

    fn is_closed(&self) -> bool;

    /// Largest frame body the server accepts on this channel.
    fn max_frame_bytes(&self) -> u32 {
        DEFAULT_MAX_FRAME_BYTES
    }

    /// The version of the server's shard map, if it said at connect that
    /// it serves several shards (`None`: one group, or not said).
    fn shard_map_version(&self) -> Option<u64> {
        None
    }
}

impl RpcChannel for Connection {
    fn call_boxed<'a>(&'a self, request: &'a Request, deadline: Instant) -> CallFuture<'a> {
        Box::pin(self.call(request, deadline))
    }

    fn is_closed(&self) -> bool {
        Connection::is_closed(self)
    }

    fn max_frame_bytes(&self) -> u32 {
        self.info.max_frame_bytes
    }

    fn shard_map_version(&self) -> Option<u64> {
        self.shard_map_version
    }
}

/// What an in-process channel calls: a server's request handler.
pub trait RpcHandler: Send + Sync + std::fmt::Debug {
    fn handle(&self, request: Request) -> Pin<Box<dyn Future<Output = Response> + Send + '_>>;
}

/// The `mem` transport's two-sided half: requests go straight to a handler
/// in this process (an embedded node), with the same deadline semantics.
#[derive(Debug, Clone)]
pub struct MemChannel {
    handler: Arc<dyn RpcHandler>,
}

impl MemChannel {
    pub fn new(handler: Arc<dyn RpcHandler>) -> MemChannel {
        MemChannel { handler }
    }
}

impl RpcChannel for MemChannel {
    fn call_boxed<'a>(&'a self, request: &'a Request, deadline: Instant) -> CallFuture<'a> {
        Box::pin(async move {
            // Handed over whole: once the handler runs, the request has
            // reached the server, so a deadline is an unknown outcome.
            timeout_at(deadline, self.handler.handle(request.clone()))
                .await
                .map_err(|_| CallError::TimedOut)
        })
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// Why a call on a connection did not produce a response.
#[derive(Debug)]
pub enum CallError {
    /// The request never left this process (no credit before the deadline, the
    /// connection was already closed, or it was still queued when it broke).
    NotSent {
        reason: String,
        timed_out: bool,
    },
    /// The request may have reached the server; no reply will come.
    Lost {
        reason: String,
    },
    /// The request was sent and the deadline passed before its reply.
    TimedOut,
    /// The request could not be encoded (never sent) or the reply not decoded.
    Encode(WireError),
    Decode(WireError),
}

type Reply = Result<Frame, Failure>;

#[derive(Debug)]
enum Failure {
    NotSent(String),
    Lost(String),
}

#[derive(Debug)]
struct Pending {
    /// `None` once the caller gave up; the entry (and its credit) stays until the
    /// server answers or the connection closes.
    reply: Option<oneshot::Sender<Reply>>,
    _credit: OwnedSemaphorePermit,
}

#[derive(Debug, Default)]
struct PendingMap {
    closed: Option<String>,
    entries: HashMap<u64, Pending>,
}

#[derive(Debug)]
struct Shared {
    addr: String,
    pending: Mutex<PendingMap>,
    credits: Arc<Semaphore>,
    closed: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PendingMap> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the connection dead and fails every outstanding call. Idempotent.
    fn close(&self, reason: String) {
        let entries = {
            let mut map = self.lock();
            if map.closed.is_some() {
                return;
            }
            tracing::debug!(addr = %self.addr, %reason, "connection closed");
            map.closed = Some(reason.clone());
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut map.entries)
        };
        self.credits.close();
        for (_, pending) in entries {
            if let Some(reply) = pending.reply {
                let _ = reply.send(Err(Failure::Lost(reason.clone())));
            }
        }
    }

    /// Completes the call waiting for `frame.request_id`.
    fn dispatch(&self, frame: Frame) {
        let entry = self.lock().entries.remove(&frame.request_id);
        match entry {
            Some(Pending {
                reply: Some(reply), ..
            }) => {
                let _ = reply.send(Ok(frame));
            }
            // The caller gave up (timeout or cancellation); dropping the entry
            // returns its credit.
            Some(Pending { reply: None, .. }) => {}
            None => tracing::warn!(
                addr = %self.addr,
                request_id = frame.request_id,
                "response for an unknown request id ignored"
            ),
        }
    }

    /// Fails a request that was still queued when the writer stopped.
    fn fail_unsent(&self, request_id: u64, reason: &str) {
        let entry = self.lock().entries.remove(&request_id);
        if let Some(Pending {
            reply: Some(reply), ..
        }) = entry
        {
            let _ = reply.send(Err(Failure::NotSent(reason.to_owned())));
        }
    }
}

#[derive(Debug)]
struct Outgoing {
    request_id: u64,
    frame: Bytes,
}

/// A live, handshaken connection. Dropping it stops its tasks.
#[derive(Debug)]
pub struct Connection {
    info: ServerInfo,
    /// The version of the server's shard map, if its hello said it serves
    /// several shards.
    shard_map_version: Option<u64>,
    /// The local address of a TCP connection (the route to the server).
    local_ip: Option<std::net::IpAddr>,
    shared: Arc<Shared>,
    queue: mpsc::UnboundedSender<Outgoing>,
    next_id: AtomicU64,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Connection {
    /// Connects to `addr` (over TLS when `tls` is given) and performs the
    /// handshake, both before `deadline`.
    pub async fn open(
        addr: &str,
        hello: &ClientHello,
        deadline: Instant,
        tls: Option<&rdkv_tls::ClientTls>,
    ) -> Result<Self, ConnectError> {
        let connect_err = |source: io::Error| ConnectError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
        let stream = timeout_at(deadline, TcpStream::connect(addr))
            .await
            .map_err(|_| connect_err(timed_out()))?
            .map_err(connect_err)?;
        stream.set_nodelay(true).map_err(connect_err)?;
        // The route to the server: an RDMA session uses the GID of this address.
        let local_ip = stream.local_addr().ok().map(|a| a.ip());
        let stream = match tls {
            None => rdkv_tls::Stream::Tcp(stream),
            Some(tls) => timeout_at(deadline, tls.connect(stream, addr))
                .await
                .map_err(|_| connect_err(timed_out()))?
                .map_err(|source| ConnectError::Tls {
                    addr: addr.to_owned(),
                    source,
                })?,
        };
        let (rd, wr) = stream.into_split();
        let mut connection = Self::start(addr, rd, wr, hello, deadline)
            .await
            .map_err(|e| tls_failure(addr, e))?;
        connection.local_ip = local_ip;
        Ok(connection)
    }

    /// Connects to a server's local Unix socket (same protocol as TCP);
    /// `addr` is the server's client address, under which the connection is
    /// pooled and reported.
    pub async fn open_unix(
        path: &std::path::Path,
        addr: &str,
        hello: &ClientHello,
        deadline: Instant,
    ) -> Result<Self, ConnectError> {
        let connect_err = |source: io::Error| ConnectError::Connect {
            addr: format!("{addr} (unix socket {})", path.display()),
            source,
        };
        let stream = timeout_at(deadline, tokio::net::UnixStream::connect(path))
            .await
            .map_err(|_| connect_err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")))?
            .map_err(connect_err)?;
        let (rd, wr) = stream.into_split();
        Self::start(addr, rd, wr, hello, deadline).await
    }

    /// Handshake, then the reader and writer tasks.
    async fn start<R, W>(
        addr: &str,
        mut rd: R,
        mut wr: W,
        hello: &ClientHello,
        deadline: Instant,
    ) -> Result<Self, ConnectError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (accepted, buf) = handshake(addr, &mut rd, &mut wr, hello, deadline).await?;
        let Accepted {
            info,
            shard_map_version,
        } = accepted;
        tracing::debug!(%addr, node_id = info.node_id, max_in_flight = info.max_in_flight, "connected");

        let permits = usize::try_from(info.max_in_flight)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        let shared = Arc::new(Shared {
            addr: addr.to_owned(),
            pending: Mutex::new(PendingMap::default()),
            credits: Arc::new(Semaphore::new(permits)),
            closed: AtomicBool::new(false),
        });
        // Replies may be as large as anything the server accepts, and never smaller
        // than the protocol default.
        let decoder = FrameDecoder::new(info.max_frame_bytes.max(DEFAULT_MAX_FRAME_BYTES));
        let (queue, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_loop(rd, buf, decoder, Arc::clone(&shared)));
        let writer = tokio::spawn(write_loop(wr, rx, Arc::clone(&shared)));
        Ok(Self {
            info,
            shard_map_version,
            local_ip: None,
            shared,
            queue,
            next_id: AtomicU64::new(1),
            reader,
            writer,
        })
    }

    /// The local address of a TCP connection (`None` over a Unix socket).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.local_ip
    }

    pub fn info(&self) -> ServerInfo {
        self.info
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Sends `request` and waits for its response until `deadline`.
    pub async fn call(&self, request: &Request, deadline: Instant) -> Result<Response, CallError> {
        let credit =
            match timeout_at(deadline, Arc::clone(&self.shared.credits).acquire_owned()).await {
                Ok(Ok(credit)) => credit,
                Ok(Err(_closed)) => {
                    return Err(CallError::NotSent {
                        reason: self.close_reason(),
                        timed_out: false,
                    });
                }
                Err(_elapsed) => {
                    self.close_if_wedged();
                    return Err(CallError::NotSent {
                        reason: "no credit became free before the deadline".to_owned(),
                        timed_out: true,
                    });
                }
            };
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = request_frame(request_id, request, self.info.max_frame_bytes)?;

        let (reply_tx, mut reply_rx) = oneshot::channel();
        {
            let mut map = self.shared.lock();
            if let Some(reason) = &map.closed {
                return Err(CallError::NotSent {
                    reason: reason.clone(),
                    timed_out: false,
                });
            }
            map.entries.insert(
                request_id,
                Pending {
                    reply: Some(reply_tx),
                    _credit: credit,
                },
            );
        }
        let outgoing = Outgoing {
            request_id,
            frame: frame.freeze(),
        };
        if self.queue.send(outgoing).is_err() {
            self.shared.lock().entries.remove(&request_id);
            return Err(CallError::NotSent {
                reason: "connection writer stopped".to_owned(),
                timed_out: false,
            });
        }

        let reply = match timeout_at(deadline, &mut reply_rx).await {
            Ok(reply) => reply,
            Err(_elapsed) => {
                if let Some(pending) = self.shared.lock().entries.get_mut(&request_id) {
                    pending.reply = None;
                }
                // The reply may have landed between the deadline and the line above.
                match reply_rx.try_recv() {
                    Ok(reply) => Ok(reply),
                    Err(_) => return Err(CallError::TimedOut),
                }
            }
        };
        match reply {
            Ok(Ok(frame)) => decode_payload::<Response>(&frame).map_err(CallError::Decode),
            Ok(Err(Failure::NotSent(reason))) => Err(CallError::NotSent {
                reason,
                timed_out: false,
            }),
            Ok(Err(Failure::Lost(reason))) => Err(CallError::Lost { reason }),
            Err(_dropped) => Err(CallError::Lost {
                reason: self.close_reason(),
            }),
        }
    }

    /// Every credit is held by a request whose caller gave up: the server is not
    /// answering this connection, and without closing it no call could ever get a
    /// credit again. Closing returns the credits; the next call reconnects.
    fn close_if_wedged(&self) {
        let wedged = {
            let map = self.shared.lock();
            !map.entries.is_empty()
                && map.entries.values().all(|p| p.reply.is_none())
                && self.shared.credits.available_permits() == 0
        };
        if wedged {
            self.shared
                .close("every credit is held by a request the server has not answered".to_owned());
        }
    }

    fn close_reason(&self) -> String {
        self.shared
            .lock()
            .closed
            .clone()
            .unwrap_or_else(|| "connection closed".to_owned())
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    mut buf: BytesMut,
    mut decoder: FrameDecoder,
    shared: Arc<Shared>,
) {
    loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) if frame.kind == FrameKind::Response => shared.dispatch(frame),
                Ok(Some(frame)) => {
                    shared.close(format!(
                        "protocol error: unexpected {:?} frame from the server",
                        frame.kind
                    ));
                    return;
                }
                Ok(None) => break,
                Err(e) => {
                    shared.close(format!("protocol error: {e}"));
                    return;
                }
            }
        }
        if buf.capacity() - buf.len() < READ_CHUNK_BYTES / 4 {
            buf.reserve(READ_CHUNK_BYTES);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => {
                shared.close("connection closed by the server".to_owned());
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.close(format!("read failed: {e}"));
                return;
            }
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    shared: Arc<Shared>,
) {
    let mut batch = BytesMut::new();
    while let Some(first) = rx.recv().await {
        batch.extend_from_slice(&first.frame);
        while batch.len() < MAX_COALESCE_BYTES {
            match rx.try_recv() {
                Ok(next) => batch.extend_from_slice(&next.frame),
                Err(_) => break,
            }
        }
        if let Err(e) = wr.write_all(&batch).await {
            let reason = format!("write failed: {e}");
            // Frames still queued never reached the socket: safe to retry anywhere.
            rx.close();
            while let Some(unsent) = rx.recv().await {
                shared.fail_unsent(unsent.request_id, &reason);
            }
            shared.close(reason);
            return;
        }
        batch.clear();
    }
    // Every sender is gone: the connection is being dropped.
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A server that takes the request and never answers.
    #[derive(Debug)]
    struct Silent;

    impl RpcHandler for Silent {
        fn handle(&self, _: Request) -> Pin<Box<dyn Future<Output = Response> + Send + '_>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn a_mem_call_past_its_deadline_is_an_unknown_outcome() {
        let channel = MemChannel::new(Arc::new(Silent));
        let deadline = Instant::now() + Duration::from_millis(20);
        let result = channel.call_boxed(&Request::Ping, deadline).await;
        // The handler had the request: not "not sent", but timed out.
        assert!(matches!(result, Err(CallError::TimedOut)), "{result:?}");
        assert!(!channel.is_closed());
    }
}
