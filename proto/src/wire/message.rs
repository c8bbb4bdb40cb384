//! Request and response messages carried in `Request`/`Response` frames.
//!
//! Postcard encodes an enum variant as its index, so every enum here is
//! **append-only**: never reorder, remove or insert variants, or old and new peers
//! will silently disagree on what a message means. Struct fields are positional for
//! the same reason; changing them needs a new protocol version.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::admin::{
    Fault, Health, MemberInfo, NodeStatus, ReadReport, ShardStatus, SnapshotChunk, StateDigestAt,
};
use super::batch::bounded_vec;
use super::handshake::{SHARDED_PROTOCOL_VERSION, SHARDS_PROTOCOL_VERSION};
use super::ofi::OfiRegionGrant;
use super::rdma::{QpEndpoint, RdmaRegionGrant};
use super::sharded::ShardRequest;
use crate::region::{DeadlineUnixMs, NO_DEADLINE};
use crate::shard::{ShardId, ShardMap, Slot};

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Consistency {
    /// The leader confirms its leadership with a quorum (ReadIndex) before reading.
    Linearizable,
    /// The leader serves the read while its lease is valid; linearizable unless
    /// clocks drift by more than the lease margin.
    #[default]
    Lease,
    /// Any replica whose applied index trails the leader's commit index by at most
    /// `max_lag_entries` may answer; otherwise it replies `StaleFollower`.
    Follower { max_lag_entries: u64 },
}

/// A value with the Raft log index of the write that produced it, usable as the
/// `expected_version` of a later [`Request::Cas`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Versioned {
    pub value: Bytes,
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Answered with [`Response::Value`].
    Get {
        key: Bytes,
        consistency: Consistency,
    },
    /// Answered with [`Response::Written`].
    Put { key: Bytes, value: Bytes },
    /// Answered with [`Response::Deleted`].
    Delete { key: Bytes },
    /// Compare-and-set on the key's version, answered with [`Response::CasDone`].
    Cas {
        key: Bytes,
        /// `None`: the key must be absent (create-if-absent).
        expected_version: Option<u64>,
        /// `None`: delete the key.
        new_value: Option<Bytes>,
    },
    /// Answered with [`Response::Values`], one entry per key in request order.
    MGet {
        #[serde(deserialize_with = "bounded_vec")]
        keys: Vec<Bytes>,
        consistency: Consistency,
    },
    /// Applied atomically as one log entry; answered with [`Response::MWritten`].
    MPut {
        #[serde(deserialize_with = "bounded_vec")]
        pairs: Vec<(Bytes, Bytes)>,
    },
    /// Answered with [`Response::Pong`]; for liveness checks and latency probes.
    Ping,
    /// Answered with [`Response::Status`] by any node (no leader needed).
    Status,
    /// Answered with [`Response::Health`] by any node.
    Health,
    /// Answered with [`Response::Members`] (the configuration this node knows).
    Members,
    /// Adds a node (as learner when `learner`, else learner then voter once it
    /// has caught up). Leader only; answered with [`Response::Members`].
    AddMember {
        id: u64,
        peer_addr: String,
        client_addr: String,
        learner: bool,
    },
    /// Makes a learner a voter. Leader only; answered with [`Response::Members`].
    PromoteMember { id: u64 },
    /// Removes a node from the configuration. Leader only; answered with
    /// [`Response::Members`].
    RemoveMember { id: u64 },
    /// Transfers leadership to `to`. Leader only; answered with [`Response::Done`]
    /// once `to` leads.
    MoveLeader { to: u64 },
    /// Reads `max_bytes` of the node's current snapshot from `offset` (a
    /// snapshot is built if the node has none); answered with
    /// [`Response::Snapshot`].
    SnapshotRead { offset: u64, max_bytes: u32 },
    /// A read-modify-write of one key applied atomically by the state machine
    /// (INCR, APPEND, SET NX/XX/GET of the RESP front end); answered with
    /// [`Response::Updated`].
    Update { key: Bytes, update: Update },
    /// Deletes every key (FLUSHDB), as one log entry; answered with
    /// [`Response::Cleared`]. Needs the cluster token when the servers have one.
    Clear,
    /// Reads up to `limit` live pairs in key order (bytewise), from
    /// `start_key` (inclusive) to `end_key` (exclusive; `None`: to the end).
    /// Answered with [`Response::Pairs`]; one reply is one consistent view at
    /// the node's applied index.
    Scan {
        start_key: Bytes,
        end_key: Option<Bytes>,
        limit: u32,
        consistency: Consistency,
    },
    /// A client's one-sided read counters for this node's region since its
    /// last report (the server never sees those reads otherwise); answered
    /// with [`Response::Done`].
    ReportReads(ReadReport),
    /// Test-only fault injection (nodes started with `--fault-injection`);
    /// answered with [`Response::Done`].
    InjectFault(Fault),
    /// Opens the `rdma` transport on this (authenticated) connection: the
    /// client's queue-pair endpoint; answered with [`Response::RdmaConnected`]
    /// (the server's endpoint and region grant), or an error reply
    /// (`InvalidRequest`) when RDMA is off on the node.
    RdmaConnect { endpoint: QpEndpoint },
    /// The current region's grant (after an epoch change), answered with
    /// [`Response::RdmaRegion`].
    RdmaRegion,
    /// The node's state digests at its last applied indexes, answered with
    /// [`Response::Digests`] by any node: `rdkvctl check` compares members
    /// at an index they all passed.
    Digests,
    /// Redis's MULTI/EXEC: `ops` applied in order as one log entry, nothing
    /// of another entry between them, if every `watch`ed key still has the
    /// version given (`None`: absent); answered with
    /// [`Response::Transaction`]. An op that fails (a quota refusal, a
    /// non-integer INCR) gets its error and the others still apply, as in
    /// Redis: there is no rollback.
    Transaction {
        #[serde(deserialize_with = "bounded_vec")]
        watch: Vec<(Bytes, Option<u64>)>,
        #[serde(deserialize_with = "bounded_vec")]
        ops: Vec<TxnOp>,
    },
    /// The key's deadline (TTL, PTTL, EXPIRETIME); answered with
    /// [`Response::Expiry`].
    Ttl {
        key: Bytes,
        consistency: Consistency,
    },
    /// The current region's `ofi` (libfabric) grant, answered with
    /// [`Response::OfiRegion`], or an error reply (`InvalidRequest`) when
    /// the transport is off on the node.
    OfiRegion,
    /// The shard map this node knows (`docs/sharding.md`), answered with
    /// [`Response::ShardMap`] by any node; a single-group node answers
    /// [`ShardMap::single_group`] of its members. A node older than this
    /// request answers `Malformed`: it serves a single group.
    ShardMap,
    /// A keyless request (scan, clear) of one shard (docs/sharding.md,
    /// section 4), sent only on connections of version
    /// [`SHARDED_PROTOCOL_VERSION`] or later ([`Request::min_version`]). A
    /// node that does not host `shard` answers [`Response::WrongShard`]
    /// (its `slot`: the shard's first one in the node's map).
    Sharded {
        shard: ShardId,
        request: ShardRequest,
    },
    /// Every shard replica the node hosts (a single-group node: shard 0),
    /// answered with [`Response::ShardStatus`] by any node. Protocol
    /// version 2 ([`Request::min_version`]); an older node answers
    /// `Malformed`.
    ShardStatus,
    /// Transfers the leadership of `shard` to node `to`. Sent to that
    /// shard's leader; answered with [`Response::Done`] once `to` leads.
    /// Protocol version 2.
    ShardMoveLeader { shard: ShardId, to: u64 },
    /// Node to node: publish `map` as the next shard map of a multi-shard
    /// cluster (docs/sharding.md, section 2). Sent to the metadata group's
    /// leader, which proposes it only if its version is exactly one above
    /// the map it applied; answered with [`Response::ShardMap`] (the map
    /// applied), `NotLeader` elsewhere, `InvalidRequest` for a stale version
    /// or on a single-group node. Protocol version 3.
    PublishShardMap { map: ShardMap },
    /// A new node joins a multi-shard cluster (`rdkv-server --join`,
    /// docs/sharding.md, section 8): the metadata group's leader adds node
    /// `id` (its Raft traffic at `peer_addr`) as a learner of the group,
    /// waits until it caught up with the group's log, and lists it with
    /// `client_addr` and `resp_addr` in the next map version. Answered with
    /// [`Response::ShardMap`] (a map listing the node); `NotLeader` naming
    /// the group's leader elsewhere; `InvalidRequest` on a single-group
    /// node and for an id the cluster already has under another peer
    /// address (or names without having it in the group). Repeating it is
    /// harmless. Protocol version 3; an older node answers `Malformed`.
    AddNode {
        id: u64,
        peer_addr: String,
        client_addr: String,
        resp_addr: Option<String>,
    },
    /// Node `id` leaves a multi-shard cluster for good (`rdkvctl node
    /// remove`, docs/sharding.md, section 8, "Removing a node"): the
    /// metadata group's leader removes it from the map (a new version) and
    /// from the group (a voter demoted first). Answered with
    /// [`Response::ShardMap`] (the map without it; the same for a node
    /// the cluster does not have, so a repeat finishes a removal cut
    /// short); `NotLeader` naming the group's leader elsewhere (the leader
    /// itself hands its leadership on first); `InvalidRequest` while the
    /// map names the node a member of any shard (the message names them)
    /// and on a single-group node. Protocol version 3; an older node
    /// answers `Malformed`.
    RemoveNode { id: u64 },
}

/// One command of a [`Request::Transaction`]. Append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    Get {
        key: Bytes,
    },
    Put {
        key: Bytes,
        value: Bytes,
    },
    Delete {
        key: Bytes,
    },
    Update {
        key: Bytes,
        update: Update,
    },
    /// The key's deadline (TTL, PTTL, EXPIRETIME inside MULTI), read on the
    /// apply clock.
    Ttl {
        key: Bytes,
    },
}

/// What one [`TxnOp`] gave; its version is the transaction's. Append-only,
/// and not a [`Response`]: a response nested in a response would let a
/// frame nest without bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnResult {
    /// `Get`: the value (`None`: absent).
    Value(Option<Versioned>),
    /// `Put`.
    Written,
    /// `Delete`: whether the key existed.
    Deleted { existed: bool },
    /// `Update`.
    Updated(UpdateOutcome),
    /// The op was refused (quota, limits); the other ops still applied.
    Error(ErrorReply),
    /// `Ttl`: the key's deadline (`None`: absent); its `now_unix_ms` is the
    /// apply clock, the time the transaction's writes count from.
    Expiry(Option<KeyExpiry>),
}

/// What a [`Request::Update`] does to its key. Append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Update {
    /// Adds `delta` to the key's value read as a decimal `i64` (an absent key
    /// counts as 0) and stores the result in decimal.
    Incr { delta: i64 },
    /// Appends `suffix` to the key's value (an absent key counts as empty).
    Append { suffix: Bytes },
    /// Writes `value` if `condition` holds; with `return_old` the outcome
    /// carries the previous value.
    SetIf {
        value: Bytes,
        condition: SetCondition,
        return_old: bool,
    },
    /// Writes `source`'s value to the key (RENAME, RENAMENX, COPY): only if
    /// `source` exists, and unless `replace` only if the key is absent;
    /// `remove_source` then deletes `source` in the same entry.
    CopyFrom {
        source: Bytes,
        replace: bool,
        remove_source: bool,
    },
    /// SET with its expiry: [`Update::SetIf`], and the written pair's
    /// deadline (`Expiry::Keep`: the one the key had, if it had one).
    Set {
        value: Bytes,
        condition: SetCondition,
        return_old: bool,
        expiry: Expiry,
    },
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (with `condition`) and PERSIST
    /// (`Expiry::Never`): changes an existing key's deadline; a deadline
    /// already past deletes the key. Answered with `ExpiryChanged`.
    Expire {
        expiry: Expiry,
        condition: ExpireCondition,
    },
    /// GETEX with an option: the value, and the key's deadline changed.
    /// Answered with `Got`.
    GetEx { expiry: Expiry },
    /// GETDEL: the value, and the key deleted. Answered with `Got`.
    GetDel,
}

/// When a written pair expires. Append-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Expiry {
    /// Never: the pair's deadline is cleared (a plain SET, PERSIST).
    Never,
    /// The key keeps the deadline it has (SET KEEPTTL).
    Keep,
    /// `ms` milliseconds after the time the leader stamped on the log entry
    /// (EX, PX, SETEX, EXPIRE): every replica computes the same deadline.
    AfterMs(u64),
    /// At this wall-clock time in unix milliseconds (EXAT, PXAT, EXPIREAT);
    /// a time already past removes the key.
    AtUnixMs(u64),
}

/// When an [`Update::Expire`] changes a key's deadline (Redis 7's EXPIRE
/// options; "no deadline" counts as an infinite one). Append-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ExpireCondition {
    Always,
    /// NX: only if the key has no deadline.
    IfNone,
    /// XX: only if the key has one.
    IfSome,
    /// GT: only if the new deadline is later.
    IfLater,
    /// LT: only if the new deadline is earlier.
    IfEarlier,
    /// XX and LT: only if the key has a deadline and the new one is
    /// earlier (LT alone also sets a deadline on a key without one).
    IfSomeEarlier,
}

/// A key's deadline as [`Request::Ttl`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyExpiry {
    /// The version of the pair the deadline belongs to.
    pub version: u64,
    /// Unix milliseconds; `None`: the key never expires.
    pub deadline_unix_ms: Option<u64>,
    /// The answering node's wall clock when it read the deadline, so that
    /// a client can tell the time left without trusting its own clock.
    pub now_unix_ms: u64,
}

impl KeyExpiry {
    /// Milliseconds left on the answering node's clock (0 once past);
    /// `None`: the key never expires.
    pub fn remaining_ms(&self) -> Option<u64> {
        self.deadline_unix_ms
            .map(|deadline| deadline.saturating_sub(self.now_unix_ms))
    }

    /// The expiry of a pair of `version` whose block holds `deadline`
    /// ([`NO_DEADLINE`]: none), read when the clock said `now_unix_ms`.
    pub fn of_block(version: u64, deadline: DeadlineUnixMs, now_unix_ms: u64) -> KeyExpiry {
        KeyExpiry {
            version,
            deadline_unix_ms: (deadline != NO_DEADLINE).then_some(deadline),
            now_unix_ms,
        }
    }
}

/// When a [`Update::SetIf`] writes. Append-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SetCondition {
    Always,
    /// Only if the key is absent (Redis NX).
    IfAbsent,
    /// Only if the key exists (Redis XX).
    IfPresent,
}

/// The outcome of a [`Request::Update`]; `version` is the log index of the
/// entry that applied it (also when nothing was written). Append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateOutcome {
    /// `Incr`: the new value.
    Integer { value: i64, version: u64 },
    /// `Append`: the value's new length.
    Length { len: u64, version: u64 },
    /// `SetIf`: whether it wrote, and (with `return_old`) the previous value.
    Set {
        written: bool,
        old: Option<Bytes>,
        version: u64,
    },
    /// `Incr` on a value that is not a decimal `i64`, or an overflow; nothing
    /// was written.
    NotAnInteger { version: u64 },
    /// `Append` would make the value larger than the value limit; nothing
    /// was written.
    TooLarge { len: u64, version: u64 },
    /// `CopyFrom`: whether it wrote; `source_missing` when it did not
    /// because the source key is absent.
    Copied {
        copied: bool,
        source_missing: bool,
        version: u64,
    },
    /// `Expire`: whether the deadline changed (false when the key is
    /// absent, PERSIST found no deadline, or the condition did not hold).
    ExpiryChanged { changed: bool, version: u64 },
    /// `GetEx`, `GetDel`: the value the key had (`None`: absent).
    Got { value: Option<Bytes>, version: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// `None`: the key is absent.
    Value(Option<Versioned>),
    /// `version` is the log index of the write.
    Written {
        version: u64,
    },
    /// `version` is the log index of the delete, even when the key did not exist.
    Deleted {
        existed: bool,
        version: u64,
    },
    /// Outcome of a [`Request::Cas`], shaped like an etcd transaction:
    ///
    /// - `succeeded: true`: `version` is the log index of the write (or delete);
    ///   `current` is `None` because the client already knows what it wrote.
    /// - `succeeded: false`: nothing was written; `version` is the applied index the
    ///   comparison was evaluated at, and `current` is what the key holds there
    ///   (`None` = absent), so a retry loop needs no extra Get.
    CasDone {
        succeeded: bool,
        version: u64,
        current: Option<Versioned>,
    },
    /// One entry per requested key, in request order.
    Values(#[serde(deserialize_with = "bounded_vec")] Vec<Option<Versioned>>),
    /// `version` is the log index of the single entry that applied the whole batch.
    MWritten {
        version: u64,
    },
    Pong,
    Error(ErrorReply),
    Status(Box<NodeStatus>),
    Health(Health),
    Members(Vec<MemberInfo>),
    Done,
    Snapshot(SnapshotChunk),
    Updated(UpdateOutcome),
    /// `removed` keys were deleted by the entry at `version`.
    Cleared {
        removed: u64,
        version: u64,
    },
    /// The answer to [`Request::Scan`]: pairs in key order. `more` is set when
    /// the reply stopped early, before `limit` and before `end_key`, because the
    /// next pair would not fit the frame; continue after the last key returned.
    Pairs {
        #[serde(deserialize_with = "bounded_vec")]
        pairs: Vec<(Bytes, Versioned)>,
        more: bool,
    },
    /// The server's queue pair is in RTS, connected to the client's endpoint.
    RdmaConnected {
        endpoint: QpEndpoint,
        region: RdmaRegionGrant,
    },
    RdmaRegion(RdmaRegionGrant),
    /// The answer to [`Request::Digests`]: oldest first.
    Digests(#[serde(deserialize_with = "bounded_vec")] Vec<StateDigestAt>),
    /// The answer to [`Request::Transaction`], applied by the entry at
    /// `version`: `aborted` when a watched key had changed (nothing was
    /// applied, `results` is empty), else one result per op in order.
    Transaction {
        aborted: bool,
        #[serde(deserialize_with = "bounded_vec")]
        results: Vec<TxnResult>,
        version: u64,
    },
    /// The answer to [`Request::Ttl`] (`None`: the key is absent).
    Expiry(Option<KeyExpiry>),
    /// The answer to [`Request::OfiRegion`].
    OfiRegion(OfiRegionGrant),
    /// The answer to [`Request::ShardMap`] (boxed: a map is larger than
    /// every other answer).
    ShardMap(Box<ShardMap>),
    /// A keyed request reached a node that does not serve its key's shard:
    /// the client's map is older than the node's. Nothing was proposed, so
    /// the request may be sent again (a write too) once the client's map
    /// is at least `map_version`. Only sent on connections that can
    /// understand it (docs/sharding.md, section 5); no node sends it yet.
    WrongShard(WrongShard),
    /// The answer to [`Request::ShardStatus`], in shard order.
    ShardStatus(#[serde(deserialize_with = "bounded_vec")] Vec<ShardStatus>),
}

/// The detail of a [`Response::WrongShard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WrongShard {
    /// The version of the answering node's map: refresh to at least this.
    pub map_version: u64,
    /// The slot of the request's key(s).
    pub slot: Slot,
    /// The shard serving `slot` in the answering node's map.
    pub shard: ShardId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub code: ErrorCode,
    /// Human-readable detail; clients should branch on `code`, never on this text.
    pub message: String,
    /// Set with `NotLeader` (and `Unavailable` when a leader is known) so the client
    /// can redirect without a discovery round trip.
    pub leader_hint: Option<LeaderHint>,
}

impl UpdateOutcome {
    /// The log index of the entry that applied the update.
    pub fn version(&self) -> u64 {
        match self {
            UpdateOutcome::Integer { version, .. }
            | UpdateOutcome::Length { version, .. }
            | UpdateOutcome::Set { version, .. }
            | UpdateOutcome::NotAnInteger { version }
            | UpdateOutcome::TooLarge { version, .. }
            | UpdateOutcome::Copied { version, .. }
            | UpdateOutcome::ExpiryChanged { version, .. }
            | UpdateOutcome::Got { version, .. } => *version,
        }
    }
}

impl Request {
    /// The lowest protocol version whose servers decode this request; a
    /// server refuses it on a connection of a lower version (a client of
    /// that version cannot have meant it). The shard admin requests came
    /// with version 2, `Sharded` with version 3.
    pub fn min_version(&self) -> u16 {
        match self {
            Request::ShardStatus | Request::ShardMoveLeader { .. } => SHARDS_PROTOCOL_VERSION,
            Request::Sharded { .. }
            | Request::PublishShardMap { .. }
            | Request::AddNode { .. }
            | Request::RemoveNode { .. } => SHARDED_PROTOCOL_VERSION,
            _ => 1,
        }
    }
}

impl Response {
    /// The lowest protocol version whose clients can decode this response;
    /// a server answers a connection of a lower version with an error
    /// instead (docs/sharding.md, section 5).
    pub fn min_version(&self) -> u16 {
        match self {
            Response::ShardMap(_) | Response::WrongShard(_) | Response::ShardStatus(_) => {
                SHARDS_PROTOCOL_VERSION
            }
            _ => 1,
        }
    }

    /// The highest log index this response shows the answering replica had
    /// applied: a write's own index, the version of a value read. A client
    /// that must never read an older state than it has seen keeps the
    /// largest of these (`None`: the response shows no index).
    pub fn applied_at_least(&self) -> Option<u64> {
        match self {
            Response::Value(value) => value.as_ref().map(|v| v.version),
            Response::Values(values) => values.iter().flatten().map(|v| v.version).max(),
            Response::Pairs { pairs, .. } => pairs.iter().map(|(_, v)| v.version).max(),
            Response::Written { version }
            | Response::Deleted { version, .. }
            | Response::CasDone { version, .. }
            | Response::MWritten { version }
            | Response::Cleared { version, .. }
            | Response::Transaction { version, .. } => Some(*version),
            Response::Updated(outcome) => Some(outcome.version()),
            Response::Expiry(expiry) => expiry.map(|e| e.version),
            _ => None,
        }
    }
}

impl ErrorReply {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            leader_hint: None,
        }
    }

    /// `hint` is `None` while an election is in progress.
    pub fn not_leader(hint: Option<LeaderHint>) -> Self {
        let message = match &hint {
            Some(h) => format!(
                "not the leader; try node {} at {}",
                h.node_id, h.client_addr
            ),
            None => "not the leader; leader unknown".to_owned(),
        };
        Self {
            code: ErrorCode::NotLeader,
            message,
            leader_hint: hint,
        }
    }

    pub fn with_leader_hint(mut self, hint: LeaderHint) -> Self {
        self.leader_hint = Some(hint);
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaderHint {
    pub node_id: u64,
    /// The leader's client-facing `host:port`, not its Raft peer address.
    pub client_addr: String,
}

/// Machine-readable error class. On the wire it is its number (a varint, the
/// same bytes postcard gives an enum variant); numbers are never reused, new
/// codes get new numbers, and a number this build does not know decodes as
/// [`ErrorCode::Unknown`] instead of failing the whole response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "u32", from = "u32")]
pub enum ErrorCode {
    /// This node is not the leader; see `leader_hint`. Safe to retry there.
    NotLeader,
    KeyTooLarge,
    ValueTooLarge,
    BatchTooLarge,
    EmptyBatch,
    /// A request or its response would exceed the frame limit (e.g. a large MGet).
    FrameTooLarge,
    /// The write would take the cluster past its replicated quota (or, on a
    /// leader, past what its region can hold). Deletes are always admitted,
    /// so deleting makes room. (Wire number 6, formerly `RegionFull`.)
    NoSpace,
    Unauthenticated,
    /// No quorum or the node is shutting down. Retryable.
    Unavailable,
    /// The outcome is unknown: a write may or may not have been applied.
    Timeout,
    /// A follower read could not meet `max_lag_entries`. Retry elsewhere.
    StaleFollower,
    /// The request could not be decoded.
    Malformed,
    /// Backpressure: more requests in flight than the handshake allowed.
    TooManyInFlight,
    UnsupportedVersion,
    Internal,
    /// A code added by a newer peer; treat it like `Internal`.
    Unknown,
    /// An admin request named something that does not exist (e.g. a member id).
    NotFound,
    /// An admin request that cannot be done in the cluster's current state.
    InvalidRequest,
}

impl ErrorCode {
    /// Every code, indexed by its wire number: one table so that the numbers
    /// cannot drift apart, and so that tests can cover every code.
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::NotLeader,
        ErrorCode::KeyTooLarge,
        ErrorCode::ValueTooLarge,
        ErrorCode::BatchTooLarge,
        ErrorCode::EmptyBatch,
        ErrorCode::FrameTooLarge,
        ErrorCode::NoSpace,
        ErrorCode::Unauthenticated,
        ErrorCode::Unavailable,
        ErrorCode::Timeout,
        ErrorCode::StaleFollower,
        ErrorCode::Malformed,
        ErrorCode::TooManyInFlight,
        ErrorCode::UnsupportedVersion,
        ErrorCode::Internal,
        ErrorCode::Unknown,
        ErrorCode::NotFound,
        ErrorCode::InvalidRequest,
    ];
}

impl From<ErrorCode> for u32 {
    fn from(code: ErrorCode) -> u32 {
        ErrorCode::ALL
            .iter()
            .position(|&c| c == code)
            .map_or(15, |i| i as u32)
    }
}

impl From<u32> for ErrorCode {
    fn from(number: u32) -> ErrorCode {
        usize::try_from(number)
            .ok()
            .and_then(|i| ErrorCode::ALL.get(i).copied())
            .unwrap_or(ErrorCode::Unknown)
    }
}

impl ErrorCode {
    /// The code as a metrics label: lower snake case.
    pub fn name(self) -> &'static str {
        match self {
            Self::NotLeader => "not_leader",
            Self::KeyTooLarge => "key_too_large",
            Self::ValueTooLarge => "value_too_large",
            Self::BatchTooLarge => "batch_too_large",
            Self::EmptyBatch => "empty_batch",
            Self::FrameTooLarge => "frame_too_large",
            Self::NoSpace => "no_space",
            Self::Unauthenticated => "unauthenticated",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::StaleFollower => "stale_follower",
            Self::Malformed => "malformed",
            Self::TooManyInFlight => "too_many_in_flight",
            Self::UnsupportedVersion => "unsupported_version",
            Self::Internal => "internal",
            Self::Unknown => "unknown",
            Self::NotFound => "not_found",
            Self::InvalidRequest => "invalid_request",
        }
    }

    /// Whether repeating the same request (possibly at another node) may succeed.
    /// `Timeout` is excluded: the write may have happened, so only the caller knows
    /// whether a retry is safe.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::NotLeader | Self::Unavailable | Self::StaleFollower | Self::TooManyInFlight
        )
    }
}
