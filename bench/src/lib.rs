//! rdkv-bench: the benchmark rdkv is judged by.
//!
//! - [`workload`]: YCSB's CoreWorkload (properties, key and operation
//!   choosers, records), with YCSB's [`generator`]s ported from its Java
//!   source; [`properties`] reads YCSB property files and `-p` overrides;
//!   [`record`] is the one-value encoding of a record.
//! - [`driver`]: the stores behind one async trait: [`driver::rdkv`],
//!   [`driver::redis`] and, with the feature `etcd`, `driver::etcd`.
//! - [`runner`]: threads x in-flight tasks, target rate with
//!   coordinated-omission-corrected latencies, warm-up, duration or count.
//! - [`report`]: hdrhistogram measurements, YCSB's text output, JSON,
//!   comparison tables; [`sla`]: pass/fail thresholds.
//! - [`embedded`]: a local rdkv cluster (real `rdkv-server` processes), a
//!   local `redis-server` and (feature `etcd`) a local etcd cluster,
//!   removed on drop.
//! - [`fabric_bench`]: perftest-style read latency and bandwidth by size.
//!
//! The binary `rdkv-bench` (`src/main.rs`, `src/cli/`) wires these to
//! the command line.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod driver;
pub mod embedded;
pub mod fabric_bench;
pub mod floor;
pub mod generator;
pub mod properties;
pub mod record;
pub mod report;
pub mod runner;
pub mod sla;
pub mod workload;
