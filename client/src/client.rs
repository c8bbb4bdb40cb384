//! The public API: [`Client`], whose one entry point is [`Client::send`];
//! every typed method is a request built, sent and its answer taken out.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{
    Consistency, ExpireCondition, Expiry, Fault, Health, KeyExpiry, MemberInfo, NodeStatus, Op,
    Request, Response, SetCondition, ShardRequest, ShardStatus, StateDigestAt, Update,
    UpdateOutcome, Versioned,
};
use tokio::io::AsyncWrite;

use crate::error::{Error, Result};
use crate::one_sided::{OneSided, OneSidedStats, ReadHandle};
use crate::options::ClientOptions;
use crate::outcome::{
    CasOutcome, Cleared, DeleteOutcome, Done, FromResponse, MWritten, Pong, Written, answer,
    unexpected,
};
use crate::routing::Router;
use crate::scan::{self, ScanRange};
use crate::snapshot::{self, SnapshotInfo};
use crate::split;

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
    router: Arc<Router>,
    one_sided: Arc<OneSided>,
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
        client.router.connect_any().await?;
        Ok(client)
    }

    /// Creates a client without connecting; connections open on first use.
    pub fn new<S: AsRef<str>>(endpoints: &[S], options: ClientOptions) -> Result<Self> {
        let router = Arc::new(Router::new(endpoints, options)?);
        let one_sided = OneSided::new(Arc::clone(&router));
        Ok(Self { router, one_sided })
    }

    /// The endpoints this client knows: the ones it was given plus leaders learned
    /// from redirects.
    pub fn endpoints(&self) -> Vec<String> {
        self.router.endpoints()
    }

    /// Client address of the node this client believes leads, if any.
    pub fn leader(&self) -> Option<String> {
        self.router.leader()
    }

    pub fn options(&self) -> &ClientOptions {
        self.router.options()
    }

    /// The newest shard map this client fetched (docs/sharding.md: at
    /// connect, kept if it has several shards, or when a node answered
    /// `WrongShard`); `None`: the cluster is taken as one group.
    pub fn shard_map(&self) -> Option<Arc<ShardMap>> {
        self.router.shard_map()
    }

    /// A synchronous handle on the one-sided read path, for one thread or
    /// task: `get_into` reads a value straight into the caller's buffer,
    /// without a lock or an allocation (see [`ReadHandle`]). Made inside a
    /// tokio runtime, the client then refreshes the handles' view of the
    /// cluster in the background.
    pub fn read_handle(&self) -> ReadHandle {
        self.one_sided.handle()
    }

    /// What the one-sided (`shm`) read path has done so far.
    pub async fn one_sided_stats(&self) -> OneSidedStats {
        self.one_sided.stats().await
    }

    /// Reports the one-sided reads not yet reported to the servers whose
    /// regions they read (the `rdkv_one_sided_*{source="client"}` metrics).
    /// The client does this by itself about once a second while it reads;
    /// call this before exiting, or before checking the metrics.
    pub async fn flush_read_reports(&self) {
        self.one_sided.flush_reports().await;
    }

    // ---- the entry points --------------------------------------------------

    /// Sends one native request where its kind must go: reads by their
    /// consistency (a GET or MGET tries the one-sided path first), writes and
    /// membership changes to the leader, status-like requests to any node;
    /// with the retries and redirects described on [`Client`]. An error reply
    /// comes back as [`Error::Server`]. The typed methods below wrap it.
    pub async fn send(&self, request: Request) -> Result<Response> {
        let one_sided = match &request {
            Request::Get { key, consistency } => self
                .one_sided
                .get(key, *consistency)
                .await
                .map(Response::Value),
            Request::MGet { keys, consistency } => self
                .one_sided
                .get_many(keys, *consistency)
                .await
                .map(Response::Values),
            _ => return self.routed(request).await,
        };
        if let Some(response) = one_sided {
            return Ok(response);
        }
        if self.options().transport.is_one_sided_only() {
            return Err(Error::OneSidedUnavailable);
        }
        self.checked_routed(request).await
    }

    /// [`routed`](Client::routed), with an `MGet`'s answer checked to have
    /// one entry per key asked.
    async fn checked_routed(&self, request: Request) -> Result<Response> {
        let asked = match &request {
            Request::MGet { keys, .. } => Some(keys.len()),
            _ => None,
        };
        match self.routed(request).await? {
            Response::Values(values) if asked.is_some_and(|n| n != values.len()) => {
                Err(unexpected(Op::MGet, &Response::Values(values)))
            }
            response => Ok(response),
        }
    }

    /// Sends one native request to exactly the node at `endpoint`: no
    /// redirect, no retry elsewhere, never one-sided. An error reply comes
    /// back as [`Error::Server`].
    pub async fn send_to(&self, endpoint: &str, request: Request) -> Result<Response> {
        self.router.send_to(endpoint, request).await
    }

    /// The request through the server. Boxed: the routing loop's future is
    /// large, and inlined into `send` it made every one-sided GET's future
    /// as large (moved on every poll set-up), about 0.1 us a GET.
    async fn routed(&self, request: Request) -> Result<Response> {
        let shard = self.router.log_of(&request);
        let response = Box::pin(self.router.send(request)).await?;
        if let Some(index) = response.applied_at_least()
            && let Some(shard) = shard
        {
            self.one_sided.saw_applied(shard, index);
        }
        Ok(response)
    }

    /// [`send`](Client::send) with the answer taken out of the response.
    pub(crate) async fn call<T: FromResponse>(&self, request: Request) -> Result<T> {
        let op = request.op();
        answer(op, self.send(request).await?)
    }

    /// [`send_to`](Client::send_to) with the answer taken out of the response.
    async fn call_to<T: FromResponse>(&self, endpoint: &str, request: Request) -> Result<T> {
        let op = request.op();
        answer(op, self.send_to(endpoint, request).await?)
    }

    // ---- key-value ---------------------------------------------------------

    /// Reads `key` with the default consistency (`None`: absent).
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Versioned>> {
        self.get_with(key, self.options().default_consistency).await
    }

    pub async fn get_with(
        &self,
        key: impl Into<Bytes>,
        consistency: Consistency,
    ) -> Result<Option<Versioned>> {
        let key = key.into();
        self.call(Request::Get { key, consistency }).await
    }

    /// Writes `key`; returns the version (log index) of the write.
    pub async fn put(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<u64> {
        let request = Request::Put {
            key: key.into(),
            value: value.into(),
        };
        let Written(version) = self.call(request).await?;
        Ok(version)
    }

    /// Writes `key` to expire `ttl` after the leader's clock when it takes
    /// the write (rounded up to whole milliseconds); returns the version.
    /// Until then every read sees it; from its deadline on (less the
    /// clock-drift margin, `ClientOptions::max_clock_drift`) none does.
    pub async fn put_with_ttl(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        ttl: std::time::Duration,
    ) -> Result<u64> {
        let update = Update::Set {
            value: value.into(),
            condition: SetCondition::Always,
            return_old: false,
            expiry: Expiry::AfterMs(ttl_ms(ttl)),
        };
        match self.update(key, update).await? {
            UpdateOutcome::Set { version, .. } => Ok(version),
            other => Err(unexpected(Op::Update, &Response::Updated(other))),
        }
    }

    /// Gives `key` a deadline `ttl` from now (the leader's clock); `false`
    /// when the key is absent.
    pub async fn expire(&self, key: impl Into<Bytes>, ttl: std::time::Duration) -> Result<bool> {
        self.change_expiry(key, Expiry::AfterMs(ttl_ms(ttl))).await
    }

    /// Removes `key`'s deadline; `false` when the key is absent or had none.
    pub async fn persist(&self, key: impl Into<Bytes>) -> Result<bool> {
        self.change_expiry(key, Expiry::Never).await
    }

    async fn change_expiry(&self, key: impl Into<Bytes>, expiry: Expiry) -> Result<bool> {
        let update = Update::Expire {
            expiry,
            condition: ExpireCondition::Always,
        };
        match self.update(key, update).await? {
            UpdateOutcome::ExpiryChanged { changed, .. } => Ok(changed),
            other => Err(unexpected(Op::Update, &Response::Updated(other))),
        }
    }

    /// `key`'s deadline with the default consistency (`None`: absent).
    pub async fn ttl(&self, key: impl Into<Bytes>) -> Result<Option<KeyExpiry>> {
        let request = Request::Ttl {
            key: key.into(),
            consistency: self.options().default_consistency,
        };
        self.call(request).await
    }

    pub async fn delete(&self, key: impl Into<Bytes>) -> Result<DeleteOutcome> {
        self.call(Request::Delete { key: key.into() }).await
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
        self.call(request).await
    }

    /// Reads several keys with the default consistency; one entry per key, in order.
    pub async fn mget<I, K>(&self, keys: I) -> Result<Vec<Option<Versioned>>>
    where
        I: IntoIterator<Item = K>,
        K: Into<Bytes>,
    {
        self.mget_with(keys, self.options().default_consistency)
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
        self.router.learn_map().await;
        match self.shard_map() {
            Some(map) if map.shards().len() > 1 => split::mget(self, &map, keys, consistency).await,
            _ => self.call(Request::MGet { keys, consistency }).await,
        }
    }

    /// Up to `limit` pairs in key order (bytewise) from `start_key` (inclusive),
    /// with the default consistency. See [`Client::scan_range`].
    pub async fn scan(
        &self,
        start_key: impl Into<Bytes>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Versioned)>> {
        let consistency = self.options().default_consistency;
        self.scan_range(start_key, None, limit, consistency).await
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
        let range = ScanRange {
            start_key: start_key.into(),
            end_key,
            limit,
            consistency,
        };
        scan::range(&self.router, range).await
    }

    /// Writes several pairs atomically (one log entry); returns its version.
    ///
    /// In a cluster of several shards the pairs are written shard by shard,
    /// each shard's part atomic, the whole not (keys sharing a hash tag
    /// `{...}` are in one shard): the call returns the highest of the parts'
    /// versions, or fails with [`Error::PartialMPut`] if some parts were
    /// written and others not.
    pub async fn mput<I, K, V>(&self, pairs: I) -> Result<u64>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<Bytes>,
        V: Into<Bytes>,
    {
        let pairs = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect::<Vec<(Bytes, Bytes)>>();
        self.router.learn_map().await;
        if let Some(map) = self.shard_map().filter(|map| map.shards().len() > 1) {
            return split::mput(self, &map, pairs).await;
        }
        let MWritten(version) = self.call(Request::MPut { pairs }).await?;
        Ok(version)
    }

    /// A read-modify-write of `key` applied atomically by the leader's state
    /// machine (INCR, APPEND, conditional SET).
    pub async fn update(&self, key: impl Into<Bytes>, update: Update) -> Result<UpdateOutcome> {
        let request = Request::Update {
            key: key.into(),
            update,
        };
        self.call(request).await
    }

    /// Deletes every key in one log entry (FLUSHDB); returns how many keys
    /// were removed and the entry's version.
    ///
    /// In a cluster of several shards each shard is cleared by its own
    /// entry, all at once, not atomically together: the call returns the
    /// keys removed in all and the highest of the shards' versions, or the
    /// first shard's error (other shards may have been cleared).
    pub async fn clear(&self) -> Result<(u64, u64)> {
        self.router.learn_map().await;
        if let Some(map) = self.shard_map().filter(|map| map.shards().len() > 1) {
            return split::clear(self, &map).await;
        }
        let Cleared { removed, version } = self.call(Request::Clear).await?;
        Ok((removed, version))
    }

    /// Round trip to the current node.
    pub async fn ping(&self) -> Result<()> {
        let Pong = self.call(Request::Ping).await?;
        Ok(())
    }

    // ---- admin -------------------------------------------------------------

    /// Status of the node this client is talking to (the leader when known).
    pub async fn status(&self) -> Result<NodeStatus> {
        self.call(Request::Status).await
    }

    /// Status of one node, asked directly (no redirect, no retry elsewhere).
    pub async fn status_of(&self, endpoint: &str) -> Result<NodeStatus> {
        self.call_to(endpoint, Request::Status).await
    }

    /// One node's state digests at its last applied indexes, oldest first,
    /// asked directly (see [`StateDigestAt`]).
    pub async fn digests_of(&self, endpoint: &str) -> Result<Vec<StateDigestAt>> {
        self.call_to(endpoint, Request::Digests).await
    }

    /// Every shard replica one node hosts (a single-group node: shard 0),
    /// asked directly. A node older than the request answers `Malformed`.
    pub async fn shard_statuses_of(&self, endpoint: &str) -> Result<Vec<ShardStatus>> {
        self.call_to(endpoint, Request::ShardStatus).await
    }

    /// Transfers shard `shard`'s leadership to node `to`, asked of the node
    /// at `endpoint` (that shard's leader: no redirect); returns once `to`
    /// leads.
    pub async fn move_shard_leader_at(
        &self,
        endpoint: &str,
        shard: ShardId,
        to: u64,
    ) -> Result<()> {
        let Done = self
            .call_to(endpoint, Request::ShardMoveLeader { shard, to })
            .await?;
        Ok(())
    }

    /// Moves shard `shard`'s replica from node `from` to node `to`
    /// (`ShardRequest::MoveReplica`, sent to the shard's leader, following
    /// its redirects): `to` added as a learner, caught up, promoted, `from`
    /// removed and its replica closed. Returns the shard's new members.
    /// It takes as long as the new replica needs to catch up: give the
    /// client a request timeout to match.
    pub async fn move_shard_replica(
        &self,
        shard: ShardId,
        from: u64,
        to: u64,
    ) -> Result<Vec<MemberInfo>> {
        self.call(Request::Sharded {
            shard,
            request: ShardRequest::MoveReplica { from, to },
        })
        .await
    }

    /// Health of one node, asked directly.
    pub async fn health_of(&self, endpoint: &str) -> Result<Health> {
        self.call_to(endpoint, Request::Health).await
    }

    /// Injects a fault into the node at `endpoint` (a partition from some
    /// peers, a slow disk, or healing), for fault tests against nodes
    /// started with `--fault-injection`; other nodes refuse it.
    pub async fn inject_fault(&self, endpoint: &str, fault: Fault) -> Result<()> {
        let Done = self.call_to(endpoint, Request::InjectFault(fault)).await?;
        Ok(())
    }

    /// The cluster configuration as the current node (the leader when known) sees it.
    pub async fn members(&self) -> Result<Vec<MemberInfo>> {
        self.call(Request::Members).await
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
        self.call(request).await
    }

    pub async fn promote_member(&self, id: u64) -> Result<Vec<MemberInfo>> {
        self.call(Request::PromoteMember { id }).await
    }

    pub async fn remove_member(&self, id: u64) -> Result<Vec<MemberInfo>> {
        self.call(Request::RemoveMember { id }).await
    }

    /// Transfers leadership to node `to`; returns once it leads.
    pub async fn move_leader(&self, to: u64) -> Result<()> {
        let Done = self.call(Request::MoveLeader { to }).await?;
        Ok(())
    }

    /// Streams the current node's snapshot into `writer`, chunk by chunk, all from
    /// one node. Each chunk gets its own `request_timeout`.
    ///
    /// A writer cannot be rewound, so if the node starts a newer snapshot mid-way
    /// this fails with [`Error::SnapshotChanged`] (call again);
    /// [`Client::snapshot_to_file`] restarts on its own instead.
    pub async fn snapshot_to<W: AsyncWrite + Unpin>(&self, writer: &mut W) -> Result<SnapshotInfo> {
        snapshot::to_writer(&self.router, writer).await
    }

    /// Saves the current node's snapshot to `path`: written to `path.part`, synced,
    /// then renamed, so `path` is either absent or complete. Starts over (up to 3
    /// times) if the node starts a newer snapshot mid-way.
    pub async fn snapshot_to_file(&self, path: impl AsRef<Path>) -> Result<SnapshotInfo> {
        snapshot::to_file(&self.router, path.as_ref()).await
    }
}

/// A TTL in whole milliseconds, rounded up: a TTL never ends early. What
/// [`Client::put_with_ttl`] and [`Client::expire`] send.
pub fn ttl_ms(ttl: std::time::Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}
