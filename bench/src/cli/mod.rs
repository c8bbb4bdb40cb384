//! The command line: subcommands `ycsb` and `fabric`.

mod fabric;
mod ycsb;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "rdkv-bench",
    version,
    about = "YCSB core workloads against rdkv, Redis and etcd, fabric micro-benchmarks, SLA checks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// YCSB core workloads A-F (load and run phases) against rdkv, Redis and/or etcd.
    Ycsb(Box<ycsb::YcsbArgs>),
    /// perftest-style one-sided read and RPC latency/bandwidth by message size.
    Fabric(Box<fabric::FabricArgs>),
}

pub fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    let stop = watch_signals();
    match cli.command {
        Command::Ycsb(args) => ycsb::run(*args, stop),
        Command::Fabric(args) => fabric::run(*args, stop),
    }
}

/// Ctrl-C and SIGTERM set the returned flag: the benchmark stops issuing
/// operations, returns, and the servers it started are removed on the way
/// out. A second signal exits at once.
fn watch_signals() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let watcher = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let Ok(mut term) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                else {
                    return;
                };
                loop {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                    }
                    if flag.swap(true, Ordering::SeqCst) {
                        eprintln!("rdkv-bench: second signal, exiting now");
                        std::process::exit(130);
                    }
                    eprintln!("rdkv-bench: stopping (signal); cleaning up");
                }
            });
        });
    if let Err(e) = watcher {
        eprintln!(
            "rdkv-bench: warning: no signal handling ({e}); Ctrl-C may leave servers running"
        );
    }
    stop
}
