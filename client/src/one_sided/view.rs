//! What a one-sided read needs to know of the cluster, as one immutable
//! [`ReadView`] that a topology refresh builds and swaps in whole: readers
//! load it without a lock (a handle keeps its own copy and looks only at a
//! generation number), and never wait for a refresh.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use rdkv_fabric::clock::{boottime_now_us, unix_now_us, wall_minus_boottime_us};
use rdkv_fabric::{ReadTime, RegionReader};
use rdkv_proto::shard::{SLOT_COUNT, ShardId, ShardMap, key_slot};

use super::topology::Topology;

/// A refresh is wanted once a view is this old (the topology's TTL).
pub(super) const VIEW_TTL: Duration = Duration::from_secs(1);

/// The readers of one shard's regions (a single group: shard 0's), and
/// which of them is its leader's.
#[derive(Debug)]
pub(crate) struct GroupView {
    pub(super) shard: ShardId,
    /// One reader per attached member region.
    pub(super) readers: Vec<RegionReader>,
    /// Which of `readers` is the leader's, if its region is attached.
    pub(super) leader: Option<usize>,
}

impl GroupView {
    pub(super) fn leader_reader(&self) -> Option<&RegionReader> {
        self.readers.get(self.leader?)
    }
}

/// The readers of the regions this client can read one-sided, by shard,
/// and the clock the reads of this view use.
#[derive(Debug, Default)]
pub(crate) struct ReadView {
    /// One per shard of the map the view was built under (a single group:
    /// one, shard 0).
    pub(super) groups: Vec<GroupView>,
    /// Under a map of several shards: for each hash slot, the index in
    /// `groups` of the shard owning it (a key's group is one table load
    /// after its CRC16). `None`: every key is `groups[0]`'s.
    slot_groups: Option<Box<[u16]>>,
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
        let groups: Vec<GroupView> = topology
            .shards()
            .map(|shard| group_of(topology, shard))
            .collect();
        let slot_groups = topology.map.as_deref().map(|map| slot_table(map, &groups));
        let ttl_us = u64::try_from(VIEW_TTL.as_micros()).unwrap_or(u64::MAX);
        // The two clocks read side by side: whatever runs between them
        // counts into the offset, and would put the view's wall clock ahead
        // by it (keys expired early) for the view's life.
        let boot_us = boottime_now_us();
        let wall_minus_boot_us = wall_minus_boottime_us(boot_us, unix_now_us());
        ReadView {
            groups,
            slot_groups,
            fresh_until_us: boot_us.saturating_add(ttl_us),
            wall_minus_boot_us,
            built: true,
        }
    }

    /// The group of the shard owning `key` (`None`: no view yet, or a map
    /// without that shard).
    #[inline]
    pub(super) fn group_of(&self, key: &[u8]) -> Option<&GroupView> {
        let index = match &self.slot_groups {
            None => 0,
            Some(table) => usize::from(*table.get(usize::from(key_slot(key).get()))?),
        };
        self.groups.get(index)
    }

    /// The group of `keys` if they are all of one shard (`None`: keys of
    /// several, or none).
    pub(super) fn one_group_of<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Option<&GroupView> {
        let mut keys = keys.into_iter();
        let group = self.group_of(keys.next()?)?;
        keys.all(|key| self.group_of(key).is_some_and(|g| std::ptr::eq(g, group)))
            .then_some(group)
    }

    /// The one clock reading of a GET: boottime, with the wall clock
    /// derived from it.
    #[inline]
    pub(super) fn now(&self) -> ReadTime {
        let boot_us = boottime_now_us();
        ReadTime {
            monotonic_us: boot_us,
            unix_ms: boot_us.saturating_add(self.wall_minus_boot_us) / 1_000,
        }
    }

    /// `time` (a reading of [`ReadView::now`]) on the wall clock, in µs.
    #[inline]
    pub(super) fn unix_us(&self, time: ReadTime) -> u64 {
        time.monotonic_us.saturating_add(self.wall_minus_boot_us)
    }
}

/// Shard `shard`'s readers in `topology`, its leader's marked.
fn group_of(topology: &Topology, shard: ShardId) -> GroupView {
    let mut readers = Vec::new();
    let mut leader = None;
    let led_by = topology.leaders.get(&shard).copied();
    for ((_, id), node) in topology.nodes.range((shard, 0)..=(shard, u64::MAX)) {
        if let Some(reader) = &node.reader {
            if Some(*id) == led_by {
                leader = Some(readers.len());
            }
            readers.push(reader.clone());
        }
    }
    GroupView {
        shard,
        readers,
        leader,
    }
}

/// For each slot of `map`, the index in `groups` of its shard's group
/// (`u16::MAX`, which no group has, if `groups` lacks it).
fn slot_table(map: &ShardMap, groups: &[GroupView]) -> Box<[u16]> {
    let mut table = vec![u16::MAX; usize::from(SLOT_COUNT)];
    for range in map.ranges() {
        let index = groups
            .iter()
            .position(|g| g.shard == range.shard)
            .and_then(|i| u16::try_from(i).ok())
            .unwrap_or(u16::MAX);
        let slots = usize::from(range.first.get())..=usize::from(range.last.get());
        if let Some(part) = table.get_mut(slots) {
            part.fill(index);
        }
    }
    table.into_boxed_slice()
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

    #[inline]
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
