//! The RESP (Redis protocol) front end: `redis-cli`, `redis-benchmark` and
//! Redis client libraries talk to rdkv through it (`--resp-listen`).
//!
//! - [`parse`]: requests (arrays of bulk strings, inline commands), bounded
//!   before anything is allocated.
//! - [`reply`]: replies, in RESP2 or RESP3 (chosen per connection by HELLO).
//! - `table`: one row per command (name, arity, flags, key positions,
//!   handler); dispatch and the `COMMAND` reply are read from it.
//! - `session`: one connection's state; runs a command by its row.
//! - `clients`: the open connections (CLIENT LIST); `client_command`: CLIENT.
//! - `cluster`: Redis Cluster's view of the shard map (CLUSTER SLOTS,
//!   SHARDS, NODES, ...), and MOVED/CROSSSLOT on connections in cluster
//!   mode (docs/sharding.md, section 7).
//! - `transaction`: MULTI/EXEC/DISCARD, WATCH/UNWATCH (one native
//!   `Transaction`, one log entry).
//! - `keyspace`: KEYS, SCAN (cursors in `keyspace::Cursors`), TYPE; `glob`:
//!   Redis's patterns.
//! - `commands`: what each Redis command does; `expiry`: the commands of
//!   key expiry (EXPIRE, TTL, GETEX, ...) and SET's expiry options.
//! - `store`: the native requests behind them, served by the [`Handler`]
//!   here or forwarded to the leader (`forward`).
//!
//! - `connection`: one task per connection reads commands while earlier
//!   ones run and runs commands on different keys at once; `order` keeps
//!   the order a client can observe (a GET after a SET of its key sees the
//!   SET; replies come back in request order). A window of commands and
//!   argument bytes bounds what one connection holds.
//!
//! **Writes and reads on a follower are forwarded** to the leader
//! transparently: the server holds an `rdkv_client::Client` over the cluster's
//! native client addresses (with the node's token) and sends the same native
//! request there; the Redis client never sees a redirect. Read-modify-write
//! commands (INCR, APPEND, SETNX, SET with options, GETSET, EXPIRE,
//! GETEX, GETDEL) are `Request::Update`s, decided and applied inside the
//! state machine.

mod client_command;
mod clients;
mod cluster;
mod commands;
mod connection;
mod expiry;
mod forward;
mod glob;
mod keyspace;
pub mod parse;
pub mod reply;
mod session;
mod store;
mod table;
mod transaction;

use std::sync::Arc;

use rdkv_proto::wire::Consistency;
use tokio::sync::watch;

use crate::config::RespClusterMode;
use crate::service::Handler;
use clients::Clients;
use forward::Forwarder;
use keyspace::Cursors;
use parse::ParseLimits;

/// Replies buffered before they are written even if more commands wait.
pub const FLUSH_BYTES: usize = 64 * 1024;

/// What every RESP connection of a node shares.
#[derive(Debug)]
pub struct RespServer {
    handler: Arc<Handler>,
    limits: ParseLimits,
    consistency: Consistency,
    /// When a connection follows Redis Cluster's rules.
    cluster_mode: RespClusterMode,
    forwarder: Forwarder,
    clients: Clients,
    cursors: Cursors,
    /// Every node's RESP address, for Redis Cluster's view.
    resp_directory: cluster::RespDirectory,
    port: u16,
}

impl RespServer {
    pub fn new(
        handler: Arc<Handler>,
        consistency: Consistency,
        cluster_mode: RespClusterMode,
        own_client: rdkv_client::ClientOptions,
        port: u16,
    ) -> RespServer {
        let limits = handler.limits();
        RespServer {
            limits: ParseLimits::for_values(limits.max_value_bytes, limits.max_batch_keys),
            forwarder: Forwarder::new(own_client),
            clients: Clients::default(),
            cursors: Cursors::default(),
            resp_directory: cluster::RespDirectory::default(),
            handler,
            consistency,
            cluster_mode,
            port,
        }
    }
}

pub async fn serve_resp(
    listener: crate::accept::TcpFront,
    server: Arc<RespServer>,
    shutdown: watch::Receiver<bool>,
) {
    crate::accept::accept_until(listener, "resp", shutdown, move |stream, peer| {
        let server = Arc::clone(&server);
        async move { connection::serve(stream, peer, &server).await }
    })
    .await;
}
