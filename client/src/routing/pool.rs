//! One `RpcChannel` per node: TCP by default, the node's Unix socket or an
//! RDMA session's channel once the one-sided path has set one up; opened
//! lazily and reopened after it breaks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkv_fabric::rpc::{Connection, RpcChannel};
use rdkv_proto::wire::ClientHello;
use tokio::time::Instant;

use crate::error::{ConnectError, Error, Result};

type Slot = Arc<tokio::sync::Mutex<Option<Arc<dyn RpcChannel>>>>;

#[derive(Debug)]
pub(crate) struct Pool {
    hello: ClientHello,
    connect_timeout: Duration,
    slots: Mutex<HashMap<String, Slot>>,
}

impl Pool {
    pub(crate) fn new(hello: ClientHello, connect_timeout: Duration) -> Pool {
        Pool {
            hello,
            connect_timeout,
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
        let conn: Arc<dyn RpcChannel> =
            Arc::new(Connection::open(addr, &self.hello, connect_deadline).await?);
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
    #[cfg(feature = "rdma")]
    pub(crate) async fn use_channel(&self, addr: &str, channel: Arc<dyn RpcChannel>) {
        let slot = self.slot(addr);
        *slot.lock().await = Some(channel);
    }

    /// A fresh, dedicated connection to `addr` (not pooled): the control
    /// connection an RDMA session lives on.
    #[cfg(feature = "rdma")]
    pub(crate) async fn dedicated_connection(&self, addr: &str) -> Result<Connection> {
        let deadline = Instant::now() + self.connect_timeout;
        Ok(Connection::open(addr, &self.hello, deadline).await?)
    }
}
