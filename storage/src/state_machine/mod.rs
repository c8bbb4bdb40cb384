//! The Raft state machine: committed entries are applied to the region (the
//! only writer of the region is this apply loop: invariant 4), snapshots are
//! built from the region's live pairs and installed by rebuilding a region.
//!
//! The region lives in memory only. After a restart the state machine starts
//! from the newest persisted snapshot and openraft re-applies the log from
//! there up to the committed index the log store saved.

mod apply;
pub mod digest;
mod keyed;
mod load;
mod local_read;
mod lookahead;
pub mod shard_map;
pub mod snapshot;
pub mod snapshot_store;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures::Stream;
use openraft::alias::SnapshotOf;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;
use openraft::{OptionalSend, RaftSnapshotBuilder};
use rdkv_proto::region::{
    BlockRef, DeadlineUnixMs, EXPIRY_MARGIN_MS, HashSeed, LeaseDeadline, expired_at,
};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{Response, StateDigestAt, Versioned};
use thiserror::Error;

use crate::cluster_id::ClusterId;
use crate::raft::{CommandResult, Entry, LogId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::region::live::LiveWalk;
use crate::region::{
    Clock, MonotonicClock, ReadError, ReaderOptions, RegionConfig, RegionError, RegionReader,
    RegionStats, RegionWriter,
};
pub use apply::no_space;
use apply::{Applied, apply_entry};
use digest::DigestHistory;
use keyed::KeyedRegion;
pub use keyed::{ScanPage, ScanRange};
use load::{load_region, seed_of};
pub use local_read::LocalReads;
use lookahead::{Lookahead, first_key};
use snapshot::{SnapshotError, SnapshotRegion, SnapshotWriter};
use snapshot_store::{NewSnapshot, SnapshotFile};

/// A snapshot is a file (see `snapshot_store`), never a buffer: it is as
/// large as the region's live data.
pub type SnapshotData = SnapshotFile;
pub type Snapshot = SnapshotOf<TypeConfig, SnapshotData>;

/// The state machine's directory (snapshots) inside a node's data directory.
pub const SNAPSHOTS_DIR_NAME: &str = "snapshots";

#[derive(Debug, Clone)]
pub struct StateMachineConfig {
    /// Template for every region this state machine creates (epochs and hash
    /// seeds are chosen per region).
    pub region: RegionConfig,
    /// Where snapshots are persisted.
    pub snapshot_dir: PathBuf,
    /// The shard this state machine applies: the `shard` label of its
    /// apply histograms (a single group: shard 0).
    pub shard: ShardId,
}

#[derive(Debug, Error)]
pub enum StateMachineError {
    #[error("region: {0}")]
    Region(#[from] RegionError),
    #[error("region read: {0}")]
    Read(#[from] ReadError),
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("snapshot encoding: {0}")]
    Encode(#[from] postcard::Error),
    /// A snapshot (received, or this node's own at a start) holds more
    /// than this node's region can place. Nothing changed: the region being
    /// filled is dropped.
    #[error(
        "the snapshot at log index {index} does not fit this node's {region_mib} MiB region \
         ({placed} pairs placed, then: {source}); give this node the --region-mib and \
         --max-value-bytes of the members the snapshot comes from"
    )]
    SnapshotDoesNotFit {
        index: u64,
        placed: u64,
        region_mib: u64,
        source: RegionError,
    },
    #[error("a blocking task (a snapshot's, a rebuild's) stopped: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the ordered key index names a {key_len}-byte key the region does not hold")]
    KeyIndexMismatch { key_len: usize },
    /// The quota admitted a write that this replica's region cannot hold
    /// even compacted: applying anything else would diverge from the
    /// replicas that hold it, so this replica stops applying.
    #[error(
        "log index {index} cannot be placed even in a compacted region ({source}); \
         this replica stops applying: give it a larger --region-mib, or lower the \
         cluster's --quota-bytes, and restart it"
    )]
    Unplaceable { index: u64, source: RegionError },
}

impl From<StateMachineError> for io::Error {
    fn from(error: StateMachineError) -> io::Error {
        io::Error::other(error)
    }
}

#[derive(Debug)]
struct State {
    writer: KeyedRegion,
    /// The cluster's hash seed once `Command::SetHashSeed` was applied; until
    /// then the region is placed with the placeholder `HashSeed::default()`,
    /// which every replica uses alike.
    hash_seed: Option<HashSeed>,
    /// The cluster's quota once `Command::SetQuota` was applied (no limit
    /// but the region's until then).
    quota_bytes: Option<u64>,
    /// The cluster's identity once `Command::SetClusterId` was applied (or a
    /// snapshot carrying one was loaded); it never changes after that.
    cluster_id: Option<ClusterId>,
    /// Raised when a write is refused for the quota (here or, on a leader,
    /// before proposing), cleared once the charge is back under
    /// `ALARM_CLEAR_PERCENT` of the quota.
    no_space_alarm: bool,
    /// The state digest at each of the last applied indexes.
    digests: DigestHistory,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    snapshot: Option<(SnapshotMeta, SnapshotFile)>,
    /// The results of a transaction's ops applied so far, kept while its
    /// entry waits for room (`Applied::Full`) and resumes at the next op.
    txn_results: Vec<rdkv_proto::wire::TxnResult>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The current region's reader; replaced with the region (a snapshot's
    /// install, a rebuild). Every local read loads it: not a lock, whose
    /// shared count every reading thread would write (a RESP GET at lease
    /// spent about 5% of the leader's CPU on an `RwLock`'s count bouncing
    /// between two workers). A read that loaded the old reader before a
    /// swap may finish on the old region after it: still mapped (the
    /// reader holds its memory) and unchanged since its rebuild began, it
    /// holds the state at the swap (before a clear or an install), and the
    /// swap falls inside that read, so its answer is linearizable.
    reader: ArcSwap<RegionReader>,
    applied_index: AtomicU64,
    config: StateMachineConfig,
    clock: Arc<dyn Clock>,
    /// Serializes writing snapshot files and adopting them as current.
    persist_lock: tokio::sync::Mutex<()>,
    /// Held by whatever changes the pairs or swaps the region (an apply
    /// batch, and with it the walk of a rebuild it makes; an install) and
    /// by a snapshot build for its walk and write: those wait for one
    /// another here, asynchronously (no runtime thread blocks); a build or
    /// a rebuild takes the state lock only to read which region it walks.
    pairs_gate: Arc<tokio::sync::Mutex<()>>,
    /// No lease is published before this (unix µs): see `suppress_lease_until`.
    lease_suppressed_until_us: AtomicU64,
    /// The lease deadline last published in the region header, on the
    /// boottime clock (µs; 0: none), for this node's own lease reads.
    published_lease_boottime_us: AtomicU64,
    /// Test hook: runs in `publish_leadership` before it takes the state lock.
    before_publish: std::sync::OnceLock<PublishHook>,
    /// Test hook: runs in a walk of the region's pairs without the state
    /// lock (a snapshot build, a rebuild) once its first pair is handed over.
    walking_pairs: std::sync::OnceLock<PublishHook>,
}

/// The pairs gate, held by an apply batch and shared with a rebuild's walk
/// off the runtime's threads.
type PairsHeld = Arc<tokio::sync::OwnedMutexGuard<()>>;

/// What a rebuilt region holds: the old one's live pairs (a compaction,
/// the hash seed's adoption) or nothing (a clear).
#[derive(Debug, Clone, Copy)]
enum Contents {
    LivePairs,
    Nothing,
}

/// A test's code to run at one point of `publish_leadership` or of a walk
/// of the region's pairs (a snapshot build, a rebuild).
struct PublishHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for PublishHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublishHook")
    }
}

/// The no-space alarm clears once the live pairs' charge is at most this
/// share of the quota: room for more than a few writes.
const ALARM_CLEAR_PERCENT: u64 = 90;

/// The quota and what is charged against it, as a replica sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaStatus {
    pub quota_bytes: Option<u64>,
    pub charged_bytes: u64,
    pub no_space_alarm: bool,
}

/// A cheap-clone handle: openraft owns one, the server keeps others for reads.
#[derive(Debug, Clone)]
pub struct RegionStateMachine {
    shared: Arc<Shared>,
}

use rdkv_fabric::clock::{unix_now_ms, unix_now_us};

/// The time from which a server-side read counts a pair as expired: this
/// node's wall clock plus the expiry margin, the rule of apply and of every
/// reader (`ReaderOptions::expiry_margin_ms`).
fn expired_from_unix_ms() -> u64 {
    unix_now_ms().saturating_add(EXPIRY_MARGIN_MS)
}

/// An empty region placed with the cluster's `seed` (the placeholder while
/// there is none): every replica places keys alike.
fn new_region(
    config: &StateMachineConfig,
    clock: &Arc<dyn Clock>,
    epoch: u64,
    seed: Option<HashSeed>,
) -> Result<RegionWriter, RegionError> {
    let region = RegionConfig {
        region_epoch: epoch,
        hash_seed: seed.unwrap_or_default(),
        ..config.region.clone()
    };
    RegionWriter::create(&region, Arc::clone(clock))
}

/// Frees a region `swap_region` replaced (its key set, its deadline index
/// and, unless an RDMA or libfabric grant still holds it until the grant
/// sweep or a local read in flight its reader, its mapping) on a blocking
/// thread, once the state lock is released: freeing a 1 GiB region of
/// 4,000,000 keys took 139 ms here, which the apply (a compaction, a clear,
/// a seed's adoption, a snapshot's install) would otherwise spend on a
/// runtime worker.
fn free_replaced(old: KeyedRegion) {
    drop(tokio::task::spawn_blocking(move || drop(old)));
}

/// Max bytes of one snapshot record: a maximal pair plus framing slack.
pub(crate) fn max_snapshot_record_bytes(region: &RegionConfig) -> u64 {
    u64::from(region.max_key_bytes) + u64::from(region.max_value_bytes) + 4096
}

impl RegionStateMachine {
    /// Creates the region and loads the newest persisted snapshot, if any.
    pub fn open(config: StateMachineConfig) -> Result<RegionStateMachine, StateMachineError> {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        // Every process incarnation starts at a new epoch (later regions of
        // it count up from there), so a client still mapping the region of a
        // previous incarnation can tell it is not the current one.
        let first_epoch = unix_now_us().max(1);
        snapshot_store::remove_temp_files(&config.snapshot_dir)?;
        let (writer, region, meta, data) = match snapshot_store::load_latest(&config.snapshot_dir)?
        {
            Some(file) => {
                let loaded = load_region(&config, &clock, first_epoch, &file)?;
                (loaded.writer, loaded.region, Some(loaded.meta), Some(file))
            }
            None => (
                KeyedRegion::empty(new_region(&config, &clock, first_epoch, None)?),
                SnapshotRegion::default(),
                None,
                None,
            ),
        };
        let reader = writer.reader(ReaderOptions::for_layout(writer.layout()))?;
        let last_applied = meta.as_ref().and_then(|m| m.last_log_id);
        let last_membership = meta
            .as_ref()
            .map(|m| m.last_membership.clone())
            .unwrap_or_default();
        if let Some(log_id) = last_applied {
            writer.publish_applied(log_id.index, unix_now_us())?;
        }
        let mut digests = DigestHistory::default();
        digests.record(last_applied.map_or(0, |l| l.index), writer.digest());
        Ok(RegionStateMachine {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    writer,
                    hash_seed: seed_of(&region),
                    quota_bytes: region.quota_bytes,
                    cluster_id: region.cluster_id,
                    no_space_alarm: false,
                    digests,
                    last_applied,
                    last_membership,
                    snapshot: meta.zip(data),
                    txn_results: Vec::new(),
                }),
                reader: ArcSwap::from_pointee(reader),
                applied_index: AtomicU64::new(last_applied.map_or(0, |l| l.index)),
                config,
                clock,
                persist_lock: tokio::sync::Mutex::new(()),
                pairs_gate: Arc::default(),
                lease_suppressed_until_us: AtomicU64::new(0),
                published_lease_boottime_us: AtomicU64::new(0),
                before_publish: std::sync::OnceLock::new(),
                walking_pairs: std::sync::OnceLock::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a half-applied entry: the
        // region itself is still consistent (every change is one atomic
        // publication), so continuing is safe.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A lock-free reader of the current region (cheap to clone).
    pub fn reader(&self) -> RegionReader {
        RegionReader::clone(&self.shared.reader.load())
    }

    /// Reads a key from this replica's region: lock-free, with the locked
    /// writer's view as the fallback when validation keeps failing.
    pub fn get_local(&self, key: &[u8]) -> Result<Option<Versioned>, StateMachineError> {
        // The guard is gone before the fallback takes the state lock.
        let read =
            local_read::read_with(&self.shared.reader.load(), key, local_read::versioned_copy);
        self.finish_local_read(read, key, local_read::versioned_copy)
    }

    /// Reads of one batch from this replica's region through one kept
    /// reader (see [`LocalReads`]).
    pub fn local_reads(&self) -> LocalReads<'_> {
        LocalReads::new(self)
    }

    /// A lock-free read's outcome; when validation kept failing, the locked
    /// writer's view handed to `found` instead (`found` ran only if the
    /// lock-free read succeeded).
    fn finish_local_read<R>(
        &self,
        read: Result<R, ReadError>,
        key: &[u8],
        mut found: impl FnMut(Option<(&[u8], u64)>) -> R,
    ) -> Result<R, StateMachineError> {
        match read {
            Ok(result) => Ok(result),
            Err(ReadError::Exhausted { .. }) => {
                let value = self.get_local_with_deadline(key)?.map(|(value, _)| value);
                Ok(found(value.as_ref().map(|v| (&v.value[..], v.version))))
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Like [`RegionStateMachine::get_local`], with the pair's deadline. A
    /// pair expired on this node's wall clock (less the clock-drift margin,
    /// as every reader counts it) is absent.
    pub fn get_local_with_deadline(
        &self,
        key: &[u8],
    ) -> Result<Option<(Versioned, DeadlineUnixMs)>, StateMachineError> {
        // Read through a loaded guard (no clone of the reader), gone before
        // the fallback takes the state lock.
        let read = self.shared.reader.load().get_with_deadline(key);
        match read {
            Ok(found) => Ok(found),
            Err(ReadError::Exhausted { .. }) => {
                let found = self.lock().writer.get_with_deadline(key)?;
                let expired_from = expired_from_unix_ms();
                Ok(found.filter(|(_, deadline)| !expired_at(*deadline, expired_from)))
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Up to `limit` keys expired at `now_unix_ms` (the leader's clock),
    /// with their versions, soonest deadline first: the next batch of the
    /// active expire cycle (`Command::ExpireKeys`).
    pub fn expired_keys(
        &self,
        now_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<(Bytes, u64)>, StateMachineError> {
        Ok(self.lock().writer.expired_keys(now_unix_ms, limit)?)
    }

    /// Keys that have a deadline (expired or not, until removed).
    pub fn expiring_keys(&self) -> usize {
        self.lock().writer.expiring_keys()
    }

    /// The current region's memory (replaced by a snapshot's install or a
    /// rebuild), for handing to local clients.
    pub fn region_memory(&self) -> Arc<rdkv_fabric::RegionMemory> {
        Arc::clone(self.lock().writer.memory())
    }

    /// The current region's epoch.
    pub fn region_epoch(&self) -> u64 {
        self.lock().writer.layout().region_epoch
    }

    /// Marks the current region retired and withdraws its lease: on a clean
    /// shutdown, so that clients mapping it stop reading it at once.
    pub fn retire(&self) -> Result<(), StateMachineError> {
        let state = self.lock();
        self.publish_lease(&state, None)?;
        state.writer.retire_region()?;
        Ok(())
    }

    pub fn applied_index(&self) -> u64 {
        self.shared.applied_index.load(Ordering::Acquire)
    }

    pub fn region_stats(&self) -> RegionStats {
        self.lock().writer.stats()
    }

    /// Up to `limit` pairs in key order from `start` (inclusive) to `end`
    /// (exclusive), as of one applied index: the ordered index and the
    /// region are read under the lock that applies take. `limit` is small
    /// (a request's batch limit), so the lock is held briefly.
    pub fn scan_local(
        &self,
        range: ScanRange<'_>,
        max_bytes: u64,
    ) -> Result<ScanPage, StateMachineError> {
        self.lock()
            .writer
            .scan(range, max_bytes, expired_from_unix_ms())
    }

    /// The shard map this replica applied (metadata group only:
    /// `Command::PublishShardMap`); `None` before the first one.
    pub fn applied_shard_map(
        &self,
    ) -> Result<Option<rdkv_proto::shard::ShardMap>, shard_map::AppliedMapError> {
        shard_map::recorded(&self.lock().writer)
    }

    /// Keys in the ordered scan index; always equal to the region's live keys.
    pub fn indexed_keys(&self) -> usize {
        self.lock().writer.indexed_keys()
    }

    /// Withdraws the lease now and keeps it withdrawn until `until_unix_us`:
    /// during a leadership transfer the target may be elected (and commit)
    /// while this node still believes it leads.
    ///
    /// The suppression is set, and the lease cleared, under the state lock
    /// that `publish_leadership` checks it under: a publisher that had
    /// decided to publish before the suppression cannot publish after it.
    pub fn suppress_lease_until(&self, until_unix_us: u64) -> Result<(), StateMachineError> {
        let state = self.lock();
        self.shared
            .lease_suppressed_until_us
            .fetch_max(until_unix_us, Ordering::AcqRel);
        self.publish_lease(&state, None)?;
        Ok(())
    }

    /// Whether lease reads must not be served (a transfer is under way).
    pub fn lease_suppressed(&self) -> bool {
        unix_now_us()
            < self
                .shared
                .lease_suppressed_until_us
                .load(Ordering::Acquire)
    }

    /// Test hook: `hook` runs inside every later `publish_leadership`, just
    /// before it takes the state lock (to stage a race with
    /// `suppress_lease_until`). Set once; later calls are ignored.
    #[doc(hidden)]
    pub fn hook_before_publish(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.shared.before_publish.set(PublishHook(Box::new(hook)));
    }

    /// Test hook: `hook` runs in every later walk of the region's pairs
    /// without the state lock (a snapshot build, a rebuild of the region)
    /// once the walk has handed over its first pair, and where a clear
    /// fills its new region with nothing (to stage other work beside
    /// them). Set once; later calls are ignored.
    #[doc(hidden)]
    pub fn hook_while_walking_pairs(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.shared.walking_pairs.set(PublishHook(Box::new(hook)));
    }

    /// Publishes the Raft term and the leader lease in the region header.
    pub fn publish_leadership(
        &self,
        term: u64,
        lease_deadline: Option<LeaseDeadline>,
    ) -> Result<(), StateMachineError> {
        if let Some(hook) = self.shared.before_publish.get() {
            (hook.0)();
        }
        let state = self.lock();
        // Checked under the lock `suppress_lease_until` sets it under.
        let lease_deadline = lease_deadline.filter(|_| !self.lease_suppressed());
        state.writer.publish_term(term)?;
        self.publish_lease(&state, lease_deadline)?;
        Ok(())
    }

    /// Writes the lease words of the region header, and keeps their
    /// boottime deadline for [`Self::published_lease_boottime_us`].
    fn publish_lease(
        &self,
        state: &State,
        deadline: Option<LeaseDeadline>,
    ) -> Result<(), StateMachineError> {
        state.writer.publish_lease(deadline)?;
        self.shared
            .published_lease_boottime_us
            .store(deadline.map_or(0, |d| d.boottime_us), Ordering::Release);
        Ok(())
    }

    /// The leader lease this node last published in its region header, on
    /// the boottime clock (µs): what one-sided readers on this host judge
    /// a lease read by, and so what this node's own lease reads are judged
    /// by too. `None`: no lease is published (not leading, no quorum
    /// contact, a transfer under way, retired).
    pub fn published_lease_boottime_us(&self) -> Option<u64> {
        match self
            .shared
            .published_lease_boottime_us
            .load(Ordering::Acquire)
        {
            0 => None,
            deadline_us => Some(deadline_us),
        }
    }

    /// Makes `writer` the region this replica serves, its readers included,
    /// retires the one it replaces (clients mapping it re-attach) and
    /// returns it, for `free_replaced` once the state lock is released.
    /// The new region takes over the term, lease and retirement published
    /// in the old one (under this lock, as every publication is), which may
    /// have changed while the new one was filled without the lock; the old
    /// one is retired under the lock too, so a lease withdrawn after the
    /// swap is never left standing in a region still served.
    fn swap_region(
        &self,
        state: &mut State,
        writer: KeyedRegion,
    ) -> Result<KeyedRegion, StateMachineError> {
        writer.carry_published_words(&state.writer)?;
        let reader = writer.reader(ReaderOptions::for_layout(writer.layout()))?;
        let old = std::mem::replace(&mut state.writer, writer);
        self.shared.reader.store(Arc::new(reader));
        old.retire_region()?;
        Ok(old)
    }

    /// Applies `Command::SetHashSeed`: the first seed applied becomes the
    /// cluster's for good, and the region is placed anew with it (it holds
    /// at most the few writes applied before the seed); a later seed
    /// changes nothing. Every replica applies the same log, so every one
    /// ends with the same seed and placement rule.
    async fn adopt_hash_seed(
        &self,
        seed: HashSeed,
        gate: &PairsHeld,
    ) -> Result<(), StateMachineError> {
        if self.lock().hash_seed.is_some() {
            return Ok(());
        }
        let rebuilt = self
            .rebuild_region(Some(seed), Contents::LivePairs, gate)
            .await?;
        let old = {
            let mut state = self.lock();
            let old = self.swap_region(&mut state, rebuilt)?;
            state.hash_seed = Some(seed);
            old
        };
        free_replaced(old);
        tracing::info!("the cluster's hash seed is applied; the region is placed with it");
        Ok(())
    }

    /// Places every live pair anew (or, for a clear, none) in an empty
    /// region (the next epoch) placed with `seed` and returns it, its
    /// applied index published, for the caller to swap in. The new region
    /// has no fragments and no block in a grace period: this is also how a
    /// region that cannot place a write compacts.
    ///
    /// Only an apply calls it, holding the pairs `gate` (the walk holds it
    /// too, should the apply be dropped): nothing changes the pairs or swaps
    /// the region meanwhile, so the old region's memory is walked without
    /// the state lock, off the runtime's threads, as a snapshot build walks
    /// it. A whole region's rebuild then does not hold up the lease's
    /// publication or reads (an apply that compacted a full 1 GiB region
    /// took 1.2 to 5.1 s here, longer than a lease); what they publish
    /// meanwhile is carried over at the swap (`swap_region`).
    async fn rebuild_region(
        &self,
        seed: Option<HashSeed>,
        contents: Contents,
        gate: &PairsHeld,
    ) -> Result<KeyedRegion, StateMachineError> {
        let (memory, layout, clock_unix_ms, applied) = {
            let state = self.lock();
            let memory = Arc::clone(state.writer.memory());
            let applied = state.last_applied;
            (
                memory,
                *state.writer.layout(),
                state.writer.clock_unix_ms(),
                applied,
            )
        };
        let (this, held) = (self.clone(), Arc::clone(gate));
        let rebuilt = tokio::task::spawn_blocking(move || {
            let _held = held;
            let empty = new_region(
                &this.shared.config,
                &this.shared.clock,
                layout.region_epoch + 1,
                seed,
            )?;
            KeyedRegion::load::<RegionError>(empty, clock_unix_ms, |put| match contents {
                Contents::LivePairs => this.walk_pairs(&LiveWalk::new(&memory, &layout), put),
                Contents::Nothing => {
                    this.run_walk_hook();
                    Ok(())
                }
            })
        })
        .await??;
        // Stamped once the walk is done, not when it began.
        if let Some(applied) = applied {
            rebuilt.publish_applied(applied.index, unix_now_us())?;
        }
        Ok(rebuilt)
    }

    /// Hands every live pair of `walk` to `f`, running the test hook
    /// (`hook_while_walking_pairs`) once the first one is handed over.
    fn walk_pairs<E: From<RegionError>>(
        &self,
        walk: &LiveWalk<'_>,
        f: &mut dyn FnMut(BlockRef<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut first = true;
        walk.for_each(|pair| {
            f(pair)?;
            if std::mem::take(&mut first) {
                self.run_walk_hook();
            }
            Ok(())
        })
    }

    /// The test hook of a walk (`hook_while_walking_pairs`), if one is set:
    /// run once the first pair is handed over, or where a region is filled
    /// with nothing (a clear).
    fn run_walk_hook(&self) {
        if let Some(hook) = self.shared.walking_pairs.get() {
            (hook.0)();
        }
    }

    /// Compacts the region (see `rebuild_region`) so that a write the quota
    /// admitted can be placed.
    async fn compact(&self, gate: &PairsHeld) -> Result<(), StateMachineError> {
        let seed = self.lock().hash_seed;
        let rebuilt = self.rebuild_region(seed, Contents::LivePairs, gate).await?;
        let old = self.swap_region(&mut self.lock(), rebuilt)?;
        free_replaced(old);
        metrics::counter!("rdkv_region_compactions_total").increment(1);
        tracing::warn!("the region could not place an admitted write; compacted it");
        Ok(())
    }

    /// Applies `Command::Clear`: the region is replaced by an empty one of
    /// the next epoch, made as a compaction makes its region (without the
    /// state lock, off the runtime's threads), rather than emptied key by
    /// key under the lock, which held it 2.2 s for 4,000,000 keys of a
    /// 1 GiB region here (longer than a lease). Returns the keys removed
    /// (those not expired on the apply clock). One-sided readers of the old
    /// region find it retired and attach the new one; a read that checked
    /// the old one's header before the swap reads the pairs as they were
    /// before the clear, which the gate kept unchanged.
    async fn clear_region(&self, version: u64, gate: &PairsHeld) -> Result<u64, StateMachineError> {
        let seed = self.lock().hash_seed;
        let empty = self.rebuild_region(seed, Contents::Nothing, gate).await?;
        // The empty region is the state after the clear: a reader attaching
        // it before the entry is recorded must not take it for the state
        // at the index before (follower reads judge a replica by it).
        empty.publish_applied(version, unix_now_us())?;
        let (old, removed) = {
            let mut state = self.lock();
            let removed = state.writer.unexpired_keys();
            (self.swap_region(&mut state, empty)?, removed)
        };
        free_replaced(old);
        Ok(removed)
    }

    /// Applies one entry to completion. A write the quota admitted but the
    /// region cannot place now waits for blocks in their grace period, then
    /// compacts the region, and stops this replica (an error) only if even
    /// the compacted region cannot hold it. It is never recorded as failed:
    /// other replicas applied it.
    async fn apply_one(
        &self,
        entry: &Entry,
        gate: &PairsHeld,
    ) -> Result<CommandResult, StateMachineError> {
        let mut resume_at = 0;
        let mut compacted_at = None;
        loop {
            let applied = apply_entry(&mut self.lock(), entry, resume_at);
            match applied {
                Applied::Done(result) => return Ok(result),
                Applied::AdoptSeed(seed) => {
                    self.adopt_hash_seed(seed, gate).await?;
                    return Ok(CommandResult::Applied(Response::Done));
                }
                Applied::Clear { version } => {
                    let removed = self.clear_region(version, gate).await?;
                    return Ok(CommandResult::Applied(Response::Cleared {
                        removed,
                        version,
                    }));
                }
                Applied::Full {
                    reclaim_at_us: Some(at_us),
                    next_pair,
                    ..
                } => {
                    let now_us = self.shared.clock.now_us();
                    let pause_us = at_us.saturating_sub(now_us).max(MIN_RECLAIM_PAUSE_US);
                    tokio::time::sleep(Duration::from_micros(pause_us)).await;
                    resume_at = next_pair;
                }
                Applied::Full {
                    reclaim_at_us: None,
                    next_pair,
                    cause,
                } => {
                    if compacted_at == Some(next_pair) {
                        tracing::error!(index = entry.log_id.index, pair = next_pair, "{cause}");
                        return Err(StateMachineError::Unplaceable {
                            index: entry.log_id.index,
                            source: cause,
                        });
                    }
                    self.compact(gate).await?;
                    compacted_at = Some(next_pair);
                    resume_at = next_pair;
                }
            }
        }
    }

    /// Starts loading the index words the apply of `entry` looks up first
    /// (see `lookahead`).
    fn prefetch_neighbourhood(&self, entry: &Entry) {
        if let Some(key) = first_key(entry) {
            self.lock().writer.prefetch_neighbourhood(key);
        }
    }

    /// Starts loading the blocks the apply of `entry` compares its key
    /// with, once its index words are (see `lookahead`).
    fn prefetch_candidates(&self, entry: &Entry) {
        if let Some(key) = first_key(entry) {
            self.lock().writer.prefetch_candidates(key);
        }
    }

    /// Records `entry` as applied: the digest there, the applied index in
    /// the region header, and the no-space alarm's state.
    fn record_applied(&self, entry: &Entry) -> Result<(), StateMachineError> {
        let index = entry.log_id.index;
        {
            let mut state = self.lock();
            state.last_applied = Some(entry.log_id);
            let digest = state.writer.digest();
            state.digests.record(index, digest);
            state.writer.publish_applied(index, unix_now_us())?;
            if state.no_space_alarm && has_room(&state) {
                state.no_space_alarm = false;
                tracing::info!("the no-space alarm is cleared");
            }
        }
        self.shared.applied_index.store(index, Ordering::Release);
        Ok(())
    }

    /// The quota, the charge against it and the alarm, read together.
    pub fn quota_status(&self) -> QuotaStatus {
        let state = self.lock();
        QuotaStatus {
            quota_bytes: state.quota_bytes,
            charged_bytes: state.writer.charged_bytes(),
            no_space_alarm: state.no_space_alarm,
        }
    }

    /// Raises the no-space alarm: a leader refused a write for the quota
    /// before proposing it.
    pub fn raise_no_space_alarm(&self) {
        let mut state = self.lock();
        if !state.no_space_alarm {
            state.no_space_alarm = true;
            tracing::warn!("no-space alarm: a write was refused for the quota");
        }
    }

    /// The state digest at each of the last applied indexes, oldest first
    /// (see `digest`): replicas compare them at an index they all passed.
    pub fn digests(&self) -> Vec<StateDigestAt> {
        self.lock().digests.entries()
    }

    /// The applied index and the state digest there, read together.
    pub fn digest_now(&self) -> StateDigestAt {
        let state = self.lock();
        StateDigestAt {
            applied_index: state.last_applied.map_or(0, |l| l.index),
            digest: state.writer.digest().value(),
        }
    }

    /// The cluster's identity, once applied here (peers must present it).
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.lock().cluster_id
    }

    /// Whether the cluster's hash seed has been applied here.
    pub fn has_hash_seed(&self) -> bool {
        self.lock().hash_seed.is_some()
    }

    /// The current snapshot, building one if there is none yet.
    pub async fn snapshot_file(&self) -> Result<(SnapshotMeta, SnapshotFile), StateMachineError> {
        if let Some(current) = self.lock().snapshot.clone() {
            return Ok(current);
        }
        let built = self.build().await?;
        Ok((built.meta, built.snapshot))
    }

    /// A new file in this node's snapshot directory, for a snapshot being
    /// received (then installed with `install_snapshot`).
    pub fn new_snapshot_file(&self) -> Result<NewSnapshot, StateMachineError> {
        Ok(NewSnapshot::create(&self.shared.config.snapshot_dir)?)
    }

    async fn build(&self) -> Result<Snapshot, StateMachineError> {
        // The pairs are written into a file off the runtime's threads;
        // applies and installs wait for the gate meanwhile.
        let gate = Arc::clone(&self.shared.pairs_gate).lock_owned().await;
        let this = self.clone();
        let (meta, file) = tokio::task::spawn_blocking(move || this.write_snapshot(gate)).await??;
        // Adoption runs beside applies and installs: adopt under the snapshot
        // lock, and never let an older snapshot replace a newer one (the
        // file not adopted is removed with its handle).
        let _persisting = self.shared.persist_lock.lock().await;
        if let Some(current) = self
            .lock()
            .snapshot
            .clone()
            .filter(|(m, _)| index_of(m) >= index_of(&meta))
        {
            return Ok(Snapshot {
                meta: current.0,
                snapshot: current.1,
            });
        }
        let file = self.adopt(file, &meta).await?;
        self.lock().snapshot = Some((meta.clone(), file.clone()));
        metrics::counter!("rdkv_snapshot_builds_total").increment(1);
        tracing::info!(
            last_log_index = index_of(&meta),
            bytes = file.len(),
            "snapshot built and persisted"
        );
        Ok(Snapshot {
            meta,
            snapshot: file,
        })
    }

    /// Writes the live pairs into a new file and syncs it. With the pairs
    /// `gate` held nothing changes them or swaps the region, so the walk of
    /// the region's memory needs the state lock only to read the snapshot's
    /// metadata and which region it is: the pairs are those of one applied
    /// index while the lock stays free for everything else (the lease's
    /// publication, reads). The gate is let go before the file is synced,
    /// which needs no pairs.
    fn write_snapshot(
        &self,
        gate: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<(SnapshotMeta, SnapshotFile), StateMachineError> {
        let mut file = self.new_snapshot_file()?;
        let (meta, region, memory, layout) = {
            let state = self.lock();
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.last_membership.clone(),
            };
            let region = SnapshotRegion {
                hash_seed: state.hash_seed.map(|seed| (seed.0, seed.1)),
                quota_bytes: state.quota_bytes,
                clock_unix_ms: state.writer.clock_unix_ms(),
                cluster_id: state.cluster_id,
            };
            let memory = Arc::clone(state.writer.memory());
            (meta, region, memory, *state.writer.layout())
        };
        file.write_with(|out| {
            let mut writer = SnapshotWriter::new(out, &meta, region)?;
            self.walk_pairs(&LiveWalk::new(&memory, &layout), &mut |pair| {
                writer.pair(pair)?;
                Ok::<_, StateMachineError>(())
            })?;
            writer.finish()?;
            Ok::<_, StateMachineError>(())
        })?;
        drop(gate);
        Ok((meta, file.finish()?))
    }

    /// Makes `file` the persisted snapshot (see `SnapshotFile::adopt`),
    /// off the runtime's threads; the caller holds the snapshot lock.
    async fn adopt(
        &self,
        file: SnapshotFile,
        meta: &SnapshotMeta,
    ) -> Result<SnapshotFile, StateMachineError> {
        let dir = self.shared.config.snapshot_dir.clone();
        let index = index_of(meta);
        Ok(tokio::task::spawn_blocking(move || file.adopt(&dir, index)).await??)
    }
}

fn index_of(meta: &SnapshotMeta) -> u64 {
    meta.last_log_id.map_or(0, |l| l.index)
}

impl RaftSnapshotBuilder<TypeConfig> for RegionStateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        Ok(self.build().await?)
    }
}

impl RaftStateMachine<TypeConfig> for RegionStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let state = self.lock();
        Ok((state.last_applied, state.last_membership.clone()))
    }

    async fn apply<S>(&mut self, entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let started = std::time::Instant::now();
        let mut applied = 0u64;
        let gate = Arc::new(Arc::clone(&self.shared.pairs_gate).lock_owned().await);
        let mut entries = Lookahead::new(entries);
        while let Some((entry, responder)) = entries
            .next(|ahead| self.prefetch_neighbourhood(ahead))
            .await?
        {
            // The next entry's index words were asked for when it was
            // pulled (an entry or more ago; only just, at a batch's start):
            // its candidate blocks load while this one applies.
            if let Some(following) = entries.following() {
                self.prefetch_candidates(following);
            }
            let result = self.apply_one(&entry, &gate).await?;
            self.record_applied(&entry)?;
            if let Some(responder) = responder {
                responder.send(result);
            }
            applied += 1;
        }
        // The apply stage of a write's latency, for the breakdown beside
        // the log's fsyncs and the replication round trips.
        if applied > 0 {
            let shard = self.shared.config.shard.to_string();
            metrics::histogram!("rdkv_raft_apply_duration_seconds", "shard" => shard.clone())
                .record(started.elapsed().as_secs_f64());
            metrics::histogram!("rdkv_raft_apply_batch_entries", "shard" => shard)
                .record(applied as f64);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let _gate = self.shared.pairs_gate.lock().await;
        let epoch = self.lock().writer.layout().region_epoch + 1;
        let (this, file) = (self.clone(), snapshot.clone());
        let loaded = tokio::task::spawn_blocking(move || {
            load_region(&this.shared.config, &this.shared.clock, epoch, &file)
        })
        .await
        .map_err(StateMachineError::from)?
        .inspect_err(|e| tracing::error!("refused a snapshot: {e}"))?;
        let (writer, stored_meta) = (loaded.writer, loaded.meta);
        if stored_meta.last_log_id != meta.last_log_id {
            return Err(io::Error::other(
                "snapshot bytes describe a different log position than their meta",
            ));
        }
        let ours = self.cluster_id();
        let cluster_id = match (ours, loaded.region.cluster_id) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                return Err(io::Error::other(format!(
                    "the snapshot is of cluster {theirs}, this node belongs to cluster {ours}"
                )));
            }
            (ours, theirs) => theirs.or(ours),
        };
        let _persisting = self.shared.persist_lock.lock().await;
        let snapshot = self.adopt(snapshot, meta).await?;
        crate::failpoint::hit(crate::failpoint::SNAPSHOT_INSTALL_AFTER_PERSIST);
        let index = meta.last_log_id.map_or(0, |l| l.index);
        writer
            .publish_applied(index, unix_now_us())
            .map_err(StateMachineError::from)?;
        let old = {
            let mut state = self.lock();
            let old = self.swap_region(&mut state, writer)?;
            state.hash_seed = seed_of(&loaded.region);
            state.quota_bytes = loaded.region.quota_bytes;
            state.cluster_id = cluster_id;
            let digest = state.writer.digest();
            state.digests.record(index, digest);
            state.last_applied = meta.last_log_id;
            state.last_membership = meta.last_membership.clone();
            state.snapshot = Some((meta.clone(), snapshot));
            old
        };
        self.shared.applied_index.store(index, Ordering::Release);
        free_replaced(old);
        metrics::counter!("rdkv_snapshot_installs_total").increment(1);
        tracing::info!(last_log_index = index, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        Ok(self
            .lock()
            .snapshot
            .clone()
            .map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

/// Pause between tries when the region waits for blocks to come back.
const MIN_RECLAIM_PAUSE_US: u64 = 100;

/// Whether the charge is back under the alarm's clearing mark.
fn has_room(state: &State) -> bool {
    state.quota_bytes.is_none_or(|quota| {
        state.writer.charged_bytes().saturating_mul(100)
            <= quota.saturating_mul(ALARM_CLEAR_PERCENT)
    })
}

impl CommandResult {
    /// Whether this result reports a failure to apply on this replica.
    pub fn is_failure(&self) -> bool {
        matches!(self, CommandResult::Failed { .. })
    }
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry;
    use rdkv_proto::wire::{Expiry, SetCondition, Update};

    use super::*;
    use crate::raft::Command;

    fn entry(index: u64, now_unix_ms: u64, command: Command) -> Entry {
        let log_id = openraft::testing::log_id::<TypeConfig>(1, 1, index);
        Entry::new_normal(log_id, command.timed(now_unix_ms))
    }

    /// A state machine on a 4 MiB region with a fixed hash seed, its
    /// snapshots under `dir`.
    fn small_state_machine(dir: &std::path::Path) -> RegionStateMachine {
        RegionStateMachine::open(StateMachineConfig {
            region: RegionConfig {
                region_bytes: 4 << 20,
                hash_seed: HashSeed(1, 1),
                ..RegionConfig::default()
            },
            snapshot_dir: dir.join("snapshots"),
            shard: ShardId(0),
        })
        .expect("a state machine")
    }

    fn set(key: &str, expiry: Expiry) -> Command {
        let update = Update::Set {
            value: Bytes::from_static(b"v"),
            condition: SetCondition::Always,
            return_old: false,
            expiry,
        };
        Command::Update {
            key: Bytes::copy_from_slice(key.as_bytes()),
            update,
        }
    }

    /// A clear answers the keys it removed that a reader could still see
    /// (not those expired on the apply clock), and the region after it
    /// keeps the apply clock and says it holds the clear's index.
    #[tokio::test]
    async fn a_clear_answers_the_keys_it_removed_and_keeps_the_apply_clock() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sm = small_state_machine(dir.path());
        let gate = Arc::new(Arc::clone(&sm.shared.pairs_gate).lock_owned().await);
        let t0_ms = 1_700_000_000_000;
        let writes = [
            set("forever", Expiry::Never),
            set("soon", Expiry::AfterMs(10)),
            set("later", Expiry::AfterMs(EXPIRY_MARGIN_MS + 60_000)),
        ];
        for (index, command) in (1..).zip(writes) {
            let entry = entry(index, t0_ms, command);
            sm.apply_one(&entry, &gate).await.expect("applied");
            sm.record_applied(&entry).expect("recorded");
        }
        let clear_ms = t0_ms + 1_000;
        let clear = entry(4, clear_ms, Command::Clear);
        let answer = sm.apply_one(&clear, &gate).await.expect("applied");
        assert_eq!(
            answer,
            CommandResult::Applied(Response::Cleared {
                removed: 2,
                version: 4
            }),
            "forever and later; soon had expired"
        );
        let state = sm.lock();
        assert_eq!(state.writer.clock_unix_ms(), clear_ms);
        assert_eq!(state.writer.stats().live_keys, 0);
        let header = sm.reader().dynamic_header().expect("a header");
        assert_eq!(header.applied_index, 4);
    }

    /// A batch's kept reader reads the region that replaced the one it
    /// kept (a clear swaps in an empty region; a compaction, the hash
    /// seed's adoption and a snapshot's install swap through the same
    /// `swap_region`), never the replaced one, which still holds the pair.
    #[tokio::test]
    async fn a_kept_reader_reads_the_region_that_replaced_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sm = small_state_machine(dir.path());
        let gate = Arc::new(Arc::clone(&sm.shared.pairs_gate).lock_owned().await);
        let t0_ms = 1_700_000_000_000;
        let write = entry(1, t0_ms, set("forever", Expiry::Never));
        sm.apply_one(&write, &gate).await.expect("applied");
        sm.record_applied(&write).expect("recorded");
        let mut reads = sm.local_reads();
        let mut slices = sm.local_reads();
        let before = reads.get(b"forever").expect("a read");
        assert!(before.is_some(), "the pair, before the clear");
        let found = slices.get_with(b"forever", |found| found.is_some()).ok();
        assert_eq!(found, Some(true), "the pair, before the clear");
        let replaced = sm.reader();
        sm.apply_one(&entry(2, t0_ms + 1_000, Command::Clear), &gate)
            .await
            .expect("applied");
        assert_eq!(reads.get(b"forever").expect("a read"), None);
        let found = slices.get_with(b"forever", |found| found.is_some()).ok();
        assert_eq!(found, Some(false), "the slice read, after the clear");
        let stale = replaced
            .get(b"forever")
            .expect("a read of the replaced region");
        assert!(stale.is_some(), "the replaced region still holds it");
    }
}
