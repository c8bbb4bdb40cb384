//! The integration tests of this crate, one binary for nearly all of
//! them: each module is one suite (its file beside this one), run as
//! `cargo test -p rdkv-tests --test it <module>::`. A filter matches every
//! test whose path contains it (`shards::` also runs `join_shards::` and
//! `one_sided_shards::`); `-- --exact` with a whole path runs one test.
//!
//! Why one binary: it links the client, tokio and the harness once instead
//! of once per suite. Rebuilding the crate's tests after a change to the
//! harness took 6 min 11 s as 42 test binaries and 2 min 3 s as four (this
//! one, then with `nemesis_shards` in it, `get_into`, `rdma`, `ofi`) on
//! this 2-core machine (`touch tests/src/lib.rs; cargo test -p rdkv-tests
//! --no-run`), and CI builds them from scratch every run.
//!
//! Kept as binaries of their own: `get_into` (it installs a counting global
//! allocator, which would count every suite's allocations), `lease` (it
//! steps this process's wall clock back an hour through the fabric's test
//! hook, which every suite beside it would read: their recorders, their
//! clients' expiry and lease judgements), `nemesis_shards` (its tests must
//! run alone in their process: one six-shard fault-injected cluster starves
//! another's heartbeats on 2 cores), and `rdma` and `ofi`
//! (built with those features by CI's transport step, and named there and
//! in docs/rdma.md).

mod backup;
mod bad_input;
mod cli;
mod cluster;
mod crash;
mod crash_points;
mod determinism;
mod expiry;
mod fill;
mod follower_lag;
mod heap_pages;
mod join_shards;
mod keyslot;
mod lincheck_model;
mod membership;
mod meta;
mod meta_voters;
mod move_resume;
mod nemesis;
mod observability;
mod one_sided;
mod one_sided_shards;
mod one_sided_stress;
mod overflow;
mod overload;
mod partition;
mod pipelining;
mod power_loss;
mod read_fence;
mod recovery;
mod redis_py;
mod resp;
mod resp_tools;
mod scan;
mod security;
mod shard_ops;
mod shards;
mod tls;
