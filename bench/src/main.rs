//! `rdkv-bench`: YCSB workloads against rdkv, Redis and etcd, fabric
//! micro-benchmarks. See `rdkv-bench --help` and docs/benchmarks.md.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod cli;

use std::process::ExitCode;

/// mimalloc, as the server uses: each operation allocates and frees its
/// request, reply and futures across the runtime's threads, and glibc's
/// malloc took about a fifth of the client's CPU in an update-only run
/// (docs/benchmarks.md, twenty-ninth round), CPU a co-located server
/// would otherwise have had.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdkv-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
