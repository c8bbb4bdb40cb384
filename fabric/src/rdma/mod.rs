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
//! - [`qp_params`]: the queue-pair attributes and why.
//! - [`error`]: typed errors, completion status mapping.
//!
//! With the cargo feature `rdma`, [`verbs`] drives real devices through the
//! `sideway` crate; rdma-core is loaded at run time, so a binary built with
//! the feature still runs (and falls back) where rdma-core or a device is
//! missing.

pub mod buffer_pool;
pub mod credits;
pub mod device;
pub mod error;
pub mod fragment;
pub mod qp_params;
pub mod wr_table;

#[cfg(feature = "rdma")]
pub mod verbs;

pub use error::{CompletionStatus, RdmaError};

/// Whether this build carries the verbs transport (the cargo feature).
pub const COMPILED_IN: bool = cfg!(feature = "rdma");
