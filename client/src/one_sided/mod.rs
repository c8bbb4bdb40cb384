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
mod handle;
mod leaders;
#[cfg(feature = "ofi")]
mod ofi;
#[cfg(feature = "rdma")]
mod rdma;
mod reports;
mod topology;
mod view;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use rdkv_fabric::{
    Clock, IndexCache, MonotonicClock, ReadError, ReadStats, ReadTime, RegionReader, Striped,
};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{Consistency, Versioned};

pub use handle::{GetIntoError, NotServed, ReadHandle};

use crate::options::Transport;
use crate::routing::Router;
use topology::Topology;
use view::{GroupView, ReadView, Views};

/// Shards with a word of their own in `OneSided::seen_applied` (the map's
/// bound): ids beyond share one, which can only refuse a read (`Behind`),
/// never serve one behind.
const SEEN_SHARDS: usize = rdkv_proto::shard::MAX_SHARDS;

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

/// One stripe of the client's one-sided counters (see `Striped`).
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
    /// What refreshes know and change (members, attachments, reports);
    /// only refreshes (and stats) lock it, never a read.
    topology: tokio::sync::Mutex<Topology>,
    /// What reads use, swapped whole by each refresh.
    views: Arc<Views>,
    cache: IndexCache,
    counters: Striped<Counters>,
    clock: Arc<dyn Clock>,
    /// Where the next follower read starts among the candidate replicas.
    spread: Striped<AtomicUsize>,
    /// Per shard (its id modulo [`SEEN_SHARDS`]), the highest log index of
    /// its log this client has seen applied (see the module comment): no
    /// region of the shard behind it serves this client a read. Shards'
    /// logs are numbered apart, so each has its own.
    seen_applied: Box<[AtomicU64]>,
    max_clock_drift_us: u64,
    use_cache: bool,
    transport: Transport,
    default_consistency: Consistency,
    /// Handles refresh in the background: started by the first one.
    refresher_started: AtomicBool,
    me: Weak<OneSided>,
}

thread_local! {
    /// The async path's buffer for values (copied out into `Bytes`).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The last clock reading of a one-sided read on this thread (any
    /// client's: it is one clock): the abandon bound of the next read
    /// counts from it.
    static SINCE: Cell<ReadTime> = const {
        Cell::new(ReadTime {
            monotonic_us: 0,
            unix_ms: 0,
        })
    };
}

impl Drop for OneSided {
    fn drop(&mut self) {
        // The background refresher (if any) wakes, finds no client, ends.
        self.views.wake.notify_one();
    }
}

impl OneSided {
    pub(crate) fn new(router: Arc<Router>) -> Arc<OneSided> {
        let options = router.options();
        let max_clock_drift = options.max_clock_drift;
        let cache_entries = options.index_cache_entries;
        let transport = options.transport;
        let default_consistency = options.default_consistency;
        Arc::new_cyclic(|me| OneSided {
            #[cfg(feature = "rdma")]
            rdma: rdma::Device::default(),
            max_clock_drift_us: u64::try_from(max_clock_drift.as_micros()).unwrap_or(u64::MAX),
            use_cache: cache_entries > 0,
            topology: tokio::sync::Mutex::new(Topology::default()),
            views: Arc::default(),
            cache: IndexCache::new(cache_entries),
            counters: Striped::default(),
            clock: Arc::new(MonotonicClock::new()),
            spread: Striped::default(),
            seen_applied: (0..SEEN_SHARDS).map(|_| AtomicU64::new(0)).collect(),
            transport,
            default_consistency,
            refresher_started: AtomicBool::new(false),
            me: me.clone(),
            router,
        })
    }

    pub(crate) async fn stats(&self) -> OneSidedStats {
        let topology = self.topology.lock().await;
        let reads = topology
            .readers()
            .fold(topology.retired_stats, |sum, reader| {
                sum.plus(reader.stats())
            });
        OneSidedStats {
            served: self.counters.sum(|c| &c.served),
            fallbacks: self.counters.sum(|c| &c.fallbacks),
            lease_refusals: self.counters.sum(|c| &c.lease_refusals),
            lag_refusals: self.counters.sum(|c| &c.lag_refusals),
            reads,
        }
    }

    /// Reads `key` one-sided if `consistency` allows it right now; `None`
    /// means "ask the server". The synchronous path (`serve`), into this
    /// thread's buffer, then copied out.
    pub(crate) async fn get(
        &self,
        key: &[u8],
        consistency: Consistency,
    ) -> Option<Option<Versioned>> {
        if self.transport == Transport::Tcp || consistency == Consistency::Linearizable {
            return None;
        }
        let view = self.view_for_read().await;
        let group = view.group_of(key);
        if self.use_cache {
            let read = |reader: &RegionReader, _: ReadTime, view: &ReadView| {
                Ok((reader.get_cached(key, &self.cache)?, view.now()))
            };
            return self.serve_async(&view, group, consistency, 1, read);
        }
        SCRATCH.with_borrow_mut(|scratch| {
            // Twice at most: a value longer than the buffer says how long it is.
            for _ in 0..2 {
                let read = |reader: &RegionReader, since: ReadTime, view: &ReadView| {
                    reader.get_into(key, scratch, since, || view.now())
                };
                match self.serve_with_since(&view, group, consistency, 1, read) {
                    Ok(got) => {
                        return Some(got.map(|got| Versioned {
                            value: Bytes::copy_from_slice(&scratch[..got.len]),
                            version: got.version,
                        }));
                    }
                    Err(GetIntoError::BufferTooSmall { needed, .. }) => scratch.resize(needed, 0),
                    Err(GetIntoError::NotServed(_)) => return None,
                }
            }
            None
        })
    }

    /// Reads `keys` one-sided (one entry per key, in order) if `consistency`
    /// allows it right now; `None` means "ask the server".
    pub(crate) async fn get_many(
        &self,
        keys: &[Bytes],
        consistency: Consistency,
    ) -> Option<Vec<Option<Versioned>>> {
        if self.transport == Transport::Tcp || consistency == Consistency::Linearizable {
            return None;
        }
        let view = self.view_for_read().await;
        // One shard's keys (a client under a map of several splits an MGet
        // by shard before it comes here); keys of several go to the server.
        let group = view.one_group_of(keys.iter().map(|key| &key[..]))?;
        let read = |reader: &RegionReader, _: ReadTime, view: &ReadView| {
            let values = if keys.len() > 1 && !self.use_cache {
                // Its reads go out in two batches.
                reader.get_many(keys)?
            } else {
                keys.iter()
                    .map(|key| self.read_one(reader, key))
                    .collect::<Result<_, _>>()?
            };
            Ok((values, view.now()))
        };
        self.serve_async(&view, Some(group), consistency, keys.len() as u64, read)
    }

    /// `serve` for the async path: `None` for anything not served.
    fn serve_async<T>(
        &self,
        view: &ReadView,
        group: Option<&GroupView>,
        consistency: Consistency,
        keys: u64,
        read: impl handle::RegionRead<T>,
    ) -> Option<T> {
        self.serve_with_since(view, group, consistency, keys, read)
            .ok()
    }

    /// `serve` with this thread's last clock reading. Not inlined: the
    /// async paths' futures (and their polls) stay small.
    #[inline(never)]
    fn serve_with_since<T>(
        &self,
        view: &ReadView,
        group: Option<&GroupView>,
        consistency: Consistency,
        keys: u64,
        read: impl handle::RegionRead<T>,
    ) -> Result<T, GetIntoError> {
        let mut since = SINCE.get();
        let served = self.serve(view, group, consistency, &mut since, keys, read);
        SINCE.set(since);
        served
    }

    /// The view to read with. A wanted refresh is made now if none is
    /// running (and waited for only by the first read, which has no view
    /// at all); otherwise reads go on with the view they have.
    pub(super) async fn view_for_read(&self) -> arc_swap::Guard<Arc<ReadView>> {
        if self.views.refresh_wanted() {
            let topology = if self.views.load().built {
                self.topology.try_lock().ok()
            } else {
                Some(self.topology.lock().await)
            };
            if let Some(mut topology) = topology
                && self.views.refresh_wanted()
            {
                self.refresh(&mut topology).await;
            }
        }
        self.views.load()
    }

    /// A synchronous read handle (see [`ReadHandle`]).
    pub(crate) fn handle(self: &Arc<Self>) -> ReadHandle {
        ReadHandle::new(Arc::clone(self))
    }

    /// Refreshes in the background whenever a handle's read asks for it
    /// (started once, by the first handle, if a tokio runtime is running;
    /// without one, the async reads refresh).
    fn start_refresher(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refresher_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        let views = Arc::clone(&self.views);
        runtime.spawn(async move {
            loop {
                let Some(one_sided) = me.upgrade() else {
                    break;
                };
                if one_sided.views.refresh_wanted() {
                    let mut topology = one_sided.topology.lock().await;
                    if one_sided.views.refresh_wanted() {
                        one_sided.refresh(&mut topology).await;
                    }
                }
                drop(one_sided);
                views.wake.notified().await;
            }
        });
    }

    /// `shard`'s word of `seen_applied`.
    #[inline]
    fn seen_word(&self, shard: ShardId) -> Option<&AtomicU64> {
        let index = usize::try_from(shard.0).unwrap_or(usize::MAX) % SEEN_SHARDS;
        self.seen_applied.get(index)
    }

    /// The highest index of `shard`'s log this client has seen applied.
    #[inline]
    fn seen(&self, shard: ShardId) -> u64 {
        self.seen_word(shard)
            .map_or(0, |seen| seen.load(Ordering::Acquire))
    }

    /// Notes that some replica of `shard` had applied `index` (a response
    /// showed it). A load first: the shared word is written only when it
    /// moves.
    #[inline]
    pub(crate) fn saw_applied(&self, shard: ShardId, index: u64) {
        if let Some(seen) = self.seen_word(shard)
            && index > seen.load(Ordering::Acquire)
        {
            seen.fetch_max(index, Ordering::AcqRel);
        }
    }

    /// After a read from `reader`, of `shard`: the state it returned is at
    /// most the region's applied index now (read after the value: a region
    /// moving on mid-read is covered too).
    #[inline]
    fn read_from(&self, shard: ShardId, reader: &RegionReader) {
        if let Ok(applied) = reader.applied_index() {
            self.saw_applied(shard, applied);
        }
    }

    fn read_one(&self, reader: &RegionReader, key: &[u8]) -> Result<Option<Versioned>, ReadError> {
        if self.use_cache {
            reader.get_cached(key, &self.cache)
        } else {
            reader.get(key)
        }
    }
}
