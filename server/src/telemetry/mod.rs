//! What a node tells its operators: Prometheus metrics, per-op statistics
//! for `endpoint status` / `rdkvctl top`, and log lines for Raft events.
//!
//! Two kinds of figures, kept apart on purpose:
//!
//! - **Events** are recorded where they happen, through the `metrics`
//!   facade (requests, errors, latencies, fsyncs, snapshots, client read
//!   reports): counters in the node's Prometheus recorder ([`recorder`]),
//!   histograms in fixed buckets of atomic counts ([`histograms`]), so
//!   recording one never allocates.
//! - **State** (Raft indexes, region fill, log size, per-follower lag, open
//!   connections) is read when `/metrics` is scraped, by the service layer
//!   (`service::metrics`), so it is never stale and a node that stops
//!   leading stops reporting follower lag. This module never reads the
//!   service: the service hands it what it has ([`scrape`]).
//!
//! A process has one recorder; every metric carries no node label (the
//! scraper adds `instance`). Nodes embedded several to a process (tests)
//! share it.

pub mod histograms;
mod log_limit;
pub mod raft_events;
pub mod recorder;
pub mod requests;
pub mod scrape;

pub use log_limit::RateLimitedLog;
pub use recorder::prometheus;
pub use requests::{ConnectionGuard, RequestStats, Via};
