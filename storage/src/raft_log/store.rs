//! `LogStore`: the segmented, CRC-framed, group-committed Raft log.

use rdkv_proto::shard::ShardId;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::IOFlushed;

use super::error::LogError;
use super::flusher::{Counters, Flusher};
use super::format::{
    self, LOCK_FILE, META_FILE, Meta, SEGMENT_HEADER_BYTES, VOTE_FILE, segment_file_name,
    segment_header,
};
use super::segment::{SegmentRecord, header_problem, scan_segment, segment_files};
use crate::raft::{Entry, LogId, TypeConfig, Vote};
use crate::record::RECORD_HEADER_BYTES;
use crate::{durability, failpoint};

pub const DEFAULT_SEGMENT_SIZE: u64 = 64 * 1024 * 1024;
/// How far ahead of the records an active segment's preallocation is
/// overwritten with zeros (`LogStore::zero_ahead`).
pub const ZERO_AHEAD_BYTES: u64 = 1024 * 1024;
/// What `zero_ahead` writes. Why a static: it exists once (1 MiB of the
/// executable's read-only data) and is never written; a fresh
/// `vec![0; 1 MiB]` per chunk cost the allocator fresh pages the kernel
/// cleared and the allocator zeroed again (4.8% of a follower's CPU under
/// update-only load).
static ZEROS: [u8; ZERO_AHEAD_BYTES as usize] = [0; ZERO_AHEAD_BYTES as usize];
/// The append buffer kept between appends is given back above this
/// capacity, so one huge batch does not pin its memory.
const APPEND_BUF_KEEP_BYTES: usize = 4 * 1024 * 1024;
pub const DEFAULT_MAX_RECORD_SIZE: u32 = 64 * 1024 * 1024;
pub const DEFAULT_CACHE_BYTES: usize = 16 * 1024 * 1024;

const RECORD_HEADER: u64 = RECORD_HEADER_BYTES as u64;

/// What a cached entry of `record_len` encoded bytes counts against
/// `cache_bytes`: its encoding and the cache's slot for it. Why the slot:
/// with small records (a RESP SET's is about 60 bytes) the 120-byte slots
/// were most of the cache's memory, and uncounted, a 16 MiB budget held
/// about 280,000 entries in some 50 MB.
fn cache_charge(record_len: u32) -> u32 {
    let slot = std::mem::size_of::<(Entry, u32)>() as u32;
    record_len.saturating_add(slot)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    /// A segment is closed (fsynced) and a new one started once the next
    /// record would take it past this size. A record larger than this gets a
    /// segment of its own.
    pub segment_size: u64,
    /// The largest encoded entry accepted by `append`, and the largest record
    /// length believed when reading (a larger length is corruption).
    pub max_record_size: u32,
    /// Recent entries kept decoded in memory so that replication of the
    /// log tail does not read the files, bounded by their encoded size plus
    /// the cache's own slot for each (`cache_charge`). 0 disables.
    pub cache_bytes: usize,
    /// The active segment is preallocated to `segment_size` (its tail of
    /// zeros is cut when the log rolls past it or closes), so that a group
    /// commit's `fdatasync` writes the data without a new file size.
    pub preallocate: bool,
    /// The shard this log belongs to: the `shard` label of its fsync
    /// histograms (a single group: shard 0).
    pub shard: ShardId,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_size: DEFAULT_SEGMENT_SIZE,
            max_record_size: DEFAULT_MAX_RECORD_SIZE,
            cache_bytes: DEFAULT_CACHE_BYTES,
            preallocate: true,
            shard: ShardId(0),
        }
    }
}

/// Counters since `open`, and the current shape of the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogStats {
    /// `fdatasync` calls on segment files: group commits, segment rolls,
    /// truncations, and the flush that precedes a vote. (Vote, meta and
    /// directory fsyncs are not counted.)
    pub fsyncs: u64,
    /// Total time spent in those fsyncs.
    pub fsync_nanos: u64,
    /// `append` calls.
    pub appends: u64,
    pub entries_appended: u64,
    /// Entries whose append callback was completed successfully.
    pub entries_flushed: u64,
    /// Group-commit rounds of the flusher (each one fsync).
    pub flush_rounds: u64,
    /// The most append callbacks completed by one fsync.
    pub max_batch: u64,
    /// Zeros written over preallocated space ahead of the records.
    pub bytes_zeroed_ahead: u64,
    pub bytes_on_disk: u64,
    pub segments: u64,
    /// First and last index present (after purge), `None` when empty.
    pub first_index: Option<u64>,
    pub last_index: Option<u64>,
}

/// The durable Raft log. A cheap `Clone` handle: clones share one log, and a
/// clone is also the `LogReader`. The directory is locked while any handle
/// is alive; the flusher thread stops when the last one is dropped.
#[derive(Clone)]
pub struct LogStore {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.shared.dir)
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

/// The vote as last made durable: seeded at open from the vote file, and set
/// by `save_vote` only once its write is durable (under the log's lock, so
/// it changes in disk order). Read without that lock, which `save_vote` and
/// segment rolls hold across fsync, so a reader never waits on the disk.
/// Never ahead of the disk: a save that fails leaves it as it was.
#[derive(Clone, Default)]
pub struct PersistedVote(Arc<arc_swap::ArcSwapOption<Vote>>);

impl PersistedVote {
    pub fn get(&self) -> Option<Vote> {
        self.0.load().as_deref().copied()
    }

    pub(crate) fn set(&self, vote: Vote) {
        self.0.store(Some(Arc::new(vote)));
    }
}

impl fmt::Debug for PersistedVote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PersistedVote").field(&self.get()).finish()
    }
}

struct Segment {
    file: Arc<File>,
    /// Bytes of the file that hold the header and intact records (the rest
    /// of an active segment is preallocated). Changed under the state lock;
    /// shared with the flusher, which syncs, and journals, that much.
    written: Arc<AtomicU64>,
    /// End of the zeros written ahead of the records (`zero_ahead`): past
    /// `written`, the bytes up to here are zeros written to the file, not
    /// preallocated ones. Under the state lock.
    zeroed_to: u64,
}

impl Segment {
    fn new(file: File, len: u64) -> Segment {
        Segment {
            file: Arc::new(file),
            written: Arc::new(AtomicU64::new(len)),
            zeroed_to: len,
        }
    }

    fn len(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    fn set_len(&self, len: u64) {
        self.written.store(len, Ordering::Release);
    }
}

/// Where one entry is: only this is kept per entry, not the payload.
#[derive(Clone, Copy)]
struct Loc {
    log_id: LogId,
    segment: u64,
    offset: u64,
    len: u32,
}

struct Inner {
    /// By first index; the last one is the active segment.
    segments: BTreeMap<u64, Segment>,
    /// The entries present, `first_index` onwards, consecutive.
    locs: VecDeque<Loc>,
    first_index: u64,
    meta: Meta,
    /// A suffix of the log: the entries `next_index - cache.len() ..`,
    /// each with what it is charged (`cache_charge`).
    cache: VecDeque<(Entry, u32)>,
    /// The sum of the cached entries' charges, within `cache_bytes`.
    cached_bytes: usize,
    /// Bumped whenever bytes of a segment may be rewritten (truncate_after),
    /// so a read done without the lock can tell that it must be redone.
    generation: u64,
    /// Opened at the first save of the committed index.
    committed_file: Option<format::CommittedFile>,
    /// The records of an append are encoded here; kept between appends
    /// (up to `APPEND_BUF_KEEP_BYTES`) so a batch's records are not built
    /// in memory the allocator must fetch fresh pages for each time.
    append_buf: Vec<u8>,
}

pub(crate) struct Shared {
    dir: PathBuf,
    dir_file: File,
    options: LogOptions,
    inner: Mutex<Inner>,
    counters: Arc<Counters>,
    flusher: Flusher,
    /// The log's vote, the one copy of it: set under `inner`'s lock (so in
    /// disk order), read without it by those that must not wait on a save.
    persisted_vote: PersistedVote,
    _lock: File,
}

enum Planned {
    Cached(Entry),
    Disk { file: Arc<File>, loc: Loc },
}

impl Inner {
    fn new(meta: Meta) -> Inner {
        Inner {
            segments: BTreeMap::new(),
            locs: VecDeque::new(),
            first_index: 0,
            meta,
            cache: VecDeque::new(),
            cached_bytes: 0,
            generation: 0,
            committed_file: None,
            append_buf: Vec::new(),
        }
    }

    fn next_index(&self) -> u64 {
        self.first_index + self.locs.len() as u64
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.locs.back().map(|l| l.log_id).or(self.meta.last_purged)
    }

    /// The index the next append must start at; `None` for a log that has
    /// neither entries nor a purge point (its first entry may be anything).
    fn expected_next(&self) -> Option<u64> {
        if self.locs.is_empty() {
            self.meta.last_purged.map(|p| p.index.saturating_add(1))
        } else {
            Some(self.next_index())
        }
    }

    /// Appends `loc`, and `entry` to the cache at a charge of
    /// `charge_bytes` against `cache_budget`.
    fn push(&mut self, loc: Loc, entry: Option<Entry>, charge_bytes: u32, cache_budget: usize) {
        if self.locs.is_empty() {
            self.first_index = loc.log_id.index;
            self.clear_cache();
        }
        self.locs.push_back(loc);
        match entry {
            Some(entry) if cache_budget > 0 => {
                self.cache.push_back((entry, charge_bytes));
                self.cached_bytes += charge_bytes as usize;
                while self.cached_bytes > cache_budget {
                    let Some((_, len)) = self.cache.pop_front() else {
                        break;
                    };
                    self.cached_bytes -= len as usize;
                }
            }
            // The cache must stay a suffix of the log.
            _ => self.clear_cache(),
        }
    }

    fn clear_cache(&mut self) {
        self.cache.clear();
        self.cached_bytes = 0;
    }

    /// Keeps the first `keep` entries.
    fn truncate_locs(&mut self, keep: usize) {
        let removed = self.locs.len().saturating_sub(keep);
        self.locs.truncate(keep);
        for _ in 0..removed {
            let Some((_, len)) = self.cache.pop_back() else {
                break;
            };
            self.cached_bytes -= len as usize;
        }
    }

    /// Forgets the entries up to `index` inclusive.
    fn drop_through(&mut self, index: u64) {
        let next = index.saturating_add(1);
        if next >= self.next_index() {
            self.locs.clear();
            self.clear_cache();
            self.first_index = next;
        } else if next > self.first_index {
            self.locs.drain(..(next - self.first_index) as usize);
            self.first_index = next;
            while self.cache.len() > self.locs.len() {
                if let Some((_, len)) = self.cache.pop_front() {
                    self.cached_bytes -= len as usize;
                }
            }
        }
    }

    /// The entries present in `[start, end)` if the cache holds them all,
    /// cloned straight into the result: the common read (the tail, for
    /// replication and apply) needs no plan of where each entry is.
    fn cached_range(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let present = self.present(start, end);
        let from = usize::try_from(present.start.checked_sub(self.cache_start())?).ok()?;
        let to = from + (present.end - present.start) as usize;
        Some(self.cache.range(from..to).map(|(e, _)| e.clone()).collect())
    }

    fn cached(&self, index: u64) -> Option<&Entry> {
        let i = index.checked_sub(self.cache_start())?;
        self.cache.get(i as usize).map(|(e, _)| e)
    }

    /// The index of the first cached entry (`next_index` when none is).
    fn cache_start(&self) -> u64 {
        self.next_index() - self.cache.len() as u64
    }

    /// The indexes of `[start, end)` the log holds (empty if none).
    fn present(&self, start: u64, end: u64) -> std::ops::Range<u64> {
        let next = self.next_index();
        let start = start.max(self.first_index).min(next);
        start..end.min(next).max(start)
    }
}

impl LogStore {
    /// Opens (creating if missing) the log in `dir` and recovers it: every
    /// record is checked; a torn tail of the last segment is cut off (with a
    /// warning), any other damage or a gap is an error.
    pub fn open(dir: impl AsRef<Path>, options: LogOptions) -> Result<LogStore, LogError> {
        let dir = dir.as_ref().to_path_buf();
        if options.segment_size == 0 || options.max_record_size == 0 {
            return Err(LogError::InvalidOptions(format!(
                "segment_size and max_record_size must be positive: {options:?}"
            )));
        }
        durability::create_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = open_rw(&lock_path, false)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(LogError::Locked { path: dir }),
            Err(fs::TryLockError::Error(e)) => return Err(LogError::io(&lock_path, e)),
        }
        let dir_file = File::open(&dir).map_err(|e| LogError::io(&dir, e))?;
        for name in [VOTE_FILE, META_FILE] {
            // Leftovers of a replacement interrupted before its rename.
            let tmp = dir.join(format!("{name}.tmp"));
            match durability::remove_file(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(LogError::io(&tmp, e)),
            }
        }
        let counters = Arc::new(Counters::for_shard(options.shard));
        counters.skip_append_fsync.store(
            failpoint::armed(failpoint::LOG_SKIP_APPEND_FSYNC),
            Ordering::Relaxed,
        );
        let (inner, vote) = recover(&dir, &dir_file, &options, &counters)?;
        let flusher = Flusher::start(counters.clone()).map_err(|e| LogError::io(&dir, e))?;
        let persisted_vote = PersistedVote::default();
        if let Some(vote) = vote {
            persisted_vote.set(vote);
        }
        Ok(LogStore {
            shared: Arc::new(Shared {
                dir,
                dir_file,
                options,
                inner: Mutex::new(inner),
                counters,
                flusher,
                persisted_vote,
                _lock: lock,
            }),
        })
    }

    /// Cuts the active segment's preallocated tail (and syncs): called at a
    /// clean stop, so that a closed log ends at its last record. Appends
    /// after it still work (past the cut, the file grows as it is written).
    pub fn trim_preallocation(&self) -> Result<(), LogError> {
        let inner = self.shared.lock()?;
        self.shared.check_writable()?;
        let Some((&key, active)) = inner.segments.last_key_value() else {
            return Ok(());
        };
        active
            .file
            .set_len(active.len())
            .map_err(|e| LogError::io(self.shared.segment_path(key), e))?;
        self.shared.sync_segment(&active.file, key, active.len())
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Failpoint for fault tests: every segment fsync from now on takes at
    /// least `delay` longer (zero removes the delay), as on a slow disk.
    pub fn set_fsync_delay(&self, delay: std::time::Duration) {
        self.shared.counters.fsync_delay_us.store(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Planted bug for power-loss tests (also armed by the failpoint
    /// `log-skip-append-fsync`): appends are acknowledged without their
    /// fsync, which only a simulated power cut can notice.
    pub fn set_skip_append_fsync(&self, skip: bool) {
        self.shared
            .counters
            .skip_append_fsync
            .store(skip, Ordering::Relaxed);
    }

    /// Test hook: while held, no group commit starts, so the appends made
    /// meanwhile are all completed by the one fsync that follows the
    /// release, as behind a slow disk, without depending on timing.
    #[doc(hidden)]
    pub fn hold_flushes(&self, held: bool) {
        self.shared.flusher.hold(held);
    }

    pub fn stats(&self) -> LogStats {
        self.shared.stats()
    }

    /// A handle on the vote as last made durable (see [`PersistedVote`]);
    /// it follows every later `save_vote` of this log.
    pub fn persisted_vote(&self) -> PersistedVote {
        self.shared.persisted_vote.clone()
    }

    /// Runs a write that fsyncs on the blocking pool (inline outside tokio).
    pub(crate) async fn blocking<T, F>(&self, f: F) -> Result<T, io::Error>
    where
        F: FnOnce(&Shared) -> Result<T, LogError> + Send + 'static,
        T: Send + 'static,
    {
        let shared = self.shared.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(move || f(&shared))
                .await
                .map_err(io::Error::other)?
                .map_err(io::Error::from),
            Err(_) => f(&shared).map_err(io::Error::from),
        }
    }
}

impl Shared {
    fn lock(&self) -> Result<MutexGuard<'_, Inner>, LogError> {
        self.inner.lock().map_err(|_| LogError::Poisoned)
    }

    fn segment_path(&self, first_index: u64) -> PathBuf {
        self.dir.join(segment_file_name(first_index))
    }

    fn check_writable(&self) -> Result<(), LogError> {
        match self.flusher.failure() {
            Some(failure) => Err(LogError::SyncFailed(failure)),
            None => Ok(()),
        }
    }

    /// Syncs a segment whose first `written_len` bytes are written.
    fn sync_segment(
        &self,
        file: &File,
        first_index: u64,
        written_len: u64,
    ) -> Result<(), LogError> {
        self.counters.sync(file, || written_len).map_err(|e| {
            self.flusher.poison(&e);
            LogError::io(self.segment_path(first_index), e)
        })
    }

    fn sync_dir(&self) -> Result<(), LogError> {
        durability::sync_dir(&self.dir_file, &self.dir).map_err(|e| {
            self.flusher.poison(&e);
            LogError::io(&self.dir, e)
        })
    }

    /// Preallocates the active segment `file` (at `path`) when the options ask.
    fn preallocate(&self, file: &File, path: &Path) -> Result<(), LogError> {
        preallocate_segment(file, path, &self.options)
    }

    fn remove_segment(&self, inner: &mut Inner, first_index: u64) -> Result<(), LogError> {
        let path = self.segment_path(first_index);
        match durability::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(path, e)),
        }
        inner.segments.remove(&first_index);
        Ok(())
    }

    pub(crate) fn append(
        &self,
        entries: Vec<Entry>,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), LogError> {
        let count = entries.len() as u64;
        let mut inner = self.lock()?;
        self.check_writable()?;
        let mut expected = inner.expected_next();
        let mut buf = std::mem::take(&mut inner.append_buf);
        buf.clear();
        let mut pending: Vec<(Entry, u32)> = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            if let Some(expected) = expected
                && expected != index
            {
                return Err(LogError::NotContiguous {
                    expected,
                    got: index,
                });
            }
            expected = Some(index.saturating_add(1));
            let start = buf.len();
            let len = format::encode_entry(&entry, self.options.max_record_size, &mut buf)?;
            let record = (buf.len() - start) as u64;
            let roll = match inner.segments.last_key_value() {
                None => true,
                Some((_, active)) => {
                    let used = active.len() + start as u64;
                    used > SEGMENT_HEADER_BYTES && used + record > self.options.segment_size
                }
            };
            if roll {
                self.write_pending(&mut inner, &buf[..start], &mut pending)?;
                buf.drain(..start);
                self.roll(&mut inner, index)?;
            }
            pending.push((entry, len));
        }
        self.write_pending(&mut inner, &buf, &mut pending)?;
        if buf.capacity() <= APPEND_BUF_KEEP_BYTES {
            inner.append_buf = buf;
        }
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        self.counters
            .entries_appended
            .fetch_add(count, Ordering::Relaxed);
        let active = inner
            .segments
            .last_key_value()
            .map(|(_, s)| (s.file.clone(), s.written.clone()));
        // Still under the state lock: the flusher always learns about the
        // newest active segment together with the newest callbacks.
        self.flusher.enqueue(callback, count, active);
        Ok(())
    }

    /// Writes the records in `bytes` (for `pending`) at the end of the active
    /// segment (to the page cache: readable at once, durable at the next
    /// fsync) and indexes them.
    fn write_pending(
        &self,
        inner: &mut Inner,
        bytes: &[u8],
        pending: &mut Vec<(Entry, u32)>,
    ) -> Result<(), LogError> {
        if pending.is_empty() {
            return Ok(());
        }
        let Some((&segment, active)) = inner.segments.iter_mut().next_back() else {
            return Err(LogError::io(
                &self.dir,
                io::Error::other("append without an active segment"),
            ));
        };
        let mut offset = active.len();
        active
            .file
            .write_all_at(bytes, offset)
            .map_err(|e| LogError::io(self.segment_path(segment), e))?;
        active.set_len(offset + bytes.len() as u64);
        self.zero_ahead(segment, active)?;
        let budget = self.options.cache_bytes;
        for (entry, len) in pending.drain(..) {
            let loc = Loc {
                log_id: entry.log_id,
                segment,
                offset,
                len,
            };
            offset += RECORD_HEADER + u64::from(len);
            inner.push(loc, Some(entry), cache_charge(len), budget);
        }
        Ok(())
    }

    /// Writes zeros over the next `ZERO_AHEAD_BYTES` of the preallocation
    /// once the records come within half of that of the zeros written
    /// before. Why: `fallocate` leaves unwritten extents, and ext4 converts
    /// the ones a record lands in with a journal commit inside that
    /// record's `fdatasync`; zeros written ahead are converted by one group
    /// commit per chunk instead of one per few records (three processes
    /// fsyncing 1,100-byte appends on this machine's disk: p50 98-154 µs
    /// into written zeros, 138-199 µs into `fallocate`d space). The zeros
    /// end at the preallocation's end, so the file's size never changes
    /// and recovery's rule (past the last record, zeros) still holds.
    fn zero_ahead(&self, segment: u64, active: &mut Segment) -> Result<(), LogError> {
        let written = active.len();
        if !self.options.preallocate || active.zeroed_to >= written + ZERO_AHEAD_BYTES / 2 {
            return Ok(());
        }
        let from = active.zeroed_to.max(written);
        let to = (from + ZERO_AHEAD_BYTES).min(self.options.segment_size);
        if to > from {
            let zeros = ZEROS.get(..(to - from) as usize).unwrap_or(&ZEROS);
            active
                .file
                .write_all_at(zeros, from)
                .map_err(|e| LogError::io(self.segment_path(segment), e))?;
            self.counters
                .bytes_zeroed_ahead
                .fetch_add(to - from, Ordering::Relaxed);
        }
        active.zeroed_to = to.max(written);
        Ok(())
    }

    /// Closes the active segment (its preallocated tail cut, fsync) and
    /// starts `seg-{first_index}`.
    fn roll(&self, inner: &mut Inner, first_index: u64) -> Result<(), LogError> {
        if let Some((&key, active)) = inner.segments.last_key_value() {
            // Only the last segment may end in zeros (recovery's rule).
            active
                .file
                .set_len(active.len())
                .map_err(|e| LogError::io(self.segment_path(key), e))?;
            self.sync_segment(&active.file, key, active.len())?;
        }
        if inner.segments.contains_key(&first_index) {
            return Err(LogError::io(
                self.segment_path(first_index),
                io::Error::new(io::ErrorKind::AlreadyExists, "segment already exists"),
            ));
        }
        let path = self.segment_path(first_index);
        let file = open_rw(&path, true)?;
        file.write_all_at(&segment_header(), 0)
            .map_err(|e| LogError::io(&path, e))?;
        self.preallocate(&file, &path)?;
        // The header is durable before the name: a cut can then leave a
        // torn tail after it, never a segment that recovery cannot identify.
        self.sync_segment(&file, first_index, SEGMENT_HEADER_BYTES)?;
        // The new name must be durable before entries in it are acknowledged.
        self.sync_dir()?;
        inner
            .segments
            .insert(first_index, Segment::new(file, SEGMENT_HEADER_BYTES));
        Ok(())
    }

    pub(crate) fn truncate_after(&self, last: Option<LogId>) -> Result<(), LogError> {
        let mut inner = self.lock()?;
        self.check_writable()?;
        let from = last
            .map_or(0, |l| l.index.saturating_add(1))
            .max(inner.first_index);
        if inner.locs.is_empty() || from >= inner.next_index() {
            return Ok(());
        }
        inner.generation += 1;
        // Whole segments first, newest first: an interruption leaves a
        // shorter log, never a hole.
        let doomed: Vec<u64> = inner
            .segments
            .range(from..)
            .map(|(k, _)| *k)
            .rev()
            .collect();
        for &key in &doomed {
            self.remove_segment(&mut inner, key)?;
            let keep = (key - inner.first_index) as usize;
            inner.truncate_locs(keep);
        }
        if !doomed.is_empty() {
            self.sync_dir()?;
        }
        let keep = (from - inner.first_index) as usize;
        if let Some(&loc) = inner.locs.get(keep)
            && let Some(segment) = inner.segments.get_mut(&loc.segment)
        {
            let path = self.dir.join(segment_file_name(loc.segment));
            // Cut, then preallocated again: the bytes past the new end read
            // as zeros, never as the removed records.
            segment
                .file
                .set_len(loc.offset)
                .map_err(|e| LogError::io(&path, e))?;
            segment.set_len(loc.offset);
            // Preallocated again past the cut, not written: zeroed anew.
            segment.zeroed_to = loc.offset;
            let file = segment.file.clone();
            self.preallocate(&file, &path)?;
            self.sync_segment(&file, loc.segment, loc.offset)?;
        }
        inner.truncate_locs(keep);
        Ok(())
    }

    pub(crate) fn purge(&self, log_id: LogId) -> Result<(), LogError> {
        let mut inner = self.lock()?;
        self.check_writable()?;
        if inner
            .meta
            .last_purged
            .is_some_and(|p| p.index >= log_id.index)
        {
            return Ok(());
        }
        let meta = Meta {
            last_purged: Some(log_id),
            ..inner.meta
        };
        // The purge point is durable before any file goes.
        format::write_meta(&self.dir, &self.dir_file, &meta)?;
        failpoint::hit(failpoint::LOG_PURGE_AFTER_META);
        inner.meta = meta;
        inner.drop_through(log_id.index);
        self.remove_purged_segments(&mut inner)
    }

    /// Deletes the segments whose entries are all purged, oldest first.
    fn remove_purged_segments(&self, inner: &mut Inner) -> Result<(), LogError> {
        let mut removed = false;
        while let Some(first) = oldest_purged_segment(inner) {
            self.remove_segment(inner, first)?;
            removed = true;
        }
        if removed {
            self.sync_dir()?;
        }
        Ok(())
    }

    pub(crate) fn save_vote(&self, vote: &Vote) -> Result<(), LogError> {
        let inner = self.lock()?;
        self.check_writable()?;
        // Writes are serialized: log data written before the vote is made
        // durable before it.
        if let Some((&key, active)) = inner.segments.last_key_value() {
            self.sync_segment(&active.file, key, active.len())?;
        }
        format::write_vote(&self.dir, &self.dir_file, vote)?;
        // Only now is the vote durable; still under the lock, so two saves
        // reach the cell in the order they reached the disk.
        self.persisted_vote.set(*vote);
        Ok(())
    }

    pub(crate) fn save_committed(&self, committed: Option<LogId>) -> Result<(), LogError> {
        let mut inner = self.lock()?;
        if inner.meta.committed == committed {
            return Ok(());
        }
        let file = match &mut inner.committed_file {
            Some(file) => file,
            empty => empty.insert(format::CommittedFile::open(&self.dir)?),
        };
        file.write(&self.dir, committed)?;
        inner.meta.committed = committed;
        Ok(())
    }

    pub(crate) fn vote(&self) -> Result<Option<Vote>, LogError> {
        // Under the lock, as a save sets it: a save in progress finishes first.
        let _inner = self.lock()?;
        Ok(self.persisted_vote.get())
    }

    pub(crate) fn committed(&self) -> Result<Option<LogId>, LogError> {
        Ok(self.lock()?.meta.committed)
    }

    pub(crate) fn log_state(&self) -> Result<(Option<LogId>, Option<LogId>), LogError> {
        let inner = self.lock()?;
        Ok((inner.meta.last_purged, inner.last_log_id()))
    }

    /// The entries present in `[start, end)`.
    pub(crate) fn read(&self, start: u64, end: u64) -> Result<Vec<Entry>, LogError> {
        self.read_around(start, end, || {})
    }

    /// `read`, with `meanwhile` run after the files are read and before the
    /// result is checked against truncations: tests truncate there.
    fn read_around(
        &self,
        start: u64,
        end: u64,
        meanwhile: impl FnOnce(),
    ) -> Result<Vec<Entry>, LogError> {
        let (plan, generation) = {
            let inner = self.lock()?;
            if let Some(entries) = inner.cached_range(start, end) {
                return Ok(entries);
            }
            (self.plan(&inner, start, end)?, inner.generation)
        };
        // Read the files without holding the lock, then check that no
        // truncation rewrote them meanwhile; if one did, read again under it.
        let result = self.fetch(plan);
        meanwhile();
        let inner = self.lock()?;
        if inner.generation == generation {
            return result;
        }
        let plan = self.plan(&inner, start, end)?;
        self.fetch(plan)
    }

    fn plan(&self, inner: &Inner, start: u64, end: u64) -> Result<Vec<Planned>, LogError> {
        let present = inner.present(start, end);
        let mut plan = Vec::with_capacity((present.end - present.start) as usize);
        for index in present {
            if let Some(entry) = inner.cached(index) {
                plan.push(Planned::Cached(entry.clone()));
                continue;
            }
            let loc = inner.locs[(index - inner.first_index) as usize];
            let Some(segment) = inner.segments.get(&loc.segment) else {
                return Err(LogError::io(
                    self.segment_path(loc.segment),
                    io::Error::new(io::ErrorKind::NotFound, "indexed segment is gone"),
                ));
            };
            plan.push(Planned::Disk {
                file: segment.file.clone(),
                loc,
            });
        }
        Ok(plan)
    }

    fn fetch(&self, plan: Vec<Planned>) -> Result<Vec<Entry>, LogError> {
        plan.into_iter()
            .map(|p| match p {
                Planned::Cached(entry) => Ok(entry),
                Planned::Disk { file, loc } => format::read_entry_at(
                    &file,
                    &self.segment_path(loc.segment),
                    loc.offset,
                    loc.len,
                    &loc.log_id,
                ),
            })
            .collect()
    }

    fn stats(&self) -> LogStats {
        let c = &self.counters;
        let mut stats = LogStats {
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            fsync_nanos: c.fsync_nanos.load(Ordering::Relaxed),
            appends: c.appends.load(Ordering::Relaxed),
            entries_appended: c.entries_appended.load(Ordering::Relaxed),
            entries_flushed: c.entries_flushed.load(Ordering::Relaxed),
            flush_rounds: c.flush_rounds.load(Ordering::Relaxed),
            max_batch: c.max_batch.load(Ordering::Relaxed),
            bytes_zeroed_ahead: c.bytes_zeroed_ahead.load(Ordering::Relaxed),
            ..LogStats::default()
        };
        if let Ok(inner) = self.lock() {
            stats.bytes_on_disk = inner.segments.values().map(Segment::len).sum();
            stats.segments = inner.segments.len() as u64;
            stats.first_index = (!inner.locs.is_empty()).then_some(inner.first_index);
            stats.last_index = inner.locs.back().map(|l| l.log_id.index);
        }
        stats
    }
}

/// Opens `path` to read and write, creating it if missing; `truncate`
/// empties a file that exists.
fn open_rw(path: &Path, truncate: bool) -> Result<File, LogError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .open(path)
        .map_err(|e| LogError::io(path, e))
}

/// The oldest segment, when every entry in it is at or below the purge point.
fn oldest_purged_segment(inner: &Inner) -> Option<u64> {
    let purged = inner.meta.last_purged?;
    let mut keys = inner.segments.keys();
    let first = *keys.next()?;
    let all_purged = match keys.next() {
        // Its entries end just before the next segment's first.
        Some(&next) => next <= purged.index.saturating_add(1),
        // The last segment: all purged when no entry is left.
        None => inner.locs.is_empty(),
    };
    all_purged.then_some(first)
}

fn recover(
    dir: &Path,
    dir_file: &File,
    options: &LogOptions,
    counters: &Counters,
) -> Result<(Inner, Option<Vote>), LogError> {
    let mut meta = format::read_meta(dir)?;
    meta.committed = format::read_committed(dir).or(meta.committed);
    let vote = format::read_vote(dir)?;
    let names = segment_files(dir)?;
    let mut inner = Inner::new(meta);
    let count = names.len();
    let mut dir_dirty = false;
    for (i, (first, path)) in names.into_iter().enumerate() {
        let place = SegmentPlace {
            first,
            last: i + 1 == count,
            expected_first: (!inner.locs.is_empty()).then(|| inner.next_index()),
        };
        match recover_segment(path, place, options, counters)? {
            RecoveredSegment::Removed => dir_dirty = true,
            RecoveredSegment::Kept { segment, records } => {
                for record in records {
                    let loc = Loc {
                        log_id: record.log_id,
                        segment: first,
                        offset: record.offset,
                        len: record.len,
                    };
                    inner.push(loc, None, 0, 0);
                }
                inner.segments.insert(first, segment);
            }
        }
    }
    if dir_dirty {
        durability::sync_dir(dir_file, dir).map_err(|e| LogError::io(dir, e))?;
    }
    finish_purge(dir, dir_file, &mut inner)?;
    cap_committed(&mut inner);
    Ok((inner, vote))
}

/// Where a segment file stands among those recovery found.
struct SegmentPlace {
    /// The first index, from its name.
    first: u64,
    /// The newest segment: the only one a crash may have left torn or empty.
    last: bool,
    /// The index the entries recovered so far call for next (`None`: none yet).
    expected_first: Option<u64>,
}

/// What recovery made of one segment file.
enum RecoveredSegment {
    /// Its intact records (a torn tail cut off and synced) and the open file.
    Kept {
        segment: Segment,
        records: Vec<SegmentRecord>,
    },
    /// The last segment, deleted: its header was never written or it held no
    /// intact entry, so nothing in it was ever acknowledged.
    Removed,
}

/// Checks one segment file; only the last one may be repaired (cut or
/// removed), damage anywhere else is an error that loses nothing.
fn recover_segment(
    path: PathBuf,
    place: SegmentPlace,
    options: &LogOptions,
    counters: &Counters,
) -> Result<RecoveredSegment, LogError> {
    let io_err = |e| LogError::io(&path, e);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_err)?;
    let size = file.metadata().map_err(io_err)?.len();
    if let Some((reason, never_written)) = header_problem(&file, size).map_err(io_err)? {
        // A segment whose creation was interrupted: nothing in it was
        // ever acknowledged.
        if place.last && never_written {
            tracing::warn!(segment = %path.display(), size, %reason, "raft log: removing a segment whose header was never written");
            durability::remove_file(&path).map_err(io_err)?;
            return Ok(RecoveredSegment::Removed);
        }
        return Err(LogError::BadSegmentHeader { path, reason });
    }
    if let Some(expected) = place.expected_first
        && place.first != expected
    {
        return Err(LogError::Gap {
            path,
            expected,
            found: place.first,
        });
    }
    let scan = scan_segment(&file, &path, place.first, size, options.max_record_size)?;
    if let Some((offset, damage)) = scan.damage {
        if !place.last {
            return Err(LogError::CorruptSegment {
                path,
                offset,
                damage,
            });
        }
        if is_zero_tail(&file, offset, size).map_err(io_err)? {
            // The preallocated tail of a log that was not closed: no damage.
            tracing::debug!(segment = %path.display(), offset, "raft log: cutting the preallocated tail");
        } else {
            tracing::warn!(
                segment = %path.display(),
                offset,
                dropped_bytes = size - offset,
                intact_entries = scan.records.len(),
                %damage,
                "raft log: truncating a torn tail of the last segment"
            );
        }
        file.set_len(offset).map_err(io_err)?;
    }
    if scan.records.is_empty() {
        if !place.last {
            return Err(LogError::EmptySegment { path });
        }
        tracing::warn!(segment = %path.display(), "raft log: removing the last segment, it holds no intact entry");
        durability::remove_file(&path).map_err(io_err)?;
        return Ok(RecoveredSegment::Removed);
    }
    if place.last {
        // The active segment again: appends go on into its preallocation.
        preallocate_segment(&file, &path, options)?;
        // What the log reports from now on must be durable, and a killed
        // process leaves its unsynced writes in the page cache, where
        // they read back as intact records: sync them (and a cut tail).
        counters.sync(&file, || scan.end).map_err(io_err)?;
    }
    Ok(RecoveredSegment::Kept {
        segment: Segment::new(file, scan.end),
        records: scan.records,
    })
}

/// Preallocates the active segment `file` (at `path`) to the segment size
/// when `options` ask; a filesystem that cannot is noted once per segment.
fn preallocate_segment(file: &File, path: &Path, options: &LogOptions) -> Result<(), LogError> {
    if !options.preallocate {
        return Ok(());
    }
    let done =
        durability::preallocate(file, options.segment_size).map_err(|e| LogError::io(path, e))?;
    if !done {
        tracing::debug!(segment = %path.display(), "raft log: the filesystem cannot preallocate");
    }
    Ok(())
}

/// Whether `file` is all zeros from `offset` to `size` (read in chunks).
fn is_zero_tail(file: &File, offset: u64, size: u64) -> io::Result<bool> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK.min(size.saturating_sub(offset)) as usize];
    let mut at = offset;
    while at < size {
        let chunk = &mut buf[..CHUNK.min(size - at) as usize];
        file.read_exact_at(chunk, at)?;
        if chunk.iter().any(|b| *b != 0) {
            return Ok(false);
        }
        at += chunk.len() as u64;
    }
    Ok(true)
}

/// Drops the entries at or below the saved purge point, and finishes a purge
/// that was interrupted after its meta write (its segment files remain).
fn finish_purge(dir: &Path, dir_file: &File, inner: &mut Inner) -> Result<(), LogError> {
    let Some(purged) = inner.meta.last_purged else {
        return Ok(());
    };
    inner.drop_through(purged.index);
    let mut removed = false;
    while let Some(first) = oldest_purged_segment(inner) {
        let path = dir.join(segment_file_name(first));
        durability::remove_file(&path).map_err(|e| LogError::io(&path, e))?;
        inner.segments.remove(&first);
        removed = true;
    }
    if removed {
        durability::sync_dir(dir_file, dir).map_err(|e| LogError::io(dir, e))?;
    }
    let expected = purged.index.saturating_add(1);
    if !inner.locs.is_empty() && inner.first_index != expected {
        let first_segment = inner.segments.keys().next().copied().unwrap_or_default();
        return Err(LogError::Gap {
            path: dir.join(segment_file_name(first_segment)),
            expected,
            found: inner.first_index,
        });
    }
    Ok(())
}

/// The committed index is saved without fsync and may name entries whose
/// own write never became durable (a follower applies what the leader
/// committed once the entry is submitted, not fsynced). An entry cut off
/// in recovery cannot be committed here: cap it, and the leader resends it.
fn cap_committed(inner: &mut Inner) {
    let last = inner.last_log_id();
    if let Some(committed) = inner.meta.committed
        && last.is_none_or(|last| committed.index > last.index)
    {
        tracing::warn!(
            committed = committed.index,
            last = ?last.map(|l| l.index),
            "the saved committed index is past the end of the recovered log; capping it"
        );
        inner.meta.committed = last;
    }
}

/// The entry cache of `Inner`. A cache miss falls back to reading the
/// segment, so reads through `LogStore` cannot tell a wrong cache from an
/// empty one: these tests look at the cache itself.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::XorShift;
    use openraft::entry::RaftEntry;

    fn lid(index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(1, 1, index)
    }

    fn loc(index: u64, len: u32) -> Loc {
        Loc {
            log_id: lid(index),
            segment: 0,
            offset: 0,
            len,
        }
    }

    fn empty_log() -> Inner {
        Inner::new(Meta::default())
    }

    /// Appends entry `index`, charged its record length `len` (the cache's
    /// rules are the same whatever the charge).
    fn push(inner: &mut Inner, index: u64, len: u32, budget: usize) {
        inner.push(
            loc(index, len),
            Some(Entry::new_blank(lid(index))),
            len,
            budget,
        );
    }

    fn push_uncacheable(inner: &mut Inner, index: u64, len: u32, budget: usize) {
        inner.push(loc(index, len), None, len, budget);
    }

    /// Asserts every rule of the cache, given that exactly the newest
    /// `cached` entries of the log are expected in it: it is a suffix of the
    /// log (`cached(i)` gives entry i for those and `None` for every other
    /// index), `cached_bytes` is the sum of their charges (here, with the
    /// `push` helpers, their record lengths), and that sum is within the
    /// budget.
    fn assert_cache(inner: &Inner, budget: usize, cached: usize) {
        assert!(
            cached <= inner.locs.len(),
            "the model caches more than the log"
        );
        assert_eq!(inner.cache.len(), cached, "cached entries");
        let next = inner.next_index();
        let start = next - cached as u64;
        for index in inner.first_index.saturating_sub(2)..=next + 1 {
            let got = inner.cached(index).map(|e| e.log_id.index);
            let want = (start..next).contains(&index).then_some(index);
            assert_eq!(got, want, "cached({index})");
        }
        let suffix = inner.locs.iter().skip(inner.locs.len() - cached);
        let lens: Vec<u32> = inner.cache.iter().map(|(_, len)| *len).collect();
        let loc_lens: Vec<u32> = suffix.map(|l| l.len).collect();
        assert_eq!(lens, loc_lens, "cached lengths are the records' lengths");
        let total: usize = lens.iter().map(|&len| len as usize).sum();
        assert_eq!(inner.cached_bytes, total, "cached_bytes");
        assert!(
            total <= budget,
            "{total} cached bytes over the budget {budget}"
        );
    }

    #[test]
    fn entries_that_exactly_fit_the_budget_are_all_kept() {
        let mut inner = empty_log();
        for index in 5..8 {
            push(&mut inner, index, 10, 30);
        }
        assert_eq!(inner.first_index, 5);
        assert_cache(&inner, 30, 3);
    }

    #[test]
    fn a_range_is_read_from_the_cache_only_if_it_holds_all_of_it() {
        let mut inner = empty_log();
        push_uncacheable(&mut inner, 5, 10, 30);
        for index in 6..9 {
            push(&mut inner, index, 10, 30);
        }
        let read = |start, end| {
            let range: Option<Vec<Entry>> = inner.cached_range(start, end);
            range.map(|entries| {
                ids(&entries)
                    .into_iter()
                    .map(|(i, _)| i)
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(read(6, 9), Some(vec![6, 7, 8]));
        assert_eq!(read(7, 100), Some(vec![7, 8]), "clamped to the log's end");
        assert_eq!(read(8, 8), Some(vec![]));
        assert_eq!(read(12, 20), Some(vec![]), "past the end: nothing");
        assert_eq!(read(9, 3), Some(vec![]), "an empty range");
        assert_eq!(read(5, 9), None, "entry 5 is not cached");
        assert_eq!(read(0, 7), None, "from before the log, with 5");
    }

    #[test]
    fn one_byte_over_the_budget_evicts_the_oldest() {
        let mut inner = empty_log();
        for index in 5..8 {
            push(&mut inner, index, 10, 30);
        }
        push(&mut inner, 8, 1, 30);
        assert_cache(&inner, 30, 3);
        assert_eq!(inner.cached_bytes, 21);
        // An entry larger than the whole budget is not cached, and leaves
        // nothing older behind it.
        push(&mut inner, 9, 31, 30);
        assert_cache(&inner, 30, 0);
    }

    #[test]
    fn a_zero_budget_caches_nothing_not_even_empty_records() {
        let mut inner = empty_log();
        for (index, len) in [(1, 0), (2, 7), (3, 0)] {
            push(&mut inner, index, len, 0);
            assert_cache(&inner, 0, 0);
        }
    }

    #[test]
    fn an_uncacheable_entry_clears_the_cache() {
        let mut inner = empty_log();
        for index in 1..4 {
            push(&mut inner, index, 4, 100);
        }
        push_uncacheable(&mut inner, 4, 4, 100);
        assert_cache(&inner, 100, 0);
        push(&mut inner, 5, 4, 100);
        assert_cache(&inner, 100, 1);
    }

    #[test]
    fn truncation_drops_the_cached_tail_with_its_bytes() {
        let mut inner = empty_log();
        for (index, len) in [(1, 50), (2, 3), (3, 5), (4, 7), (5, 11)] {
            push(&mut inner, index, len, 30);
        }
        assert_cache(&inner, 30, 4);
        inner.truncate_locs(6);
        assert_cache(&inner, 30, 4);
        inner.truncate_locs(3);
        assert_eq!(inner.next_index(), 4);
        assert_cache(&inner, 30, 2);
        assert_eq!(inner.cached_bytes, 8);
        // Past the cached part: only uncached entries are left.
        inner.truncate_locs(1);
        assert_cache(&inner, 30, 0);
    }

    #[test]
    fn dropping_inside_the_log_keeps_the_cache_within_it() {
        let mut inner = empty_log();
        for index in 10..16 {
            push(&mut inner, index, 2 + index as u32, 100);
        }
        // Before the first entry: nothing changes.
        inner.drop_through(8);
        assert_eq!(inner.first_index, 10);
        assert_cache(&inner, 100, 6);
        inner.drop_through(9);
        assert_eq!(inner.first_index, 10);
        assert_cache(&inner, 100, 6);
        inner.drop_through(12);
        assert_eq!((inner.first_index, inner.locs.len()), (13, 3));
        assert_cache(&inner, 100, 3);
        assert_eq!(inner.cached_bytes, 15 + 16 + 17);
    }

    #[test]
    fn dropping_uncached_entries_keeps_the_whole_cache() {
        let mut inner = empty_log();
        for index in 1..6 {
            push(&mut inner, index, 10, 20);
        }
        assert_cache(&inner, 20, 2);
        inner.drop_through(2);
        assert_cache(&inner, 20, 2);
        inner.drop_through(3);
        assert_cache(&inner, 20, 2);
        inner.drop_through(4);
        assert_cache(&inner, 20, 1);
    }

    #[test]
    fn dropping_through_the_last_entry_or_past_it_empties_the_log() {
        for (through, first) in [(5, 6), (9, 10)] {
            let mut inner = empty_log();
            for index in 1..6 {
                push(&mut inner, index, 3, 100);
            }
            inner.drop_through(through);
            assert!(inner.locs.is_empty());
            assert_eq!(inner.first_index, first);
            assert_cache(&inner, 100, 0);
        }
    }

    #[test]
    fn a_push_after_the_log_empties_starts_a_fresh_cache() {
        let mut inner = empty_log();
        for index in 1..4 {
            push(&mut inner, index, 3, 100);
        }
        inner.drop_through(3);
        push(&mut inner, 4, 5, 100);
        assert_eq!(inner.first_index, 4);
        assert_cache(&inner, 100, 1);
        inner.truncate_locs(0);
        // A log cut to nothing may start again at any index.
        push(&mut inner, 20, 6, 100);
        assert_eq!(inner.first_index, 20);
        assert_cache(&inner, 100, 1);
    }

    /// What `Inner` should hold, stated without its eviction loops: the
    /// (index, len) of each entry, and how many of the newest are cached.
    struct Model {
        first_index: u64,
        entries: VecDeque<(u64, u32)>,
        cached: usize,
    }

    impl Model {
        fn next_index(&self) -> u64 {
            self.first_index + self.entries.len() as u64
        }

        fn cached_bytes(&self) -> usize {
            let skip = self.entries.len() - self.cached;
            self.entries
                .iter()
                .skip(skip)
                .map(|&(_, len)| len as usize)
                .sum()
        }

        fn push(&mut self, index: u64, len: u32, cacheable: bool, budget: usize) {
            if self.entries.is_empty() {
                self.first_index = index;
            }
            self.entries.push_back((index, len));
            // A budget of 0 turns the cache off, even for empty records.
            self.cached = if cacheable && budget > 0 {
                self.cached + 1
            } else {
                0
            };
            while self.cached > 0 && self.cached_bytes() > budget {
                self.cached -= 1;
            }
        }

        fn truncate(&mut self, keep: usize) {
            let removed = self.entries.len().saturating_sub(keep);
            self.entries.truncate(keep);
            self.cached = self.cached.saturating_sub(removed);
        }

        fn drop_through(&mut self, index: u64) {
            let next = index + 1;
            if next >= self.next_index() {
                self.entries.clear();
                self.first_index = next;
            } else if next > self.first_index {
                self.entries.drain(..(next - self.first_index) as usize);
                self.first_index = next;
            }
            self.cached = self.cached.min(self.entries.len());
        }
    }

    /// One random operation on both the model and `inner`.
    fn step(rng: &mut XorShift, model: &mut Model, inner: &mut Inner, budget: usize) {
        let next = model.next_index();
        match rng.below(10) {
            0..6 => {
                // Lengths from 0 so that small budgets still cache some.
                let len = rng.below(21) as u32;
                model.push(next, len, true, budget);
                push(inner, next, len, budget);
            }
            6 => {
                let len = rng.below(21) as u32;
                model.push(next, len, false, budget);
                push_uncacheable(inner, next, len, budget);
            }
            7 => {
                let keep = rng.below(model.entries.len() as u64 + 2) as usize;
                model.truncate(keep);
                inner.truncate_locs(keep);
            }
            _ => {
                // From before the first entry to past the last one.
                let span = next - model.first_index + 4;
                let index = (model.first_index + rng.below(span)).saturating_sub(2);
                model.drop_through(index);
                inner.drop_through(index);
            }
        }
    }

    #[test]
    fn the_cache_follows_a_model_through_random_operations() {
        for budget in [0, 1, 25, 64, 10_000] {
            let mut rng = XorShift::new(budget as u64);
            let mut model = Model {
                first_index: 1,
                entries: VecDeque::new(),
                cached: 0,
            };
            let mut inner = empty_log();
            inner.first_index = 1;
            for _ in 0..3000 {
                step(&mut rng, &mut model, &mut inner, budget);
                let locs: Vec<(u64, u32)> =
                    inner.locs.iter().map(|l| (l.log_id.index, l.len)).collect();
                assert_eq!(locs, Vec::from(model.entries.clone()), "budget {budget}");
                assert_eq!(inner.first_index, model.first_index, "budget {budget}");
                assert_cache(&inner, budget, model.cached);
            }
        }
    }

    // ------------------------------------------------------------ the store

    fn open_log(dir: &Path, segment_size: u64) -> LogStore {
        let options = LogOptions {
            segment_size,
            cache_bytes: 0,
            ..LogOptions::default()
        };
        LogStore::open(dir, options).unwrap()
    }

    fn blank(term: u64, index: u64) -> Entry {
        Entry::new_blank(openraft::testing::log_id::<TypeConfig>(term, 1, index))
    }

    fn append_blank(shared: &Shared, term: u64, indexes: std::ops::Range<u64>) {
        let entries = indexes.map(|i| blank(term, i)).collect();
        shared.append(entries, IOFlushed::noop()).unwrap();
    }

    /// (index, term) of each entry.
    fn ids(entries: &[Entry]) -> Vec<(u64, u64)> {
        let id = |e: &Entry| (e.log_id.index, e.log_id.leader_id.term);
        entries.iter().map(id).collect()
    }

    #[test]
    fn an_appended_entry_is_charged_its_record_and_its_cache_slot() {
        let dir = tempfile::tempdir().unwrap();
        let record_len = postcard::to_allocvec(&blank(1, 1)).unwrap().len() as u32;
        let charge = cache_charge(record_len) as usize;
        assert!(charge > record_len as usize + 100, "the slot is counted");
        let options = LogOptions {
            cache_bytes: 10 * charge,
            ..LogOptions::default()
        };
        let store = LogStore::open(dir.path(), options).unwrap();
        append_blank(&store.shared, 1, 1..31);
        let inner = store.shared.lock().unwrap();
        assert_eq!(inner.cache.len(), 10, "ten entries' charges fit the budget");
        assert_eq!(inner.cached_bytes, 10 * charge);
    }

    #[test]
    fn after_a_failed_fsync_every_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_log(dir.path(), DEFAULT_SEGMENT_SIZE);
        let shared = &store.shared;
        append_blank(shared, 1, 1..4);
        // Linux may drop the dirty pages of a failed fsync: nothing written
        // after it can be trusted to reach the disk (fsyncgate).
        shared
            .flusher
            .poison(&io::Error::other("injected fsync failure"));
        let writes = [
            shared.append(vec![blank(1, 4)], IOFlushed::noop()),
            shared.truncate_after(Some(lid(2))),
            shared.purge(lid(1)),
        ];
        for result in writes {
            assert!(matches!(result, Err(LogError::SyncFailed(_))), "{result:?}");
        }
        assert_eq!(ids(&shared.read(0, 10).unwrap()), [(1, 1), (2, 1), (3, 1)]);
    }

    fn vote(term: u64, node: u64) -> Vote {
        openraft::Vote::new(term, node)
    }

    #[test]
    fn the_vote_cell_is_the_last_saved_vote() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_log(dir.path(), DEFAULT_SEGMENT_SIZE);
        let cell = store.persisted_vote();
        assert_eq!(cell.get(), None, "a fresh log has saved no vote");
        let (v1, v2) = (vote(1, 1), vote(2, 3));
        store.shared.save_vote(&v1).unwrap();
        store.shared.save_vote(&v2).unwrap();
        assert_eq!(
            cell.get(),
            Some(v2),
            "a handle taken earlier follows the saves"
        );
        assert_eq!(store.persisted_vote().get(), Some(v2));
        drop(cell);
        drop(store);
        let reopened = open_log(dir.path(), DEFAULT_SEGMENT_SIZE);
        assert_eq!(reopened.persisted_vote().get(), Some(v2), "seeded at open");
    }

    #[test]
    fn a_failed_save_vote_leaves_the_cell() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_log(dir.path(), DEFAULT_SEGMENT_SIZE);
        let shared = &store.shared;
        let v2 = vote(2, 1);
        shared.save_vote(&v2).unwrap();
        // The vote file's write fails (its temporary name is taken by a
        // directory): the log is writable, the vote never reaches the disk.
        let tmp = dir.path().join(format!("{}.tmp", format::VOTE_FILE));
        std::fs::create_dir(&tmp).unwrap();
        let result = shared.save_vote(&vote(3, 1));
        assert!(matches!(result, Err(LogError::Io { .. })), "{result:?}");
        assert_eq!(store.persisted_vote().get(), Some(v2));
        std::fs::remove_dir(&tmp).unwrap();
        // A refused write: the log was poisoned by a failed fsync.
        shared
            .flusher
            .poison(&io::Error::other("injected fsync failure"));
        let result = shared.save_vote(&vote(3, 1));
        assert!(matches!(result, Err(LogError::SyncFailed(_))), "{result:?}");
        // The cell must never claim a vote the disk may not hold.
        assert_eq!(store.persisted_vote().get(), Some(v2));
    }

    #[test]
    fn a_read_that_races_a_truncation_answers_from_the_rewritten_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_log(dir.path(), DEFAULT_SEGMENT_SIZE);
        let shared = &store.shared;
        append_blank(shared, 1, 1..6);
        // A new leader's entries replace 4 and 5 after the read fetched the
        // old ones from the file.
        let read = shared
            .read_around(1, 6, || {
                shared.truncate_after(Some(lid(3))).unwrap();
                append_blank(shared, 2, 4..6);
            })
            .unwrap();
        assert_eq!(ids(&read), [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]);
    }

    #[test]
    fn a_truncation_stopped_midway_indexes_no_entry_of_a_removed_segment() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_log(dir.path(), 160);
        let shared = &store.shared;
        append_blank(shared, 1, 1..40);
        let firsts: Vec<u64> = shared.lock().unwrap().segments.keys().copied().collect();
        assert!(firsts.len() >= 3 && firsts[1] > 2, "segments {firsts:?}");
        let newest = firsts[firsts.len() - 1];
        // The second newest segment's file cannot be removed (a directory
        // stands in its place): removal fails with something other than
        // "not found", after the newest segment is already gone.
        let blocked = shared.segment_path(firsts[firsts.len() - 2]);
        fs::remove_file(&blocked).unwrap();
        fs::create_dir(&blocked).unwrap();
        let result = shared.truncate_after(Some(lid(1)));
        assert!(matches!(result, Err(LogError::Io { .. })), "{result:?}");
        assert_eq!(shared.stats().last_index, Some(newest - 1));
        // With the obstacle gone, the file is missing: the truncation
        // completes, as it must after a crash between unlink and index.
        fs::remove_dir(&blocked).unwrap();
        shared.truncate_after(Some(lid(1))).unwrap();
        assert_eq!(shared.stats().last_index, Some(1));
        assert_eq!(ids(&shared.read(0, 50).unwrap()), [(1, 1)]);
    }
}
