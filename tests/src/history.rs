//! Recording client histories for the linearizability checker
//! ([`crate::linearizability`]).
//!
//! Every client operation becomes one [`OpRecord`]: who ran it (a process id,
//! one per logical client), on which key, what it asked ([`Operation`]), what
//! came back ([`Outcome`]) and when it was invoked and completed.
//!
//! **Time.** The checker needs the exact real-time order of "A completed
//! before B was invoked". Wall clocks read on different threads can tie or be
//! coarse, so each invocation and completion takes a *tick* from one shared
//! atomic counter (`fetch_add`, `SeqCst`): the invocation tick is taken before
//! the request is sent and the completion tick after the reply arrived, so if
//! A's reply came before B was started, A's completion tick is smaller than
//! B's invocation tick. Ticks are unique, so there are no ties. The
//! nanoseconds since the recorder started are kept beside them for humans.
//!
//! **Wall clock.** Keys written with a TTL expire by the wall clock, so each
//! record also carries the unix milliseconds ([`unix_now_us`] in ms, the clock the
//! servers stamp writes and judge expiry with) read just before the request
//! is sent and just after the reply arrived: whatever time a server used for
//! the operation lies within them (the servers of the tests share this
//! host's clock). The checker uses them only for expiry. That argument
//! assumes the wall clock does not step while the history is recorded; the
//! recorder measures how far it stepped against the monotonic clock
//! ([`History::wall_clock_step_us`]) and the checker allows for it.
//!
//! **Outcomes.** `Ok` carries what the server returned. `Fail` means the
//! operation definitely had no effect (a write that never left the client or
//! was refused before it reached the log; any failed read); the checker drops
//! it. `Unknown` means it may have taken effect at any time after its
//! invocation, or never ([`rdkv_client::Error::OutcomeUnknown`], and any error
//! that does not prove the opposite); its completion tick is recorded but the
//! checker treats it as infinity. A [`PendingOp`] dropped without being
//! completed (its task was cancelled or panicked) is recorded as `Unknown`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkv_client::{
    CasOutcome, Client, Consistency, DeleteOutcome, Error, ErrorCode, Versioned, ttl_ms,
};
use rdkv_fabric::clock::unix_now_us;
use rdkv_proto::wire::{Request, Response, TxnOp, TxnResult};

/// A logical client. Operations of one process never overlap in time when a
/// process waits for each reply before its next call (not required by the
/// checker).
pub type ProcessId = u64;

/// A point on the recorder's logical clock (see the module documentation).
pub type Tick = u64;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// A read, at the given consistency level.
    Get {
        consistency: Consistency,
    },
    Put {
        value: Bytes,
    },
    /// A put whose value expires `ttl_ms` after the leader stamped it (see
    /// [`rdkv_client::Client::put_with_ttl`]).
    PutTtl {
        value: Bytes,
        ttl_ms: u64,
    },
    Delete,
    /// Succeeds iff the key's version equals `expected_version` (`None`: the
    /// key is absent); then writes `new_value` (`None`: deletes the key).
    Cas {
        expected_version: Option<u64>,
        new_value: Option<Bytes>,
    },
    /// A transaction (MULTI/EXEC's native form, one log entry) that reads
    /// the key and then writes `value`: returns what it read.
    Swap {
        value: Bytes,
    },
}

impl Operation {
    pub fn is_read(&self) -> bool {
        matches!(self, Operation::Get { .. })
    }
}

/// What a completed operation returned (one variant per [`Operation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Returned {
    /// Of a `Get`: the value and the log index that wrote it, or absent.
    Value(Option<Versioned>),
    /// Of a `Put` or `PutTtl`: its log index.
    Written { version: u64 },
    /// Of a `Delete`: whether the key existed, and the delete's log index.
    Deleted { existed: bool, version: u64 },
    /// Of a `Cas`: see [`rdkv_client::CasOutcome`] (`version` is the Cas
    /// command's own log index whether or not it succeeded).
    Cas {
        succeeded: bool,
        version: u64,
        current: Option<Versioned>,
    },
    /// Of a `Swap`: what it read, and the transaction's log index (the
    /// version it wrote).
    Swapped {
        old: Option<Versioned>,
        version: u64,
    },
}

impl Returned {
    /// The log index this result proves committed: a write's (or failed
    /// Cas's) own index, or the index of the write a read observed.
    pub fn committed_index(&self) -> Option<u64> {
        match self {
            Returned::Value(value) => value.as_ref().map(|v| v.version),
            Returned::Written { version }
            | Returned::Deleted { version, .. }
            | Returned::Cas { version, .. }
            | Returned::Swapped { version, .. } => Some(*version),
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok(Returned),
    /// Definitely not applied (writes), or no information (reads).
    Fail,
    /// May or may not have been applied, at any time after invocation.
    Unknown,
}

/// One client operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRecord {
    /// Index of the invocation in the recorder (unique within a history).
    pub id: usize,
    pub process: ProcessId,
    pub key: Bytes,
    pub operation: Operation,
    pub outcome: Outcome,
    pub invoked_at: Tick,
    /// For `Unknown` outcomes: when the client gave up (the checker uses
    /// infinity instead).
    pub completed_at: Tick,
    /// Nanoseconds since the recorder started (diagnostics only).
    pub invoked_ns: u64,
    pub completed_ns: u64,
    /// Wall clock, unix ms, just before the request was sent and just after
    /// the reply arrived (see the module documentation).
    pub invoked_unix_ms: u64,
    pub completed_unix_ms: u64,
}

impl OpRecord {
    /// The completion time the checker uses: infinity for `Unknown`.
    pub fn effective_completion(&self) -> Tick {
        match self.outcome {
            Outcome::Unknown => Tick::MAX,
            _ => self.completed_at,
        }
    }
}

/// A recorded history: operations in order of invocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<OpRecord>,
    /// How far the wall clock moved against the monotonic clock while the
    /// history was recorded, µs (a step by NTP, a hypervisor or an
    /// operator; slewing moves both clocks alike). Up to about
    /// [`WALL_SAMPLE_MAX_US`] of it is the measurement's own error. The
    /// servers stamp and expire by the same stepped clock, so the wall
    /// readings of the records are good only to within this.
    pub wall_clock_step_us: u64,
}

impl History {
    /// Builds a history from records (e.g. hand-written ones); renumbers the
    /// ids in the given order.
    pub fn from_records(records: impl IntoIterator<Item = OpRecord>) -> History {
        let mut ops: Vec<OpRecord> = records.into_iter().collect();
        for (id, op) in ops.iter_mut().enumerate() {
            op.id = id;
        }
        History {
            ops,
            wall_clock_step_us: 0,
        }
    }

    /// The distinct keys, in byte order.
    pub fn keys(&self) -> Vec<Bytes> {
        let mut keys: Vec<Bytes> = self.ops.iter().map(|op| op.key.clone()).collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// A wall-clock sample whose two bracketing readings are further apart
/// than this is not used to measure the clock's steps: the thread may have
/// been descheduled between them.
pub const WALL_SAMPLE_MAX_US: u64 = 10;

#[derive(Debug)]
struct RecorderInner {
    started: Instant,
    clock: AtomicU64,
    next_id: AtomicU64,
    completed: Mutex<Vec<OpRecord>>,
    wall_offsets: WallOffsets,
}

/// The least and greatest (wall clock − monotonic clock) seen, µs: their
/// difference is how far the wall clock stepped.
#[derive(Debug)]
struct WallOffsets {
    least_us: AtomicI64,
    greatest_us: AtomicI64,
}

impl WallOffsets {
    fn new() -> WallOffsets {
        WallOffsets {
            least_us: AtomicI64::new(i64::MAX),
            greatest_us: AtomicI64::new(i64::MIN),
        }
    }

    /// One sample: the wall clock read at `before_us` and `after_us`
    /// around the monotonic reading `monotonic_us`.
    fn sample(&self, before_us: u64, monotonic_us: u64, after_us: u64) {
        let Some(spread_us) = after_us.checked_sub(before_us) else {
            return; // stepped back between the readings: later samples show it
        };
        if spread_us > WALL_SAMPLE_MAX_US {
            return;
        }
        let wall_us = before_us + spread_us / 2;
        let offset_us = i64::try_from(wall_us).unwrap_or(i64::MAX)
            - i64::try_from(monotonic_us).unwrap_or(i64::MAX);
        self.least_us.fetch_min(offset_us, Ordering::Relaxed);
        self.greatest_us.fetch_max(offset_us, Ordering::Relaxed);
    }

    /// The step measured so far (0 before two samples).
    fn step_us(&self) -> u64 {
        let least = self.least_us.load(Ordering::Relaxed);
        let greatest = self.greatest_us.load(Ordering::Relaxed);
        u64::try_from(greatest.saturating_sub(least)).unwrap_or(0)
    }
}

/// A thread-safe history recorder; clones share one history.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            inner: Arc::new(RecorderInner {
                started: Instant::now(),
                clock: AtomicU64::new(0),
                next_id: AtomicU64::new(0),
                completed: Mutex::new(Vec::new()),
                wall_offsets: WallOffsets::new(),
            }),
        }
    }

    /// The logical tick, the ns since the start and the unix ms of now
    /// (the wall clock read around the monotonic one, for the step).
    fn tick(&self) -> (Tick, u64, u64) {
        let tick = self.inner.clock.fetch_add(1, Ordering::SeqCst);
        let before_us = unix_now_us();
        let ns = u64::try_from(self.inner.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let after_us = unix_now_us();
        self.inner
            .wall_offsets
            .sample(before_us, ns / 1_000, after_us);
        (tick, ns, after_us / 1_000)
    }

    /// Records an invocation; call this just before sending the request.
    pub fn invoke(
        &self,
        process: ProcessId,
        key: impl Into<Bytes>,
        operation: Operation,
    ) -> PendingOp {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (invoked_at, invoked_ns, invoked_unix_ms) = self.tick();
        PendingOp {
            recorder: self.clone(),
            record: Some(OpRecord {
                id: usize::try_from(id).unwrap_or(usize::MAX),
                process,
                key: key.into(),
                operation,
                outcome: Outcome::Unknown,
                invoked_at,
                completed_at: Tick::MAX,
                invoked_ns,
                completed_ns: u64::MAX,
                invoked_unix_ms,
                completed_unix_ms: u64::MAX,
            }),
        }
    }

    fn finish(&self, mut record: OpRecord, outcome: Outcome) {
        let (completed_at, completed_ns, completed_unix_ms) = self.tick();
        record.outcome = outcome;
        record.completed_at = completed_at;
        record.completed_ns = completed_ns;
        record.completed_unix_ms = completed_unix_ms;
        // A poisoned lock only means another recording thread panicked; the
        // records already pushed are intact.
        let mut completed = self
            .inner
            .completed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        completed.push(record);
    }

    /// Everything completed so far, in order of invocation. Operations still
    /// pending are not included (complete or drop them first).
    pub fn history(&self) -> History {
        let completed = self
            .inner
            .completed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut ops = completed.clone();
        ops.sort_by_key(|op| op.invoked_at);
        History {
            ops,
            wall_clock_step_us: self.inner.wall_offsets.step_us(),
        }
    }

    /// A client wrapper that records every call as `process`.
    pub fn client(&self, client: Client, process: ProcessId) -> RecordingClient {
        RecordingClient {
            client,
            process,
            recorder: self.clone(),
        }
    }
}

/// An invoked operation waiting for its outcome. Dropping it without
/// [`PendingOp::complete`] records the outcome as `Unknown` (a cancelled
/// write may still have been sent).
#[derive(Debug)]
pub struct PendingOp {
    recorder: Recorder,
    record: Option<OpRecord>,
}

impl PendingOp {
    pub fn complete(mut self, outcome: Outcome) {
        if let Some(record) = self.record.take() {
            self.recorder.finish(record, outcome);
        }
    }

    pub fn complete_get(self, result: &rdkv_client::Result<Option<Versioned>>) {
        let outcome = match result {
            Ok(value) => Outcome::Ok(Returned::Value(value.clone())),
            // A failed read changed nothing and told nothing.
            Err(_) => Outcome::Fail,
        };
        self.complete(outcome);
    }

    pub fn complete_put(self, result: &rdkv_client::Result<u64>) {
        self.complete_write(result, |&version| Returned::Written { version });
    }

    pub fn complete_delete(self, result: &rdkv_client::Result<DeleteOutcome>) {
        self.complete_write(result, |d| Returned::Deleted {
            existed: d.existed,
            version: d.version,
        });
    }

    pub fn complete_cas(self, result: &rdkv_client::Result<CasOutcome>) {
        self.complete_write(result, |c| Returned::Cas {
            succeeded: c.succeeded,
            version: c.version,
            current: c.current.clone(),
        });
    }

    pub fn complete_swap(self, result: &rdkv_client::Result<(Option<Versioned>, u64)>) {
        self.complete_write(result, |(old, version)| Returned::Swapped {
            old: old.clone(),
            version: *version,
        });
    }

    /// A write's outcome: what it returned, or what its error says about
    /// whether it happened.
    fn complete_write<T>(
        self,
        result: &rdkv_client::Result<T>,
        returned: impl FnOnce(&T) -> Returned,
    ) {
        let outcome = match result {
            Ok(reply) => Outcome::Ok(returned(reply)),
            Err(e) => write_error_outcome(e),
        };
        self.complete(outcome);
    }
}

impl Drop for PendingOp {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            self.recorder.finish(record, Outcome::Unknown);
        }
    }
}

/// Classifies a failed write: `Fail` only when the error proves the write
/// never reached the log; everything else (including error kinds added
/// later) is `Unknown`, which is always sound (it only weakens the check).
pub fn write_error_outcome(error: &Error) -> Outcome {
    match error {
        // Never sent, or refused before reaching Raft.
        Error::NoEndpoints
        | Error::Connect(_)
        | Error::Timeout(_)
        | Error::NoLeader
        | Error::OneSidedUnavailable => Outcome::Fail,
        Error::Server(reply) => match reply.code {
            // Refused by validation, routing, backpressure or the quota.
            ErrorCode::NotLeader
            | ErrorCode::KeyTooLarge
            | ErrorCode::ValueTooLarge
            | ErrorCode::BatchTooLarge
            | ErrorCode::EmptyBatch
            | ErrorCode::FrameTooLarge
            | ErrorCode::Unauthenticated
            | ErrorCode::Unavailable
            | ErrorCode::StaleFollower
            | ErrorCode::Malformed
            | ErrorCode::TooManyInFlight
            | ErrorCode::UnsupportedVersion
            | ErrorCode::NotFound
            | ErrorCode::InvalidRequest
            // Refused before the log, or by every replica's apply alike:
            // the quota decides the same everywhere.
            | ErrorCode::NoSpace => Outcome::Fail,
            // Timeout, Internal, Unknown say nothing.
            ErrorCode::Timeout
            | ErrorCode::Internal
            | ErrorCode::Unknown => Outcome::Unknown,
        },
        _ => Outcome::Unknown,
    }
}

/// A [`Client`] that records each call into a [`Recorder`] as one process.
#[derive(Debug, Clone)]
pub struct RecordingClient {
    client: Client,
    process: ProcessId,
    recorder: Recorder,
}

impl RecordingClient {
    pub fn process(&self) -> ProcessId {
        self.process
    }

    pub fn inner(&self) -> &Client {
        &self.client
    }

    pub async fn get(
        &self,
        key: impl Into<Bytes>,
        consistency: Consistency,
    ) -> rdkv_client::Result<Option<Versioned>> {
        let key = key.into();
        let pending =
            self.recorder
                .invoke(self.process, key.clone(), Operation::Get { consistency });
        let result = self.client.get_with(key, consistency).await;
        pending.complete_get(&result);
        result
    }

    pub async fn put(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> rdkv_client::Result<u64> {
        let key = key.into();
        let value = value.into();
        let pending = self.recorder.invoke(
            self.process,
            key.clone(),
            Operation::Put {
                value: value.clone(),
            },
        );
        let result = self.client.put(key, value).await;
        pending.complete_put(&result);
        result
    }

    /// A put whose value expires after `ttl`; recorded as
    /// [`Operation::PutTtl`] with the TTL in whole ms, as the client sends it.
    pub async fn put_with_ttl(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        ttl: Duration,
    ) -> rdkv_client::Result<u64> {
        let key = key.into();
        let value = value.into();
        let pending = self.recorder.invoke(
            self.process,
            key.clone(),
            Operation::PutTtl {
                value: value.clone(),
                ttl_ms: ttl_ms(ttl),
            },
        );
        let result = self.client.put_with_ttl(key, value, ttl).await;
        pending.complete_put(&result);
        result
    }

    pub async fn delete(&self, key: impl Into<Bytes>) -> rdkv_client::Result<DeleteOutcome> {
        let key = key.into();
        let pending = self
            .recorder
            .invoke(self.process, key.clone(), Operation::Delete);
        let result = self.client.delete(key).await;
        pending.complete_delete(&result);
        result
    }

    pub async fn cas(
        &self,
        key: impl Into<Bytes>,
        expected_version: Option<u64>,
        new_value: Option<Bytes>,
    ) -> rdkv_client::Result<CasOutcome> {
        let key = key.into();
        let pending = self.recorder.invoke(
            self.process,
            key.clone(),
            Operation::Cas {
                expected_version,
                new_value: new_value.clone(),
            },
        );
        let result = self.client.cas(key, expected_version, new_value).await;
        pending.complete_cas(&result);
        result
    }

    /// Reads `key` and writes `value` in one transaction: what it read and
    /// the transaction's log index.
    pub async fn swap(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> rdkv_client::Result<(Option<Versioned>, u64)> {
        let key = key.into();
        let value = value.into();
        let pending = self.recorder.invoke(
            self.process,
            key.clone(),
            Operation::Swap {
                value: value.clone(),
            },
        );
        let request = Request::Transaction {
            watch: Vec::new(),
            ops: vec![TxnOp::Get { key: key.clone() }, TxnOp::Put { key, value }],
        };
        let result = match self.client.send(request).await {
            Ok(Response::Transaction {
                aborted: false,
                results,
                version,
            }) if matches!(
                results.as_slice(),
                [TxnResult::Value(_), TxnResult::Written]
            ) =>
            {
                let old = match results.into_iter().next() {
                    Some(TxnResult::Value(old)) => old,
                    _ => None,
                };
                Ok((old, version))
            }
            Ok(other) => Err(Error::UnexpectedResponse {
                request: "transaction",
                response: format!("{other:?}"),
            }),
            Err(e) => Err(e),
        };
        pending.complete_swap(&result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_order_invocations_and_completions() {
        let recorder = Recorder::new();
        let a = recorder.invoke(1, "k", Operation::Delete);
        a.complete(Outcome::Ok(Returned::Deleted {
            existed: false,
            version: 3,
        }));
        let b = recorder.invoke(2, "k", Operation::Put { value: "v".into() });
        drop(b); // cancelled: recorded as Unknown
        let history = recorder.history();
        assert_eq!(history.ops.len(), 2);
        let (a, b) = (&history.ops[0], &history.ops[1]);
        assert!(a.invoked_at < a.completed_at);
        assert!(a.completed_at < b.invoked_at);
        assert!(a.invoked_unix_ms <= a.completed_unix_ms);
        assert!(a.completed_unix_ms <= b.invoked_unix_ms);
        assert_eq!(b.outcome, Outcome::Unknown);
        assert_eq!(b.effective_completion(), Tick::MAX);
    }

    #[test]
    fn the_wall_clock_step_is_measured_against_the_monotonic_clock() {
        let offsets = WallOffsets::new();
        assert_eq!(offsets.step_us(), 0, "no sample yet");
        // A steady clock: wall − monotonic stays 1_000_000 µs (± the
        // bracket's half).
        offsets.sample(1_000_100, 100, 1_000_110);
        offsets.sample(1_005_000, 5_000, 1_005_000);
        assert_eq!(offsets.step_us(), 5);
        // Readings bracketed too loosely (descheduled), or stepping back
        // between the two reads, are not samples.
        offsets.sample(1_040_000, 9_000, 1_040_000 + WALL_SAMPLE_MAX_US + 1);
        offsets.sample(1_050_000, 20_000, 1_049_000);
        assert_eq!(offsets.step_us(), 5);
        // A step back of 3 ms.
        offsets.sample(1_027_000, 30_000, 1_027_000);
        assert_eq!(offsets.step_us(), 3_005);
    }

    #[test]
    fn a_recorded_history_carries_its_wall_clock_step() {
        let recorder = Recorder::new();
        for _ in 0..100 {
            recorder
                .invoke(1, "k", Operation::Delete)
                .complete(Outcome::Fail);
        }
        // The bracket is wide enough for this host's clock reads: samples
        // were taken (a step measured 0 for want of any would hide steps).
        let offsets = &recorder.inner.wall_offsets;
        assert!(
            offsets.least_us.load(Ordering::Relaxed) <= offsets.greatest_us.load(Ordering::Relaxed)
        );
        // A sample of an offset of 0 against the real ones (about the unix
        // time in µs): as if the clock had stepped back to 1970.
        recorder.inner.wall_offsets.sample(5, 5, 5);
        let history = recorder.history();
        assert!(
            history.wall_clock_step_us > 1_700_000_000_000_000,
            "{history:?}"
        );
    }

    #[test]
    fn ttls_are_recorded_in_whole_ms_rounded_up_as_the_client_sends_them() {
        assert_eq!(ttl_ms(Duration::from_millis(300)), 300);
        assert_eq!(ttl_ms(Duration::from_micros(300_001)), 301);
    }

    #[test]
    fn only_proven_failures_are_fail() {
        assert_eq!(write_error_outcome(&Error::NoLeader), Outcome::Fail);
        let unknown = Error::OutcomeUnknown {
            addr: "a".into(),
            reason: "r".into(),
        };
        assert_eq!(write_error_outcome(&unknown), Outcome::Unknown);
        let lost = Error::ConnectionLost {
            addr: "a".into(),
            reason: "r".into(),
        };
        assert_eq!(write_error_outcome(&lost), Outcome::Unknown);
    }
}
