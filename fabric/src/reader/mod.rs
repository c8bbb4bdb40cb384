//! The lock-free reader: what a one-sided GET does, through any [`Fabric`].
//! It uses exactly the validation steps of `rdkv_proto::region::lookup` that a
//! remote reader uses, copies with atomic loads only (invariant 5), and either
//! returns one committed version of the key or retries (invariant 2).

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use rdkv_proto::region::{
    BlockError, BlockVerdict, ChainWalk, DYNAMIC_WORDS, DeadlineUnixMs, DynamicHeader,
    DynamicWords, HEADER_USED_BYTES, HeaderError, MAX_OVERFLOW_TABLE_BYTES, NO_DEADLINE,
    RegionLayout, SLOT_BYTES, SlotError, TableWords, ValueShape, dynamic_word, examine_block,
    expired_within, neighbourhood_slots,
};
use rdkv_proto::wire::Versioned;
use thiserror::Error;

use crate::clock::{Clock, DEFAULT_MAX_CLOCK_DRIFT_MS, unix_now_ms};
use crate::memory::RegionMemory;
use crate::read_stats::{ReadCounters, ReadStats, RetryCause};
use crate::transport::{Fabric, FabricError, MappedFabric, RegionDescriptor, RemoteRegion};

mod batch;
mod index_cache;
mod landing;
mod region;

pub use index_cache::{CachedLocation, IndexCache};
pub use landing::INLINE_KEY_BYTES;
use landing::{IntoBuffer, Landed, Landing, ValueInto, WholeBlock};
use region::Region;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderOptions {
    /// Attempts before giving up (the client then falls back to an RPC GET).
    pub max_attempts: u32,
    /// Abandon an attempt whose slot-to-copy time exceeds this; `None` never
    /// abandons (only for tests that want to provoke torn reads). Must stay
    /// below the region's grace period for invariant 3 to hold.
    pub abandon_after_us: Option<u64>,
    /// A pair counts as expired from `expiry_margin_ms` before its deadline
    /// on this reader's wall clock: the bound on the clock error between
    /// the leader that chose the deadline and this reader (the lease's
    /// `max_clock_drift`), so that no reader serves a pair past its
    /// deadline while the clocks agree within it.
    pub expiry_margin_ms: u64,
}

impl ReaderOptions {
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

    /// Defaults for a region: abandon after half its grace period; the
    /// default clock-drift bound as the expiry margin.
    pub fn for_layout(layout: &RegionLayout) -> ReaderOptions {
        ReaderOptions {
            max_attempts: ReaderOptions::DEFAULT_MAX_ATTEMPTS,
            abandon_after_us: Some(layout.grace_period_us / 2),
            expiry_margin_ms: DEFAULT_MAX_CLOCK_DRIFT_MS,
        }
    }
}

/// What made one attempt fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ReadProblem {
    #[error("slot: {0}")]
    Slot(SlotError),
    #[error("block: {0}")]
    Block(BlockError),
    #[error("the key's slot changed while its block was read")]
    Moved,
    #[error("attempt took {elapsed_us} µs, over the abandon bound")]
    Slow { elapsed_us: u64 },
}

impl ReadProblem {
    fn cause(self) -> RetryCause {
        match self {
            ReadProblem::Slot(_) => RetryCause::Slot,
            ReadProblem::Block(BlockError::Invalidated) => RetryCause::Invalidated,
            ReadProblem::Block(_) => RetryCause::Block,
            ReadProblem::Moved => RetryCause::Moved,
            ReadProblem::Slow { .. } => RetryCause::Slow,
        }
    }
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("region header: {0}")]
    Header(#[from] HeaderError),
    #[error("region memory is {len_bytes} bytes but its header says {region_bytes}")]
    ShortMapping { len_bytes: u64, region_bytes: u64 },
    /// Abandoning later than half the grace period would let a reader copy a
    /// block after it was reused (invariant 3).
    #[error(
        "abandon bound {abandon_after_us} µs exceeds half the grace period ({grace_period_us} µs)"
    )]
    AbandonBound {
        abandon_after_us: u64,
        grace_period_us: u64,
    },
    #[error("region epoch changed from {attached} to {found}: re-attach")]
    EpochChanged { attached: u64, found: u64 },
    /// Every attempt failed validation: the data is torn beyond the retry
    /// budget or corrupted. Nothing was returned.
    #[error("read gave up after {attempts} attempts; last problem: {last}")]
    Exhausted { attempts: u32, last: ReadProblem },
    /// `get_into`: the value (validated) is longer than the caller's buffer.
    #[error("the value is {needed} bytes, the buffer {len}")]
    BufferTooSmall { needed: usize, len: usize },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// What [`RegionReader::get_into`] found: the value is the first `len`
/// bytes of the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GotInto {
    pub len: usize,
    /// The Raft log index that wrote it.
    pub version: u64,
}

/// One reading of a GET's clock, in the two units a read judges: the
/// abandon bound (a monotonic microsecond count) and key expiry (wall-clock
/// unix milliseconds). A caller with one clock derives both from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTime {
    pub monotonic_us: u64,
    pub unix_ms: u64,
}

/// What one attempt looks for: a key and its fingerprint.
struct Probe<'a> {
    key: &'a [u8],
    fingerprint: u16,
}

pub(crate) fn slot_problem(error: SlotError) -> AttemptError {
    AttemptError::Retry(ReadProblem::Slot(error))
}

/// A value, its deadline, and where its block was.
pub(crate) struct Found {
    value: Versioned,
    deadline: DeadlineUnixMs,
    location: CachedLocation,
}

pub(crate) enum AttemptError {
    Retry(ReadProblem),
    Fatal(FabricError),
}

impl From<FabricError> for AttemptError {
    fn from(error: FabricError) -> Self {
        AttemptError::Fatal(error)
    }
}

#[derive(Debug, Clone)]
pub struct RegionReader {
    region: Region,
    layout: RegionLayout,
    options: ReaderOptions,
    clock: Arc<dyn Clock>,
    counters: Arc<ReadCounters>,
}

fn read_layout(region: &dyn RemoteRegion) -> Result<RegionLayout, ReadError> {
    let mut header = [0u8; HEADER_USED_BYTES];
    region.read(0, &mut header)?;
    let layout = RegionLayout::decode(&header)?;
    let len_bytes = region.descriptor().len_bytes;
    if len_bytes < layout.region_bytes {
        return Err(ReadError::ShortMapping {
            len_bytes,
            region_bytes: layout.region_bytes,
        });
    }
    Ok(layout)
}

impl RegionReader {
    /// A reader of memory mapped into this process (the `mem` transport, or
    /// a mapping obtained over `shm`): registers it with a private
    /// [`MappedFabric`] and attaches through that.
    pub fn attach(
        memory: Arc<RegionMemory>,
        clock: Arc<dyn Clock>,
        options: ReaderOptions,
    ) -> Result<RegionReader, ReadError> {
        let fabric = Arc::new(MappedFabric::new());
        // The epoch is not known before the header is read; the private
        // registry has this one region only.
        let remote = fabric.register(memory, 0, 0);
        RegionReader::over(fabric, remote, clock, options)
    }

    /// Validates the header of the region `remote` names on `fabric` and
    /// caches its geometry, as a remote client does when it connects.
    pub fn over(
        fabric: Arc<dyn Fabric>,
        remote: RegionDescriptor,
        clock: Arc<dyn Clock>,
        options: ReaderOptions,
    ) -> Result<RegionReader, ReadError> {
        let region = fabric.open(&remote)?;
        let layout = read_layout(region.as_ref())?;
        if let Some(abandon_after_us) = options
            .abandon_after_us
            .filter(|&a| a > layout.grace_period_us / 2)
        {
            return Err(ReadError::AbandonBound {
                abandon_after_us,
                grace_period_us: layout.grace_period_us,
            });
        }
        Ok(RegionReader {
            region: Region::new(region),
            layout,
            options,
            clock,
            counters: Arc::default(),
        })
    }

    pub fn layout(&self) -> &RegionLayout {
        &self.layout
    }

    /// Whether the region is on this host (see [`RemoteRegion::on_this_host`]).
    #[inline]
    pub fn on_this_host(&self) -> bool {
        self.region.on_this_host()
    }

    /// The dynamic header words (term, applied index, lease, state) without
    /// re-validating the static part: the per-GET check of a lease read.
    #[inline(always)]
    pub fn dynamic_header(&self) -> Result<DynamicHeader, ReadError> {
        // The dynamic words only (the static part was validated on attach
        // and is not looked at here), loaded as words: on a mapping, six
        // loads instead of a byte copy into a header-sized buffer.
        let mut words: DynamicWords = [0; DYNAMIC_WORDS];
        self.region
            .read_words(dynamic_word::RAFT_TERM, &mut words)?;
        Ok(DynamicHeader::from_words(&words))
    }

    /// The applied index word alone (one word load on a mapping): what a
    /// client notes after a read from this region.
    #[inline(always)]
    pub fn applied_index(&self) -> Result<u64, ReadError> {
        let mut word = [0u64];
        self.region
            .read_words(dynamic_word::APPLIED_INDEX, &mut word)?;
        Ok(word[0])
    }

    /// Re-validates the header (a remote client does this on its header
    /// refresh); an error means the cached geometry must not be used.
    pub fn check_header(&self) -> Result<DynamicHeader, ReadError> {
        let layout = read_layout(self.region.as_dyn())?;
        if layout != self.layout {
            return Err(ReadError::EpochChanged {
                attached: self.layout.region_epoch,
                found: layout.region_epoch,
            });
        }
        let mut header = [0u8; HEADER_USED_BYTES];
        self.region.read(0, &mut header)?;
        Ok(DynamicHeader::decode(&header)?)
    }

    pub fn stats(&self) -> ReadStats {
        self.counters.snapshot()
    }

    /// The time since `started_us` when it exceeds the abandon bound: the
    /// copy may overlap a block's reuse, so it must not be trusted.
    fn past_abandon_bound(&self, started_us: u64) -> Option<u64> {
        self.abandon_bound_between(started_us, self.clock.now_us())
    }

    /// The time from `started_us` to `now_us` when it exceeds the abandon
    /// bound.
    #[inline]
    fn abandon_bound_between(&self, started_us: u64, now_us: u64) -> Option<u64> {
        let limit_us = self.options.abandon_after_us?;
        let elapsed_us = now_us.saturating_sub(started_us);
        (elapsed_us > limit_us).then_some(elapsed_us)
    }

    /// One committed version of `key`, `None` if absent, or an error after
    /// `max_attempts` failed validations. Never returns unvalidated bytes.
    pub fn get(&self, key: &[u8]) -> Result<Option<Versioned>, ReadError> {
        Ok(self.get_located(key)?.map(|found| found.value))
    }

    /// Like [`RegionReader::get`], with the pair's deadline
    /// ([`NO_DEADLINE`]: none).
    pub fn get_with_deadline(
        &self,
        key: &[u8],
    ) -> Result<Option<(Versioned, DeadlineUnixMs)>, ReadError> {
        Ok(self
            .get_located(key)?
            .map(|found| (found.value, found.deadline)))
    }

    /// Whether a validated pair may be served: not expired, counting the
    /// margin. The wall clock is read only for pairs with a deadline.
    fn serves(&self, deadline: DeadlineUnixMs) -> bool {
        deadline == NO_DEADLINE || self.serves_at(deadline, unix_now_ms())
    }

    /// [`RegionReader::serves`] at a given wall-clock time.
    #[inline]
    fn serves_at(&self, deadline: DeadlineUnixMs, now_unix_ms: u64) -> bool {
        !expired_within(deadline, now_unix_ms, self.options.expiry_margin_ms)
    }

    fn get_located(&self, key: &[u8]) -> Result<Option<Found>, ReadError> {
        let mut last = None;
        for _ in 0..self.options.max_attempts {
            let mut whole = WholeBlock {
                started_us: self.clock.now_us(),
            };
            match self.attempt(key, &mut whole) {
                Ok(found) => {
                    // An expired pair is absent to every reader.
                    let found = found.filter(|found| self.serves(found.deadline));
                    self.counters.finished(found.is_some());
                    return Ok(found);
                }
                Err(AttemptError::Retry(problem)) => last = Some(self.retrying(problem)),
                Err(AttemptError::Fatal(error)) => return Err(error.into()),
            }
        }
        Err(self.gave_up(last))
    }

    /// Counts a failed attempt before the next.
    #[cold]
    #[inline(never)]
    fn retrying(&self, problem: ReadProblem) -> ReadProblem {
        let cause = problem.cause();
        self.counters.retry(cause);
        if cause == RetryCause::Invalidated {
            // The writer is between invalidating the old block and
            // publishing the new slot; if it was preempted there, spinning
            // through the attempts cannot help.
            std::thread::yield_now();
        }
        problem
    }

    #[cold]
    #[inline(never)]
    fn gave_up(&self, last: Option<ReadProblem>) -> ReadError {
        self.counters.exhausted();
        ReadError::Exhausted {
            attempts: self.options.max_attempts,
            last: last.unwrap_or(ReadProblem::Moved),
        }
    }

    /// [`RegionReader::get`] without allocating: the value is copied
    /// straight into `buf` (which holds it if `Ok(Some)`; anything else
    /// leaves its contents unspecified), checked by the same rules. The
    /// GET's clock is read through `now` once, after the copy (a key found:
    /// right after its block's copy, before the block is validated, which
    /// reads nothing more; absent: after the attempt), and that reading
    /// decides the abandon bound against `since` (a reading taken before
    /// this call began: a handle passes its previous GET's) and expiry;
    /// returned for the caller's own checks (a lease). Only when `since`
    /// is older than the abandon bound allows is the attempt made again and
    /// the clock read again; a fingerprint collision or a block read whole
    /// after its split read reads it once more too. Keys longer than
    /// [`INLINE_KEY_BYTES`], fingerprint collisions and values
    /// longer than `buf` read their block whole (that allocates).
    #[inline(always)]
    pub fn get_into(
        &self,
        key: &[u8],
        buf: &mut [u8],
        since: ReadTime,
        mut now: impl FnMut() -> ReadTime,
    ) -> Result<(Option<GotInto>, ReadTime), ReadError> {
        let mut since_us = since.monotonic_us;
        let mut last = None;
        for _ in 0..self.options.max_attempts {
            let mut landing = IntoBuffer {
                buf: &mut *buf,
                now: &mut now,
                matched_at: None,
            };
            let attempt = self.attempt(key, &mut landing);
            let time = match (&attempt, landing.matched_at) {
                // The matching block's copy was the attempt's last read:
                // the reading taken right after it is the GET's.
                (Ok(Some(_)), Some(time)) => time,
                // Anything else (absent, a retry) reads it after the attempt.
                _ => now(),
            };
            // Judged first: a copy that may have overlapped a block's reuse
            // is slow, whatever its validation said (as `get` judges it).
            let slow = self.abandon_bound_between(since_us, time.monotonic_us);
            let problem = match (attempt, slow) {
                (Err(AttemptError::Fatal(error)), _) => return Err(error.into()),
                (_, Some(elapsed_us)) => ReadProblem::Slow { elapsed_us },
                (Err(AttemptError::Retry(problem)), None) => problem,
                (Ok(found), None) => {
                    let got = self.answer_into(found, buf.len(), time)?;
                    return Ok((got, time));
                }
            };
            last = Some(self.retrying(problem));
            since_us = time.monotonic_us;
        }
        Err(self.gave_up(last))
    }

    /// A validated answer of `get_into` at `time`: absent if expired.
    #[inline]
    fn answer_into(
        &self,
        found: Option<ValueInto>,
        buf_len: usize,
        time: ReadTime,
    ) -> Result<Option<GotInto>, ReadError> {
        let found =
            found.filter(|f| f.deadline == NO_DEADLINE || self.serves_at(f.deadline, time.unix_ms));
        match found {
            // Not an answer: the caller reads again with a buffer that fits,
            // and that read is the one counted (and reported to the server).
            Some(found) if found.len > buf_len => Err(ReadError::BufferTooSmall {
                needed: found.len,
                len: buf_len,
            }),
            found => {
                self.counters.finished(found.is_some());
                Ok(found.map(|f| GotInto {
                    len: f.len,
                    version: f.version,
                }))
            }
        }
    }

    fn attempt<L: Landing>(
        &self,
        key: &[u8],
        landing: &mut L,
    ) -> Result<Option<L::Found>, AttemptError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        let hash = self.layout.key_hash(key);
        let (start, len) = self.layout.neighbourhood_range(hash);
        let words = self.region.read_neighbourhood(start, len)?;
        // With the loads of the copy before it, an acquire fence makes them
        // acquire loads: a block published by a slot seen here is seen whole.
        fence(Ordering::Acquire);
        let probe = Probe {
            key,
            fingerprint: hash.fingerprint,
        };
        if let Some(found) = self.search(&probe, start, words.as_slice(), landing)? {
            return Ok(Some(found));
        }
        let walk = ChainWalk::from_neighbourhood(words.as_slice()).map_err(slot_problem)?;
        self.search_chain(&probe, walk, landing)
    }

    /// After the neighbourhood missed: each table of the home bucket's
    /// overflow chain in turn, one read each, searched as the neighbourhood
    /// was. Tables are never freed, and a slot moves only forward along the
    /// reading order (an anchor's entry into the first table), so a key
    /// present throughout is found.
    fn search_chain<L: Landing>(
        &self,
        probe: &Probe<'_>,
        mut walk: ChainWalk,
        landing: &mut L,
    ) -> Result<Option<L::Found>, AttemptError> {
        while let Some(link) = walk.next_table() {
            // Inside the loop: a miss with no overflow table (the common
            // one) does not pay for clearing a table-sized buffer.
            let mut table_bytes = [0u8; MAX_OVERFLOW_TABLE_BYTES];
            let (offset, len) = self.layout.table_range(link).map_err(slot_problem)?;
            let table_bytes = &mut table_bytes[..len as usize];
            self.region.read(offset, table_bytes)?;
            // As after the neighbourhood read: entries seen here are whole.
            fence(Ordering::Acquire);
            let words = TableWords::decode(table_bytes);
            if let Some(found) = self.search(probe, offset, words.as_slice(), landing)? {
                return Ok(Some(found));
            }
            walk.advance(words.as_slice()).map_err(slot_problem)?;
        }
        Ok(None)
    }

    /// The key among the candidates of `words`, slot words read at region
    /// offset `words_at` (a neighbourhood or an overflow table); `landing`
    /// reads and judges each candidate's block.
    fn search<L: Landing>(
        &self,
        probe: &Probe<'_>,
        words_at: u64,
        words: &[u64],
        landing: &mut L,
    ) -> Result<Option<L::Found>, AttemptError> {
        for (position, slot) in neighbourhood_slots(words, probe.fingerprint) {
            let slot = slot.map_err(slot_problem)?;
            let (offset, block_len) = self.layout.block_range(slot).map_err(slot_problem)?;
            match landing.land(self, probe.key, offset, block_len)? {
                Landed::Match(found) => return Ok(Some(found)),
                Landed::OtherKey => {
                    let slot_offset = words_at + position as u64 * SLOT_BYTES;
                    self.check_unmoved(slot_offset, words[position])?;
                }
            }
        }
        Ok(None)
    }

    /// After a candidate's block held another key: a fingerprint collision
    /// if the slot at `slot_offset` still holds `seen`, else the block was
    /// reused under a slot that moved on (retry).
    fn check_unmoved(&self, slot_offset: u64, seen: u64) -> Result<(), AttemptError> {
        let mut again = [0u8; SLOT_BYTES as usize];
        self.region.read(slot_offset, &mut again)?;
        fence(Ordering::Acquire);
        if u64::from_le_bytes(again) != seen {
            return Err(AttemptError::Retry(ReadProblem::Moved));
        }
        Ok(())
    }

    /// Like [`RegionReader::get`], but first tries the key's cached block
    /// location: one read instead of two. The cached block must still hold
    /// this key at the cached version (a writer invalidates a block before
    /// replacing it, so a valid block at the cached version is current);
    /// anything else falls back to the slot read and refreshes the cache.
    pub fn get_cached(
        &self,
        key: &[u8],
        cache: &IndexCache,
    ) -> Result<Option<Versioned>, ReadError> {
        if let Some(location) = cache.lookup(key, self.layout.region_epoch) {
            if let Some(found) = self.read_cached(key, location)? {
                self.counters.cache_hit();
                return Ok(Some(found));
            }
            cache.forget(key);
        }
        self.counters.cache_miss();
        let found = self.get_located(key)?;
        Ok(found.map(|found| {
            cache.remember(key, found.location);
            found.value
        }))
    }

    fn read_cached(
        &self,
        key: &[u8],
        location: CachedLocation,
    ) -> Result<Option<Versioned>, ReadError> {
        let started_us = self.clock.now_us();
        let mut block = vec![0u8; location.block_len as usize];
        self.region.read(location.block_offset, &mut block)?;
        if self.past_abandon_bound(started_us).is_some() {
            return Ok(None);
        }
        match examine_block(&self.layout, key, &block) {
            BlockVerdict::Match(found) if found.version == location.version => {
                let shape = ValueShape::of(&found);
                // An expired pair falls back to the full read, which answers
                // absent: one rule, in `search`.
                Ok(self.serves(shape.deadline).then(|| shape.take(block)))
            }
            _ => Ok(None),
        }
    }
}
