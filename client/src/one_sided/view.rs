//! What a one-sided read needs to know of the cluster, as one immutable
//! [`ReadView`] that a topology refresh builds and swaps in whole: readers
//! load it without a lock (a handle keeps its own copy and looks only at a
//! generation number), and never wait for a refresh.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use rdkv_fabric::clock::{boottime_now_us, unix_now_us};
use rdkv_fabric::{ReadTime, RegionReader};

use super::topology::Topology;

/// A refresh is wanted once a view is this old (the topology's TTL).
pub(super) const VIEW_TTL: Duration = Duration::from_secs(1);

/// The readers of the regions this client can read one-sided, the leader
/// among them, and the clock the reads of this view use.
#[derive(Debug, Default)]
pub(crate) struct ReadView {
    /// One reader per attached member region.
    pub(super) readers: Vec<RegionReader>,
    /// Which of `readers` is the leader's, if the leader's region is attached.
    pub(super) leader: Option<usize>,
    /// On the boottime clock: after this a refresh is wanted.
    pub(super) fresh_until_us: u64,
    /// Wall clock minus boottime (µs) when the view was built: a GET reads
    /// the boottime clock once and derives the wall clock from it (expiry,
    /// remote leases), so a wall-clock step reaches reads with the next
    /// refresh, within [`VIEW_TTL`].
    pub(super) wall_minus_boot_us: u64,
    /// Whether a refresh built it (the first view, before any, is empty).
    pub(super) built: bool,
}

impl ReadView {
    /// A view of `topology` as refreshed now.
    pub(super) fn of(topology: &Topology) -> ReadView {
        let boot_us = boottime_now_us();
        let mut readers = Vec::new();
        let mut leader = None;
        for (id, node) in &topology.nodes {
            if let Some(reader) = &node.reader {
                if Some(*id) == topology.leader {
                    leader = Some(readers.len());
                }
                readers.push(reader.clone());
            }
        }
        let ttl_us = u64::try_from(VIEW_TTL.as_micros()).unwrap_or(u64::MAX);
        ReadView {
            readers,
            leader,
            fresh_until_us: boot_us.saturating_add(ttl_us),
            wall_minus_boot_us: unix_now_us().saturating_sub(boot_us),
            built: true,
        }
    }

    pub(super) fn leader_reader(&self) -> Option<&RegionReader> {
        self.readers.get(self.leader?)
    }

    /// The one clock reading of a GET: boottime, with the wall clock
    /// derived from it.
    pub(super) fn now(&self) -> ReadTime {
        let boot_us = boottime_now_us();
        ReadTime {
            monotonic_us: boot_us,
            unix_ms: boot_us.saturating_add(self.wall_minus_boot_us) / 1_000,
        }
    }

    /// `time` (a reading of [`ReadView::now`]) on the wall clock, in µs.
    pub(super) fn unix_us(&self, time: ReadTime) -> u64 {
        time.monotonic_us.saturating_add(self.wall_minus_boot_us)
    }
}

/// The current view and the wish for a new one.
#[derive(Debug)]
pub(super) struct Views {
    current: ArcSwap<ReadView>,
    /// Bumped after each swap: a handle compares it with its own copy's.
    generation: AtomicU64,
    /// Set by a read that found its view old or its leader's lease gone;
    /// cleared when a refresh starts.
    wanted: AtomicBool,
    /// Wakes the background refresher (if handles started one).
    pub(super) wake: tokio::sync::Notify,
}

impl Default for Views {
    fn default() -> Self {
        Views {
            current: ArcSwap::from_pointee(ReadView::default()),
            generation: AtomicU64::new(0),
            wanted: AtomicBool::new(true),
            wake: tokio::sync::Notify::new(),
        }
    }
}

impl Views {
    /// The current view, without a lock.
    pub(super) fn load(&self) -> arc_swap::Guard<Arc<ReadView>> {
        self.current.load()
    }

    /// The current view and its generation, for a handle to keep.
    pub(super) fn load_full(&self) -> (Arc<ReadView>, u64) {
        let generation = self.generation.load(Ordering::Acquire);
        (self.current.load_full(), generation)
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn publish(&self, view: ReadView) {
        self.current.store(Arc::new(view));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Asks for a refresh (once until it starts); never blocks.
    pub(super) fn want_refresh(&self) {
        // A load first: a view past its TTL asks on every read until the
        // refresh starts, and a swap each time would be a locked
        // read-modify-write per GET (on a line every reader shares).
        if !self.wanted.load(Ordering::Acquire) && !self.wanted.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    pub(super) fn refresh_wanted(&self) -> bool {
        self.wanted.load(Ordering::Acquire)
    }

    /// A refresh starts: later wishes ask for the next one.
    pub(super) fn refresh_starts(&self) {
        self.wanted.store(false, Ordering::Release);
    }
}
