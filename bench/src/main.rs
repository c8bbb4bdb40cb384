//! `rdkv-bench`: YCSB workloads against rdkv and Redis, fabric
//! micro-benchmarks. See `rdkv-bench --help` and docs/benchmarks.md.

#![forbid(unsafe_code)]

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
