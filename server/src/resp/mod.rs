//! The RESP (Redis protocol) front end: `redis-cli`, `redis-benchmark` and
//! Redis client libraries talk to rdkv through it (`--resp-listen`).
//!
//! - [`parse`]: RESP2 requests (arrays of bulk strings, inline commands),
//!   bounded before anything is allocated.
//! - [`reply`]: RESP2 replies.
//! - `table`: one row per command (name, arity, flags, key positions,
//!   handler); dispatch and the `COMMAND` reply are read from it.
//! - `session`: one connection's state; runs a command by its row.
//! - `commands`: what each Redis command does.
//! - `store`: the native requests behind them, served by the [`Handler`]
//!   here or forwarded to the leader (`forward`).
//!
//! One task per connection reads commands and runs them **one at a time, in
//! order** (a pipelined GET after a SET sees the SET), appending replies to
//! an output buffer that is flushed whenever no complete command is buffered
//! or it passes [`FLUSH_BYTES`]. The input buffer holds at most one command
//! (bounded by [`ParseLimits`]) plus one read, so a large pipeline never
//! makes the server buffer more than that: the client is simply not read
//! while its earlier commands run.
//!
//! **Writes and reads on a follower are forwarded** to the leader
//! transparently: the server holds an `rdkv_client::Client` over the cluster's
//! native client addresses (with the node's token) and sends the same native
//! request there; the Redis client never sees a redirect. Read-modify-write
//! commands (INCR, APPEND, SETNX, SET NX/XX/GET, GETSET) are
//! `Request::Update`s, decided and applied inside the state machine.

mod commands;
mod forward;
pub mod parse;
pub mod reply;
mod session;
mod store;
mod table;

use std::sync::Arc;

use anyhow::Result;
use bytes::BytesMut;
use rdkv_proto::wire::Consistency;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::service::Handler;
use crate::telemetry::Via;
use forward::Forwarder;
use parse::{ParseLimits, next_command};
use reply::Reply;
use session::Session;

/// Replies buffered before they are written even if more commands wait.
pub const FLUSH_BYTES: usize = 64 * 1024;
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// What a connection may send before it has authenticated (AUTH, HELLO, PING).
const UNAUTHENTICATED_LIMITS: ParseLimits = ParseLimits {
    max_bulk_bytes: 4096,
    max_array_len: 16,
    max_inline_bytes: 4096,
    max_command_bytes: 16 * 1024,
};

/// What every RESP connection of a node shares.
#[derive(Debug)]
pub struct RespServer {
    handler: Arc<Handler>,
    limits: ParseLimits,
    consistency: Consistency,
    forwarder: Forwarder,
    port: u16,
}

impl RespServer {
    pub fn new(
        handler: Arc<Handler>,
        consistency: Consistency,
        token: Option<String>,
        port: u16,
    ) -> RespServer {
        let limits = handler.limits();
        RespServer {
            limits: ParseLimits::for_values(limits.max_value_bytes, limits.max_batch_keys),
            forwarder: Forwarder::new(token),
            handler,
            consistency,
            port,
        }
    }
}

pub async fn serve_resp(
    listener: TcpListener,
    server: Arc<RespServer>,
    shutdown: watch::Receiver<bool>,
) {
    crate::accept::accept_until(listener, "resp", shutdown, |stream, _| {
        connection(stream, Arc::clone(&server))
    })
    .await;
}

async fn connection(stream: TcpStream, server: Arc<RespServer>) -> Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut read, mut write) = stream.into_split();
    let _open = server.handler.stats().connection(Via::Resp);
    let mut input = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut output = BytesMut::new();
    let mut session = Session::new(&server);
    loop {
        loop {
            // Before AUTH only small commands are read: nothing large is
            // buffered for a client that has not authenticated.
            let limits = if session.authenticated() {
                &server.limits
            } else {
                &UNAUTHENTICATED_LIMITS
            };
            match next_command(&mut input, limits) {
                Ok(Some(args)) => {
                    if args.is_empty() {
                        continue;
                    }
                    let (reply, close) = session.execute(&args).await;
                    reply.encode(&mut output);
                    if close {
                        write.write_all(&output).await?;
                        return Ok(());
                    }
                    if output.len() >= FLUSH_BYTES {
                        write.write_all(&output).await?;
                        output.clear();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The stream cannot be resynchronised: say why, then close.
                    Reply::err(format!("Protocol error: {e}")).encode(&mut output);
                    write.write_all(&output).await?;
                    anyhow::bail!("protocol error: {e}");
                }
            }
        }
        if !output.is_empty() {
            write.write_all(&output).await?;
            output.clear();
        }
        // The parser refuses a command over its limits before it is complete,
        // so the buffer never holds more than one command plus one read.
        input.reserve(READ_CHUNK_BYTES);
        if read.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
    }
}
