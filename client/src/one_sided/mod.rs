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
//! - `Lease`: only from the leader's region, and only while the lease in
//!   its header runs at least `max_clock_drift` beyond now: on the boottime
//!   clock for a region on this host (`shm`; no clock step can move it), on
//!   the wall clock for a remote one (`rdma`; assumes the two hosts' wall
//!   clocks differ by less than `max_clock_drift`). Otherwise (no lease, a
//!   retired region, a node that stopped leading) the read goes to the
//!   server by RPC, which confirms leadership itself.
//! - `Follower { max_lag_entries }`: from any mapped replica whose applied
//!   index trails the leader's by at most the bound.
//! - `Linearizable`: always by RPC (ReadIndex).
//!
//! Both one-sided levels read only a region that has applied at least the
//! highest log index this client has seen (a region's applied index after a
//! read from it, a write's index, a value's version): one client's reads
//! never go back in time, even spread over replicas that lag differently.
//!
//! A read that keeps failing validation falls back to RPC as well.

mod choice;
#[cfg(feature = "rdma")]
mod rdma;
mod reports;
mod topology;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use rdkv_fabric::{Clock, IndexCache, MonotonicClock, ReadError, ReadStats, RegionReader};
use rdkv_proto::wire::{Consistency, Versioned};

use crate::options::Transport;
use crate::routing::Router;
use topology::Topology;

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

/// The one-sided read path of a client. It asks the [`Router`] for status
/// and hands it the channels it sets up; keys never go back up to it.
#[derive(Debug)]
pub(crate) struct OneSided {
    router: Arc<Router>,
    #[cfg(feature = "rdma")]
    rdma: rdma::Device,
    topology: tokio::sync::Mutex<Topology>,
    cache: IndexCache,
    counters: Counters,
    clock: Arc<dyn Clock>,
    /// Where the next follower read starts among the candidate replicas.
    spread: AtomicUsize,
    /// The highest log index this client has seen applied (see the module
    /// comment): no region behind it serves this client a read.
    seen_applied: AtomicU64,
    max_clock_drift_us: u64,
    use_cache: bool,
}

impl OneSided {
    pub(crate) fn new(router: Arc<Router>) -> OneSided {
        let options = router.options();
        let max_clock_drift = options.max_clock_drift;
        let cache_entries = options.index_cache_entries;
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
            seen_applied: AtomicU64::new(0),
            router,
        }
    }

    pub(crate) async fn stats(&self) -> OneSidedStats {
        let topology = self.topology.lock().await;
        let reads = topology
            .readers()
            .fold(topology.retired_stats, |sum, reader| {
                sum.plus(reader.stats())
            });
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OneSidedStats {
            served: get(&self.counters.served),
            fallbacks: get(&self.counters.fallbacks),
            lease_refusals: get(&self.counters.lease_refusals),
            lag_refusals: get(&self.counters.lag_refusals),
            reads,
        }
    }

    /// Reads `key` one-sided if `consistency` allows it right now; `None`
    /// means "ask the server".
    pub(crate) async fn get(
        &self,
        key: &[u8],
        consistency: Consistency,
    ) -> Option<Option<Versioned>> {
        let reader = self.reader(consistency).await?;
        let read = self.read_one(&reader, key);
        self.read_from(&reader);
        self.served(read, 1).await
    }

    /// Reads `keys` one-sided (one entry per key, in order) if `consistency`
    /// allows it right now; `None` means "ask the server".
    pub(crate) async fn get_many(
        &self,
        keys: &[Bytes],
        consistency: Consistency,
    ) -> Option<Vec<Option<Versioned>>> {
        let reader = self.reader(consistency).await?;
        let read = if keys.len() > 1 && !self.use_cache {
            // Its reads go out in two batches.
            reader.get_many(keys)
        } else {
            keys.iter().map(|key| self.read_one(&reader, key)).collect()
        };
        self.read_from(&reader);
        self.served(read, keys.len()).await
    }

    /// The highest log index this client has seen applied.
    fn seen(&self) -> u64 {
        self.seen_applied.load(Ordering::Acquire)
    }

    /// Notes that some replica had applied `index` (a response showed it).
    pub(crate) fn saw_applied(&self, index: u64) {
        self.seen_applied.fetch_max(index, Ordering::AcqRel);
    }

    /// After a read from `reader`: the state it returned is at most the
    /// region's applied index now (read after the value: a region moving on
    /// mid-read is covered too).
    fn read_from(&self, reader: &RegionReader) {
        if let Ok(applied) = reader.applied_index() {
            self.saw_applied(applied);
        }
    }

    fn read_one(&self, reader: &RegionReader, key: &[u8]) -> Result<Option<Versioned>, ReadError> {
        if self.use_cache {
            reader.get_cached(key, &self.cache)
        } else {
            reader.get(key)
        }
    }

    /// The reader that may serve a read at `consistency`, after re-learning
    /// the topology if it is old.
    async fn reader(&self, consistency: Consistency) -> Option<RegionReader> {
        let transport = self.router.options().transport;
        if transport == Transport::Tcp || consistency == Consistency::Linearizable {
            return None;
        }
        let mut topology = self.topology.lock().await;
        if topology.is_stale() {
            self.refresh(&mut topology).await;
        }
        self.reader_for(&mut topology, consistency)
    }

    /// Counts a read of `keys` keys that succeeded; `None` (ask the server)
    /// for one that failed.
    async fn served<T>(&self, read: Result<T, ReadError>, keys: usize) -> Option<T> {
        match read {
            Ok(values) => {
                self.counters
                    .served
                    .fetch_add(keys as u64, Ordering::Relaxed);
                Some(values)
            }
            Err(ReadError::Exhausted { .. }) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                tracing::debug!("one-sided read failed: {e}");
                // A lost RDMA session or a re-registered region: look again
                // (and reconnect) on the next read.
                self.topology.lock().await.refreshed_at = None;
                None
            }
        }
    }
}
