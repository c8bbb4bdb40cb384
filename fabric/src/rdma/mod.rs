//! The `rdma` transport: one-sided RDMA READs of a server's region for
//! GETs, two-sided SEND/RECV for everything else, over RC queue pairs set up
//! through the authenticated TCP control connection (see docs/rdma.md).
//!
//! The protocol logic is pure and always built (and tested without a
//! device):
//! - [`credits`]: flow control, so a SEND always finds a posted buffer.
//! - [`wr_table`]: work-request ids with generations, so a stale completion
//!   cannot complete a newer request.
//! - [`buffer_pool`]: the client's registered read slots, and how a long
//!   read is split across them.
//! - [`fragment`]: messages larger than a receive buffer.
//! - [`device`]: which device, port and GID to use.
//! - [`contexts`]: one opened context per device and port, chosen per
//!   connection by the route to the peer.
//! - [`qp_params`]: the queue-pair attributes and why.
//! - [`error`]: typed errors, completion status mapping.
//! - [`admission`]: connections reserve their worst case of the shared
//!   completion queue, so a full queue refuses new ones.
//! - [`setup`]: a connection abandoned before connecting is torn down.
//! - [`batch`]: READs posted together, the shared read slots.
//! - [`wait`]: synchronous waits on futures the poller completes.
//! - [`poll_policy`]: when the completion poller spins and when it sleeps
//!   on the completion channel.
//! - [`reopen`]: a failed device open is retried after a delay.
//! - [`async_event`]: what each asynchronous device event does, carried
//!   out on [`connections`], the registry of a context's connections.
//!
//! With the cargo feature `rdma`, [`verbs`] drives real devices through the
//! `sideway` crate; rdma-core is loaded at run time, so a binary built with
//! the feature still runs (and falls back) where rdma-core or a device is
//! missing.

pub mod admission;
pub mod async_event;
pub mod batch;
pub mod buffer_pool;
pub mod connections;
pub mod contexts;
pub mod credits;
pub mod device;
pub mod error;
#[cfg(test)]
mod fake;
pub mod fragment;
pub mod poll_policy;
pub mod qp_params;
pub mod reopen;
pub mod setup;
pub mod wait;
pub mod wr_table;

#[cfg(feature = "rdma")]
pub mod verbs;

pub use error::{CompletionStatus, RdmaError};

/// Whether this build carries the verbs transport (the cargo feature).
pub const COMPILED_IN: bool = cfg!(feature = "rdma");
