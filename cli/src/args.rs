//! Command-line arguments (clap derive).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use rdkv_client::Consistency;

use crate::output::Format;

/// rdkvctl: manage an rdkv cluster and read or write keys (etcdctl-style).
#[derive(Debug, Parser)]
#[command(name = "rdkvctl", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Comma-separated client addresses (host:port) of cluster members.
    #[arg(
        long,
        global = true,
        env = "RDKV_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7379"
    )]
    pub endpoints: Vec<String>,

    /// Cluster token (required when the servers have one).
    #[arg(long, global = true, env = "RDKV_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Output format.
    #[arg(
        short = 'w',
        long = "write-out",
        global = true,
        value_enum,
        default_value_t = Format::Simple
    )]
    pub write_out: Format,

    /// CA certificates (PEM) the servers' certificates must chain to:
    /// connect over TLS. Needed when the servers have --tls-cert.
    #[arg(long, global = true, env = "RDKVCTL_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// This client's certificate (PEM), for servers with --tls-ca. With --tls-key.
    #[arg(long, global = true, env = "RDKVCTL_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(long, global = true, env = "RDKVCTL_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// The name the servers' certificates must carry. Default: the host of
    /// each endpoint.
    #[arg(long, global = true)]
    pub tls_server_name: Option<String>,

    /// Budget of each request, including retries and redirects (e.g. 5s, 500ms, 1m).
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Writes a key; prints OK.
    Put {
        key: OsString,
        value: OsString,
        /// Expire the key this long after the leader takes the write
        /// (e.g. 30s, 500ms, 1h); without it the key never expires.
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<Duration>,
    },
    /// Prints a key's time to live in milliseconds as Redis's PTTL does:
    /// -1 when it never expires, -2 when it is absent.
    Ttl { key: OsString },
    /// Reads a key; prints its value, or nothing (exit 0) if it is absent.
    Get {
        key: OsString,
        /// linearizable: leader confirms with a quorum; lease: leader lease
        /// (default); follower: any replica within --max-lag entries of the
        /// leader; local: whichever node answers, however far behind. Lease
        /// and follower reads are one-sided (no server CPU) when the servers
        /// run on this host.
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Lease)]
        consistency: ConsistencyArg,
        /// Log entries a follower read may trail the leader by.
        #[arg(long, default_value_t = 100)]
        max_lag: u64,
    },
    /// Lists pairs in key order from START (inclusive): key and value lines.
    Scan {
        start: OsString,
        /// Stop before this key (exclusive); default: the end of the key space.
        #[arg(long)]
        end: Option<OsString>,
        /// At most this many pairs.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// As for `get`; scans are always served by a node (RPC).
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Lease)]
        consistency: ConsistencyArg,
        /// Log entries a follower scan may trail the leader by.
        #[arg(long, default_value_t = 100)]
        max_lag: u64,
    },
    /// Deletes a key; prints the number of keys deleted (1 or 0).
    Del { key: OsString },
    /// Membership: list, add, promote, remove.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Per-endpoint status and health.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Whether every member holds the same state: compares the members'
    /// state digests at the newest applied index they all passed; exits 1
    /// if they differ (or no such index is found).
    Check,
    /// Transfers leadership to member ID.
    MoveLeader { id: u64 },
    /// The shards of a multi-shard cluster: list, move-leader, move-replica.
    #[command(subcommand)]
    Shard(ShardCommand),
    /// The nodes of a multi-shard cluster: remove.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Moves shard replicas so that every node (one hosting none
    /// included) hosts floor or ceil of (replicas / nodes), one move at a
    /// time, then shard leaderships so that no node leads more than
    /// ceil(shards / nodes) where the shards' members allow it; prints the
    /// moves and each node's counts. Running it again moves nothing.
    Rebalance {
        /// Print the plan (replica moves, then leader moves) without moving
        /// anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Snapshots of a node's state.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// A live view of every member (role, term, applied index, lag, ops/s,
    /// p99, error rate, region fill), refreshed until Ctrl-C.
    Top {
        /// Milliseconds between refreshes.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        interval_ms: u64,
        /// Stop after this many refreshes (default: run until Ctrl-C).
        #[arg(long)]
        iterations: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyArg {
    Linearizable,
    Lease,
    Follower,
    Local,
}

impl ConsistencyArg {
    /// The read level; `max_lag_entries` applies to `follower` only.
    pub fn level(self, max_lag_entries: u64) -> Consistency {
        match self {
            Self::Linearizable => Consistency::Linearizable,
            Self::Lease => Consistency::Lease,
            Self::Follower => Consistency::Follower { max_lag_entries },
            Self::Local => Consistency::Follower {
                max_lag_entries: u64::MAX,
            },
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// Lists the members: ID, peer address, client address, is learner.
    List,
    /// Adds a member (a learner first; a voter once caught up unless --learner).
    Add {
        id: u64,
        peer_addr: String,
        /// The new member's client address.
        #[arg(long)]
        client_addr: String,
        /// Keep it a learner (promote later with `member promote`).
        #[arg(long)]
        learner: bool,
    },
    /// Makes a learner a voter.
    Promote { id: u64 },
    /// Removes a member.
    Remove { id: u64 },
}

#[derive(Debug, Subcommand)]
pub enum ShardCommand {
    /// The shard map: shard, slot ranges, members, leader, map version.
    List,
    /// Transfers shard SHARD's leadership to node NODE (one of its members).
    MoveLeader { shard: u32, node: u64 },
    /// Moves shard SHARD's replica from node FROM to node TO (not a member
    /// yet): TO is added as a learner, catches up, is promoted, FROM is
    /// removed and drops its replica.
    MoveReplica { shard: u32, from: u64, to: u64 },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Removes node ID from a multi-shard cluster for good: from the shard
    /// map and the metadata group (a voter is replaced by a learner when
    /// one is caught up). Refused while the map names it a member of any
    /// shard: move those replicas away first (`shard move-replica SHARD ID
    /// TO`). Running it again finishes a removal cut short and changes
    /// nothing after one. Stop the removed node's process afterwards.
    Remove { id: u64 },
}

#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Role, term, leader, commit/applied index, region fill and lag of each endpoint.
    Status {
        /// Query every member's client address (from the member list) instead of
        /// --endpoints.
        #[arg(long)]
        cluster: bool,
    },
    /// Whether each endpoint is healthy; exits 1 if any is not.
    Health {
        /// Query every member's client address (from the member list).
        #[arg(long)]
        cluster: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Saves a snapshot to FILE (written to FILE.part, then renamed).
    Save { file: PathBuf },
    /// Checks FILE end to end (every record's CRC, the end record) and
    /// prints its index, term, keys, bytes, state digest, cluster and format
    /// version; names the first damage and exits 1 if there is any. Reads
    /// the file only: no cluster is contacted.
    Status { file: PathBuf },
    /// Builds a fresh data directory for member --id of a NEW cluster from
    /// FILE: the membership given, a new cluster identity (the old
    /// cluster's members refuse it). Run it for every member, with the same
    /// FILE, --initial-cluster and --cluster-name; then start each
    /// rdkv-server with its --data-dir, --id and that --initial-cluster.
    Restore {
        file: PathBuf,
        /// The member's data directory: absent or empty.
        #[arg(long)]
        data_dir: PathBuf,
        /// The member's id, one of --initial-cluster's.
        #[arg(long)]
        id: u64,
        /// The new cluster's members: ID=PEER_HOST:PORT,... as rdkv-server takes it.
        #[arg(long)]
        initial_cluster: String,
        /// Names the new cluster, so that two clusters restored from one
        /// file with one membership are still told apart (etcd's
        /// --initial-cluster-token). The same for every member.
        #[arg(long, default_value = "")]
        cluster_name: String,
        #[command(flatten)]
        node: NodeSizeArgs,
    },
}

/// The size settings the restored node will run with (rdkv-server's flags
/// of the same names, with its defaults): a backup it could not hold is
/// refused.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct NodeSizeArgs {
    /// The node's region size in MiB. Default 256.
    #[arg(long)]
    pub region_mib: Option<u64>,
    /// The node's quota in bytes. Default 90% of the region's data area.
    #[arg(long)]
    pub quota_bytes: Option<u64>,
    /// The node's index sizing: one slot per this many bytes. Default 128.
    #[arg(long)]
    pub bytes_per_slot: Option<u64>,
    /// The node's largest value in bytes. Default 1 MiB.
    #[arg(long)]
    pub max_value_bytes: Option<u32>,
}

/// Units a duration may carry, longest suffix first (`ms` before `s`).
const DURATION_UNITS: [(&str, f64); 5] = [
    ("ms", 0.001),
    ("s", 1.0),
    ("m", 60.0),
    ("h", 3_600.0),
    ("d", 86_400.0),
];

/// Parses `500ms`, `5s`, `1.5s`, `2m`, `1h`, `7d` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit_secs) = DURATION_UNITS
        .iter()
        .find_map(|(suffix, secs)| text.strip_suffix(suffix).map(|n| (n, *secs)))
        .unwrap_or((text, 1.0));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {text:?} (try 5s, 500ms, 1m or 1h)"))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(format!("duration {text:?} must be positive"));
    }
    Duration::try_from_secs_f64(value * unit_secs).map_err(|e| format!("duration {text:?}: {e}"))
}

/// The bytes of a command-line argument (not necessarily UTF-8 on Unix).
pub fn arg_bytes(arg: OsString) -> Vec<u8> {
    #[cfg(unix)]
    {
        std::os::unix::ffi::OsStringExt::into_vec(arg)
    }
    #[cfg(not(unix))]
    {
        arg.to_string_lossy().into_owned().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = Cli::try_parse_from([
            "rdkvctl",
            "get",
            "k",
            "--endpoints",
            "a:1,b:2",
            "-w",
            "json",
            "--consistency",
            "local",
        ])
        .unwrap();
        assert_eq!(cli.global.endpoints, ["a:1", "b:2"]);
        assert_eq!(cli.global.write_out, Format::Json);
        assert!(matches!(
            cli.command,
            Command::Get {
                consistency: ConsistencyArg::Local,
                ..
            }
        ));
        let cli = Cli::try_parse_from([
            "rdkvctl",
            "member",
            "add",
            "4",
            "h:7380",
            "--client-addr",
            "h:7379",
            "--learner",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Member(MemberCommand::Add {
                id: 4,
                learner: true,
                ..
            })
        ));
    }
}
