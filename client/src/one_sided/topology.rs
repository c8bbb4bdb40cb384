//! What the one-sided path knows of the cluster: the members, the leader and
//! a region reader per node it could attach to (over `rdma` or `shm`),
//! re-learned from the nodes' status when a read finds its view older than
//! `view::VIEW_TTL` (or its leader's lease gone); each refresh publishes a
//! new `ReadView` for the reads.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkv_fabric::{ReadError, ReadStats, ReaderOptions, RegionReader, attach_shm};
use rdkv_proto::region::RegionState;
use rdkv_proto::wire::{MemberInfo, NodeStatus, Op, Request};

use super::OneSided;
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
    /// Whether the node's reader reads its current region: serving, and of
    /// the epoch the node's `status` names (a restarted or snapshot-rebuilt
    /// node has a new one).
    fn reads_current_region(&self, status: Option<&NodeStatus>) -> bool {
        self.reader.as_ref().is_some_and(|r| {
            r.dynamic_header()
                .is_ok_and(|h| h.state == RegionState::Serving)
                && status.is_none_or(|s| s.region_epoch == r.layout().region_epoch)
        })
    }
}

#[derive(Debug, Default)]
pub(super) struct Topology {
    pub(super) leader: Option<u64>,
    pub(super) nodes: BTreeMap<u64, Node>,
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

    /// Drops node `id`'s reader (and session), keeping its counts; returns
    /// the retired RDMA session's channel, which the caller takes out of
    /// the pool.
    fn retire_reader(&mut self, id: u64) -> Retired {
        let node = self.nodes.entry(id).or_default();
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

    /// Keeps the nodes of `members` only, with their current addresses.
    fn keep_members(&mut self, members: &[MemberInfo]) {
        for member in members {
            if let Some(node) = self.nodes.get_mut(&member.id) {
                node.client_addr.clone_from(&member.client_addr);
            }
        }
        self.nodes
            .retain(|id, _| members.iter().any(|m| m.id == *id));
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
    /// Learns members, leader and sockets, and attaches to the regions of
    /// the nodes this client can read one-sided.
    /// Then publishes the new view (also when the status could not be
    /// had: the old readers, fresh for another TTL, rather than a refresh
    /// per read).
    pub(super) async fn refresh(&self, topology: &mut Topology) {
        self.views.refresh_starts();
        self.refresh_topology(topology).await;
        self.views.publish(ReadView::of(topology));
    }

    async fn refresh_topology(&self, topology: &mut Topology) {
        let status = tokio::time::timeout(STATUS_TIMEOUT, self.router.send(Request::Status)).await;
        let Ok(Ok(status)) = status.map(|r| r.and_then(|s| answer::<NodeStatus>(Op::Status, s)))
        else {
            return;
        };
        topology.leader = status.leader_id;
        for member in &status.members {
            // Each member's own view: its sockets and its region's epoch.
            let member_status = if member.id == status.id {
                Some(status.clone())
            } else {
                self.status_of(&member.client_addr).await
            };
            self.refresh_member(topology, member, member_status).await;
        }
        topology.keep_members(&status.members);
        self.report_in_background(topology);
    }

    async fn status_of(&self, addr: &str) -> Option<NodeStatus> {
        let asked = self.router.send_to(addr, Request::Status);
        let response = tokio::time::timeout(STATUS_TIMEOUT, asked)
            .await
            .ok()?
            .ok()?;
        answer(Op::Status, response).ok()
    }

    /// Re-attaches to `member`'s region unless its reader is current or an
    /// attach failed recently.
    async fn refresh_member(
        &self,
        topology: &mut Topology,
        member: &MemberInfo,
        status: Option<NodeStatus>,
    ) {
        let now = Instant::now();
        let node = topology.nodes.entry(member.id).or_default();
        if node.reads_current_region(status.as_ref())
            || node.retry_attach_at.is_some_and(|at| at > now)
        {
            return;
        }
        if let Some(channel) = topology.retire_reader(member.id) {
            self.router
                .pool()
                .forget_channel(&member.client_addr, &channel)
                .await;
        }
        #[cfg(feature = "rdma")]
        if self.attach_rdma(topology, member, now).await {
            return;
        }
        #[cfg(feature = "ofi")]
        if self
            .attach_ofi(topology, member, status.as_ref(), now)
            .await
        {
            return;
        }
        let reader = self.attach_local(member, status).await;
        let node = topology.nodes.entry(member.id).or_default();
        node.retry_attach_at = reader.is_none().then_some(now + ATTACH_BACKOFF);
        node.reader = reader;
    }

    /// Sets up an RDMA session with `member` (unless RDMA failed with it
    /// recently); its channel then carries this client's requests to it.
    #[cfg(feature = "rdma")]
    async fn attach_rdma(
        &self,
        topology: &mut Topology,
        member: &MemberInfo,
        now: Instant,
    ) -> bool {
        let node = topology.nodes.entry(member.id).or_default();
        let transport = self.router.options().transport;
        if !transport.allows_rdma() || node.retry_rdma_at.is_some_and(|at| at > now) {
            return false;
        }
        let addr = &member.client_addr;
        let Some(attached) = self.rdma.attach(&self.router, addr, &self.clock).await else {
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

    /// Reads `member`'s region over libfabric (unless that failed with it
    /// recently, or `Auto` would take libfabric's software tcp provider
    /// over a region this host can map).
    #[cfg(feature = "ofi")]
    async fn attach_ofi(
        &self,
        topology: &mut Topology,
        member: &MemberInfo,
        status: Option<&NodeStatus>,
        now: Instant,
    ) -> bool {
        let node = topology.nodes.entry(member.id).or_default();
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
        let Some(attached) =
            super::ofi::attach(&self.router, &member.client_addr, &self.clock).await
        else {
            node.retry_ofi_at = Some(now + OFI_BACKOFF);
            return false;
        };
        node.reader = Some(attached.reader.clone());
        node.ofi = Some(attached);
        node.retry_attach_at = None;
        node.retry_ofi_at = None;
        true
    }

    /// Maps `member`'s region if it is on this host (its shm socket exists),
    /// and then talks to it over its Unix socket too (writes and control
    /// skip TCP).
    async fn attach_local(
        &self,
        member: &MemberInfo,
        status: Option<NodeStatus>,
    ) -> Option<RegionReader> {
        let (socket, rpc_socket) = status
            .map(|s| (s.shm_socket, s.rpc_socket))
            .unwrap_or_default();
        let shm_allowed = self.router.options().transport.allows_shm();
        let reader = match socket.filter(|p| shm_allowed && Path::new(p).exists()) {
            Some(path) => self.attach_shm(Path::new(&path)).await,
            None => None,
        };
        if let Some(rpc) = rpc_socket.filter(|p| reader.is_some() && Path::new(p).exists())
            && let Err(e) = self
                .router
                .pool()
                .use_unix_socket(&member.client_addr, Path::new(&rpc))
                .await
        {
            tracing::debug!(rpc, "unix socket unusable, staying on tcp: {e}");
        }
        reader
    }

    async fn attach_shm(&self, path: &Path) -> Option<RegionReader> {
        let options = self.router.options();
        let attachment = attach_shm(path, options.token.as_deref(), &options.client_name)
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
