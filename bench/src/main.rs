//! `rdkv-bench`: YCSB workloads against rdkv, Redis and etcd, fabric
//! micro-benchmarks. See `rdkv-bench --help` and docs/benchmarks.md.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdkv-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
