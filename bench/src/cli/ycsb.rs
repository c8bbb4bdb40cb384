//! `rdkv-bench ycsb`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use rdkv_bench::driver::DriverFactory;
#[cfg(feature = "etcd")]
use rdkv_bench::driver::etcd::EtcdFactory;
use rdkv_bench::driver::rdkv::{self, RdkvFactory, TransportChoice};
use rdkv_bench::driver::redis::{RedisFactory, RespServer};
#[cfg(feature = "etcd")]
use rdkv_bench::embedded::LocalEtcd;
use rdkv_bench::embedded::{ClusterOptions, EmbeddedCluster, LocalRedis, RedisFsync};
use rdkv_bench::properties::Properties;
use rdkv_bench::report::{self, PhaseResult};
use rdkv_bench::runner::{Phase, RunError, RunOptions, run_phase};
use rdkv_bench::sla::{Sla, SlaReport};
use rdkv_bench::workload::{OpKind, Workload, WorkloadSpec};
use rdkv_client::{ClientTlsFiles, Consistency};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PhaseArg {
    Load,
    Run,
    Both,
}

#[derive(Debug, Args)]
pub struct YcsbArgs {
    /// A YCSB workload property file (e.g. bench/workloads/workloada); later files override earlier ones.
    #[arg(short = 'P', value_name = "FILE")]
    property_files: Vec<PathBuf>,
    /// Sets one property, as YCSB's -p (e.g. -p recordcount=100000); overrides the files.
    #[arg(short = 'p', value_name = "NAME=VALUE")]
    properties: Vec<String>,
    /// Which phases to run: load (insert recordcount records), run (operationcount operations) or both.
    #[arg(long, value_enum, default_value = "both")]
    phase: PhaseArg,
    /// Store(s) to benchmark, one after another with the same seed and records:
    /// rdkv (with --transport), rdkv-shm, rdkv-tcp, rdkv-auto, rdkv-rdma, rdkv-resp (the
    /// embedded cluster's leader through its RESP port, with the redis driver), redis or
    /// etcd (etcd needs a build with `--features etcd`). Repeatable. rdkv-<transport>-batch
    /// (e.g. rdkv-shm-batch): in the run phase each thread gathers --concurrency operations
    /// and issues their reads as one batch (`get_many_into`), one after another otherwise.
    #[arg(long = "target", value_name = "TARGET", default_value = "rdkv")]
    targets: Vec<String>,

    /// rdkv client endpoints (host:port, comma separated).
    #[arg(long, value_delimiter = ',', env = "RDKV_ENDPOINTS")]
    endpoints: Vec<String>,
    /// How rdkv GETs travel: auto, shm (one-sided from mapped regions), tcp (RPC) or rdma.
    #[arg(long, default_value = "auto")]
    transport: String,
    /// rdkv read consistency: linearizable, lease or follower[:max_lag_entries].
    #[arg(long, default_value = "lease")]
    consistency: String,
    /// rdkv cluster token.
    #[arg(long, env = "RDKV_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificates (PEM) of the servers: rdkv targets connect over TLS,
    /// and so does --target redis with a rediss:// --redis-url.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for servers that verify clients; with --tls-key.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Start an N-node rdkv cluster of local rdkv-server processes for this run.
    #[arg(long, value_name = "N")]
    embedded: Option<u64>,
    /// Region size of each embedded node.
    #[arg(long, default_value_t = 256)]
    embedded_region_mib: u64,
    /// Shards (Raft groups) of the embedded cluster (`rdkv-server --shards`).
    #[arg(long, default_value_t = 1, requires = "embedded")]
    shards: u32,
    /// Replicas of each shard of the embedded cluster (`rdkv-server
    /// --replicas`; default: every node).
    #[arg(long, requires = "embedded")]
    replicas: Option<u64>,
    /// An extra rdkv-server flag for every embedded node, e.g.
    /// `--server-arg=--resp-read-consistency=lease`. Repeatable.
    #[arg(long = "server-arg", value_name = "FLAG", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// RESP endpoint of an rdkv node for --target rdkv-resp without --embedded.
    #[arg(long)]
    rdkv_resp_url: Option<String>,

    /// Redis endpoint for --target redis.
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis_url: String,
    /// Start a local redis-server for this run (on a free port) and stop it afterwards.
    #[arg(long)]
    start_redis: bool,
    /// Persistence of the started redis-server: none (--save '' --appendonly no),
    /// everysec or always (appendonly yes with that appendfsync).
    #[arg(long, default_value = "none")]
    redis_fsync: String,

    /// etcd client endpoints for --target etcd (host:port, comma separated).
    // Read only by the etcd target, which a build without the feature lacks.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    etcd_endpoints: Vec<String>,
    /// Start an N-member etcd cluster of local etcd processes for this run
    /// (etcd on PATH, or ETCD_BIN) and stop it afterwards.
    #[arg(long, value_name = "N")]
    start_etcd: Option<u64>,

    /// Benchmark threads, each with its own client (default: YCSB's threadcount property, else 1).
    #[arg(long)]
    threads: Option<usize>,
    /// Operations in flight per thread.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Target throughput in operations per second over all threads; latencies are then also
    /// reported from the intended start times (Intended-*). Default: YCSB's target property,
    /// else unthrottled.
    #[arg(long)]
    target_ops: Option<f64>,
    /// Run phase: seconds of operations before measuring starts (not reported).
    #[arg(long, default_value_t = 0.0)]
    warmup_secs: f64,
    /// Run phase: measure for this long instead of operationcount operations.
    #[arg(long)]
    duration_secs: Option<f64>,
    /// Seed of every random choice (keys, operations, values).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write every result as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Pass/fail thresholds on the run phase, e.g. 'read.p99<500us,throughput>100000'.
    #[arg(long)]
    sla: Option<String>,
    /// No progress bar (it is only drawn on a terminal anyway).
    #[arg(long)]
    no_progress: bool,
}

/// A target to run, resolved from `--target`.
#[derive(Debug, Clone)]
enum Target {
    /// The transport, and whether a thread's in-flight reads go as one
    /// batch (`rdkv-<transport>-batch`).
    Rdkv(TransportChoice, bool),
    /// rdkv's RESP front end, through the redis driver.
    RdkvResp,
    Redis,
    #[cfg(feature = "etcd")]
    Etcd,
}

/// What a build without the feature says to `--target etcd` and `--start-etcd`.
#[cfg(not(feature = "etcd"))]
const NO_ETCD: &str = "this rdkv-bench was built without the etcd target: rebuild it with \
    `--features etcd` (cargo run --release -p rdkv-bench --features etcd -- ycsb ...); \
    building etcd-client needs protoc (Debian: apt-get install protobuf-compiler)";

#[cfg(feature = "etcd")]
fn etcd_target() -> Result<Target> {
    Ok(Target::Etcd)
}

#[cfg(not(feature = "etcd"))]
fn etcd_target() -> Result<Target> {
    bail!("--target etcd: {NO_ETCD}")
}

/// `--start-etcd` without the etcd target built in fails rather than
/// being ignored.
fn check_etcd_flags(args: &YcsbArgs) -> Result<()> {
    #[cfg(not(feature = "etcd"))]
    if args.start_etcd.is_some() {
        bail!("--start-etcd: {NO_ETCD}");
    }
    if args.start_etcd == Some(0) {
        bail!("--start-etcd needs at least 1 member");
    }
    Ok(())
}

fn resolve_targets(args: &YcsbArgs) -> Result<Vec<Target>> {
    let default_transport = TransportChoice::parse(&args.transport)?;
    args.targets
        .iter()
        .map(|t| {
            Ok(match t.as_str() {
                "rdkv" => Target::Rdkv(default_transport, false),
                "rdkv-resp" => Target::RdkvResp,
                "redis" => Target::Redis,
                "etcd" => etcd_target()?,
                other => match other.strip_prefix("rdkv-") {
                    Some(transport) => match transport.strip_suffix("-batch") {
                        Some(transport) => Target::Rdkv(TransportChoice::parse(transport)?, true),
                        None => Target::Rdkv(TransportChoice::parse(transport)?, false),
                    },
                    None => bail!(
                        "unknown target {other:?}: expected rdkv, rdkv-shm, rdkv-tcp, rdkv-auto, rdkv-rdma (each also as rdkv-<transport>-batch), rdkv-resp, redis or etcd"
                    ),
                },
            })
        })
        .collect()
}

/// One phase of one target, against the servers started for the run.
fn run_target(
    target: &Target,
    phase: Phase,
    workload: &Arc<Workload>,
    servers: &Servers,
    args: &YcsbArgs,
    consistency: Consistency,
    run_options: &RunOptions,
) -> Result<PhaseResult> {
    let tls = client_tls(args)?;
    Ok(match target {
        Target::Rdkv(transport, batch_reads) => {
            let factory = RdkvFactory {
                endpoints: servers.endpoints.clone(),
                transport: *transport,
                consistency,
                token: args.token.clone(),
                request_timeout: Duration::from_secs(10),
                tls,
                batch_reads: *batch_reads,
            };
            factory.validate()?;
            run_one(phase, workload, &factory, run_options)?
        }
        Target::RdkvResp => {
            let factory = RedisFactory {
                url: servers
                    .rdkv_resp_url
                    .clone()
                    .context("--target rdkv-resp needs --embedded N or --rdkv-resp-url")?,
                server: RespServer::Rdkv,
                tls: None,
            };
            run_one(phase, workload, &factory, run_options)?
        }
        Target::Redis => {
            let factory = RedisFactory {
                url: servers.redis_url.clone(),
                server: RespServer::Redis,
                tls: tls.filter(|_| servers.redis_url.starts_with("rediss://")),
            };
            run_one(phase, workload, &factory, run_options)?
        }
        #[cfg(feature = "etcd")]
        Target::Etcd => {
            let factory = EtcdFactory {
                endpoints: servers.etcd_endpoints.clone(),
                request_timeout: Duration::from_secs(10),
            };
            run_one(phase, workload, &factory, run_options)?
        }
    })
}

fn positive(name: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        bail!("{name} must be a non-negative number of seconds, got {value}")
    }
}

/// The TLS the rdkv targets (and a `rediss://` Redis) connect with.
fn client_tls(args: &YcsbArgs) -> Result<Option<ClientTlsFiles>> {
    ClientTlsFiles::from_settings(
        args.tls_ca.clone(),
        args.tls_cert.clone(),
        args.tls_key.clone(),
        None,
    )
    .context("--tls-ca, --tls-cert, --tls-key")
}

pub fn run(args: YcsbArgs, stop: Arc<AtomicBool>) -> Result<ExitCode> {
    let properties = load_properties(&args)?;
    let spec = WorkloadSpec::from_properties(&properties).context("workload properties")?;
    if spec.record_count == 0 {
        bail!("recordcount is 0: set it in the workload file or with -p recordcount=N");
    }
    check_etcd_flags(&args)?;
    let targets = resolve_targets(&args)?;
    for target in &targets {
        if let Target::Rdkv(transport, _) = target {
            transport.check_available()?;
        }
    }
    let sla = args.sla.as_deref().map(Sla::parse).transpose()?;
    let redis_fsync = RedisFsync::parse(&args.redis_fsync).with_context(|| {
        format!(
            "--redis-fsync {:?}: expected none, everysec or always",
            args.redis_fsync
        )
    })?;
    let consistency = rdkv::parse_consistency(&args.consistency)?;
    // Checked before anything starts (each target reads them again).
    client_tls(&args)?;
    let run_options = run_options(&args, &properties, &stop)?;
    let phases: &[Phase] = match args.phase {
        PhaseArg::Load => &[Phase::Load],
        PhaseArg::Run => &[Phase::Run],
        PhaseArg::Both => &[Phase::Load, Phase::Run],
    };
    let scans = spec.scan_proportion > 0.0 && phases.contains(&Phase::Run);
    if scans && targets.iter().any(|t| matches!(t, Target::Rdkv(..))) && !rdkv::SUPPORTS_SCAN {
        bail!(
            "this workload scans (scanproportion={}) and this rdkv-client has no scan yet: \
             run it with --target redis only",
            spec.scan_proportion
        );
    }
    // Started before anything runs, removed when this goes out of scope.
    let servers = Servers::start(&args, &targets, redis_fsync, &stop)?;

    let mut results: Vec<PhaseResult> = Vec::new();
    for target in &targets {
        // Every target gets a fresh workload: the same seed, keys and records.
        let workload = Arc::new(Workload::new(spec.clone())?);
        for &phase in phases {
            let result = run_target(
                target,
                phase,
                &workload,
                &servers,
                &args,
                consistency,
                &run_options,
            )?;
            print_result(&result);
            results.push(result);
        }
    }
    if targets.len() > 1 {
        print_comparisons(phases, &results);
    }
    let sla_reports = sla.as_ref().map(|sla| judge(sla, phases, &results));
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "seed": args.seed,
            "properties": properties.names().map(|n| (n.to_owned(), properties.get(n).unwrap_or_default().to_owned())).collect::<std::collections::BTreeMap<_, _>>(),
            "results": results,
            "sla_passed": sla_reports.as_ref().map(|reports| reports.iter().all(SlaReport::passed)),
        });
        let text = serde_json::to_string_pretty(&json)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    drop(servers);
    if sla_reports.iter().flatten().any(|r| !r.passed()) {
        eprintln!("rdkv-bench: SLA missed");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// The workload properties: the files in order, then the `-p` overrides.
fn load_properties(args: &YcsbArgs) -> Result<Properties> {
    let mut properties = Properties::new();
    for file in &args.property_files {
        properties
            .load_file(file)
            .with_context(|| format!("reading workload file {}", file.display()))?;
    }
    for p in &args.properties {
        properties.set_override(p)?;
    }
    for name in WorkloadSpec::unknown_properties(&properties) {
        eprintln!(
            "rdkv-bench: warning: property {name} is not used by CoreWorkload (typo?); ignored"
        );
    }
    Ok(properties)
}

/// Threads, rate, warm-up and duration from the flags, else the properties.
fn run_options(
    args: &YcsbArgs,
    properties: &Properties,
    stop: &Arc<AtomicBool>,
) -> Result<RunOptions> {
    let threads = match args.threads {
        Some(t) => t,
        None => properties.u64("threadcount", 1)? as usize,
    };
    if threads == 0 || args.concurrency == 0 {
        bail!("--threads and --concurrency must be at least 1");
    }
    let target_ops = match args.target_ops {
        Some(t) => Some(t),
        None => match properties.f64("target", 0.0)? {
            t if t > 0.0 => Some(t),
            _ => None,
        },
    };
    if target_ops.is_some_and(|t| !(t.is_finite() && t > 0.0)) {
        bail!("--target-ops must be a positive number of operations per second");
    }
    let duration = args
        .duration_secs
        .map(|d| positive("--duration-secs", d).map(Duration::from_secs_f64))
        .transpose()?;
    Ok(RunOptions {
        threads,
        concurrency: args.concurrency,
        target_ops_per_sec: target_ops,
        warmup: Duration::from_secs_f64(positive("--warmup-secs", args.warmup_secs)?),
        duration,
        seed: args.seed,
        progress: !args.no_progress,
        stop: Arc::clone(stop),
    })
}

/// The servers the run started (removed on drop) and where to reach the targets.
struct Servers {
    cluster: Option<EmbeddedCluster>,
    redis: Option<LocalRedis>,
    #[cfg(feature = "etcd")]
    etcd: Option<LocalEtcd>,
    endpoints: Vec<String>,
    /// The RESP URL of rdkv's leader (embedded) or `--rdkv-resp-url`.
    rdkv_resp_url: Option<String>,
    redis_url: String,
    #[cfg(feature = "etcd")]
    etcd_endpoints: Vec<String>,
}

impl Servers {
    /// Starts the embedded rdkv cluster and redis-server the flags ask for,
    /// when a target needs them.
    fn start(
        args: &YcsbArgs,
        targets: &[Target],
        redis_fsync: RedisFsync,
        stop: &AtomicBool,
    ) -> Result<Servers> {
        let mut servers = Servers {
            cluster: None,
            redis: None,
            #[cfg(feature = "etcd")]
            etcd: None,
            endpoints: args.endpoints.clone(),
            rdkv_resp_url: args.rdkv_resp_url.clone(),
            redis_url: args.redis_url.clone(),
            #[cfg(feature = "etcd")]
            etcd_endpoints: args.etcd_endpoints.clone(),
        };
        let wants_rdkv = targets
            .iter()
            .any(|t| matches!(t, Target::Rdkv(..) | Target::RdkvResp));
        if wants_rdkv && let Some(n) = args.embedded {
            servers.start_cluster(n, args, stop)?;
        }
        let wants_redis = targets.iter().any(|t| matches!(t, Target::Redis));
        if wants_redis && args.start_redis {
            let r = LocalRedis::start(redis_fsync).context("starting redis-server")?;
            servers.redis_url = r.url();
            eprintln!(
                "rdkv-bench: started redis-server at {} with {}",
                servers.redis_url,
                redis_fsync.describe()
            );
            servers.redis = Some(r);
        }
        #[cfg(feature = "etcd")]
        if targets.iter().any(|t| matches!(t, Target::Etcd))
            && let Some(n) = args.start_etcd
        {
            servers.start_etcd(n, stop)?;
        }
        Ok(servers)
    }

    fn start_cluster(&mut self, nodes: u64, args: &YcsbArgs, stop: &AtomicBool) -> Result<()> {
        let runtime = waiting_runtime()?;
        eprintln!(
            "rdkv-bench: starting an embedded {nodes}-node rdkv cluster of {} shard(s)",
            args.shards
        );
        let mut extra_args = vec!["--shards".to_owned(), args.shards.to_string()];
        if let Some(replicas) = args.replicas {
            extra_args.extend(["--replicas".to_owned(), replicas.to_string()]);
        }
        extra_args.extend(args.server_args.iter().cloned());
        let mut c = EmbeddedCluster::start(&ClusterOptions {
            nodes,
            region_mib: args.embedded_region_mib,
            extra_args,
        })
        .context("starting the embedded cluster")?;
        let leader = runtime
            .block_on(c.wait_for_leader(Duration::from_secs(30), stop))
            .context("waiting for the embedded cluster's leader")?;
        eprintln!(
            "rdkv-bench: embedded cluster ready, leader node {leader}: {}",
            c.endpoints().join(",")
        );
        self.endpoints = c.endpoints().to_vec();
        self.rdkv_resp_url = c.resp_url(leader);
        self.cluster = Some(c);
        Ok(())
    }

    #[cfg(feature = "etcd")]
    fn start_etcd(&mut self, members: u64, stop: &AtomicBool) -> Result<()> {
        let runtime = waiting_runtime()?;
        eprintln!("rdkv-bench: starting a local {members}-member etcd cluster");
        let mut etcd = LocalEtcd::start(members).context("starting the etcd cluster")?;
        runtime
            .block_on(etcd.wait_ready(Duration::from_secs(30), stop))
            .context("waiting for the etcd cluster")?;
        eprintln!(
            "rdkv-bench: etcd cluster ready: {}",
            etcd.endpoints().join(",")
        );
        self.etcd_endpoints = etcd.endpoints().to_vec();
        self.etcd = Some(etcd);
        Ok(())
    }
}

/// A runtime to wait for started servers in (the benchmark threads have
/// their own).
fn waiting_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a tokio runtime")
}

/// One phase's YCSB text, with a heading that says how it ran.
fn print_result(result: &PhaseResult) {
    println!(
        "# {} {} phase: {} threads x {} in flight{}",
        result.target,
        result.phase,
        result.threads,
        result.concurrency,
        match result.target_ops_per_sec {
            Some(t) =>
                format!(", target {t} ops/s (Intended-* series: latency from the intended start)"),
            None => ", unthrottled".into(),
        }
    );
    print!("{}", report::ycsb_text(result));
    for e in &result.first_errors {
        eprintln!("rdkv-bench: {} {}: error: {e}", result.target, result.phase);
    }
}

fn print_comparisons(phases: &[Phase], results: &[PhaseResult]) {
    for &phase in phases {
        let same: Vec<&PhaseResult> = results.iter().filter(|r| r.phase == phase.name()).collect();
        println!(
            "\n# comparison, {} phase (service-time latencies; ratio = first target / other)",
            phase.name()
        );
        print!("{}", report::comparison_table(&same));
    }
}

/// The SLA's verdict on the run phase (the load phase when only it ran),
/// printed as it goes.
fn judge(sla: &Sla, phases: &[Phase], results: &[PhaseResult]) -> Vec<SlaReport> {
    let judged = if phases.contains(&Phase::Run) {
        "run"
    } else {
        "load"
    };
    let mut reports = Vec::new();
    for r in results.iter().filter(|r| r.phase == judged) {
        let report = sla.evaluate(r);
        println!();
        print!("{report}");
        reports.push(report);
    }
    reports
}

fn run_one<F: DriverFactory>(
    phase: Phase,
    workload: &Arc<Workload>,
    factory: &F,
    options: &RunOptions,
) -> Result<PhaseResult> {
    let scans = phase == Phase::Run && workload.issues(OpKind::Scan);
    eprintln!(
        "rdkv-bench: {} {} phase{}",
        factory.label(),
        phase.name(),
        if scans { " (with scans)" } else { "" }
    );
    match run_phase(phase, workload, factory, options) {
        Ok(r) => Ok(r),
        Err(RunError::Interrupted) => bail!("interrupted"),
        Err(e) => Err(e).with_context(|| format!("{} {} phase", factory.label(), phase.name())),
    }
}
