//! One-sided GETs: the client reads the servers' regions itself, with the
//! same validation as every other reader (`rdkv_fabric::RegionReader`), so a
//! GET costs the server no CPU. Per server, the first transport that works:
//! - `rdma` (feature `rdma`, a device on both sides): RDMA READs of the
//!   region granted over an authenticated control connection; the session's
//!   SEND/RECV channel then carries this client's requests to that server.
//! - `shm` (servers on this host): the region mapped read-only (a memfd
//!   handed over after the token check).
//! - otherwise none: GETs are RPCs over TCP.
//!
//! Consistency, per read:
//! - `Lease`: only from the leader's region, and only while the lease word
//!   in its header says the lease runs at least `max_clock_drift` beyond the
//!   client's clock. Clock assumption: the client's and the leader's wall
//!   clocks differ by less than `max_clock_drift`. Otherwise (no lease, a
//!   retired region, a node that stopped leading) the read goes to the
//!   server by RPC, which confirms leadership itself.
//! - `Follower { max_lag_entries }`: from any mapped replica whose applied
//!   index trails the leader's by at most the bound.
//! - `Linearizable`: always by RPC (ReadIndex).
//!
//! A read that keeps failing validation falls back to RPC as well.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkv_fabric::clock::unix_now_us;
use rdkv_fabric::{
    Clock, IndexCache, MonotonicClock, ReadError, ReadStats, ReaderOptions, RegionReader,
    attach_shm,
};
use rdkv_proto::region::RegionState;
use rdkv_proto::wire::{Consistency, ReadReport, Request, Versioned};

use crate::Client;

/// How often the client re-learns which nodes exist and which one leads.
const TOPOLOGY_TTL: Duration = Duration::from_secs(1);
/// Budget of each status call of a refresh (GETs wait behind a refresh).
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a node whose region could not be attached is left alone.
const ATTACH_BACKOFF: Duration = Duration::from_secs(2);

/// How long a node whose RDMA session could not be set up is read through
/// the other transports before RDMA is tried again.
#[cfg(feature = "rdma")]
const RDMA_BACKOFF: Duration = Duration::from_secs(10);

/// Which transport serves GETs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// One-sided through `rdma` where both sides have a device, else through
    /// `shm` where the server is on this host, when the consistency level
    /// allows it; RPC over TCP otherwise.
    #[default]
    Auto,
    /// Always RPC over TCP.
    Tcp,
    /// Only one-sided through `shm`: a GET that cannot be served from a
    /// mapped region fails with `Error::OneSidedUnavailable` instead of
    /// going to the server (for benchmarks and for tests that must not touch
    /// the server's CPU).
    Shm,
    /// Only one-sided through `rdma`, like `Shm` otherwise. Needs the
    /// client built with the `rdma` feature.
    Rdma,
}

impl Transport {
    /// GETs that cannot be served one-sided fail instead of using RPC.
    pub fn is_one_sided_only(self) -> bool {
        matches!(self, Transport::Shm | Transport::Rdma)
    }

    #[cfg(feature = "rdma")]
    fn allows_rdma(self) -> bool {
        matches!(self, Transport::Auto | Transport::Rdma)
    }

    fn allows_shm(self) -> bool {
        matches!(self, Transport::Auto | Transport::Shm)
    }
}

/// What the one-sided path did, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OneSidedStats {
    /// GETs (keys of an MGet count one each) answered from a mapped region.
    pub served: u64,
    /// Reads that fell back to RPC because validation kept failing.
    pub fallbacks: u64,
    /// Lease reads refused because the leader's lease was absent or too close
    /// to expiry (served by RPC instead).
    pub lease_refusals: u64,
    /// Follower reads refused because no mapped replica was within the lag.
    pub lag_refusals: u64,
    /// Validation statistics of all region readers (retries by cause, cache
    /// hits and misses).
    pub reads: ReadStats,
}

#[derive(Debug, Default)]
struct Counters {
    served: AtomicU64,
    fallbacks: AtomicU64,
    lease_refusals: AtomicU64,
    lag_refusals: AtomicU64,
}

#[derive(Debug, Default)]
struct Node {
    reader: Option<RegionReader>,
    retry_attach_at: Option<Instant>,
    client_addr: String,
    /// The reader's counters when they were last reported to the node.
    reported: ReadStats,
    /// Counts of replaced readers not yet reported.
    unreported: ReadStats,
    /// The RDMA session `reader` reads through, if any, with its control
    /// connection (the server drops the queue pair when it closes).
    #[cfg(feature = "rdma")]
    rdma: Option<rdma::Attached>,
    #[cfg(feature = "rdma")]
    retry_rdma_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct Topology {
    refreshed_at: Option<Instant>,
    leader: Option<u64>,
    nodes: BTreeMap<u64, Node>,
    /// Readers of regions replaced since, kept for their statistics.
    retired_stats: ReadStats,
    /// Refusal counters when last reported (to the leader).
    reported_lease_refusals: u64,
    reported_lag_refusals: u64,
}

#[derive(Debug)]
pub(crate) struct OneSided {
    #[cfg(feature = "rdma")]
    rdma: rdma::Device,
    topology: tokio::sync::Mutex<Topology>,
    cache: IndexCache,
    counters: Counters,
    clock: Arc<dyn Clock>,
    spread: AtomicUsize,
    max_clock_drift_us: u64,
    use_cache: bool,
}

fn report_of(stats: ReadStats) -> ReadReport {
    ReadReport {
        reads: stats.reads,
        retries_slot: stats.retries_slot,
        retries_block: stats.retries_block,
        retries_invalidated: stats.retries_invalidated,
        retries_moved: stats.retries_moved,
        retries_slow: stats.retries_slow,
        rpc_fallbacks: stats.exhausted,
        cache_hits: stats.cache_hits,
        cache_misses: stats.cache_misses,
        lease_refusals: 0,
        lag_refusals: 0,
    }
}

/// Best effort: a report that cannot be delivered is dropped (metrics, not data).
async fn send_reports(client: &Client, reports: Vec<(String, ReadReport)>) {
    for (addr, report) in reports {
        let sent = tokio::time::timeout(
            STATUS_TIMEOUT,
            client.request_to(&addr, Request::ReportReads(report)),
        )
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            tracing::debug!(addr, "one-sided read report not delivered");
        }
    }
}

impl OneSided {
    pub(crate) fn new(cache_entries: usize, max_clock_drift: Duration) -> OneSided {
        OneSided {
            #[cfg(feature = "rdma")]
            rdma: rdma::Device::default(),
            max_clock_drift_us: u64::try_from(max_clock_drift.as_micros()).unwrap_or(u64::MAX),
            use_cache: cache_entries > 0,
            topology: tokio::sync::Mutex::new(Topology::default()),
            cache: IndexCache::new(cache_entries),
            counters: Counters::default(),
            clock: Arc::new(MonotonicClock::new()),
            spread: AtomicUsize::new(0),
        }
    }

    pub(crate) async fn stats(&self) -> OneSidedStats {
        let topology = self.topology.lock().await;
        let mut reads = topology.retired_stats;
        for reader in topology.nodes.values().filter_map(|n| n.reader.as_ref()) {
            reads = reads.plus(reader.stats());
        }
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OneSidedStats {
            served: get(&self.counters.served),
            fallbacks: get(&self.counters.fallbacks),
            lease_refusals: get(&self.counters.lease_refusals),
            lag_refusals: get(&self.counters.lag_refusals),
            reads,
        }
    }

    /// Learns members, leader and shm sockets, and maps the regions of the
    /// nodes on this host.
    async fn refresh(&self, client: &Client, topology: &mut Topology) {
        topology.refreshed_at = Some(Instant::now());
        let Ok(Ok(status)) = tokio::time::timeout(STATUS_TIMEOUT, client.status()).await else {
            return;
        };
        topology.leader = status.leader_id;
        let now = Instant::now();
        for member in &status.members {
            // Each member's own view: its sockets and its current region's
            // epoch (a restarted or snapshot-rebuilt node has a new one).
            let member_status = if member.id == status.id {
                Some(status.clone())
            } else {
                tokio::time::timeout(STATUS_TIMEOUT, client.status_of(&member.client_addr))
                    .await
                    .ok()
                    .and_then(Result::ok)
            };
            let node = topology.nodes.entry(member.id).or_default();
            let current = node.reader.as_ref().is_some_and(|r| {
                r.dynamic_header()
                    .is_ok_and(|h| h.state == RegionState::Serving)
                    && member_status
                        .as_ref()
                        .is_none_or(|s| s.region_epoch == r.layout().region_epoch)
            });
            if current || node.retry_attach_at.is_some_and(|at| at > now) {
                continue;
            }
            if let Some(old) = node.reader.take() {
                let old_stats = old.stats();
                node.unreported = node.unreported.plus(old_stats.since(node.reported));
                node.reported = ReadStats::default();
                topology.retired_stats = topology.retired_stats.plus(old_stats);
            }
            #[cfg(feature = "rdma")]
            {
                node.rdma = None;
                let transport = client.options().transport;
                if transport.allows_rdma() && node.retry_rdma_at.is_none_or(|at| at <= now) {
                    match self
                        .rdma
                        .attach(client, &member.client_addr, &self.clock)
                        .await
                    {
                        Some(attached) => {
                            client
                                .use_channel(&member.client_addr, attached.channel())
                                .await;
                            let node = topology.nodes.entry(member.id).or_default();
                            node.reader = Some(attached.reader.clone());
                            node.rdma = Some(attached);
                            node.retry_attach_at = None;
                            node.retry_rdma_at = None;
                            continue;
                        }
                        None => {
                            let node = topology.nodes.entry(member.id).or_default();
                            node.retry_rdma_at = Some(now + RDMA_BACKOFF);
                        }
                    }
                }
            }
            let (socket, rpc_socket) = member_status
                .map(|s| (s.shm_socket, s.rpc_socket))
                .unwrap_or_default();
            let shm_allowed = client.options().transport.allows_shm();
            let attached = match socket.filter(|p| shm_allowed && Path::new(p).exists()) {
                Some(path) => self.attach(client, Path::new(&path)).await,
                None => None,
            };
            // A node whose region this client can map is on this host: talk
            // to it over its Unix socket too (writes and control skip TCP).
            if let Some(rpc) = rpc_socket.filter(|p| attached.is_some() && Path::new(p).exists())
                && let Err(e) = client
                    .use_unix_socket(&member.client_addr, Path::new(&rpc))
                    .await
            {
                tracing::debug!(rpc, "unix socket unusable, staying on tcp: {e}");
            }
            let node = topology.nodes.entry(member.id).or_default();
            node.retry_attach_at = attached.is_none().then_some(now + ATTACH_BACKOFF);
            node.reader = attached;
        }
        for member in &status.members {
            if let Some(node) = topology.nodes.get_mut(&member.id) {
                node.client_addr.clone_from(&member.client_addr);
            }
        }
        topology
            .nodes
            .retain(|id, _| status.members.iter().any(|m| m.id == *id));
        // Servers never see one-sided reads: tell each node what was read
        // from its region, in the background, at most once per refresh.
        let reports = self.take_reports(topology);
        if !reports.is_empty() {
            let client = client.clone();
            tokio::spawn(async move { send_reports(&client, reports).await });
        }
    }

    /// Deltas since the last report, per node address: each node's region
    /// reads, and the refusals for the leader.
    fn take_reports(&self, topology: &mut Topology) -> Vec<(String, ReadReport)> {
        let leader = topology.leader;
        let mut reports = Vec::new();
        for (id, node) in &mut topology.nodes {
            let mut delta = std::mem::take(&mut node.unreported);
            if let Some(reader) = &node.reader {
                let now = reader.stats();
                delta = delta.plus(now.since(node.reported));
                node.reported = now;
            }
            let mut report = report_of(delta);
            if Some(*id) == leader {
                let lease = self.counters.lease_refusals.load(Ordering::Relaxed);
                let lag = self.counters.lag_refusals.load(Ordering::Relaxed);
                report.lease_refusals = lease.saturating_sub(topology.reported_lease_refusals);
                report.lag_refusals = lag.saturating_sub(topology.reported_lag_refusals);
                topology.reported_lease_refusals = lease;
                topology.reported_lag_refusals = lag;
            }
            if !report.is_empty() && !node.client_addr.is_empty() {
                reports.push((node.client_addr.clone(), report));
            }
        }
        reports
    }

    /// Sends what has not been reported yet, now.
    pub(crate) async fn flush_reports(&self, client: &Client) {
        let reports = {
            let mut topology = self.topology.lock().await;
            self.take_reports(&mut topology)
        };
        send_reports(client, reports).await;
    }

    async fn attach(&self, client: &Client, path: &Path) -> Option<RegionReader> {
        let options = client.options();
        let attachment = attach_shm(path, options.token.as_deref(), &options.client_name)
            .await
            .map_err(|e| tracing::debug!(path = %path.display(), "no shm attachment: {e}"))
            .ok()?;
        let probe = RegionReader::attach(
            Arc::clone(&attachment.memory),
            Arc::clone(&self.clock),
            ReaderOptions {
                max_attempts: ReaderOptions::DEFAULT_MAX_ATTEMPTS,
                abandon_after_us: None,
            },
        )
        .ok()?;
        let reader_options = ReaderOptions::for_layout(probe.layout());
        RegionReader::attach(attachment.memory, Arc::clone(&self.clock), reader_options).ok()
    }

    /// Reads `keys` one-sided if `consistency` allows it right now; `None`
    /// means "ask the server".
    pub(crate) async fn try_get(
        &self,
        client: &Client,
        keys: &[Bytes],
        consistency: Consistency,
    ) -> Option<Vec<Option<Versioned>>> {
        if client.options().transport == Transport::Tcp || consistency == Consistency::Linearizable
        {
            return None;
        }
        let mut topology = self.topology.lock().await;
        if topology
            .refreshed_at
            .is_none_or(|at| at.elapsed() > TOPOLOGY_TTL)
        {
            self.refresh(client, &mut topology).await;
        }
        let reader = match consistency {
            Consistency::Linearizable => return None,
            Consistency::Lease => self.lease_reader(&mut topology),
            Consistency::Follower { max_lag_entries } => {
                self.follower_reader(&topology, max_lag_entries)
            }
        }?;
        drop(topology);
        let read = if keys.len() > 1 && !self.use_cache {
            // An MGet: its reads go out in two batches.
            reader.get_many(keys)
        } else {
            keys.iter()
                .map(|key| {
                    if self.use_cache {
                        reader.get_cached(key, &self.cache)
                    } else {
                        reader.get(key)
                    }
                })
                .collect()
        };
        let values = match read {
            Ok(values) => values,
            Err(ReadError::Exhausted { .. }) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Err(e) => {
                tracing::debug!("one-sided read failed: {e}");
                // A lost RDMA session or a re-registered region: look again
                // (and reconnect) on the next read.
                self.topology.lock().await.refreshed_at = None;
                return None;
            }
        };
        self.counters
            .served
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        Some(values)
    }

    fn lease_reader(&self, topology: &mut Topology) -> Option<RegionReader> {
        let leader = topology.leader?;
        let reader = topology.nodes.get(&leader)?.reader.clone()?;
        let header = reader.dynamic_header().ok()?;
        let valid = header.state == RegionState::Serving
            && header.lease_deadline_unix_us.is_some_and(|deadline| {
                unix_now_us().saturating_add(self.max_clock_drift_us) < deadline
            });
        if valid {
            Some(reader)
        } else {
            self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
            // The leader may have changed: look again on the next read.
            topology.refreshed_at = None;
            None
        }
    }

    fn follower_reader(&self, topology: &Topology, max_lag_entries: u64) -> Option<RegionReader> {
        // The leader's published applied index is the reference only while
        // its lease holds: a leader cut off from its quorum (which may not
        // know it has been replaced) publishes a stale one.
        let now_us = unix_now_us();
        let leader_applied = topology
            .leader
            .and_then(|id| {
                topology
                    .nodes
                    .get(&id)?
                    .reader
                    .as_ref()?
                    .dynamic_header()
                    .ok()
            })
            .filter(|h| {
                h.state == RegionState::Serving
                    && h.lease_deadline_unix_us.is_some_and(|deadline| {
                        now_us.saturating_add(self.max_clock_drift_us) < deadline
                    })
            })
            .map(|h| h.applied_index);
        let candidates: Vec<&RegionReader> = topology
            .nodes
            .values()
            .filter_map(|n| n.reader.as_ref())
            .filter(|r| {
                let Ok(header) = r.dynamic_header() else {
                    return false;
                };
                let within = match leader_applied {
                    Some(leader) => leader.saturating_sub(header.applied_index) <= max_lag_entries,
                    // Without the leader's position only "any lag" is safe.
                    None => max_lag_entries == u64::MAX,
                };
                header.state == RegionState::Serving && within
            })
            .collect();
        if candidates.is_empty() {
            self.counters.lag_refusals.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let pick = self.spread.fetch_add(1, Ordering::Relaxed) % candidates.len();
        Some(candidates[pick].clone())
    }
}

#[cfg(feature = "rdma")]
mod rdma {
    //! Attaching to a node over RDMA: a dedicated control connection, the
    //! queue-pair exchange (`Request::RdmaConnect`), then a `RegionReader`
    //! over the session's RDMA fabric.

    use std::sync::{Arc, Mutex};

    use rdkv_fabric::rdma::verbs::read::descriptor_of;
    use rdkv_fabric::rdma::verbs::{RdmaClient, RdmaSession};
    use rdkv_fabric::rpc::{Connection, RpcChannel};
    use rdkv_fabric::{Clock, ReaderOptions, RegionReader};
    use rdkv_proto::wire::{Request, Response};

    use crate::Client;

    /// The client's device, opened on first use; `Err` remembers why RDMA
    /// is off for this client (logged once).
    #[derive(Debug, Default)]
    pub(super) struct Device {
        opened: Mutex<Option<Result<Arc<RdmaClient>, String>>>,
    }

    #[derive(Debug)]
    pub(super) struct Attached {
        pub(super) reader: RegionReader,
        session: Arc<RdmaSession>,
        _control: Connection,
    }

    impl Attached {
        pub(super) fn channel(&self) -> Arc<dyn RpcChannel> {
            Arc::clone(&self.session) as Arc<dyn RpcChannel>
        }
    }

    impl Device {
        fn get(&self, client: &Client) -> Option<Arc<RdmaClient>> {
            let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
            let result = opened.get_or_insert_with(|| {
                let wanted = client.options().rdma_device.clone();
                RdmaClient::open(wanted.as_deref()).map_err(|e| {
                    tracing::info!("rdma transport off for this client: {e}");
                    e.to_string()
                })
            });
            result.as_ref().ok().cloned()
        }

        pub(super) async fn attach(
            &self,
            client: &Client,
            addr: &str,
            clock: &Arc<dyn Clock>,
        ) -> Option<Attached> {
            let device = self.get(client)?;
            let control = client
                .dedicated_connection(addr)
                .await
                .map_err(|e| tracing::debug!(addr, "no rdma control connection: {e}"))
                .ok()?;
            let pending = device
                .prepare()
                .map_err(|e| tracing::debug!(addr, "no rdma queue pair: {e}"))
                .ok()?;
            let deadline = tokio::time::Instant::now() + client.options().connect_timeout;
            let request = Request::RdmaConnect {
                endpoint: pending.endpoint(),
            };
            let (endpoint, region) = match control.call(&request, deadline).await {
                Ok(Response::RdmaConnected { endpoint, region }) => (endpoint, region),
                Ok(other) => {
                    tracing::debug!(addr, "server refused rdma: {other:?}");
                    return None;
                }
                Err(e) => {
                    tracing::debug!(addr, "rdma connect failed: {e:?}");
                    return None;
                }
            };
            let session = pending
                .complete(endpoint, region, control.info().max_frame_bytes)
                .map_err(|e| tracing::debug!(addr, "rdma connect failed: {e}"))
                .ok()?;
            let fabric = session.fabric();
            let descriptor = descriptor_of(&region);
            let probe = RegionReader::over(
                Arc::clone(&fabric) as _,
                descriptor,
                Arc::clone(clock),
                ReaderOptions {
                    max_attempts: ReaderOptions::DEFAULT_MAX_ATTEMPTS,
                    abandon_after_us: None,
                },
            )
            .map_err(|e| tracing::debug!(addr, "rdma region unreadable: {e}"))
            .ok()?;
            let options = ReaderOptions::for_layout(probe.layout());
            let reader = RegionReader::over(fabric as _, descriptor, Arc::clone(clock), options)
                .map_err(|e| tracing::debug!(addr, "rdma region unreadable: {e}"))
                .ok()?;
            tracing::debug!(addr, "reading over rdma");
            Some(Attached {
                reader,
                session,
                _control: control,
            })
        }
    }
}
