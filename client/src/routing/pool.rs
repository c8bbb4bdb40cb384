//! One `RpcChannel` per node: TCP (with TLS when the options say so) by default, the node's Unix socket or an
//! RDMA session's channel once the one-sided path has set one up; opened
//! lazily and reopened after it breaks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkv_fabric::rpc::{Connection, RpcChannel};
use rdkv_proto::wire::ClientHello;
use rdkv_tls::ClientTls;
use tokio::time::Instant;

use crate::error::{ConnectError, Error, Result};

type Slot = Arc<tokio::sync::Mutex<Option<Arc<dyn RpcChannel>>>>;

#[derive(Debug)]
pub(crate) struct Pool {
    hello: ClientHello,
    connect_timeout: Duration,
    /// TLS for the TCP connections (`None`: plain).
    tls: Option<Arc<ClientTls>>,
    slots: Mutex<HashMap<String, Slot>>,
}

impl Pool {
    pub(crate) fn new(
        hello: ClientHello,
        connect_timeout: Duration,
        tls: Option<Arc<ClientTls>>,
    ) -> Pool {
        Pool {
            hello,
            connect_timeout,
            tls,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The slot holding the channel to the node at `addr` (created empty on
    /// first use).
    fn slot(&self, addr: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(slots.entry(addr.to_owned()).or_default())
    }

    /// The channel to `addr`, opening a TCP connection if there is none.
    pub(crate) async fn connection(
        &self,
        addr: &str,
        deadline: Instant,
    ) -> Result<Arc<dyn RpcChannel>> {
        let slot = self.slot(addr);
        let connect_deadline = deadline.min(Instant::now() + self.connect_timeout);
        let timed_out = || {
            Error::Connect(ConnectError::Connect {
                addr: addr.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            })
        };
        // Concurrent callers wait for one connect instead of racing several.
        let mut guard = tokio::time::timeout_at(connect_deadline, slot.lock())
            .await
            .map_err(|_| timed_out())?;
        if let Some(conn) = guard.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(conn));
        }
        *guard = None;
        let conn: Arc<dyn RpcChannel> = Arc::new(
            Connection::open(addr, &self.hello, connect_deadline, self.tls.as_deref()).await?,
        );
        *guard = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// Routes requests for the node at client address `addr` through its
    /// local Unix socket from now on (until that connection breaks; then TCP).
    pub(crate) async fn use_unix_socket(&self, addr: &str, path: &Path) -> Result<()> {
        let slot = self.slot(addr);
        let deadline = Instant::now() + self.connect_timeout;
        let conn = Connection::open_unix(path, addr, &self.hello, deadline).await?;
        *slot.lock().await = Some(Arc::new(conn));
        Ok(())
    }

    /// Routes requests for the node at client address `addr` through
    /// `channel` (an RDMA session) until it breaks; then TCP again.
    #[cfg(any(feature = "rdma", test))]
    pub(crate) async fn use_channel(&self, addr: &str, channel: Arc<dyn RpcChannel>) {
        let slot = self.slot(addr);
        *slot.lock().await = Some(channel);
    }

    /// Stops routing `addr`'s requests through `channel` if it is the one in
    /// use (a retired RDMA session: its queue pair's peer is gone, and a
    /// request sent into it would wait for the transport's retries and be
    /// reported as possibly applied); the next request opens TCP. Another
    /// channel set since (a Unix socket, a newer session) is left alone.
    pub(crate) async fn forget_channel(&self, addr: &str, channel: &Arc<dyn RpcChannel>) {
        let slot = self.slot(addr);
        let mut guard = slot.lock().await;
        if guard
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, channel))
        {
            *guard = None;
        }
    }

    /// A fresh, dedicated connection to `addr` (not pooled): the control
    /// connection an RDMA session lives on.
    #[cfg(feature = "rdma")]
    pub(crate) async fn dedicated_connection(&self, addr: &str) -> Result<Connection> {
        let deadline = Instant::now() + self.connect_timeout;
        Ok(Connection::open(addr, &self.hello, deadline, self.tls.as_deref()).await?)
    }
}

#[cfg(test)]
mod tests {
    use rdkv_fabric::rpc::{CallError, CallFuture};
    use rdkv_proto::wire::Request;

    use super::*;

    /// A channel that never reports closed, as an RDMA session whose peer
    /// dropped its queue pair does until the transport's retries run out.
    #[derive(Debug)]
    struct Silent;

    impl RpcChannel for Silent {
        fn call_boxed<'a>(&'a self, _: &'a Request, _: Instant) -> CallFuture<'a> {
            Box::pin(async {
                Err(CallError::Lost {
                    reason: "no answer".into(),
                })
            })
        }

        fn is_closed(&self) -> bool {
            false
        }
    }

    fn current(pool: &Pool, addr: &str) -> Option<Arc<dyn RpcChannel>> {
        pool.slot(addr).try_lock().ok().and_then(|g| g.clone())
    }

    #[tokio::test]
    async fn a_retired_sessions_channel_is_not_used_again() {
        let pool = Pool::new(ClientHello::new("test", None), Duration::from_secs(1), None);
        let addr = "127.0.0.1:9";
        let session: Arc<dyn RpcChannel> = Arc::new(Silent);
        pool.use_channel(addr, Arc::clone(&session)).await;
        // The refresh retires the session.
        pool.forget_channel(addr, &session).await;
        assert!(
            current(&pool, addr).is_none_or(|c| !Arc::ptr_eq(&c, &session)),
            "the dead session is still the node's channel"
        );
        // A channel set since is not the retired one's to drop.
        let newer: Arc<dyn RpcChannel> = Arc::new(Silent);
        pool.use_channel(addr, Arc::clone(&newer)).await;
        pool.forget_channel(addr, &session).await;
        assert!(current(&pool, addr).is_some_and(|c| Arc::ptr_eq(&c, &newer)));
    }
}
