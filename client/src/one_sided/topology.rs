//! What the one-sided path knows of the cluster: per shard (a single group:
//! shard 0), the members, the leader and a region reader per (node, shard)
//! it could attach to (over `rdma`, `ofi` or `shm`), re-learned from the
//! nodes' status when a read finds its view older than `view::VIEW_TTL`
//! (or its leader's lease gone); each refresh publishes a new `ReadView`
//! for the reads. Under a map of several shards the client attaches every
//! shard's region on every node that hosts it, each grant naming its shard
//! (docs/sharding.md, section 5); a single group asks as before sharding.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkv_fabric::{ReadError, ReadStats, ReaderOptions, RegionReader, attach_shm_shard};
use rdkv_proto::region::RegionState;
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{NodeStatus, Op, Request, Role, ShardStatus};

use super::OneSided;
use super::leaders::LeaderClaims;
use super::view::ReadView;
use crate::outcome::answer;

/// Budget of each status call of a refresh.
pub(super) const STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a node whose region could not be attached is left alone.
const ATTACH_BACKOFF: Duration = Duration::from_secs(2);
/// How long a node whose RDMA session could not be set up is read through
/// the other transports before RDMA is tried again.
#[cfg(feature = "rdma")]
const RDMA_BACKOFF: Duration = Duration::from_secs(10);
/// The same for a node whose libfabric grant or session failed.
#[cfg(feature = "ofi")]
const OFI_BACKOFF: Duration = Duration::from_secs(10);

/// The channel of a retired RDMA session (always `None` without the feature).
type Retired = Option<std::sync::Arc<dyn rdkv_fabric::rpc::RpcChannel>>;

#[derive(Debug, Default)]
pub(super) struct Node {
    pub(super) reader: Option<RegionReader>,
    retry_attach_at: Option<Instant>,
    pub(super) client_addr: String,
    /// The reader's counters when they were last reported to the node.
    pub(super) reported: ReadStats,
    /// Counts of replaced readers not yet reported.
    pub(super) unreported: ReadStats,
    /// The RDMA session `reader` reads through, if any, with its control
    /// connection (the server drops the queue pair when it closes).
    #[cfg(feature = "rdma")]
    rdma: Option<super::rdma::Attached>,
    #[cfg(feature = "rdma")]
    retry_rdma_at: Option<Instant>,
    /// The libfabric session `reader` reads through, if any.
    #[cfg(feature = "ofi")]
    ofi: Option<super::ofi::Attached>,
    #[cfg(feature = "ofi")]
    retry_ofi_at: Option<Instant>,
}

impl Node {
    /// Whether the reader reads its current region: serving, and of
    /// `epoch` when the node's status names it (a restarted or
    /// snapshot-rebuilt node has a new one).
    fn reads_current_region(&self, epoch: Option<u64>) -> bool {
        self.reader.as_ref().is_some_and(|r| {
            r.dynamic_header()
                .is_ok_and(|h| h.state == RegionState::Serving)
                && epoch.is_none_or(|epoch| epoch == r.layout().region_epoch)
        })
    }
}

/// Where a region is: its shard (`None`: a single group's, asked for
/// without naming one), its node and that node's client address.
#[derive(Debug, Clone, Copy)]
pub(super) struct RegionAt<'a> {
    pub(super) shard: Option<ShardId>,
    pub(super) id: u64,
    pub(super) addr: &'a str,
}

impl RegionAt<'_> {
    fn key(&self) -> RegionKey {
        (self.shard.unwrap_or(ShardId(0)), self.id)
    }

    /// The grant request of this region: `unnamed` for a single group's,
    /// else `named` inside `Request::Sharded`.
    #[cfg(any(feature = "rdma", feature = "ofi"))]
    pub(super) fn grant_request(
        &self,
        unnamed: Request,
        named: rdkv_proto::wire::ShardRequest,
    ) -> Request {
        match self.shard {
            None => unnamed,
            Some(shard) => Request::Sharded {
                shard,
                request: named,
            },
        }
    }
}

/// A region's place: (shard, node id).
pub(super) type RegionKey = (ShardId, u64);

#[derive(Debug, Default)]
pub(super) struct Topology {
    /// Each shard's leader (a single group: shard 0's).
    pub(super) leaders: BTreeMap<ShardId, u64>,
    /// A region per (shard, node).
    pub(super) nodes: BTreeMap<RegionKey, Node>,
    /// The map of several shards the regions were attached under; `None`:
    /// a single group, every key shard 0's.
    pub(super) map: Option<Arc<ShardMap>>,
    /// Readers of regions replaced since, kept for their statistics.
    pub(super) retired_stats: ReadStats,
    /// Refusal counters when last reported (to the leader).
    pub(super) reported_lease_refusals: u64,
    pub(super) reported_lag_refusals: u64,
}

impl Topology {
    pub(super) fn readers(&self) -> impl Iterator<Item = &RegionReader> {
        self.nodes.values().filter_map(|n| n.reader.as_ref())
    }

    /// The shards a view has a group for: the map's, or shard 0.
    pub(super) fn shards(&self) -> impl Iterator<Item = ShardId> + '_ {
        let mapped = self
            .map
            .iter()
            .flat_map(|map| map.shards().iter().map(|s| s.id));
        let single = self.map.is_none().then_some(ShardId(0));
        mapped.chain(single)
    }

    /// Drops the reader (and session) of the region at `key`, keeping its
    /// counts; returns the retired RDMA session's channel, which the
    /// caller takes out of the pool.
    fn retire_reader(&mut self, key: RegionKey) -> Retired {
        let node = self.nodes.entry(key).or_default();
        #[cfg(feature = "rdma")]
        let retired = node.rdma.take().map(|attached| attached.channel());
        #[cfg(not(feature = "rdma"))]
        let retired = None;
        #[cfg(feature = "ofi")]
        {
            node.ofi = None;
        }
        if let Some(old) = node.reader.take() {
            let old_stats = old.stats();
            node.unreported = node.unreported.plus(old_stats.since(node.reported));
            node.reported = ReadStats::default();
            self.retired_stats = self.retired_stats.plus(old_stats);
        }
        retired
    }

    /// Keeps the regions of `wanted` only (their counts join the retired).
    fn keep_only(&mut self, wanted: &[RegionKey]) {
        let gone: Vec<RegionKey> = self
            .nodes
            .keys()
            .filter(|key| !wanted.contains(key))
            .copied()
            .collect();
        for key in gone {
            self.retire_reader(key);
            self.nodes.remove(&key);
        }
    }
}

/// A reader of a region with options sized for its layout: a first reader
/// with defaults learns the layout, then `open` is called again for good.
/// Pairs count as expired `max_clock_drift` before their deadline.
pub(super) fn sized_reader(
    max_clock_drift: std::time::Duration,
    open: impl Fn(ReaderOptions) -> Result<RegionReader, ReadError>,
) -> Result<RegionReader, ReadError> {
    let expiry_margin_ms = u64::try_from(max_clock_drift.as_millis()).unwrap_or(u64::MAX);
    let probe = open(ReaderOptions {
        max_attempts: ReaderOptions::DEFAULT_MAX_ATTEMPTS,
        abandon_after_us: None,
        expiry_margin_ms,
    })?;
    open(ReaderOptions {
        expiry_margin_ms,
        ..ReaderOptions::for_layout(probe.layout())
    })
}

/// A reader of a remote region (rdma, ofi) over the session's `fabric`,
/// sized for its layout, with the client's clock drift bound.
#[cfg(any(feature = "rdma", feature = "ofi"))]
pub(super) fn remote_reader(
    router: &crate::routing::Router,
    fabric: Arc<dyn rdkv_fabric::Fabric>,
    descriptor: rdkv_fabric::RegionDescriptor,
    clock: &Arc<dyn rdkv_fabric::Clock>,
) -> Result<RegionReader, ReadError> {
    sized_reader(router.options().max_clock_drift, |options| {
        RegionReader::over(Arc::clone(&fabric), descriptor, Arc::clone(clock), options)
    })
}

impl OneSided {
    /// Learns members, leaders and sockets, and attaches to the regions
    /// this client can read one-sided.
    /// Then publishes the new view (also when the status could not be
    /// had: the old readers, fresh for another TTL, rather than a refresh
    /// per read).
    pub(super) async fn refresh(&self, topology: &mut Topology) {
        self.views.refresh_starts();
        // Whether the cluster has several shards decides how regions are
        // asked for: known before the first attach (once per client).
        self.router.learn_map().await;
        self.router.complete_map().await;
        match self.router.shard_map().filter(|_| self.router.is_sharded()) {
            Some(map) => self.refresh_shards(topology, map).await,
            None => self.refresh_group(topology).await,
        }
        self.report_in_background(topology);
        self.views.publish(ReadView::of(topology));
    }

    /// A single group: the members from one node's status, each member's
    /// region asked for as before sharding.
    async fn refresh_group(&self, topology: &mut Topology) {
        let status = tokio::time::timeout(STATUS_TIMEOUT, self.router.send(Request::Status)).await;
        let Ok(Ok(status)) = status.map(|r| r.and_then(|s| answer::<NodeStatus>(Op::Status, s)))
        else {
            return;
        };
        if topology.map.take().is_some() {
            // A map of several shards before: its regions are not a group's.
            topology.keep_only(&[]);
        }
        let mut claims = LeaderClaims::default();
        claims.note(ShardId(0), Some(status.term), status.leader_id);
        let mut wanted = Vec::new();
        for member in &status.members {
            // Each member's own view: its sockets and its region's epoch.
            let member_status = if member.id == status.id {
                Some(status.clone())
            } else {
                self.status_of(&member.client_addr).await
            };
            let at = RegionAt {
                shard: None,
                id: member.id,
                addr: &member.client_addr,
            };
            wanted.push(at.key());
            if let Some(member) = &member_status {
                claims.note(ShardId(0), Some(member.term), member.leader_id);
            }
            let epoch = member_status.as_ref().map(|s| s.region_epoch);
            self.refresh_member(topology, at, member_status.as_ref(), epoch)
                .await;
        }
        topology.leaders = claims.leaders();
        topology.keep_only(&wanted);
    }

    /// A map of several shards: every node of the map asked for its status
    /// (sockets) and its replicas' (leaders), and every shard's region on
    /// every member attached, the grant naming the shard.
    async fn refresh_shards(&self, topology: &mut Topology, map: Arc<ShardMap>) {
        if topology.map.is_none() {
            // A single group's regions (asked for unnamed) are not shard 0's.
            topology.keep_only(&[]);
        }
        // The map's hints carry no term: any replica's claim outranks them.
        let mut claims = LeaderClaims::default();
        for shard in map.shards() {
            claims.note(shard.id, None, shard.leader);
        }
        topology.map = Some(Arc::clone(&map));
        let mut wanted = Vec::new();
        for node in map.nodes() {
            let Some(addr) = node.client_addr.as_deref() else {
                continue;
            };
            let status = self.status_of(addr).await;
            for replica in self.shard_statuses_of(addr).await {
                let leader = match replica.role {
                    Role::Leader => Some(node.id),
                    _ => replica.leader_id,
                };
                claims.note(replica.shard, Some(replica.term), leader);
            }
            let hosted = map.shards().iter().filter(|s| s.members.contains(&node.id));
            for shard in hosted {
                let at = RegionAt {
                    shard: Some(shard.id),
                    id: node.id,
                    addr,
                };
                wanted.push(at.key());
                // A shard's region epoch is not in the node's status: a
                // retired region is replaced by its state word.
                self.refresh_member(topology, at, status.as_ref(), None)
                    .await;
            }
        }
        topology.leaders = claims.leaders();
        topology.keep_only(&wanted);
    }

    async fn status_of(&self, addr: &str) -> Option<NodeStatus> {
        let asked = self.router.send_to(addr, Request::Status);
        let response = tokio::time::timeout(STATUS_TIMEOUT, asked)
            .await
            .ok()?
            .ok()?;
        answer(Op::Status, response).ok()
    }

    /// The node's shard replicas (their roles); none if it cannot say.
    async fn shard_statuses_of(&self, addr: &str) -> Vec<ShardStatus> {
        let asked = self.router.send_to(addr, Request::ShardStatus);
        match tokio::time::timeout(STATUS_TIMEOUT, asked).await {
            Ok(Ok(response)) => answer(Op::ShardStatus, response).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Re-attaches to the region `at` unless its reader is current (serving,
    /// and of `epoch` when known) or an attach failed recently.
    async fn refresh_member(
        &self,
        topology: &mut Topology,
        at: RegionAt<'_>,
        status: Option<&NodeStatus>,
        epoch: Option<u64>,
    ) {
        let now = Instant::now();
        let node = topology.nodes.entry(at.key()).or_default();
        node.client_addr = at.addr.to_owned();
        if node.reads_current_region(epoch) || node.retry_attach_at.is_some_and(|at| at > now) {
            return;
        }
        if let Some(channel) = topology.retire_reader(at.key()) {
            self.router.pool().forget_channel(at.addr, &channel).await;
        }
        #[cfg(feature = "rdma")]
        if self.attach_rdma(topology, at, now).await {
            return;
        }
        #[cfg(feature = "ofi")]
        if self.attach_ofi(topology, at, status, now).await {
            return;
        }
        let reader = self.attach_local(at, status).await;
        let node = topology.nodes.entry(at.key()).or_default();
        node.retry_attach_at = reader.is_none().then_some(now + ATTACH_BACKOFF);
        node.reader = reader;
    }

    /// Sets up an RDMA session reading the region `at` (unless RDMA failed
    /// with it recently); its channel then carries this client's requests
    /// to the node (under a map of several shards each of the node's
    /// sessions in turn: the newest is used, and a retired one's requests
    /// go back to TCP until the next refresh).
    #[cfg(feature = "rdma")]
    async fn attach_rdma(&self, topology: &mut Topology, at: RegionAt<'_>, now: Instant) -> bool {
        let node = topology.nodes.entry(at.key()).or_default();
        let transport = self.router.options().transport;
        if !transport.allows_rdma() || node.retry_rdma_at.is_some_and(|at| at > now) {
            return false;
        }
        let addr = at.addr;
        let Some(attached) = self.rdma.attach(&self.router, at, &self.clock).await else {
            node.retry_rdma_at = Some(now + RDMA_BACKOFF);
            return false;
        };
        self.router
            .pool()
            .use_channel(addr, attached.channel())
            .await;
        node.reader = Some(attached.reader.clone());
        node.rdma = Some(attached);
        node.retry_attach_at = None;
        node.retry_rdma_at = None;
        true
    }

    /// Reads the region `at` over libfabric (unless that failed with it
    /// recently, or `Auto` would take libfabric's software tcp provider
    /// over a region this host can map).
    #[cfg(feature = "ofi")]
    async fn attach_ofi(
        &self,
        topology: &mut Topology,
        at: RegionAt<'_>,
        status: Option<&NodeStatus>,
        now: Instant,
    ) -> bool {
        let node = topology.nodes.entry(at.key()).or_default();
        let transport = self.router.options().transport;
        if !transport.allows_ofi() || node.retry_ofi_at.is_some_and(|at| at > now) {
            return false;
        }
        let software_only = status.is_some_and(|s| s.ofi.contains("tcp;ofi_rxm"));
        let mappable = status
            .and_then(|s| s.shm_socket.as_deref())
            .is_some_and(|p| Path::new(p).exists());
        if transport == crate::Transport::Auto && software_only && mappable {
            return false;
        }
        let Some(attached) = super::ofi::attach(&self.router, at, &self.clock).await else {
            node.retry_ofi_at = Some(now + OFI_BACKOFF);
            return false;
        };
        node.reader = Some(attached.reader.clone());
        node.ofi = Some(attached);
        node.retry_attach_at = None;
        node.retry_ofi_at = None;
        true
    }

    /// Maps the region `at` if its node is on this host (its shm socket
    /// exists), and then talks to that node over its Unix socket too
    /// (writes and control skip TCP).
    async fn attach_local(
        &self,
        at: RegionAt<'_>,
        status: Option<&NodeStatus>,
    ) -> Option<RegionReader> {
        let (socket, rpc_socket) = status
            .map(|s| (s.shm_socket.clone(), s.rpc_socket.clone()))
            .unwrap_or_default();
        let shm_allowed = self.router.options().transport.allows_shm();
        let reader = match socket.filter(|p| shm_allowed && Path::new(p).exists()) {
            Some(path) => self.attach_shm(Path::new(&path), at.shard).await,
            None => None,
        };
        if let Some(rpc) = rpc_socket.filter(|p| reader.is_some() && Path::new(p).exists())
            && let Err(e) = self
                .router
                .pool()
                .use_unix_socket(at.addr, Path::new(&rpc))
                .await
        {
            tracing::debug!(rpc, "unix socket unusable, staying on tcp: {e}");
        }
        reader
    }

    async fn attach_shm(&self, path: &Path, shard: Option<ShardId>) -> Option<RegionReader> {
        let options = self.router.options();
        let token = options.token.as_deref();
        let attachment = attach_shm_shard(path, token, &options.client_name, shard)
            .await
            .map_err(|e| tracing::debug!(path = %path.display(), "no shm attachment: {e}"))
            .ok()?;
        sized_reader(options.max_clock_drift, |reader_options| {
            RegionReader::attach(
                Arc::clone(&attachment.memory),
                Arc::clone(&self.clock),
                reader_options,
            )
        })
        .ok()
    }
}
