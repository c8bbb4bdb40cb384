//! Node configuration: command-line flags, `RDKV_*` environment variables and
//! a TOML file (`--config`), in that order of precedence, over defaults that
//! start a single-node cluster serving on loopback.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Parser;
use rdkv_proto::shard::{MAX_MEMBERS, MAX_SHARDS};
use rdkv_proto::wire::{Consistency, DEFAULT_MAX_VALUE_BYTES};
use rdkv_tls::ServerTlsFiles;
use serde::Deserialize;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7379";
pub const DEFAULT_PEER_LISTEN: &str = "127.0.0.1:7380";
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:9379";
pub const DEFAULT_RESP_LISTEN: &str = "127.0.0.1:6380";
pub const DEFAULT_DATA_DIR: &str = "rdkv-data";
/// A grace period below this cannot cover a slow reader (see ARCHITECTURE.md).
pub const MIN_GRACE_PERIOD_MS: u64 = 10;
/// The region's default index: one slot per 128 bytes (`RegionConfig`).
pub const DEFAULT_BYTES_PER_SLOT: u64 = 128;
/// An index denser than one slot per 16 bytes would take half the region.
pub const MIN_BYTES_PER_SLOT: u64 = 16;
/// The largest `--max-value-bytes`: a value is read, framed and copied
/// whole, so a node holds several at once per connection.
pub use rdkv_storage::backup::MAX_MAX_VALUE_BYTES;

#[derive(Debug, Parser)]
#[command(
    name = "rdkv-server",
    version,
    about = "rdkv node: a replicated key-value store"
)]
pub struct Args {
    /// TOML file with any of the settings below (flags and env override it).
    #[arg(long, env = "RDKV_CONFIG")]
    pub config: Option<PathBuf>,
    /// This node's id (unique in the cluster, >= 1). Default 1.
    #[arg(long, env = "RDKV_ID")]
    pub id: Option<u64>,
    /// Where the Raft log, vote and snapshots live. Default ./rdkv-data.
    #[arg(long, env = "RDKV_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Client and admin RPC address. Default 127.0.0.1:7379.
    #[arg(long, env = "RDKV_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Raft peer traffic address. Default 127.0.0.1:7380.
    #[arg(long, env = "RDKV_PEER_LISTEN")]
    pub peer_listen: Option<SocketAddr>,
    /// Health and status HTTP address. Default 127.0.0.1:9379; `off` disables.
    #[arg(long, env = "RDKV_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// RESP (Redis protocol) address. Default 127.0.0.1:6380; `off` disables.
    #[arg(long, env = "RDKV_RESP_LISTEN")]
    pub resp_listen: Option<String>,
    /// Consistency of reads through the RESP port: `linearizable` (default),
    /// `lease`, or `follower:N` (this replica if at most N entries behind).
    #[arg(long, env = "RDKV_RESP_READ_CONSISTENCY")]
    pub resp_read_consistency: Option<String>,
    /// Redis Cluster's rules (MOVED, CROSSSLOT) on RESP connections:
    /// `auto` (default: once a connection asks CLUSTER SLOTS|SHARDS|NODES
    /// or READONLY), `always` (from the start, as a Redis Cluster node:
    /// `redis-cli -c`), `never` (every key forwarded).
    #[arg(long, env = "RDKV_RESP_CLUSTER_MODE")]
    pub resp_cluster_mode: Option<String>,
    /// Unix socket of the `shm` transport (local clients map the region
    /// read-only). Default `<data-dir>/rdkv.sock`; `off` disables.
    #[arg(long, env = "RDKV_SHM_SOCKET")]
    pub shm_socket: Option<String>,
    /// Unix socket serving the native protocol to clients on this host
    /// (their writes and control requests skip TCP). Default
    /// `<data-dir>/rdkv-rpc.sock`; `off` disables.
    #[arg(long, env = "RDKV_RPC_SOCKET")]
    pub rpc_socket: Option<String>,
    /// `1=PEER_ADDR,2=PEER_ADDR,...`: every node started with the same list
    /// forms that cluster. Default: a single-node cluster of this node.
    #[arg(long, env = "RDKV_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Raft groups (shards) the key space is split into at bootstrap
    /// (docs/sharding.md); more than 1 needs --initial-cluster, and every
    /// node gets the same. Fixed for the data directory's life. Default 1.
    /// With --join: taken from the cluster joined, and checked against it
    /// when given.
    #[arg(long, env = "RDKV_SHARDS")]
    pub shards: Option<u32>,
    /// With --shards: how many nodes hold each shard (1 to the node
    /// count). Default: every node of --initial-cluster. Not used with
    /// --join (a joining node is placed no shard).
    #[arg(long, env = "RDKV_REPLICAS")]
    pub replicas: Option<usize>,
    /// Client address of any member: this fresh node asks to be added
    /// (to a single group as a voter; to a multi-shard cluster as a node
    /// hosting no shard until replicas are moved onto it). Keep it on
    /// restarts: a node that joined does not join again.
    #[arg(long, env = "RDKV_JOIN")]
    pub join: Option<String>,
    /// Builds this node's data directory (absent or empty) from the backup
    /// FILE (`rdkvctl snapshot save`) before starting, as `rdkvctl snapshot
    /// restore` does: member --id of a NEW cluster of --initial-cluster's
    /// members, with a new cluster identity. Give every member the same
    /// FILE, --initial-cluster and --cluster-name; restart without it.
    #[arg(long, value_name = "FILE", env = "RDKV_RESTORE")]
    pub restore: Option<PathBuf>,
    /// With --restore: names the new cluster (`rdkvctl snapshot restore
    /// --cluster-name`), the same for every member. Default empty.
    #[arg(long, env = "RDKV_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// Shared secret for clients, admins and peers.
    #[arg(long, env = "RDKV_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Allow binding non-loopback addresses without a token.
    #[arg(long, env = "RDKV_INSECURE")]
    pub insecure: bool,
    /// Accept fault-injection requests (partition, slow fsync) from
    /// authenticated clients. For fault tests only; never in production.
    #[arg(long, env = "RDKV_FAULT_INJECTION", hide = true)]
    pub fault_injection: bool,
    /// Confirm linearizable reads at the leader with a read fence (each
    /// follower's persisted vote, answered on its peer connection); a
    /// ReadIndex round stays the fallback. On by default;
    /// `--read-fence=false` confirms every round by ReadIndex.
    #[arg(
        long,
        env = "RDKV_READ_FENCE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub read_fence: Option<bool>,
    /// Region size in MiB. Default 256.
    #[arg(long, env = "RDKV_REGION_MIB")]
    pub region_mib: Option<u64>,
    /// The cluster's quota: the most keys, values and their per-key
    /// overhead may take (a pair is charged its block's size class plus an
    /// index slot). Writes past it are refused with NoSpace (RESP: OOM);
    /// deletes always pass. The leader's setting is replicated to every
    /// member, so set the same on each. Default: 90% of the region's data
    /// area, leaving room for fragments and blocks in their grace period.
    #[arg(long, env = "RDKV_QUOTA_BYTES")]
    pub quota_bytes: Option<u64>,
    /// Largest value a write may carry, in bytes (1 to 64 MiB). Default
    /// 1 MiB. Larger values (e.g. 4 MiB KV-cache chunks) raise the native
    /// protocol's frame limit with it. Set the same on every member: a
    /// replica with a lower limit cannot apply what its leader admitted.
    #[arg(long, env = "RDKV_MAX_VALUE_BYTES")]
    pub max_value_bytes: Option<u32>,
    /// Index sizing: one index slot per this many bytes of region. Default
    /// 128. Larger means a smaller index and more keys in overflow tables
    /// (tests use it to exercise them).
    #[arg(long, env = "RDKV_BYTES_PER_SLOT")]
    pub bytes_per_slot: Option<u64>,
    /// Threads that run the node's connections, Raft and replication (the
    /// async runtime's workers), 1 to 1024. Default: one per CPU (or
    /// `TOKIO_WORKER_THREADS`). Where several nodes and their clients share
    /// a host's cores, fewer per node keep threads from queuing for the
    /// same core (docs/benchmarks.md, issue 15's eleventh round).
    #[arg(long, env = "RDKV_WORKER_THREADS")]
    pub worker_threads: Option<u32>,
    /// Client connections (TCP and Unix socket together) served at once;
    /// more are refused at the handshake with `Unavailable`. Default 1024.
    #[arg(long, env = "RDKV_MAX_CLIENT_CONNECTIONS")]
    pub max_client_connections: Option<u32>,
    /// MiB of large requests (over 64 KiB each) the node holds at once,
    /// across all connections; beyond it, connections are not read until
    /// some are answered (backpressure). Default 256.
    #[arg(long, env = "RDKV_MAX_IN_FLIGHT_MIB")]
    pub max_in_flight_mib: Option<u32>,
    /// Grace period before a freed block is reused, ms. Default 250.
    #[arg(long, env = "RDKV_GRACE_PERIOD_MS")]
    pub grace_period_ms: Option<u64>,
    /// Raft heartbeat interval, ms. Default 100.
    #[arg(long, env = "RDKV_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Entries between snapshots. Default 100000 (etcd's --snapshot-count):
    /// a snapshot copies every live pair, so with 10000 a small hot data
    /// set was copied (and fsynced) for every few KiB written.
    #[arg(long, env = "RDKV_SNAPSHOT_ENTRIES")]
    pub snapshot_entries: Option<u64>,
    /// How often the leader removes expired keys (its active expire
    /// cycle), ms. Until then an expired key is invisible but holds its
    /// memory and quota. Default 100 (Redis's 10 times a second).
    #[arg(long, env = "RDKV_EXPIRE_CYCLE_MS")]
    pub expire_cycle_ms: Option<u64>,
    /// Log entries kept behind a snapshot (a follower further behind gets
    /// the snapshot). Default 1000.
    #[arg(long, env = "RDKV_SNAPSHOT_KEEP_ENTRIES")]
    pub snapshot_keep_entries: Option<u64>,
    /// Log format: text or json.
    #[arg(long, env = "RDKV_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// RDMA device for one-sided reads (e.g. `mlx5_0`, `rxe0`). Default: the
    /// first device with an active port; `off` disables RDMA. Without the
    /// `rdma` build feature, rdma-core or a device, RDMA is off (logged).
    #[arg(long, env = "RDKV_RDMA_DEVICE")]
    pub rdma_device: Option<String>,
    /// libfabric provider for one-sided reads (`tcp;ofi_rxm`,
    /// `verbs;ofi_rxm`, `efa`, `cxi`, ...). Default: the first that opens
    /// of cxi, efa, verbs;ofi_rxm, tcp;ofi_rxm; `off` disables it. Without
    /// the `ofi` build feature or libfabric.so.1 it is off (logged).
    #[arg(long, env = "RDKV_OFI_PROVIDER")]
    pub ofi_provider: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS settings (docs/security.md). Certificate files are read again on
/// SIGHUP and when they change.
#[derive(Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// Certificate chain (PEM) of the client, RESP and HTTP ports: they
    /// speak TLS only. With --tls-key.
    #[arg(long, env = "RDKV_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "RDKV_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM): clients of those ports must present a certificate
    /// it signed.
    #[arg(long, env = "RDKV_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Certificate chain (PEM) of this node on the peer port, presented to
    /// the peers it accepts and to those it connects to. With
    /// --peer-tls-key and --peer-tls-ca: peers then use mutual TLS.
    #[arg(long, env = "RDKV_PEER_TLS_CERT")]
    pub peer_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --peer-tls-cert.
    #[arg(long, env = "RDKV_PEER_TLS_KEY")]
    pub peer_tls_key: Option<PathBuf>,
    /// CA bundle (PEM) every peer's certificate must chain to.
    #[arg(long, env = "RDKV_PEER_TLS_CA")]
    pub peer_tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// Each setting from the flag (or env), else the file.
    fn or_file(self, file: &mut FileConfig) -> TlsArgs {
        TlsArgs {
            tls_cert: self.tls_cert.or(file.tls_cert.take()),
            tls_key: self.tls_key.or(file.tls_key.take()),
            tls_ca: self.tls_ca.or(file.tls_ca.take()),
            peer_tls_cert: self.peer_tls_cert.or(file.peer_tls_cert.take()),
            peer_tls_key: self.peer_tls_key.or(file.peer_tls_key.take()),
            peer_tls_ca: self.peer_tls_ca.or(file.peer_tls_ca.take()),
        }
    }

    /// The client-facing ports' files: none, or a certificate with its key
    /// (and optionally a client CA).
    fn front(&self) -> Result<Option<ServerTlsFiles>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_ca.clone(),
                flag_prefix: "tls",
            })),
            (None, None) if self.tls_ca.is_some() => {
                bail!("--tls-ca needs --tls-cert and --tls-key")
            }
            (None, None) => Ok(None),
            _ => bail!("--tls-cert and --tls-key go together"),
        }
    }

    /// The peer port's files: all three settings or none (peers always
    /// verify each other).
    fn peer(&self) -> Result<Option<ServerTlsFiles>> {
        match (&self.peer_tls_cert, &self.peer_tls_key, &self.peer_tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(Some(ServerTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: Some(ca.clone()),
                flag_prefix: "peer-tls",
            })),
            (None, None, None) => Ok(None),
            _ => bail!("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together"),
        }
    }
}

/// The TOML file: the same settings, snake_case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    peer_listen: Option<SocketAddr>,
    http_listen: Option<String>,
    resp_listen: Option<String>,
    resp_read_consistency: Option<String>,
    resp_cluster_mode: Option<String>,
    shm_socket: Option<String>,
    rpc_socket: Option<String>,
    initial_cluster: Option<String>,
    shards: Option<u32>,
    replicas: Option<usize>,
    join: Option<String>,
    token: Option<String>,
    insecure: Option<bool>,
    read_fence: Option<bool>,
    region_mib: Option<u64>,
    quota_bytes: Option<u64>,
    max_value_bytes: Option<u32>,
    bytes_per_slot: Option<u64>,
    worker_threads: Option<u32>,
    max_client_connections: Option<u32>,
    max_in_flight_mib: Option<u32>,
    grace_period_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    snapshot_entries: Option<u64>,
    snapshot_keep_entries: Option<u64>,
    expire_cycle_ms: Option<u64>,
    log_format: Option<String>,
    rdma_device: Option<String>,
    ofi_provider: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    peer_tls_cert: Option<PathBuf>,
    peer_tls_key: Option<PathBuf>,
    peer_tls_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The resolved configuration of a node.
#[derive(Debug, Clone)]
pub struct Config {
    pub id: u64,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub peer_listen: SocketAddr,
    pub http_listen: Option<SocketAddr>,
    /// The RESP front end's address; `None`: off.
    pub resp_listen: Option<SocketAddr>,
    pub resp_read_consistency: Consistency,
    pub resp_cluster_mode: RespClusterMode,
    pub shm_socket: Option<PathBuf>,
    pub rpc_socket: Option<PathBuf>,
    /// id -> peer address; empty when joining.
    pub initial_cluster: BTreeMap<u64, String>,
    /// Shards at bootstrap (1: today's single group on every node). A
    /// joining node's is settled at its start (`join::settle_shards`): the
    /// cluster's, which `--shards` must match when given.
    pub shards: u32,
    /// Whether `--shards` (or `RDKV_SHARDS`, `shards` in the file) was given.
    pub shards_given: bool,
    /// Nodes per shard (the member count when `shards` is 1).
    pub replicas: usize,
    pub join: Option<String>,
    /// A backup to build the data directory from before starting.
    pub restore: Option<PathBuf>,
    /// The new cluster's name for `restore`.
    pub cluster_name: String,
    pub token: Option<String>,
    pub region_bytes: u64,
    /// `None`: derived from the region (see `Args::quota_bytes`).
    pub quota_bytes: Option<u64>,
    pub max_value_bytes: u32,
    /// One index slot per this many bytes of region.
    pub bytes_per_slot: u64,
    pub grace_period_ms: u64,
    pub heartbeat_ms: u64,
    pub snapshot_entries: u64,
    pub snapshot_keep_entries: u64,
    pub expire_cycle_ms: u64,
    pub log_format: LogFormat,
    pub fault_injection: bool,
    /// Linearizable reads at the leader try a read fence before a ReadIndex
    /// round (`Args::read_fence`).
    pub read_fence: bool,
    /// `None`: the runtime's default (one per CPU).
    pub worker_threads: Option<usize>,
    pub max_client_connections: u32,
    pub max_in_flight_mib: u32,
    /// `None`: the first device with an active port; `Some("off")`: no RDMA.
    pub rdma_device: Option<String>,
    /// `None`: automatic; `Some("off")`: no libfabric transport.
    pub ofi_provider: Option<String>,
    /// TLS of the client, RESP and HTTP ports; `None`: plain TCP.
    pub tls: Option<ServerTlsFiles>,
    /// Mutual TLS between peers; `None`: plain TCP.
    pub peer_tls: Option<ServerTlsFiles>,
}

/// `ID=HOST:PORT,...` (the parser `rdkvctl snapshot restore` uses too).
pub fn parse_initial_cluster(spec: &str) -> Result<BTreeMap<u64, String>> {
    Ok(rdkv_storage::backup::parse_initial_cluster(spec)?)
}

/// `linearizable`, `lease` or `follower:N`.
pub fn parse_consistency(text: &str) -> Result<Consistency> {
    match text {
        "linearizable" => Ok(Consistency::Linearizable),
        "lease" => Ok(Consistency::Lease),
        other => match other.strip_prefix("follower:").map(str::parse::<u64>) {
            Some(Ok(max_lag_entries)) => Ok(Consistency::Follower { max_lag_entries }),
            _ => bail!("read consistency {other:?} is not linearizable, lease or follower:N"),
        },
    }
}

/// The RESP port's read consistency and cluster mode: the flag, else the
/// file's, else `linearizable` and `auto`.
fn resp_rules(args: &Args, file: &FileConfig) -> Result<(Consistency, RespClusterMode)> {
    let consistency = args.resp_read_consistency.as_deref();
    let consistency = consistency.or(file.resp_read_consistency.as_deref());
    let cluster_mode = args.resp_cluster_mode.as_deref();
    let cluster_mode = cluster_mode.or(file.resp_cluster_mode.as_deref());
    Ok((
        parse_consistency(consistency.unwrap_or("linearizable"))?,
        parse_resp_cluster_mode(cluster_mode.unwrap_or("auto"))?,
    ))
}

/// When a RESP connection follows Redis Cluster's rules (docs/sharding.md,
/// section 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespClusterMode {
    /// Once it asked CLUSTER SLOTS|SHARDS|NODES or READONLY.
    Auto,
    /// From its first command.
    Always,
    /// Never: every key is served here or forwarded.
    Never,
}

/// `auto`, `always` or `never`.
pub fn parse_resp_cluster_mode(text: &str) -> Result<RespClusterMode> {
    match text {
        "auto" => Ok(RespClusterMode::Auto),
        "always" => Ok(RespClusterMode::Always),
        "never" => Ok(RespClusterMode::Never),
        other => bail!("RESP cluster mode {other:?} is not auto, always or never"),
    }
}

fn read_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

fn parse_addr(what: &str, value: &str) -> Result<SocketAddr> {
    value
        .parse()
        .with_context(|| format!("{what} {value:?} is not HOST:PORT"))
}

/// The members of the cluster to initialize: from `--initial-cluster`, none
/// when joining, else this node alone.
fn initial_members(
    spec: Option<String>,
    joining: bool,
    id: u64,
    peer_listen: SocketAddr,
) -> Result<BTreeMap<u64, String>> {
    let members = match (spec, joining) {
        (Some(_), true) => bail!("--initial-cluster and --join are exclusive"),
        (Some(spec), false) => parse_initial_cluster(&spec)?,
        (None, true) => BTreeMap::new(),
        (None, false) => BTreeMap::from([(id, peer_listen.to_string())]),
    };
    if !members.is_empty() && !members.contains_key(&id) {
        bail!("--initial-cluster does not name this node (id {id})");
    }
    Ok(members)
}

/// `--shards` and `--replicas`: one group on every member by default; more
/// groups only at a bootstrap that names its members, each on 1 to all of
/// them. A joining node (no members) takes the cluster's shards (checked
/// against `--shards` at its start) and no part in the placement
/// (`--replicas` is accepted and not used).
fn shard_counts(
    shards: Option<u32>,
    replicas: Option<usize>,
    explicit_members: bool,
    members: usize,
) -> Result<(u32, usize)> {
    let shards = within("shards", shards.unwrap_or(1), 1..=MAX_SHARDS as u32)?;
    if !explicit_members && members == 0 {
        // Joining: `--replicas` was the bootstrap's placement, which the
        // node takes no part in (it hosts no shard until replicas are moved
        // onto it); accepted, so that every node may get the same flags.
        if let Some(replicas) = replicas {
            within("replicas", replicas, 1..=MAX_MEMBERS)?;
        }
        return Ok((shards, 0));
    }
    if shards == 1 {
        if replicas.is_some_and(|r| r != members) {
            bail!("--replicas needs --shards above 1: a single group is on every member");
        }
        return Ok((1, members));
    }
    if !explicit_members {
        bail!("--shards {shards} needs --initial-cluster (every node bootstraps the same shards)");
    }
    let replicas = within("replicas", replicas.unwrap_or(members), 1..=members)?;
    Ok((shards, replicas))
}

/// Without a token, every listener must be on a loopback address.
fn refuse_exposed(mut addrs: impl Iterator<Item = SocketAddr>) -> Result<()> {
    if addrs.any(|addr| !addr.ip().is_loopback()) {
        bail!(
            "refusing to listen on a non-loopback address without --token \
             (or RDKV_TOKEN); pass --insecure to do it anyway"
        );
    }
    Ok(())
}

/// A Unix socket's path: `setting`, or `default` in the data directory when
/// unset; `off`: none.
fn socket_path(data_dir: &Path, setting: Option<String>, default: &str) -> Option<PathBuf> {
    match setting.as_deref() {
        Some("off") => None,
        Some(path) => Some(PathBuf::from(path)),
        None => Some(data_dir.join(default)),
    }
}

/// `setting`, or `default` when unset.
fn address(what: &str, setting: Option<SocketAddr>, default: &str) -> Result<SocketAddr> {
    setting.map_or_else(|| parse_addr(what, default), Ok)
}

/// `setting` (or `default` when unset) as an address; `off`: none.
fn optional_addr(what: &str, setting: Option<String>, default: &str) -> Result<Option<SocketAddr>> {
    match setting.as_deref().unwrap_or(default) {
        "off" => Ok(None),
        addr => parse_addr(what, addr).map(Some),
    }
}

/// `value` of flag `--{flag}`, refused outside `range`.
fn within<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<T> {
    if !range.contains(&value) {
        bail!(
            "--{flag} must be between {} and {}",
            range.start(),
            range.end()
        );
    }
    Ok(value)
}

fn parse_log_format(text: Option<&str>) -> Result<LogFormat> {
    match text.unwrap_or("text") {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => bail!("--log-format {other:?} is not text or json"),
    }
}

/// The node's id: 1 unless given, never 0.
fn node_id(given: Option<u64>) -> Result<u64> {
    match given.unwrap_or(1) {
        0 => bail!("--id must be >= 1"),
        id => Ok(id),
    }
}

/// The numeric settings, each from the flag, else the file, else its
/// default; the sizes, counts and periods with a range are checked against it.
struct NumericSettings {
    region_mib: u64,
    quota_bytes: Option<u64>,
    max_value_bytes: u32,
    bytes_per_slot: u64,
    worker_threads: Option<usize>,
    max_client_connections: u32,
    max_in_flight_mib: u32,
    grace_period_ms: u64,
    heartbeat_ms: u64,
    snapshot_entries: u64,
    snapshot_keep_entries: u64,
    expire_cycle_ms: u64,
}

impl NumericSettings {
    fn resolve(args: &Args, file: &FileConfig) -> Result<NumericSettings> {
        let region_mib = args.region_mib.or(file.region_mib).unwrap_or(256);
        let region_mib = within("region-mib", region_mib, 1..=1024 * 1024)?;
        let quota_bytes = args.quota_bytes.or(file.quota_bytes);
        let quota_bytes = quota_bytes
            .map(|bytes| within("quota-bytes", bytes, 1..=region_mib * 1024 * 1024))
            .transpose()?;
        let max_value_bytes = within(
            "max-value-bytes",
            args.max_value_bytes
                .or(file.max_value_bytes)
                .unwrap_or(DEFAULT_MAX_VALUE_BYTES),
            1..=MAX_MAX_VALUE_BYTES,
        )?;
        let bytes_per_slot = args.bytes_per_slot.or(file.bytes_per_slot);
        let bytes_per_slot = within(
            "bytes-per-slot",
            bytes_per_slot.unwrap_or(DEFAULT_BYTES_PER_SLOT),
            MIN_BYTES_PER_SLOT..=1024 * 1024 * 1024,
        )?;
        let worker_threads = args.worker_threads.or(file.worker_threads);
        let worker_threads = worker_threads
            .map(|n| within("worker-threads", n, 1..=1024).map(|n| n as usize))
            .transpose()?;
        let connections = args.max_client_connections.or(file.max_client_connections);
        let max_client_connections = within(
            "max-client-connections",
            connections.unwrap_or(1024),
            1..=1_000_000,
        )?;
        let in_flight_mib = args.max_in_flight_mib.or(file.max_in_flight_mib);
        let max_in_flight_mib = within(
            "max-in-flight-mib",
            in_flight_mib.unwrap_or(256),
            1..=1024 * 1024,
        )?;
        let grace_period_ms = args.grace_period_ms.or(file.grace_period_ms).unwrap_or(250);
        if grace_period_ms < MIN_GRACE_PERIOD_MS {
            bail!("--grace-period-ms must be at least {MIN_GRACE_PERIOD_MS}");
        }
        let heartbeat_ms = args.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(100);
        let snapshot_entries = args.snapshot_entries.or(file.snapshot_entries);
        let snapshot_keep_entries = args.snapshot_keep_entries.or(file.snapshot_keep_entries);
        let expire_cycle_ms = args.expire_cycle_ms.or(file.expire_cycle_ms).unwrap_or(100);
        Ok(NumericSettings {
            region_mib,
            quota_bytes,
            max_value_bytes,
            bytes_per_slot,
            worker_threads,
            max_client_connections,
            max_in_flight_mib,
            grace_period_ms,
            heartbeat_ms: within("heartbeat-ms", heartbeat_ms, 10..=10_000)?,
            snapshot_entries: snapshot_entries.unwrap_or(100_000).max(1),
            snapshot_keep_entries: snapshot_keep_entries.unwrap_or(1000),
            expire_cycle_ms: within("expire-cycle-ms", expire_cycle_ms, 10..=3_600_000)?,
        })
    }
}

/// The addresses the node listens on, each from the flag, else the file,
/// else its default (`off` turns the HTTP and RESP ports off).
struct Listeners {
    listen: SocketAddr,
    peer_listen: SocketAddr,
    http_listen: Option<SocketAddr>,
    resp_listen: Option<SocketAddr>,
}

impl Listeners {
    fn resolve(args: &mut Args, file: &mut FileConfig) -> Result<Listeners> {
        let listen = address("listen", args.listen.or(file.listen), DEFAULT_LISTEN)?;
        let peer_listen = args.peer_listen.or(file.peer_listen);
        let peer_listen = address("peer-listen", peer_listen, DEFAULT_PEER_LISTEN)?;
        let http_listen = optional_addr(
            "http-listen",
            args.http_listen.take().or(file.http_listen.take()),
            DEFAULT_HTTP_LISTEN,
        )?;
        let resp_listen = optional_addr(
            "resp-listen",
            args.resp_listen.take().or(file.resp_listen.take()),
            DEFAULT_RESP_LISTEN,
        )?;
        Ok(Listeners {
            listen,
            peer_listen,
            http_listen,
            resp_listen,
        })
    }

    fn all(&self) -> impl Iterator<Item = SocketAddr> {
        [
            Some(self.listen),
            Some(self.peer_listen),
            self.http_listen,
            self.resp_listen,
        ]
        .into_iter()
        .flatten()
    }
}

/// How the node enters its cluster: the first members (or a join), and the
/// shards and replicas the cluster is bootstrapped with.
struct Membership {
    initial_cluster: BTreeMap<u64, String>,
    shards: u32,
    shards_given: bool,
    replicas: usize,
    join: Option<String>,
}

impl Membership {
    fn resolve(
        args: &mut Args,
        file: &mut FileConfig,
        id: u64,
        peer_listen: SocketAddr,
    ) -> Result<Membership> {
        let join = args.join.take().or(file.join.take());
        if args.restore.is_some() && join.is_some() {
            bail!("--restore and --join are exclusive: a restored node starts a new cluster");
        }
        let spec = args.initial_cluster.take().or(file.initial_cluster.take());
        let explicit_members = spec.is_some();
        let initial_cluster = initial_members(spec, join.is_some(), id, peer_listen)?;
        let shards_flag = args.shards.or(file.shards);
        let (shards, replicas) = shard_counts(
            shards_flag,
            args.replicas.or(file.replicas),
            explicit_members,
            initial_cluster.len(),
        )?;
        if shards > 1 && args.restore.is_some() {
            bail!("--restore builds a single group: it cannot be combined with --shards");
        }
        Ok(Membership {
            initial_cluster,
            shards,
            shards_given: shards_flag.is_some(),
            replicas,
            join,
        })
    }
}

impl Config {
    pub fn resolve(mut args: Args) -> Result<Config> {
        let mut file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let tls = std::mem::take(&mut args.tls).or_file(&mut file);
        let id = node_id(args.id.or(file.id))?;
        let numbers = NumericSettings::resolve(&args, &file)?;
        let (resp_read_consistency, resp_cluster_mode) = resp_rules(&args, &file)?;
        let listeners = Listeners::resolve(&mut args, &mut file)?;
        let members = Membership::resolve(&mut args, &mut file, id, listeners.peer_listen)?;
        let token = args.token.or(file.token).filter(|t| !t.is_empty());
        let insecure = args.insecure || file.insecure.unwrap_or(false);
        if token.is_none() && !insecure {
            refuse_exposed(listeners.all())?;
        }
        let log_format = parse_log_format(args.log_format.or(file.log_format).as_deref())?;
        let data_dir = args
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let shm_socket = socket_path(&data_dir, args.shm_socket.or(file.shm_socket), "rdkv.sock");
        let rpc_socket = socket_path(
            &data_dir,
            args.rpc_socket.or(file.rpc_socket),
            "rdkv-rpc.sock",
        );
        Ok(Config {
            id,
            data_dir,
            shm_socket,
            rpc_socket,
            listen: listeners.listen,
            peer_listen: listeners.peer_listen,
            http_listen: listeners.http_listen,
            resp_listen: listeners.resp_listen,
            resp_read_consistency,
            resp_cluster_mode,
            initial_cluster: members.initial_cluster,
            shards: members.shards,
            shards_given: members.shards_given,
            replicas: members.replicas,
            join: members.join,
            restore: args.restore,
            cluster_name: args.cluster_name.unwrap_or_default(),
            token,
            region_bytes: numbers.region_mib * 1024 * 1024,
            quota_bytes: numbers.quota_bytes,
            max_value_bytes: numbers.max_value_bytes,
            bytes_per_slot: numbers.bytes_per_slot,
            grace_period_ms: numbers.grace_period_ms,
            heartbeat_ms: numbers.heartbeat_ms,
            snapshot_entries: numbers.snapshot_entries,
            snapshot_keep_entries: numbers.snapshot_keep_entries,
            expire_cycle_ms: numbers.expire_cycle_ms,
            log_format,
            fault_injection: args.fault_injection,
            read_fence: args.read_fence.or(file.read_fence).unwrap_or(true),
            worker_threads: numbers.worker_threads,
            max_client_connections: numbers.max_client_connections,
            max_in_flight_mib: numbers.max_in_flight_mib,
            rdma_device: args
                .rdma_device
                .or(file.rdma_device)
                .filter(|d| !d.is_empty()),
            ofi_provider: args
                .ofi_provider
                .or(file.ofi_provider)
                .filter(|p| !p.is_empty()),
            tls: tls.front()?,
            peer_tls: tls.peer()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["rdkv-server"];
        argv.extend_from_slice(extra);
        Args::parse_from(argv)
    }

    #[test]
    fn defaults_are_a_single_node_on_loopback() {
        let config = Config::resolve(args(&[])).unwrap();
        assert_eq!(config.id, 1);
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.initial_cluster.len(), 1);
        assert_eq!(config.initial_cluster[&1], DEFAULT_PEER_LISTEN);
        assert_eq!(config.data_dir, PathBuf::from("rdkv-data"));
        assert_eq!(config.rdma_device, None);
        let error = Config::resolve(args(&["--id", "0"])).unwrap_err();
        assert!(error.to_string().contains("--id"), "{error}");
        let config = Config::resolve(args(&["--rdma-device", "rxe0"])).unwrap();
        assert_eq!(config.rdma_device.as_deref(), Some("rxe0"));
    }

    #[test]
    fn initial_cluster_is_parsed_and_checked() {
        let c = parse_initial_cluster("1=127.0.0.1:1, 2=127.0.0.2:2,3=127.0.0.3:3").unwrap();
        assert_eq!(c.len(), 3);
        assert!(parse_initial_cluster("1=nope").is_err());
        assert!(parse_initial_cluster("x=127.0.0.1:1").is_err());
        assert!(parse_initial_cluster("1=127.0.0.1:1,1=127.0.0.1:2").is_err());
        assert!(parse_initial_cluster("").is_err());
        assert!(
            Config::resolve(args(&["--id", "4", "--initial-cluster", "1=127.0.0.1:1"])).is_err()
        );
    }

    #[test]
    fn shards_default_to_one_group_and_more_need_the_members() {
        let config = Config::resolve(args(&[])).unwrap();
        assert_eq!((config.shards, config.replicas), (1, 1));
        let three = [
            "--initial-cluster",
            "1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3",
        ];
        let config = Config::resolve(args(&[&three[..], &["--shards", "6"]].concat())).unwrap();
        assert_eq!((config.shards, config.replicas), (6, 3));
        let flags = [&three[..], &["--shards", "6", "--replicas", "2"]].concat();
        let config = Config::resolve(args(&flags)).unwrap();
        assert_eq!((config.shards, config.replicas), (6, 2));
        let refused = |extra: &[&str], says: &str| {
            let error = Config::resolve(args(extra)).unwrap_err().to_string();
            assert!(error.contains(says), "{extra:?}: {error}");
        };
        refused(&["--shards", "2"], "needs --initial-cluster");
        refused(&["--shards", "0"], "--shards must be between 1 and 4096");
        refused(&["--shards", "4097"], "--shards must be between 1 and 4096");
        refused(
            &[&three[..], &["--replicas", "2"]].concat(),
            "--replicas needs --shards",
        );
        for bad in ["0", "4"] {
            let flags = [&three[..], &["--shards", "3", "--replicas", bad]].concat();
            refused(&flags, "--replicas must be between 1 and 3");
        }
        // A joining node takes the cluster's count (checked at its start
        // when given) and no placement.
        let join = ["--join", "127.0.0.1:1"];
        let config = Config::resolve(args(&join)).unwrap();
        assert_eq!((config.shards, config.shards_given), (1, false));
        let config = Config::resolve(args(&[&join[..], &["--shards", "6"]].concat())).unwrap();
        assert_eq!((config.shards, config.shards_given), (6, true));
        // The cluster's flags may be given to every node: --replicas too.
        let flags = [&join[..], &["--shards", "3", "--replicas", "2"]].concat();
        let config = Config::resolve(args(&flags)).unwrap();
        assert_eq!((config.shards, config.replicas), (3, 0));
        refused(
            &[&join[..], &["--replicas", "0"]].concat(),
            "--replicas must be between",
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rdkv.toml");
        std::fs::write(
            &path,
            "initial_cluster = \"1=127.0.0.1:1,2=127.0.0.1:2\"\nshards = 4\nreplicas = 1\n",
        )
        .unwrap();
        let config = Config::resolve(args(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!((config.shards, config.replicas), (4, 1));
    }

    #[test]
    fn non_loopback_needs_a_token_or_insecure() {
        let open = ["--listen", "0.0.0.0:7379"];
        assert!(Config::resolve(args(&open)).is_err());
        assert!(Config::resolve(args(&[&open[..], &["--token", "s3cret"]].concat())).is_ok());
        assert!(Config::resolve(args(&[&open[..], &["--insecure"]].concat())).is_ok());
    }

    #[test]
    fn resp_listen_defaults_and_can_be_turned_off() {
        let config = Config::resolve(args(&[])).unwrap();
        assert_eq!(config.resp_listen.unwrap().to_string(), DEFAULT_RESP_LISTEN);
        assert_eq!(config.resp_read_consistency, Consistency::Linearizable);
        let config = Config::resolve(args(&["--resp-listen", "off"])).unwrap();
        assert!(config.resp_listen.is_none());
        assert!(Config::resolve(args(&["--resp-listen", "0.0.0.0:6380"])).is_err());
        let config = Config::resolve(args(&["--resp-read-consistency", "follower:5"])).unwrap();
        assert_eq!(
            config.resp_read_consistency,
            Consistency::Follower { max_lag_entries: 5 }
        );
        assert!(Config::resolve(args(&["--resp-read-consistency", "eventual"])).is_err());
        let auto = Config::resolve(args(&[])).unwrap();
        assert_eq!(auto.resp_cluster_mode, RespClusterMode::Auto);
        let always = Config::resolve(args(&["--resp-cluster-mode", "always"])).unwrap();
        assert_eq!(always.resp_cluster_mode, RespClusterMode::Always);
        assert!(Config::resolve(args(&["--resp-cluster-mode", "sometimes"])).is_err());
    }

    #[test]
    fn file_settings_apply_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rdkv.toml");
        std::fs::write(
            &path,
            "id = 7\nlisten = \"127.0.0.1:1111\"\ninitial_cluster = \"7=127.0.0.1:2222\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let config = Config::resolve(args(&["--config", p])).unwrap();
        assert_eq!(config.id, 7);
        assert_eq!(config.listen.port(), 1111);
        let config = Config::resolve(args(&["--config", p, "--listen", "127.0.0.1:3333"])).unwrap();
        assert_eq!(config.listen.port(), 3333);
        std::fs::write(&path, "bogus = 1\n").unwrap();
        let error = Config::resolve(args(&["--config", p])).unwrap_err();
        assert!(format!("{error:#}").contains("unknown field"));
    }

    #[test]
    fn the_read_fence_is_on_unless_the_flag_or_the_file_turns_it_off() {
        let fence = |argv: &[&str]| Config::resolve(args(argv)).unwrap().read_fence;
        assert!(fence(&[]));
        assert!(fence(&["--read-fence"]));
        assert!(fence(&["--read-fence=true"]));
        assert!(!fence(&["--read-fence=false"]));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rdkv.toml");
        std::fs::write(&path, "read_fence = false\n").unwrap();
        let p = path.to_str().unwrap();
        assert!(!fence(&["--config", p]));
        // The command line wins over the file.
        assert!(fence(&["--config", p, "--read-fence"]));
        std::fs::write(&path, "read_fence = true\n").unwrap();
        assert!(fence(&["--config", p]));
        assert!(!fence(&["--config", p, "--read-fence=false"]));
    }

    #[test]
    fn tls_settings_go_together_and_come_from_the_file_too() {
        assert!(Config::resolve(args(&[])).unwrap().tls.is_none());
        let cases: [(&[&str], &str); 3] = [
            (
                &["--tls-cert", "c.pem"],
                "--tls-cert and --tls-key go together",
            ),
            (&["--tls-ca", "ca.pem"], "--tls-ca needs --tls-cert"),
            (
                &["--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem"],
                "go together",
            ),
        ];
        for (flags, expected) in cases {
            let error = Config::resolve(args(flags)).unwrap_err().to_string();
            assert!(error.contains(expected), "{flags:?}: {error}");
        }
        let config = Config::resolve(args(&["--tls-cert", "c.pem", "--tls-key", "k.pem"])).unwrap();
        let front = config.tls.unwrap();
        assert_eq!(
            (front.cert, front.client_ca),
            (PathBuf::from("c.pem"), None)
        );
        assert!(config.peer_tls.is_none());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rdkv.toml");
        std::fs::write(
            &path,
            "tls_cert = \"c.pem\"\ntls_key = \"k.pem\"\ntls_ca = \"ca.pem\"\n\
             peer_tls_cert = \"p.pem\"\npeer_tls_key = \"p.key\"\npeer_tls_ca = \"pca.pem\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let config = Config::resolve(args(&["--config", p, "--tls-ca", "flag-ca.pem"])).unwrap();
        assert_eq!(
            config.tls.unwrap().client_ca,
            Some(PathBuf::from("flag-ca.pem"))
        );
        let peer = config.peer_tls.unwrap();
        assert_eq!(peer.client_ca, Some(PathBuf::from("pca.pem")));
        assert_eq!(peer.flag_prefix, "peer-tls");
    }

    #[test]
    fn the_quota_is_optional_and_bounded_by_the_region() {
        assert_eq!(Config::resolve(args(&[])).unwrap().quota_bytes, None);
        let config = Config::resolve(args(&["--region-mib", "8", "--quota-bytes", "1000"]));
        assert_eq!(config.unwrap().quota_bytes, Some(1000));
        for bad in ["0", "8388609"] {
            let config = Config::resolve(args(&["--region-mib", "8", "--quota-bytes", bad]));
            assert!(config.is_err(), "--quota-bytes {bad}");
        }
        for unparsable in ["-1", "lots"] {
            let argv = ["rdkv-server", "--quota-bytes", unparsable];
            assert!(Args::try_parse_from(argv).is_err(), "{unparsable}");
        }
    }

    /// A numeric setting taken from its flag or the file, the flag winning,
    /// and refused outside its range or unparsable.
    struct Bounded {
        flag: &'static str,
        /// Its key in the TOML file.
        key: &'static str,
        value: fn(&Config) -> Option<u64>,
        default: Option<u64>,
        /// Two accepted values: one given as the flag, one in the file.
        accepted: [u64; 2],
        /// Parsed, then refused by the range check (naming the flag).
        out_of_range: &'static [&'static str],
        /// Refused by the parser.
        unparsable: &'static [&'static str],
    }

    const BOUNDED: [Bounded; 3] = [
        Bounded {
            flag: "--bytes-per-slot",
            key: "bytes_per_slot",
            value: |c| Some(c.bytes_per_slot),
            default: Some(128),
            accepted: [65536, 16],
            out_of_range: &["15", "0", "1073741825"],
            unparsable: &["-1", "lots"],
        },
        Bounded {
            flag: "--worker-threads",
            key: "worker_threads",
            value: |c| c.worker_threads.and_then(|n| u64::try_from(n).ok()),
            default: None,
            accepted: [1, 3],
            out_of_range: &["0", "1025"],
            unparsable: &["-1", "two", "4294967296"],
        },
        Bounded {
            flag: "--max-value-bytes",
            key: "max_value_bytes",
            value: |c| Some(u64::from(c.max_value_bytes)),
            default: Some(DEFAULT_MAX_VALUE_BYTES as u64),
            accepted: [4 * 1024 * 1024, 2 * 1024 * 1024],
            out_of_range: &["0", "67108865"],
            unparsable: &["-1", "4MiB", "4294967296"],
        },
    ];

    #[test]
    fn bounded_settings_come_from_the_flag_or_the_file_within_their_range() {
        for setting in &BOUNDED {
            check_bounded(setting);
        }
    }

    fn check_bounded(setting: &Bounded) {
        let Bounded {
            flag, key, value, ..
        } = *setting;
        let [as_flag, in_file] = setting.accepted.map(|v| v.to_string());
        assert_eq!(
            value(&Config::resolve(args(&[])).unwrap()),
            setting.default,
            "{flag}"
        );
        let config = Config::resolve(args(&[flag, &as_flag])).unwrap();
        assert_eq!(value(&config), Some(setting.accepted[0]), "{flag}");
        for bad in setting.out_of_range {
            let error = Config::resolve(args(&[flag, bad])).unwrap_err();
            assert!(error.to_string().contains(flag), "{flag} {bad}: {error}");
        }
        for unparsable in setting.unparsable {
            let argv = ["rdkv-server", flag, unparsable];
            assert!(Args::try_parse_from(argv).is_err(), "{flag} {unparsable}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rdkv.toml");
        std::fs::write(&path, format!("{key} = {in_file}\n")).unwrap();
        let p = path.to_str().unwrap();
        let config = Config::resolve(args(&["--config", p])).unwrap();
        assert_eq!(
            value(&config),
            Some(setting.accepted[1]),
            "{key} in the file"
        );
        let config = Config::resolve(args(&["--config", p, flag, &as_flag])).unwrap();
        assert_eq!(
            value(&config),
            Some(setting.accepted[0]),
            "{flag} over the file"
        );
    }
}
