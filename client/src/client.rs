//! The client: connection pool, leader tracking, retries and the typed API.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rdkv_proto::wire::{
    ClientHello, Consistency, DEFAULT_MAX_BATCH_KEYS, ErrorCode, Fault, Health, MemberInfo,
    NodeStatus, Request, Response, SnapshotChunk, Update, UpdateOutcome, Versioned,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, sleep_until};

use crate::error::{Error, Result};
use crate::one_sided::{OneSided, OneSidedStats};
use crate::options::ClientOptions;
use rdkv_fabric::rpc::{CallError, Connection, RpcChannel};

const BACKOFF_START: Duration = Duration::from_millis(50);
/// An election takes a few hundred milliseconds (5 to 10 heartbeats): a client
/// backing off longer than that waits for nothing after a failover.
const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// How long a node that did not answer is tried only after the others.
const SUSPECT_FOR: Duration = Duration::from_secs(5);
/// Largest snapshot chunk asked for (further bounded by the server's frame limit).
const SNAPSHOT_CHUNK_BYTES: u32 = 1024 * 1024;
/// Frame bytes a snapshot chunk needs besides its data.
const SNAPSHOT_CHUNK_OVERHEAD_BYTES: u32 = 64;
/// Times [`Client::snapshot_to_file`] starts over when the snapshot changes.
const SNAPSHOT_RESTARTS: u32 = 3;

/// Result of [`Client::delete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// Whether the key existed.
    pub existed: bool,
    /// Log index of the delete (also when the key did not exist).
    pub version: u64,
}

/// Result of [`Client::cas`], shaped like an etcd transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasOutcome {
    /// Whether the comparison held and the write (or delete) was applied.
    pub succeeded: bool,
    /// On success the log index of the write; on failure the applied index the
    /// comparison was evaluated at.
    pub version: u64,
    /// On failure, what the key holds (`None` = absent); `None` on success.
    pub current: Option<Versioned>,
}

/// What [`Client::snapshot_to`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Log index the snapshot covers.
    pub last_log_index: u64,
    pub total_bytes: u64,
}

/// Where a request may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Only the leader; follow `NotLeader` redirects.
    Leader,
    /// Any node; prefer the leader (or the node last talked to) when known.
    AnyPreferLeader,
    /// Any node, spread round-robin over the endpoints (follower reads).
    AnySpread,
}

/// Whether repeating a request after an unknown outcome is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idempotence {
    Read,
    Write,
}

#[derive(Debug, Default)]
struct RouteState {
    /// Seed endpoints plus leader addresses learned from hints.
    endpoints: Vec<String>,
    /// Client address of the node believed to lead.
    leader: Option<String>,
    /// The node that answered last.
    current: Option<String>,
    /// Nodes that recently failed to answer within a call's budget, and
    /// since when: tried last until `SUSPECT_FOR` has passed.
    suspects: HashMap<String, Instant>,
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<dyn RpcChannel>>>>;

#[derive(Debug)]
struct Inner {
    one_sided: OneSided,
    options: ClientOptions,
    hello: ClientHello,
    route: Mutex<RouteState>,
    pool: Mutex<HashMap<String, Slot>>,
    spread: AtomicUsize,
}

/// An rdkv client: cheap to clone (clones share connections and leader knowledge).
///
/// One TCP connection per server, opened lazily and reopened after it breaks;
/// requests on it are pipelined up to the server's `max_in_flight`. Writes go to
/// the leader: a `NotLeader` reply with a hint redirects there at once, one
/// without a hint (an election) backs off from 50 ms doubling to 250 ms while trying
/// the other endpoints; `Unavailable`, `TooManyInFlight` and `StaleFollower` are
/// retried the same way. Everything stays within `request_timeout` and
/// `max_attempts`.
///
/// **Unknown outcomes are never retried.** A write (put, delete, cas, mput,
/// membership change, leader move) that was sent but whose reply never came
/// (the connection broke, the request timed out, or the server answered
/// `Timeout`) fails with [`Error::OutcomeUnknown`]; it may or may not have been
/// applied. Reads are always retried.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects with default [`ClientOptions`]; see [`Client::connect_with`].
    pub async fn connect<S: AsRef<str>>(endpoints: &[S]) -> Result<Self> {
        Self::connect_with(endpoints, ClientOptions::default()).await
    }

    /// Creates a client and connects to the first endpoint that answers (in order),
    /// so that a bad token or unreachable cluster shows up here.
    pub async fn connect_with<S: AsRef<str>>(
        endpoints: &[S],
        options: ClientOptions,
    ) -> Result<Self> {
        let client = Self::new(endpoints, options)?;
        let deadline = Instant::now() + client.inner.options.request_timeout;
        let mut last_err = Error::NoEndpoints;
        for addr in client.endpoints() {
            match client.connection(&addr, deadline).await {
                Ok(_) => {
                    client.route().current = Some(addr);
                    return Ok(client);
                }
                Err(e @ Error::Handshake { .. }) if !e.is_retryable() => return Err(e),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    /// Creates a client without connecting; connections open on first use.
    pub fn new<S: AsRef<str>>(endpoints: &[S], options: ClientOptions) -> Result<Self> {
        let mut list: Vec<String> = Vec::new();
        for e in endpoints {
            let e = e.as_ref().trim();
            if !e.is_empty() && !list.iter().any(|x| x == e) {
                list.push(e.to_owned());
            }
        }
        if list.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let hello = ClientHello::new(options.client_name.clone(), options.token.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                one_sided: OneSided::new(options.index_cache_entries, options.max_clock_drift),
                options,
                hello,
                route: Mutex::new(RouteState {
                    endpoints: list,
                    leader: None,
                    current: None,
                    suspects: HashMap::new(),
                }),
                pool: Mutex::new(HashMap::new()),
                spread: AtomicUsize::new(0),
            }),
        })
    }

    /// The endpoints this client knows: the ones it was given plus leaders learned
    /// from redirects.
    pub fn endpoints(&self) -> Vec<String> {
        self.route().endpoints.clone()
    }

    /// Client address of the node this client believes leads, if any.
    pub fn leader(&self) -> Option<String> {
        self.route().leader.clone()
    }

    /// What the one-sided (`shm`) read path has done so far.
    pub async fn one_sided_stats(&self) -> OneSidedStats {
        self.inner.one_sided.stats().await
    }

    /// Injects a fault into the node at `endpoint` (a partition from some
    /// peers, a slow disk, or healing), for fault tests against nodes
    /// started with `--fault-injection`; other nodes refuse it.
    pub async fn inject_fault(&self, endpoint: &str, fault: Fault) -> Result<()> {
        match self
            .request_to(endpoint, Request::InjectFault(fault))
            .await?
        {
            Response::Done => Ok(()),
            other => Err(unexpected("InjectFault", &other)),
        }
    }

    /// Reports the one-sided reads not yet reported to the servers whose
    /// regions they read (the `rdkv_one_sided_*{source="client"}` metrics).
    /// The client does this by itself about once a second while it reads;
    /// call this before exiting, or before checking the metrics.
    pub async fn flush_read_reports(&self) {
        self.inner.one_sided.flush_reports(self).await;
    }

    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    // ---- the one entry point ---------------------------------------------

    /// Sends one native request where its kind must go: reads by their
    /// consistency (a GET or MGET tries the one-sided path first), writes and
    /// membership changes to the leader, status-like requests to any node;
    /// with the retries and redirects described on [`Client`]. An error reply
    /// comes back as [`Error::Server`]. The typed methods below wrap it.
    pub async fn send(&self, request: Request) -> Result<Response> {
        let response = match request {
            Request::Get { key, consistency } => {
                Response::Value(self.get_with(key, consistency).await?)
            }
            Request::MGet { keys, consistency } => {
                Response::Values(self.mget_with(keys, consistency).await?)
            }
            other => {
                let (route, idempotence) = route_of(&other);
                self.request(other, route, idempotence).await?
            }
        };
        match response {
            Response::Error(reply) => Err(Error::Server(reply)),
            ok => Ok(ok),
        }
    }

    // ---- key-value ---------------------------------------------------------

    /// Reads `key` with the default consistency (`None`: absent).
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Versioned>> {
        self.get_with(key, self.inner.options.default_consistency)
            .await
    }

    pub async fn get_with(
        &self,
        key: impl Into<Bytes>,
        consistency: Consistency,
    ) -> Result<Option<Versioned>> {
        let key = key.into();
        if let Some(mut values) = self
            .inner
            .one_sided
            .try_get(self, std::slice::from_ref(&key), consistency)
            .await
        {
            return Ok(values.pop().flatten());
        }
        if self.inner.options.transport.is_one_sided_only() {
            return Err(Error::OneSidedUnavailable);
        }
        let request = Request::Get { key, consistency };
        match self
            .request(request, read_route(consistency), Idempotence::Read)
            .await?
        {
            Response::Value(value) => Ok(value),
            other => Err(unexpected("Get", &other)),
        }
    }

    /// Writes `key`; returns the version (log index) of the write.
    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<u64> {
        let request = Request::Put {
            key: key.into(),
            value: value.into(),
        };
        match self.write(request).await? {
            Response::Written { version } => Ok(version),
            other => Err(unexpected("Put", &other)),
        }
    }

    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<DeleteOutcome> {
        let request = Request::Delete { key: key.into() };
        match self.write(request).await? {
            Response::Deleted { existed, version } => Ok(DeleteOutcome { existed, version }),
            other => Err(unexpected("Delete", &other)),
        }
    }

    /// Compare-and-set on the key's version: `expected_version: None` requires the
    /// key to be absent; `new_value: None` deletes it.
    pub async fn cas(
        &self,
        key: impl Into<Bytes>,
        expected_version: Option<u64>,
        new_value: Option<Bytes>,
    ) -> Result<CasOutcome> {
        let request = Request::Cas {
            key: key.into(),
            expected_version,
            new_value,
        };
        match self.write(request).await? {
            Response::CasDone {
                succeeded,
                version,
                current,
            } => Ok(CasOutcome {
                succeeded,
                version,
                current,
            }),
            other => Err(unexpected("Cas", &other)),
        }
    }

    /// Reads several keys with the default consistency; one entry per key, in order.
    pub async fn mget<I, K>(&self, keys: I) -> Result<Vec<Option<Versioned>>>
    where
        I: IntoIterator<Item = K>,
        K: Into<Bytes>,
    {
        self.mget_with(keys, self.inner.options.default_consistency)
            .await
    }

    pub async fn mget_with<I, K>(
        &self,
        keys: I,
        consistency: Consistency,
    ) -> Result<Vec<Option<Versioned>>>
    where
        I: IntoIterator<Item = K>,
        K: Into<Bytes>,
    {
        let keys: Vec<Bytes> = keys.into_iter().map(Into::into).collect();
        if let Some(values) = self.inner.one_sided.try_get(self, &keys, consistency).await {
            return Ok(values);
        }
        if self.inner.options.transport.is_one_sided_only() {
            return Err(Error::OneSidedUnavailable);
        }
        let n = keys.len();
        let request = Request::MGet { keys, consistency };
        match self
            .request(request, read_route(consistency), Idempotence::Read)
            .await?
        {
            Response::Values(values) if values.len() == n => Ok(values),
            other => Err(unexpected("MGet", &other)),
        }
    }

    /// Up to `limit` pairs in key order (bytewise) from `start_key` (inclusive),
    /// with the default consistency. See [`Client::scan_range`].
    pub async fn scan(
        &self,
        start_key: impl Into<Bytes>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Versioned)>> {
        self.scan_range(
            start_key,
            None,
            limit,
            self.inner.options.default_consistency,
        )
        .await
    }

    pub async fn scan_with(
        &self,
        start_key: impl Into<Bytes>,
        limit: usize,
        consistency: Consistency,
    ) -> Result<Vec<(Bytes, Versioned)>> {
        self.scan_range(start_key, None, limit, consistency).await
    }

    /// Up to `limit` pairs in key order from `start_key` (inclusive) to
    /// `end_key` (exclusive; `None`: no end). Always served by RPC from the
    /// server's ordered key index (the region's hash index has no order).
    ///
    /// One reply is one consistent view at the serving node's applied index.
    /// A scan larger than one reply (more than 1024 pairs, or more bytes than
    /// a frame holds) continues after the last key it got, in further
    /// requests, each consistent on its own but not with each other, like
    /// paging through etcd with a limit.
    pub async fn scan_range(
        &self,
        start_key: impl Into<Bytes>,
        end_key: Option<Bytes>,
        limit: usize,
        consistency: Consistency,
    ) -> Result<Vec<(Bytes, Versioned)>> {
        let mut start_key = start_key.into();
        let mut out: Vec<(Bytes, Versioned)> = Vec::new();
        while out.len() < limit {
            let page_limit = (limit - out.len()).min(DEFAULT_MAX_BATCH_KEYS as usize);
            let request = Request::Scan {
                start_key: start_key.clone(),
                end_key: end_key.clone(),
                limit: u32::try_from(page_limit).unwrap_or(DEFAULT_MAX_BATCH_KEYS),
                consistency,
            };
            let (pairs, more) = match self
                .request(request, read_route(consistency), Idempotence::Read)
                .await?
            {
                Response::Pairs { pairs, more } if pairs.len() <= page_limit => (pairs, more),
                other => return Err(unexpected("Scan", &other)),
            };
            let page_full = pairs.len() == page_limit;
            let Some((last, _)) = pairs.last() else {
                break;
            };
            let in_order = pairs.windows(2).all(|w| w[0].0 < w[1].0);
            if !in_order || pairs[0].0 < start_key {
                return Err(Error::UnexpectedResponse {
                    request: "Scan",
                    response: "pairs out of key order or before the start key".to_owned(),
                });
            }
            // The smallest key after `last`.
            let mut next = last.to_vec();
            next.push(0);
            start_key = Bytes::from(next);
            out.extend(pairs);
            if !more && !page_full {
                break;
            }
        }
        Ok(out)
    }

    /// Writes several pairs atomically (one log entry); returns its version.
    pub async fn mput<I, K, V>(&self, pairs: I) -> Result<u64>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<Bytes>,
        V: Into<Bytes>,
    {
        let pairs = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        match self.write(Request::MPut { pairs }).await? {
            Response::MWritten { version } => Ok(version),
            other => Err(unexpected("MPut", &other)),
        }
    }

    /// A read-modify-write of `key` applied atomically by the leader's state
    /// machine (INCR, APPEND, conditional SET).
    pub async fn update(&self, key: impl Into<Bytes>, update: Update) -> Result<UpdateOutcome> {
        let request = Request::Update {
            key: key.into(),
            update,
        };
        match self.write(request).await? {
            Response::Updated(outcome) => Ok(outcome),
            other => Err(unexpected("Update", &other)),
        }
    }

    /// Deletes every key in one log entry (FLUSHDB); returns how many keys
    /// were removed and the entry's version.
    pub async fn clear(&self) -> Result<(u64, u64)> {
        match self.write(Request::Clear).await? {
            Response::Cleared { removed, version } => Ok((removed, version)),
            other => Err(unexpected("Clear", &other)),
        }
    }

    /// Round trip to the current node.
    pub async fn ping(&self) -> Result<()> {
        match self
            .request(Request::Ping, Route::AnyPreferLeader, Idempotence::Read)
            .await?
        {
            Response::Pong => Ok(()),
            other => Err(unexpected("Ping", &other)),
        }
    }

    // ---- admin -------------------------------------------------------------

    /// Status of the node this client is talking to (the leader when known).
    pub async fn status(&self) -> Result<NodeStatus> {
        let response = self
            .request(Request::Status, Route::AnyPreferLeader, Idempotence::Read)
            .await?;
        into_status(response)
    }

    /// Status of one node, asked directly (no redirect, no retry elsewhere).
    pub async fn status_of(&self, endpoint: &str) -> Result<NodeStatus> {
        into_status(self.request_to(endpoint, Request::Status).await?)
    }

    /// Health of one node, asked directly.
    pub async fn health_of(&self, endpoint: &str) -> Result<Health> {
        match self.request_to(endpoint, Request::Health).await? {
            Response::Health(health) => Ok(health),
            other => Err(unexpected("Health", &other)),
        }
    }

    /// The cluster configuration as the current node (the leader when known) sees it.
    pub async fn members(&self) -> Result<Vec<MemberInfo>> {
        match self
            .request(Request::Members, Route::AnyPreferLeader, Idempotence::Read)
            .await?
        {
            Response::Members(members) => Ok(members),
            other => Err(unexpected("Members", &other)),
        }
    }

    /// Adds a node (as a learner if `learner`); returns the new configuration.
    pub async fn add_member(
        &self,
        id: u64,
        peer_addr: impl Into<String>,
        client_addr: impl Into<String>,
        learner: bool,
    ) -> Result<Vec<MemberInfo>> {
        let request = Request::AddMember {
            id,
            peer_addr: peer_addr.into(),
            client_addr: client_addr.into(),
            learner,
        };
        into_members("AddMember", self.write(request).await?)
    }

    pub async fn promote_member(&self, id: u64) -> Result<Vec<MemberInfo>> {
        into_members(
            "PromoteMember",
            self.write(Request::PromoteMember { id }).await?,
        )
    }

    pub async fn remove_member(&self, id: u64) -> Result<Vec<MemberInfo>> {
        into_members(
            "RemoveMember",
            self.write(Request::RemoveMember { id }).await?,
        )
    }

    /// Transfers leadership to node `to`; returns once it leads.
    pub async fn move_leader(&self, to: u64) -> Result<()> {
        match self.write(Request::MoveLeader { to }).await? {
            Response::Done => {
                // The old leader no longer leads; rediscover on the next write.
                self.route().leader = None;
                Ok(())
            }
            other => Err(unexpected("MoveLeader", &other)),
        }
    }

    /// Streams the current node's snapshot into `writer`, chunk by chunk, all from
    /// one node. Each chunk gets its own `request_timeout`.
    ///
    /// A writer cannot be rewound, so if the node starts a newer snapshot mid-way
    /// this fails with [`Error::SnapshotChanged`] (call again);
    /// [`Client::snapshot_to_file`] restarts on its own instead.
    pub async fn snapshot_to<W: AsyncWrite + Unpin>(&self, writer: &mut W) -> Result<SnapshotInfo> {
        let (addr, first) = self.first_snapshot_chunk().await?;
        let info = self.stream_snapshot(&addr, first, writer).await?;
        writer.flush().await?;
        Ok(info)
    }

    /// Saves the current node's snapshot to `path`: written to `path.part`, synced,
    /// then renamed, so `path` is either absent or complete. Starts over (up to 3
    /// times) if the node starts a newer snapshot mid-way.
    pub async fn snapshot_to_file(&self, path: impl AsRef<Path>) -> Result<SnapshotInfo> {
        let path = path.as_ref();
        let mut part = path.as_os_str().to_owned();
        part.push(".part");
        let part = PathBuf::from(part);
        let result = self.snapshot_to_part(&part).await;
        match result {
            Ok(info) => {
                tokio::fs::rename(&part, path).await?;
                Ok(info)
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&part).await;
                Err(e)
            }
        }
    }

    async fn snapshot_to_part(&self, part: &Path) -> Result<SnapshotInfo> {
        let mut restarts = 0;
        loop {
            let mut file = tokio::fs::File::create(part).await?;
            match self.snapshot_to(&mut file).await {
                Ok(info) => {
                    file.sync_all().await?;
                    return Ok(info);
                }
                Err(Error::SnapshotChanged { from, to }) if restarts < SNAPSHOT_RESTARTS => {
                    restarts += 1;
                    tracing::debug!(from, to, "snapshot changed during transfer; restarting");
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn first_snapshot_chunk(&self) -> Result<(String, SnapshotChunk)> {
        let request = Request::SnapshotRead {
            offset: 0,
            max_bytes: SNAPSHOT_CHUNK_BYTES,
        };
        let (addr, response) = self
            .request_at(request, Route::AnyPreferLeader, Idempotence::Read)
            .await?;
        Ok((addr, into_chunk(response)?))
    }

    async fn stream_snapshot<W: AsyncWrite + Unpin>(
        &self,
        addr: &str,
        first: SnapshotChunk,
        writer: &mut W,
    ) -> Result<SnapshotInfo> {
        let info = SnapshotInfo {
            last_log_index: first.last_log_index,
            total_bytes: first.total_bytes,
        };
        let mut chunk = first;
        let mut offset = 0u64;
        loop {
            if chunk.last_log_index != info.last_log_index {
                return Err(Error::SnapshotChanged {
                    from: info.last_log_index,
                    to: chunk.last_log_index,
                });
            }
            let len = u64::try_from(chunk.data.len()).unwrap_or(u64::MAX);
            let end = offset.saturating_add(len);
            if chunk.offset != offset
                || chunk.total_bytes != info.total_bytes
                || end > info.total_bytes
                || (len == 0 && offset < info.total_bytes)
            {
                return Err(Error::UnexpectedResponse {
                    request: "SnapshotRead",
                    response: format!(
                        "chunk at offset {} of {} bytes (total {}) when offset {} of {} was asked",
                        chunk.offset, len, chunk.total_bytes, offset, info.total_bytes
                    ),
                });
            }
            writer.write_all(&chunk.data).await?;
            offset = end;
            if offset == info.total_bytes {
                return Ok(info);
            }
            let max_bytes = self.snapshot_chunk_bytes(addr).await;
            let response = self
                .request_to(addr, Request::SnapshotRead { offset, max_bytes })
                .await?;
            chunk = into_chunk(response)?;
        }
    }

    async fn snapshot_chunk_bytes(&self, addr: &str) -> u32 {
        let deadline = Instant::now() + self.inner.options.request_timeout;
        let frame_max = match self.connection(addr, deadline).await {
            Ok(conn) => conn.max_frame_bytes(),
            Err(_) => SNAPSHOT_CHUNK_BYTES,
        };
        frame_max
            .saturating_sub(SNAPSHOT_CHUNK_OVERHEAD_BYTES)
            .clamp(1, SNAPSHOT_CHUNK_BYTES)
    }

    // ---- routing -----------------------------------------------------------

    fn route(&self) -> MutexGuard<'_, RouteState> {
        self.inner
            .route
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    async fn write(&self, request: Request) -> Result<Response> {
        self.request(request, Route::Leader, Idempotence::Write)
            .await
    }

    async fn request(
        &self,
        request: Request,
        route: Route,
        idempotence: Idempotence,
    ) -> Result<Response> {
        self.request_at(request, route, idempotence)
            .await
            .map(|(_, response)| response)
    }

    /// The pool slot holding the channel to the node at `addr` (created
    /// empty on first use).
    fn slot(&self, addr: &str) -> Slot {
        let mut pool = self
            .inner
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(pool.entry(addr.to_owned()).or_default())
    }

    /// Routes requests for the node at client address `addr` through its
    /// local Unix socket from now on (until that connection breaks; then TCP).
    pub(crate) async fn use_unix_socket(&self, addr: &str, path: &Path) -> Result<()> {
        let slot = self.slot(addr);
        let deadline = Instant::now() + self.inner.options.connect_timeout;
        let conn = Connection::open_unix(path, addr, &self.inner.hello, deadline).await?;
        *slot.lock().await = Some(Arc::new(conn));
        Ok(())
    }

    /// Routes requests for the node at client address `addr` through
    /// `channel` (an RDMA session) until it breaks; then TCP again.
    #[cfg(feature = "rdma")]
    pub(crate) async fn use_channel(&self, addr: &str, channel: Arc<dyn RpcChannel>) {
        let slot = self.slot(addr);
        *slot.lock().await = Some(channel);
    }

    /// A fresh, dedicated connection to `addr` (not pooled): the control
    /// connection an RDMA session lives on.
    #[cfg(feature = "rdma")]
    pub(crate) async fn dedicated_connection(&self, addr: &str) -> Result<Connection> {
        let deadline = Instant::now() + self.inner.options.connect_timeout;
        Ok(Connection::open(addr, &self.inner.hello, deadline).await?)
    }

    /// Returns the connection to `addr`, opening it if needed.
    async fn connection(&self, addr: &str, deadline: Instant) -> Result<Arc<dyn RpcChannel>> {
        let slot = self.slot(addr);
        let connect_deadline = deadline.min(Instant::now() + self.inner.options.connect_timeout);
        let timed_out = || Error::Connect {
            addr: addr.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
        };
        // Concurrent callers wait for one connect instead of racing several.
        let mut guard = tokio::time::timeout_at(connect_deadline, slot.lock())
            .await
            .map_err(|_| timed_out())?;
        if let Some(conn) = guard.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(conn));
        }
        *guard = None;
        let conn: Arc<dyn RpcChannel> =
            Arc::new(Connection::open(addr, &self.inner.hello, connect_deadline).await?);
        *guard = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// One request to exactly `addr`: no redirects, no retries elsewhere.
    /// One request to one node, no redirects or retries.
    pub(crate) async fn request_to(&self, addr: &str, request: Request) -> Result<Response> {
        let start = Instant::now();
        let deadline = start + self.inner.options.request_timeout;
        let conn = self.connection(addr, deadline).await?;
        match conn.call_boxed(&request, deadline).await {
            Ok(Response::Error(reply)) => Err(Error::Server(reply)),
            Ok(response) => Ok(response),
            Err(CallError::NotSent {
                timed_out: true, ..
            })
            | Err(CallError::TimedOut) => Err(Error::Timeout(start.elapsed())),
            Err(CallError::NotSent { reason, .. }) | Err(CallError::Lost { reason }) => {
                Err(Error::ConnectionLost {
                    addr: addr.to_owned(),
                    reason,
                })
            }
            Err(CallError::Encode(e)) | Err(CallError::Decode(e)) => Err(Error::Protocol(e)),
        }
    }

    /// Sends `request` where `route` allows, retrying and redirecting within the
    /// request timeout and attempt budget. Returns the answering node's address.
    async fn request_at(
        &self,
        request: Request,
        route: Route,
        idempotence: Idempotence,
    ) -> Result<(String, Response)> {
        let start = Instant::now();
        let deadline = start + self.inner.options.request_timeout;
        let max_attempts = self.inner.options.max_attempts.max(1);
        let mut cursor = match route {
            Route::AnySpread => self.inner.spread.fetch_add(1, Ordering::Relaxed),
            Route::Leader | Route::AnyPreferLeader => 0,
        };
        let mut backoff = BACKOFF_START;
        // What to report if the budget runs out.
        let mut last_err: Option<Error> = None;
        // The node to try next, when a redirect named one.
        let mut next: Option<String> = None;
        let mut redirects = 0u32;

        for attempt in 1..=max_attempts {
            let addr = match next.take() {
                Some(addr) => addr,
                None => self.pick(route, cursor),
            };
            let conn = match self.connection(&addr, deadline).await {
                Ok(conn) => conn,
                Err(e) if matches!(e, Error::Handshake { .. }) && !e.is_retryable() => {
                    return Err(e);
                }
                // Our own deadline cut this connect short: the earlier error says more.
                Err(_) if Instant::now() >= deadline && last_err.is_some() => break,
                Err(e) => {
                    tracing::debug!(%addr, attempt, error = %e, "cannot reach node; trying the next");
                    self.forget(&addr);
                    cursor = cursor.wrapping_add(1);
                    last_err = Some(e);
                    if Instant::now() >= deadline {
                        break;
                    }
                    if self.round_done(cursor) {
                        self.back_off(&mut backoff, deadline).await;
                    }
                    continue;
                }
            };

            let reply = match conn.call_boxed(&request, deadline).await {
                Ok(Response::Error(reply)) => reply,
                Ok(response) => {
                    let mut state = self.route();
                    state.suspects.remove(&addr);
                    if route == Route::Leader {
                        state.leader = Some(addr.clone());
                    }
                    state.current = Some(addr.clone());
                    return Ok((addr, response));
                }
                Err(CallError::Encode(e)) | Err(CallError::Decode(e)) => {
                    return Err(Error::Protocol(e));
                }
                Err(CallError::TimedOut) => {
                    // A node that does not answer (crashed, frozen, cut off)
                    // must not stay the first choice of the next calls.
                    self.forget(&addr);
                    self.route().suspects.insert(addr.clone(), Instant::now());
                    return Err(match idempotence {
                        Idempotence::Write => Error::OutcomeUnknown {
                            addr,
                            reason: format!(
                                "no reply came within {:?}",
                                self.inner.options.request_timeout
                            ),
                        },
                        Idempotence::Read => Error::Timeout(start.elapsed()),
                    });
                }
                Err(CallError::NotSent {
                    timed_out: true, ..
                }) => break,
                Err(CallError::Lost { reason }) if idempotence == Idempotence::Write => {
                    return Err(Error::OutcomeUnknown {
                        addr,
                        reason: format!("the connection broke before the reply ({reason})"),
                    });
                }
                Err(CallError::NotSent { reason, .. }) | Err(CallError::Lost { reason }) => {
                    tracing::debug!(%addr, attempt, %reason, "connection lost; retrying");
                    self.forget(&addr);
                    cursor = cursor.wrapping_add(1);
                    last_err = Some(Error::ConnectionLost { addr, reason });
                    if self.round_done(cursor) {
                        self.back_off(&mut backoff, deadline).await;
                    }
                    continue;
                }
            };

            let hint = reply
                .leader_hint
                .clone()
                .filter(|h| h.client_addr != addr)
                .filter(|_| matches!(reply.code, ErrorCode::NotLeader | ErrorCode::Unavailable));
            if let Some(hint) = hint {
                tracing::debug!(
                    from = %addr,
                    to = %hint.client_addr,
                    leader_id = hint.node_id,
                    code = ?reply.code,
                    "redirecting to the leader"
                );
                redirects += 1;
                self.learn_leader(&hint.client_addr);
                next = Some(hint.client_addr);
                last_err = Some(match reply.code {
                    ErrorCode::NotLeader => Error::NoLeader,
                    _ => Error::Server(reply),
                });
                // Nodes that disagree about the leader (stale hints) must not spin.
                if redirects > 1 {
                    self.back_off(&mut backoff, deadline).await;
                }
                if Instant::now() >= deadline {
                    break;
                }
                continue;
            }
            match reply.code {
                ErrorCode::NotLeader => {
                    tracing::debug!(%addr, attempt, "not the leader and no leader known; backing off");
                    self.forget(&addr);
                    cursor = cursor.wrapping_add(1);
                    last_err = Some(Error::NoLeader);
                    self.back_off(&mut backoff, deadline).await;
                }
                ErrorCode::Unavailable | ErrorCode::TooManyInFlight | ErrorCode::StaleFollower => {
                    tracing::debug!(%addr, attempt, code = ?reply.code, "retryable error; backing off");
                    if reply.code != ErrorCode::TooManyInFlight {
                        self.forget(&addr);
                        cursor = cursor.wrapping_add(1);
                    }
                    last_err = Some(Error::Server(reply));
                    self.back_off(&mut backoff, deadline).await;
                }
                ErrorCode::Timeout if idempotence == Idempotence::Write => {
                    return Err(Error::OutcomeUnknown {
                        addr,
                        reason: format!("the server answered Timeout: {}", reply.message),
                    });
                }
                ErrorCode::Timeout => {
                    last_err = Some(Error::Server(reply));
                    self.back_off(&mut backoff, deadline).await;
                }
                _ => return Err(Error::Server(reply)),
            }
            if Instant::now() >= deadline {
                break;
            }
        }

        // The last thing that went wrong says more than "timed out" (an unreachable
        // node, no leader, Unavailable); nothing was sent whose outcome is unknown.
        Err(last_err.unwrap_or_else(|| Error::Timeout(start.elapsed())))
    }

    /// The node to try for `route` on the `cursor`-th fallback.
    fn pick(&self, route: Route, cursor: usize) -> String {
        let state = self.route();
        let preferred = match route {
            Route::Leader | Route::AnyPreferLeader => {
                state.leader.clone().or_else(|| state.current.clone())
            }
            Route::AnySpread => None,
        };
        if let Some(addr) = preferred {
            return addr;
        }
        let n = state.endpoints.len().max(1);
        let suspect = |addr: &String| {
            state
                .suspects
                .get(addr)
                .is_some_and(|since| since.elapsed() < SUSPECT_FOR)
        };
        // From the cursor on, the first endpoint not under suspicion; all
        // suspect (or none left): plain rotation.
        (0..n)
            .filter_map(|k| state.endpoints.get((cursor + k) % n))
            .find(|addr| !suspect(addr))
            .or_else(|| state.endpoints.get(cursor % n))
            .cloned()
            .unwrap_or_default()
    }

    /// Whether the cursor has just gone through every endpoint once.
    fn round_done(&self, cursor: usize) -> bool {
        let n = self.route().endpoints.len().max(1);
        cursor.is_multiple_of(n)
    }

    /// Stops preferring `addr` after it failed.
    fn forget(&self, addr: &str) {
        let mut state = self.route();
        if state.leader.as_deref() == Some(addr) {
            state.leader = None;
        }
        if state.current.as_deref() == Some(addr) {
            state.current = None;
        }
    }

    fn learn_leader(&self, addr: &str) {
        let mut state = self.route();
        if !state.endpoints.iter().any(|e| e == addr) {
            state.endpoints.push(addr.to_owned());
        }
        state.leader = Some(addr.to_owned());
    }

    /// Sleeps for the current back-off (never past `deadline`) and doubles it.
    async fn back_off(&self, backoff: &mut Duration, deadline: Instant) {
        let wake = (Instant::now() + *backoff).min(deadline);
        sleep_until(wake).await;
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    }
}

/// Where a request of this kind may be served, and whether repeating it after
/// an unknown outcome is harmless.
fn route_of(request: &Request) -> (Route, Idempotence) {
    match request {
        Request::Get { consistency, .. }
        | Request::MGet { consistency, .. }
        | Request::Scan { consistency, .. } => (read_route(*consistency), Idempotence::Read),
        Request::Ping
        | Request::Status
        | Request::Health
        | Request::Members
        | Request::SnapshotRead { .. }
        | Request::ReportReads(_)
        | Request::RdmaRegion => (Route::AnyPreferLeader, Idempotence::Read),
        Request::Put { .. }
        | Request::Delete { .. }
        | Request::Cas { .. }
        | Request::MPut { .. }
        | Request::Update { .. }
        | Request::Clear
        | Request::AddMember { .. }
        | Request::PromoteMember { .. }
        | Request::RemoveMember { .. }
        | Request::MoveLeader { .. }
        | Request::InjectFault(_)
        | Request::RdmaConnect { .. } => (Route::Leader, Idempotence::Write),
    }
}

fn read_route(consistency: Consistency) -> Route {
    match consistency {
        Consistency::Linearizable | Consistency::Lease => Route::Leader,
        Consistency::Follower { .. } => Route::AnySpread,
    }
}

fn unexpected(request: &'static str, response: &Response) -> Error {
    match response {
        Response::Error(reply) => Error::Server(reply.clone()),
        other => Error::UnexpectedResponse {
            request,
            response: format!("{other:?}").chars().take(200).collect(),
        },
    }
}

fn into_status(response: Response) -> Result<NodeStatus> {
    match response {
        Response::Status(status) => Ok(*status),
        other => Err(unexpected("Status", &other)),
    }
}

fn into_members(request: &'static str, response: Response) -> Result<Vec<MemberInfo>> {
    match response {
        Response::Members(members) => Ok(members),
        other => Err(unexpected(request, &other)),
    }
}

fn into_chunk(response: Response) -> Result<SnapshotChunk> {
    match response {
        Response::Snapshot(chunk) => Ok(chunk),
        other => Err(unexpected("SnapshotRead", &other)),
    }
}
