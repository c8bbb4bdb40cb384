//! The accept loop every listener of a node runs: spawn a task per
//! connection, back off on accept errors (out of file descriptors) instead of
//! spinning, stop on shutdown. A TCP listener's connections become
//! [`Stream`]s in their own task (the TLS handshake, when the listener has
//! TLS), so a slow or hostile client never holds up the accept loop.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use rdkv_tls::{ServerTls, Stream};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;

use crate::telemetry::RateLimitedLog;

const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// A client that has not finished its TLS handshake by then is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Failed TLS handshakes are logged (a peer with the wrong certificate is
/// an operator's problem to see), but anyone can cause them: rate limited.
static TLS_REFUSALS: RateLimitedLog = RateLimitedLog::new(10);

/// A listener: TCP (with or without TLS) or Unix.
pub trait Listener {
    /// What `accept` returns.
    type Accepted: Send + 'static;
    /// What a connection is served over.
    type Stream: Send + 'static;
    fn accept_one(&self) -> impl Future<Output = io::Result<(Self::Accepted, String)>> + Send;
    /// Turns an accepted connection into the stream served; runs in the
    /// connection's task.
    fn establish(
        &self,
        accepted: Self::Accepted,
    ) -> impl Future<Output = io::Result<Self::Stream>> + Send + 'static;
}

/// A TCP listener whose connections are TLS when `tls` is set.
#[derive(Debug)]
pub struct TcpFront {
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
}

impl TcpFront {
    pub fn new(listener: TcpListener, tls: Option<Arc<ServerTls>>) -> TcpFront {
        TcpFront { listener, tls }
    }
}

impl Listener for TcpFront {
    type Accepted = TcpStream;
    type Stream = Stream;

    async fn accept_one(&self) -> io::Result<(TcpStream, String)> {
        let (stream, addr) = self.listener.accept().await?;
        Ok((stream, addr.to_string()))
    }

    fn establish(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Stream>> + 'static {
        let tls = self.tls.clone();
        async move {
            // Requests and replies are small and latency bound: no Nagle.
            let _ = tcp.set_nodelay(true);
            let Some(tls) = tls else {
                return Ok(Stream::Tcp(tcp));
            };
            tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(tcp))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
        }
    }
}

impl Listener for UnixListener {
    type Accepted = UnixStream;
    type Stream = UnixStream;

    async fn accept_one(&self) -> io::Result<(UnixStream, String)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, "unix socket".to_owned()))
    }

    fn establish(
        &self,
        stream: UnixStream,
    ) -> impl Future<Output = io::Result<UnixStream>> + 'static {
        std::future::ready(Ok(stream))
    }
}

/// Accepts connections on `listener` until `shutdown` changes, running
/// `serve(stream, peer)` for each in its own task; `what` names the
/// listener in logs.
pub async fn accept_until<L, F, Fut>(
    listener: L,
    what: &'static str,
    mut shutdown: watch::Receiver<bool>,
    serve: F,
) where
    L: Listener,
    F: Fn(L::Stream, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let serve = Arc::new(serve);
    loop {
        tokio::select! {
            accepted = listener.accept_one() => match accepted {
                Ok((accepted, peer)) => {
                    let established = listener.establish(accepted);
                    let serve = Arc::clone(&serve);
                    tokio::spawn(async move {
                        let stream = match established.await {
                            Ok(stream) => stream,
                            Err(e) => {
                                TLS_REFUSALS.warn(format_args!(
                                    "{what} connection from {peer}: TLS handshake failed: {e}"
                                ));
                                return;
                            }
                        };
                        if let Err(e) = serve(stream, peer.clone()).await {
                            tracing::debug!(%peer, "{what} connection closed: {e:#}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accepting a {what} connection: {e}");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}
