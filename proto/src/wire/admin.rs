//! Admin and status messages (etcdctl-style operations of `rdkvctl`). Plain
//! data, independent of the Raft library's types, so clients need no Raft
//! dependency. Append-only like every message type (see `message`).

use serde::{Deserialize, Serialize};

use crate::shard::ShardId;

/// A node's Raft role as its own metrics report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

/// One member of the cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberInfo {
    pub id: u64,
    pub peer_addr: String,
    pub client_addr: String,
    /// `false`: a learner (receives the log, does not vote).
    pub voter: bool,
}

/// How full a node's region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionFill {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub pending_reclaim_bytes: u64,
    pub live_keys: u64,
}

/// One follower's replication progress, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationLag {
    pub id: u64,
    /// Highest log index known to be on that follower (`None`: nothing yet).
    pub matched_index: Option<u64>,
    /// Leader's last log index minus `matched_index`.
    pub lag_entries: u64,
}

/// What `endpoint status` shows for one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: u64,
    pub client_addr: String,
    pub peer_addr: String,
    pub role: Role,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub leader_client_addr: Option<String>,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    /// The last log index removed behind a snapshot (0: none): a follower
    /// behind it can catch up only by a snapshot install.
    pub purged_index: u64,
    pub region: RegionFill,
    pub members: Vec<MemberInfo>,
    /// Filled on the leader only.
    pub replication: Vec<ReplicationLag>,
    /// Unix socket path of the `shm` transport, for clients on this host.
    pub shm_socket: Option<String>,
    /// Requests this node has answered over the native protocol, by kind.
    pub served: ServedCounts,
    /// Unix socket serving the native protocol to clients on this host.
    pub rpc_socket: Option<String>,
    /// Epoch of the region this node serves now (new per process start and
    /// per installed snapshot): a client mapping another epoch re-attaches.
    pub region_epoch: u64,
    /// Per request kind (data ops and admin), since the node started.
    pub ops: Vec<OpStats>,
    /// Open client connections now: native TCP, native Unix socket, RESP.
    pub open_connections: OpenConnections,
    /// The RDMA transport: `on: <device, port, GID, MTU>` or `off: <why>`.
    pub rdma: String,
    /// The state digest at the applied index this status was taken at (see
    /// [`StateDigestAt`]).
    pub state_digest: StateDigestAt,
    /// The cluster's quota as this replica applied it, and its charge.
    pub quota: QuotaUse,
    /// Alarms raised on this node (etcd's `alarm list`).
    pub alarms: Vec<Alarm>,
    /// The libfabric transport: `on: <provider (libfabric version)>` or
    /// `off: <why>`.
    pub ofi: String,
    /// The RESP port's `host:port` (`None`: none): how the other nodes
    /// name this one in Redis Cluster's view (`CLUSTER SLOTS`, `MOVED`).
    pub resp_addr: Option<String>,
}

/// The quota and what the live pairs are charged against it (a pair's
/// block size class plus an index slot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUse {
    /// `None` until the leader's `SetQuota` is applied here.
    pub quota_bytes: Option<u64>,
    pub charged_bytes: u64,
}

/// A condition an operator must act on, as etcd's alarms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Alarm {
    /// A write was refused for the quota, and the charge has not yet fallen
    /// back under 90% of it: delete keys or raise `--quota-bytes`.
    NoSpace,
}

impl Alarm {
    /// The name etcd uses for the same alarm.
    pub fn name(self) -> &'static str {
        match self {
            Alarm::NoSpace => "NOSPACE",
        }
    }
}

/// A replica's state digest at one applied index: replicas that applied the
/// same log to that index report the same digest (a wrapping sum over the
/// live pairs of SipHash-1-3 of key and version, with fixed keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDigestAt {
    pub applied_index: u64,
    pub digest: u64,
}

/// One request kind's counters on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStats {
    /// [`Op::name`](super::op::Op::name).
    pub op: String,
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// 99th percentile of the service time over the last 10-20 s (0: no
    /// request in that window).
    pub recent_p99_us: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenConnections {
    pub tcp: u64,
    pub unix: u64,
    pub resp: u64,
}

/// One-sided read counters a client reports for one node's region (deltas
/// since its previous report). Append-only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReport {
    /// Reads answered from the mapped region (hit or miss).
    pub reads: u64,
    pub retries_slot: u64,
    pub retries_block: u64,
    pub retries_invalidated: u64,
    pub retries_moved: u64,
    pub retries_slow: u64,
    /// Reads that gave up validating and went to the server by RPC.
    pub rpc_fallbacks: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Lease reads refused (lease absent or too close to expiry) and served
    /// by RPC; reported to the leader whose lease it was.
    pub lease_refusals: u64,
    /// Follower reads refused because no replica was within the lag bound.
    pub lag_refusals: u64,
}

impl ReadReport {
    pub fn is_empty(&self) -> bool {
        *self == ReadReport::default()
    }
}

/// Requests answered by one node since it started. One-sided reads never
/// reach the server, so they do not appear here: that is the point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedCounts {
    pub get: u64,
    pub mget: u64,
    pub put: u64,
    pub delete: u64,
    pub cas: u64,
    pub mput: u64,
    pub admin: u64,
    /// Client connections accepted over TCP and over the local Unix socket.
    pub tcp_connections: u64,
    pub unix_connections: u64,
    pub scan: u64,
}

/// A node's answer to "are you healthy?": healthy when it knows a leader and
/// has applied everything it knows to be committed (within a bound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub healthy: bool,
    /// Why not, when not healthy; empty otherwise.
    pub reason: String,
}

/// One piece of the node's current snapshot (`rdkvctl snapshot save`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotChunk {
    /// Log index the snapshot covers; a client that sees it change between
    /// chunks must start over.
    pub last_log_index: u64,
    pub total_bytes: u64,
    pub offset: u64,
    pub data: bytes::Bytes,
}

/// A fault a test injects into a node started with `--fault-injection`
/// (refused otherwise). Append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// Drop all Raft traffic between this node and these members, both
    /// directions: outgoing RPCs fail as unreachable, incoming ones are not
    /// answered and their connection is closed. Replaces the previous set.
    Isolate { peers: Vec<u64> },
    /// Undo every fault.
    Heal,
    /// Delay every raft log fsync by this much (0: no delay), as a slow or
    /// overloaded disk would.
    SlowFsync { delay_ms: u64 },
}

/// One shard replica hosted by a node, as its own Raft sees it: a row of
/// `endpoint status`, `/status` and `rdkvctl shard list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStatus {
    pub shard: ShardId,
    pub role: Role,
    pub term: u64,
    pub leader_id: Option<u64>,
    /// The shard's voters and learners as this replica knows them.
    #[serde(deserialize_with = "super::batch::bounded_vec")]
    pub members: Vec<u64>,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub region: RegionFill,
}
