#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use anyhow::{Context, Result};
use clap::Parser;
use rdkv_server::config::{Args, Config, LogFormat};
use rdkv_server::node::Node;
use tracing_subscriber::EnvFilter;

/// mimalloc, not glibc's malloc: the request and replication paths allocate
/// and free many small buffers across threads, where glibc spent about a
/// fifth of the leader's CPU (docs/benchmarks.md, issue 15).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn wait_for_signal() -> Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    })
}

fn main() -> Result<()> {
    let config = Config::resolve(Args::parse())?;
    init_logging(config.log_format);
    rdkv_server::restore::restore_before_start(&config)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(workers, "runtime started");
        let node = Node::start(config).await?;
        let signal = wait_for_signal().await?;
        tracing::info!("{signal} received: shutting down");
        node.stop().await?;
        tracing::info!("stopped");
        Ok(())
    })
}
