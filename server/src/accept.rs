//! The accept loop every listener of a node runs: spawn a task per
//! connection, back off on accept errors (out of file descriptors) instead of
//! spinning, stop on shutdown.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;

const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// A listener: TCP or Unix.
pub trait Listener {
    type Stream: Send + 'static;
    fn accept_one(&self) -> impl Future<Output = io::Result<(Self::Stream, String)>> + Send;
}

impl Listener for TcpListener {
    type Stream = TcpStream;

    async fn accept_one(&self) -> io::Result<(TcpStream, String)> {
        let (stream, addr) = self.accept().await?;
        Ok((stream, addr.to_string()))
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;

    async fn accept_one(&self) -> io::Result<(UnixStream, String)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, "unix socket".to_owned()))
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
    F: Fn(L::Stream, String) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    loop {
        tokio::select! {
            accepted = listener.accept_one() => match accepted {
                Ok((stream, peer)) => {
                    let task = serve(stream, peer.clone());
                    tokio::spawn(async move {
                        if let Err(e) = task.await {
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
