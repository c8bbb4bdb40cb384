//! rdkv client library (async, tokio).
//!
//! ```no_run
//! use rdkv_client::{Client, Consistency};
//!
//! # async fn run() -> Result<(), rdkv_client::Error> {
//! let client = Client::connect(&["127.0.0.1:7379"]).await?;
//!
//! let version = client.put("greeting", "hello").await?;
//! let got = client.get("greeting").await?; // Lease read on the leader
//! assert_eq!(got.map(|v| v.value), Some("hello".into()));
//!
//! // Compare-and-set on the version returned by the put.
//! let cas = client
//!     .cas("greeting", Some(version), Some("hello again".into()))
//!     .await?;
//! assert!(cas.succeeded);
//!
//! // Batched read from any replica at most 100 entries behind.
//! let values = client
//!     .mget_with(["greeting", "missing"], Consistency::Follower { max_lag_entries: 100 })
//!     .await?;
//! assert!(values[1].is_none());
//! # Ok(())
//! # }
//! ```
//!
//! The same program is `client/examples/basic.rs`
//! (`cargo run -p rdkv-client --example basic`).
//!
//! # Public surface
//!
//! - [`Client`]: [`connect`](Client::connect), [`connect_with`](Client::connect_with)
//!   (with [`ClientOptions`]: token, timeouts, attempt budget, client name, default
//!   read consistency), [`new`](Client::new) (lazy, no I/O);
//!   key-value: [`get`](Client::get), [`get_with`](Client::get_with),
//!   [`put`](Client::put), [`delete`](Client::delete), [`cas`](Client::cas),
//!   [`mget`](Client::mget), [`mget_with`](Client::mget_with), [`mput`](Client::mput);
//!   admin: [`status`](Client::status), [`status_of`](Client::status_of),
//!   [`health_of`](Client::health_of), [`members`](Client::members),
//!   [`add_member`](Client::add_member), [`promote_member`](Client::promote_member),
//!   [`remove_member`](Client::remove_member), [`move_leader`](Client::move_leader),
//!   [`snapshot_to`](Client::snapshot_to), [`snapshot_to_file`](Client::snapshot_to_file),
//!   [`endpoints`](Client::endpoints), [`leader`](Client::leader).
//! - [`Error`]: typed failures; [`Error::OutcomeUnknown`] is the one to read carefully.
//!
//! # Connections, leader tracking and retries
//!
//! One TCP connection per server, opened lazily and reopened after it breaks.
//! Requests are pipelined on it (a writer task, a reader task, responses matched by
//! request id, in any order) and never more than the server's `max_in_flight` are
//! outstanding: a request waits for a credit instead.
//!
//! Writes, membership changes and `Linearizable`/`Lease` reads go to the leader.
//! The client remembers the leader; a `NotLeader` reply with a hint sends the
//! request to the hinted address at once (adding it to [`Client::endpoints`]); one
//! without a hint (an election) backs off, 50 ms doubling up to 250 ms, and tries the
//! other endpoints. `Unavailable`, `TooManyInFlight` and `StaleFollower` are retried
//! the same way. All of this happens within `request_timeout` and `max_attempts`.
//!
//! # Unknown outcomes are not retried
//!
//! Reads are retried freely. A write that was **sent** but whose reply never came
//! (the connection broke, `request_timeout` passed, or the server answered
//! `Timeout`) may or may not have been applied, and the client will not repeat it
//! behind your back: it fails with [`Error::OutcomeUnknown`]. Decide yourself:
//! read the key back, or make the write conditional with [`Client::cas`]. A write
//! that provably never left the client (no connection, no credit before the
//! deadline, rejected with `NotLeader`/`Unavailable`) is retried or reported as
//! [`Error::Timeout`] / [`Error::NoLeader`].
//!
//! # Consistency and clocks
//!
//! `Lease` reads (the default) are linearizable as long as the servers' clocks do
//! not drift apart by more than the lease margin the leader keeps; use
//! [`Consistency::Linearizable`] to depend on no clock, or
//! [`Consistency::Follower`] to spread reads over replicas with a bounded lag.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod client;
mod error;
mod merge;
mod one_sided;
mod options;
mod outcome;
mod routing;
mod scan;
mod snapshot;
mod split;

/// Re-exported so that callers need not depend on `bytes` themselves.
pub use bytes::Bytes;
pub use client::{Client, ttl_ms};
pub use error::{ConnectError, Error, PartialMPut, Result};
pub use one_sided::{GetIntoError, NotServed, OneSidedStats, ReadHandle};
pub use options::{ClientOptions, ClientTlsFiles, Transport};
pub use outcome::{CasOutcome, DeleteOutcome};
pub use rdkv_fabric::GotInto;
pub use rdkv_proto::wire::{
    Consistency, ErrorCode, ErrorReply, ExpireCondition, Expiry, Fault, Health, KeyExpiry,
    LeaderHint, MemberInfo, NodeStatus, OpStats, OpenConnections, RegionFill, ReplicationLag, Role,
    ShardStatus, StateDigestAt, Versioned,
};
pub use snapshot::SnapshotInfo;
