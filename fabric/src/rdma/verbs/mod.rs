//! The verbs half of the `rdma` transport (feature `rdma`), on `sideway`:
//!
//! - [`context`]: device discovery and selection, protection domain,
//!   memory registration, the completion queue and its poller thread.
//! - [`events`]: one thread per context reads asynchronous device events
//!   (`rdma::async_event` says what each does).
//! - [`poller`]: one thread per completion queue; completions are matched to
//!   their requests by work-request id (`wr_table`).
//! - [`connection`]: one RC queue pair (INIT -> RTR -> RTS), its receive and
//!   send buffers, credits and fragment reassembly.
//! - [`read`]: one-sided READs as a [`Fabric`](crate::Fabric) /
//!   [`RemoteRegion`](crate::RemoteRegion), batched in one post.
//! - [`rpc`]: SEND/RECV as an [`RpcChannel`](crate::RpcChannel) (client) and
//!   the server's request loop.
//! - [`server`] and [`client`]: what a node and a client hold.
//!
//! Nothing here has run on a device in this project's CI (there is none);
//! see docs/rdma.md for what is verified where.

pub mod client;
pub mod connection;
pub mod context;
pub mod events;
pub mod poller;
pub mod read;
pub mod rpc;
pub mod server;

pub use client::{PendingSession, RdmaClient, RdmaSession};
pub use context::{DeviceChoice, RdmaContext};
pub use read::{RdmaFabric, RdmaRegion};
pub use rpc::RdmaChannel;
pub use server::{RdmaServer, ServerConnection};
