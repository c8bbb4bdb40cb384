//! The client service: what a node answers on the native protocol (TCP,
//! Unix socket, in-process `mem`), one concern per module.
//!
//! - `connection`: one connection's tasks: frames in, answers out,
//!   credits and the node-wide budget (backpressure).
//! - `handshake`: the hello: version, token, connection limit.
//! - `handler`: [`Handler`], which validates a request, sends it to the
//!   module that serves it, and accounts for it.
//! - `admission`: what the node takes in: connections, bytes of large
//!   requests in flight, and the region headroom a write needs.
//! - `read`: GET, MGET and SCAN from the local region, once the read's
//!   consistency allows it.
//! - `write`: commands through the Raft log, and their outcomes.
//! - `proposals`: writes proposed together go to Raft as one batch.
//! - `admin`: membership, leadership transfer, snapshots, fault injection.
//! - `status`: `endpoint status` and `endpoint health`.
//! - `metrics`: the `/metrics` page, state read at scrape time.

pub(crate) mod admin;
mod admission;
mod connection;
mod handler;
mod handshake;
mod metrics;
mod move_state;
pub mod proposals;
pub(crate) mod read;
pub mod read_fence;
pub mod read_rounds;
mod replica_move;
mod status;
pub(crate) mod write;

use std::time::Duration;

use rdkv_proto::wire::{ErrorCode, ErrorReply, Response};

pub use connection::{serve_clients, serve_unix_clients};
pub use handler::{Endpoints, Handler, HandlerSettings};
pub use status::shard_status;

/// Requests one connection may have in the server at once.
pub const MAX_IN_FLIGHT: u32 = 128;

/// A request's answer before it is sent: an error is a `Response::Error`.
pub(crate) type Reply = Result<Response, ErrorReply>;

/// `work`'s output, or an error reply with `code` when it takes longer than
/// `limit`: a leader cut off from its quorum would otherwise hold a request
/// (and its connection's credit) forever. `missed` says what did not happen.
async fn within<T>(
    limit: Duration,
    code: ErrorCode,
    missed: &str,
    work: impl Future<Output = T>,
) -> Result<T, ErrorReply> {
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| ErrorReply::new(code, format!("{missed} within {limit:?}")))
}
