//! `rdkv-bench fabric`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use rdkv_bench::embedded::{ClusterOptions, EmbeddedCluster};
use rdkv_bench::fabric_bench::{
    FabricOptions, FabricTransport, default_sizes, format_table, run_fabric,
};
use rdkv_bench::floor::{FloorOptions, FloorTable, fill, format_floor, run_floor};
use rdkv_client::{Client, ClientOptions, Transport};

#[derive(Debug, Args)]
pub struct FabricArgs {
    /// Transports to measure, comma separated: mem, shm, shm-get, tcp, and
    /// floor (the one-sided GET against the memory work under it, for a
    /// hot and a cold region; see `--floor-*`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mem,shm,shm-get,tcp,floor"
    )]
    transports: Vec<String>,
    /// Value sizes of the floor table.
    #[arg(long, value_delimiter = ',', default_value = "8,1024")]
    floor_sizes: Vec<usize>,
    /// The cold region of the floor table: the embedded cluster's region
    /// size, filled to about 70% with keys of every floor size.
    #[arg(long, default_value_t = 256)]
    floor_region_mib: usize,
    /// Rows of the floor table: tiny (64 keys: the GET's software alone),
    /// hot (1 MiB of keys), cold (the whole region).
    #[arg(long, value_delimiter = ',', default_value = "tiny,hot,cold")]
    floor_regions: Vec<String>,
    /// Operations per timed round of the floor table.
    #[arg(long, default_value_t = 20_000)]
    floor_ops: usize,
    /// Rounds per row of the floor table (the median is reported).
    #[arg(long, default_value_t = 9)]
    floor_rounds: usize,
    /// Message sizes in bytes, comma separated (default: powers of two from 8 B to 1 MiB).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Timed operations per size (perftest's -n).
    #[arg(long, default_value_t = 1000)]
    iterations: usize,
    /// Untimed operations per size before timing.
    #[arg(long, default_value_t = 100)]
    warmup_iterations: usize,
    /// GETs in flight during the tcp bandwidth test.
    #[arg(long, default_value_t = 16)]
    bw_inflight: usize,
    /// rdkv servers for shm-get and tcp; without them a 1-node cluster is started.
    #[arg(long, value_delimiter = ',', env = "RDKV_ENDPOINTS")]
    endpoints: Vec<String>,
    /// rdkv cluster token.
    #[arg(long, env = "RDKV_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Nodes of the cluster started when no --endpoints are given. Three by
    /// default: a 1-node leader was seen never to publish a lease for shm
    /// GETs in this run's time (docs/benchmarks.md).
    #[arg(long, default_value_t = 3)]
    embedded: u64,
    /// Also write the tables as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

pub fn run(args: FabricArgs, stop: Arc<AtomicBool>) -> Result<ExitCode> {
    let with_floor = args.transports.iter().any(|t| t == "floor");
    let transports = args
        .transports
        .iter()
        .filter(|t| *t != "floor")
        .map(|t| FabricTransport::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let sizes = if args.sizes.is_empty() {
        default_sizes()
    } else {
        args.sizes.clone()
    };
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > 1 << 20) {
        bail!("--sizes: {bad} is outside 1 B .. 1 MiB");
    }
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a tokio runtime")?;
    let mut cluster = None;
    let mut endpoints = args.endpoints.clone();
    if endpoints.is_empty() && (with_floor || transports.iter().any(|t| t.needs_server())) {
        eprintln!(
            "rdkv-bench: starting an embedded {}-node rdkv cluster",
            args.embedded
        );
        let mut c = EmbeddedCluster::start(&ClusterOptions {
            nodes: args.embedded,
            // Room for one value of every size, and the floor's cold region.
            region_mib: if with_floor {
                args.floor_region_mib as u64
            } else {
                64
            },
            extra_args: Vec::new(),
        })
        .context("starting the embedded cluster")?;
        runtime
            .block_on(c.wait_for_leader(Duration::from_secs(30), &stop))
            .context("waiting for the embedded cluster's leader")?;
        endpoints = c.endpoints().to_vec();
        cluster = Some(c);
    }
    let options = FabricOptions {
        sizes,
        iterations: args.iterations,
        warmup_iterations: args.warmup_iterations,
        bw_inflight: args.bw_inflight,
        endpoints,
        token: args.token.clone(),
    };
    let tables = runtime.block_on(run_fabric(&transports, &options))?;
    for table in &tables {
        print!("{}", format_table(table));
    }
    if with_floor {
        let table = runtime.block_on(floor_table(&args, &options))?;
        print!("{}", format_floor(&table));
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&tables)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    drop(cluster);
    Ok(ExitCode::SUCCESS)
}

/// Fills the cluster's region (about 70% of it) with keys of every floor
/// size, then measures the floor table.
async fn floor_table(args: &FabricArgs, options: &FabricOptions) -> Result<FloorTable> {
    if args.floor_sizes.is_empty() || args.floor_ops == 0 || args.floor_rounds == 0 {
        bail!("--floor-sizes, --floor-ops and --floor-rounds must not be empty or 0");
    }
    let region_bytes = args.floor_region_mib << 20;
    let per_key: usize = args
        .floor_sizes
        .iter()
        .map(|&s| rdkv_bench::floor::block_bytes(s) + 8)
        .sum();
    let cold_keys = region_bytes * 7 / 10 / per_key;
    let client = Client::new(
        &options.endpoints,
        ClientOptions {
            token: options.token.clone(),
            request_timeout: Duration::from_secs(30),
            transport: Transport::Shm,
            ..ClientOptions::default()
        },
    )?;
    eprintln!(
        "rdkv-bench: filling the region with {cold_keys} keys of each of {:?} bytes",
        args.floor_sizes
    );
    fill(&client, &args.floor_sizes, cold_keys).await?;
    let floor = FloorOptions {
        sizes: args.floor_sizes.clone(),
        cold_region_bytes: region_bytes,
        ops_per_round: args.floor_ops,
        rounds: args.floor_rounds,
        regions: args.floor_regions.clone(),
    };
    Ok(run_floor(&client, &floor, cold_keys).await?)
}
