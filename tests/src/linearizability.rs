//! A linearizability checker for recorded rdkv histories
//! ([`crate::history`]), and a separate check of the follower-read bound.
//!
//! # Algorithm
//!
//! Keys are independent registers, so a history is linearizable iff each
//! key's sub-history is; [`check_history`] partitions by key and checks each
//! with the Wing & Gong / Lowe algorithm as Porcupine implements it: the
//! operations' call and return events form one doubly linked list in time
//! order (at equal times calls come first, i.e. such operations count as
//! concurrent). The search walks the list from the front; at a call entry it
//! tries to linearize that operation next (the model must accept it from the
//! current state); if it does and the pair (set of linearized operations as a
//! bitset, model state) was not seen before, it pushes the operation on a
//! stack, unlinks its call and return entries and starts again from the front.
//! Reaching a return entry means that operation had to be linearized by now
//! and was not: pop the last choice (relink it, restore the state) and try the
//! next candidate after it. The memo of (bitset, state) pairs makes the
//! search forget nothing it already refuted. Every loop iteration counts as a
//! step; a key that needs more than [`CheckOptions::max_steps_per_key`] gives
//! [`Verdict::Timeout`] instead of hanging.
//!
//! # The model: a versioned register per key
//!
//! State: `value`: absent, or (value, version) where the version is
//! `Known(n)` or `Unknown { after, before }` (written by an operation whose
//! outcome we do not know: its log index is greater than `after`, the floor
//! when it was linearized, and less than `before`, see "Expiry"); and
//! `floor`: the largest log index known among the operations linearized so
//! far.
//!
//! Versions are Raft log indexes. Every rdkv write command (Put, Delete, Cas,
//! whether the Cas succeeds or not) is its own log entry, and applying the
//! log in index order *is* the order in which writes take effect, so in the
//! true linearization the log indexes of one key's write operations strictly
//! increase. The model therefore requires every operation with a known index
//! to be linearized above `floor`, and sets `floor` to it:
//!
//! - `Put(v) -> Ok(n)`: needs `n > floor`; state becomes `(v, Known(n))`, floor `n`.
//!   `PutTtl(v, ttl)` likewise, and its value expires (see "Expiry").
//! - `Delete -> Ok(existed, n)`: needs `existed` == "state present" and
//!   `n > floor`; state becomes absent, floor `n`.
//! - `Cas(expected, new) -> Ok(succeeded, n)`: needs `n > floor`.
//!   Succeeded: the state's version must equal `expected` (`None`: absent);
//!   state becomes `new` with `Known(n)` (or absent). Failed: `current` (what
//!   the server says the key held) must equal the state and its version must
//!   differ from `expected`; the state is unchanged.
//! - `Get -> Ok(None)`: the state must be absent. `Get -> Ok((v, n))`: the
//!   state's value must be `v` and its version must match `n`.
//!
//! A version "matches" `n` if it is `Known(n)`, or `Unknown { after, before }`
//! with `after < n < before`; in the second case the operation also
//! *refines* the state to `Known(n)` and the floor to `max(floor, n)` (a
//! read or failed Cas that returned the version of a write whose outcome we
//! did not know tells us its log index; an operation with a known index
//! linearized since that write overwrote it, refined it, or was a failed Cas
//! that saw it expired and set `before` to its own index). Values are
//! compared by bytes (interned to small integers for the search).
//!
//! # Expiry
//!
//! A `PutTtl(v, ttl)` value expires at the deadline `D = stamp + ttl`, where
//! `stamp` is the leader's wall clock (unix ms) when it proposed the write.
//! Every path of the server (apply deciding a Delete, Cas or transaction;
//! server reads; one-sided reads) counts the key absent at wall time `t`
//! iff `t + M >= D`, `M` = [`EXPIRY_MARGIN_MS`]. Each operation carries its
//! wall interval `[s, e]` (unix ms read just before the request was sent and
//! just after the reply; `e` = infinity for an unknown outcome). For an
//! expiring value the state keeps an interval `[lo, hi]` known to hold `D`,
//! `[s + ttl, e + ttl]` of its PutTtl to begin with, and each operation that
//! observes the key narrows it (and is rejected if that leaves `lo > hi`):
//!
//! - it saw the value (a read returning it, a Delete that says it existed, a
//!   Cas whose condition or `current` has it, a Swap's `old`): `t + M < D`
//!   for some `t >= s`, so `lo := max(lo, s + M + 1)`;
//! - it saw the key absent: `t + M >= D` for some `t <= e`, so
//!   `hi := min(hi, e + M)`; the expired value stays in the state (a failed
//!   Cas that saw it so, with index `c`, bounds an unknown version by
//!   `before := c`: the value was written before it).
//!
//! Plain Put, a successful Cas and Swap write values that never expire. Every
//! operation observes the key or overwrites it, and its outcome says which
//! it saw, so a step stays a function of (state, operation). An unknown Cas
//! that took effect needs its condition: an expected absence is always
//! possible (`e` is infinite), an expected version narrows `lo` as above.
//!
//! What this catches, the three ways to reach `lo > hi`:
//!
//! - a value served after its deadline: seen live although `s + M >= hi`;
//! - a key expired too early: seen absent although `e + M < lo`;
//! - a resurrection: the value seen again by an operation that began after
//!   one that saw it expired had completed (`D <= e1 + M` and
//!   `D >= s2 + M + 1` cannot both hold when `s2 >= e1`), whatever happened
//!   in between.
//!
//! **Soundness.** `D` lies in the initial interval: the leader reads its
//! clock after the request left the client and before the reply came back,
//! on the same host clock (`unix_now_ms` floors it for everyone, which keeps
//! the order). Each operation decides presence at one time within its own
//! interval: a read when it is served; a write at its own stamp, because
//! apply moves the replicated apply clock to each entry's stamp and never
//! back, and every entry before it in the log existed, stamped, before its
//! leader appended it, so the clock at an entry is that entry's stamp. So
//! every narrowing keeps the true `D`, and the true execution (log order,
//! reads where they were served) is accepted.
//!
//! **Why an observed expiry is not a state change.** Turning the register
//! absent when an operation sees the value expired (the expiry as one event
//! of the linearization) is not sound for this server: a write decides at
//! its stamp, when proposed, but takes its place in the order when it
//! commits. A read served in between, later on the clock but earlier in the
//! log, can see the value expired, while a Cas or Swap after it in the log
//! saw it live and replaced it; no single expiry point orders the two. The
//! two overlap in time, which the rule above allows, while it still rejects
//! a value seen live after an operation that saw it expired had completed.
//!
//! All of this reads the host's wall clock as one steady timeline. When it
//! steps while the history is recorded (NTP, a hypervisor), a server's
//! reading may lie up to the step outside an operation's `[s, e]` (and the
//! apply clock, which never goes back, keeps a stamp from before a step
//! back). The recorder measures the step against the monotonic clock
//! ([`History::wall_clock_step_us`]); beyond the measurement's own error,
//! every operation's wall interval is widened by it, rounded up to whole
//! ms ([`wall_slack_ms`]), before anything is judged.
//!
//! # Unknown and failed operations
//!
//! `Fail` operations (definitely not applied) and failed reads are dropped
//! before checking. Reads at `Follower` consistency are not linearizable by
//! design and are left to [`check_follower_reads`]; `Lease` and
//! `Linearizable` reads are both checked here (the lease's clock assumption
//! holds on one machine).
//!
//! An `Unknown` write may take effect at any time after its invocation, or
//! never. It gets no return entry (return time = infinity), so the search may
//! linearize it anywhere after its call; and the search succeeds as soon as
//! every operation *with* a known outcome is linearized, so an unknown one
//! left over "never happened". When linearized, an unknown Put(v) makes the
//! state `(v, Unknown { after: floor, before: ∞ })` without moving the
//! floor; an unknown Delete makes it absent; an unknown Cas needs its
//! condition to be possible (for an `Unknown` version: `expected` must match
//! it, refining it) and then acts
//! like a successful one with an unknown version (an unknown Cas whose
//! condition failed changed nothing, which is the same as never happening).
//! This model is sound: the true execution (log order, each value with its
//! real index) is always one of the linearizations it accepts. It relies on
//! the server putting every write command, a failing Cas included, in its own
//! log entry and answering with that entry's index (`Command::Cas` in
//! `storage/src/state_machine/apply.rs`); a server that answered a failing
//! Cas from its applied state without a log entry would need `>=` there.
//!
//! # Explanations
//!
//! A violation is reported with a witness: the shortest prefix of the key's
//! history (cut right after some operation's completion; operations still
//! running at the cut become `Unknown` writes or are dropped if reads) that is
//! still not linearizable, from which read-like operations (reads, failed
//! Cas) were then removed in chunks while it stayed non-linearizable. A
//! prefix, and a history with fewer reads, can only be *more* linearizable,
//! so the witness proves the whole history is not. The `culprit` is the
//! witness's last operation to complete: up to just before its completion
//! the shrunk history was still explainable.
//!
//! # The follower-read bound ([`check_follower_reads`])
//!
//! `Follower { max_lag_entries: L }` promises that the replica serving the
//! read has applied every log entry up to (commit index − L) at read time.
//! Let `c` be the largest log index any operation (on any key) returned
//! before the read was invoked (a write's or a failed Cas's own index, or the
//! version a read returned): it was committed then, so the commit index at the
//! read is ≥ `c`, and the replica's applied index `A` is ≥ `c − L`. The
//! replica's value for the key is the effect of its last write with index ≤
//! `A`. So, with `W` = the known write (Ok Put, Delete or successful Cas) of
//! this key with the largest index `≤ c − L` (acknowledged or not, since its
//! index alone puts it in the replica's state):
//!
//! - a read returning `(v, n)` needs `n ≥ index(W)`;
//! - a read returning absent needs `W` to be a delete, or some delete of the
//!   key (Ok with index > `index(W)`, or Unknown) invoked before the read
//!   completed, or a PutTtl (`W` itself, or one with index > `index(W)` or
//!   Unknown, invoked before the read completed) whose value may have
//!   expired by the read's completion (`s + ttl <= e_read + M`);
//! - and in any case, if `n` is the index of a known write of this key, that
//!   write must have written `v` and been invoked before the read completed,
//!   and if it was a PutTtl, the read must have begun before its deadline
//!   less the margin could have passed (`s_read + M < e + ttl`).
//!
//! The bound is relative to the cluster's commit index, as documented; a
//! follower that judges its lag by its own (partitioned, stale) view of the
//! commit index can fail this check (ARCHITECTURE.md lists that as a known
//! limit).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

use bytes::Bytes;
use rdkv_client::{Consistency, Versioned};
use rdkv_proto::region::EXPIRY_MARGIN_MS;

use crate::history::{History, OpRecord, Operation, Outcome, Returned, Tick, WALL_SAMPLE_MAX_US};

/// Bounds on the checker's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckOptions {
    /// Search steps allowed per key before that key's verdict is `Timeout`.
    pub max_steps_per_key: u64,
    /// Search steps allowed per violation for shrinking its witness (the
    /// unshrunk witness is reported when they run out).
    pub max_minimize_steps: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            max_steps_per_key: 5_000_000,
            max_minimize_steps: 5_000_000,
        }
    }
}

/// The checker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    NotLinearizable(Box<Violation>),
    /// No violation found, but these keys ran out of steps.
    Timeout {
        keys: Vec<Bytes>,
    },
}

/// Why a key's history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub key: Bytes,
    /// A non-linearizable sub-history (see the module documentation), in
    /// order of invocation. Outcomes of operations cut off by the prefix are
    /// shown as `Unknown`.
    pub witness: Vec<OpRecord>,
    /// The last operation of the witness to complete: the witness without
    /// the operations invoked after that completion was still linearizable.
    pub culprit: Option<OpRecord>,
    /// The longest sequence of operation ids the search could linearize in
    /// the witness before it got stuck.
    pub longest_linearized: Vec<usize>,
    /// Whether shrinking finished within its step budget.
    pub minimized: bool,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {:?} is not linearizable{}",
            self.key.escape_ascii().to_string(),
            if self.minimized {
                ""
            } else {
                " (witness not fully shrunk)"
            }
        )?;
        if let Some(culprit) = &self.culprit {
            writeln!(
                f,
                "  explainable until the completion of: {}",
                describe(culprit)
            )?;
        }
        writeln!(f, "  witness:")?;
        for op in &self.witness {
            writeln!(f, "    {}", describe(op))?;
        }
        writeln!(
            f,
            "  longest linearization found: {:?}",
            self.longest_linearized
        )
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Linearizable => write!(f, "linearizable"),
            Verdict::NotLinearizable(v) => write!(f, "{v}"),
            Verdict::Timeout { keys } => {
                write!(f, "unknown: step budget ran out on {} key(s)", keys.len())
            }
        }
    }
}

fn describe_versioned(v: &Option<Versioned>) -> String {
    match v {
        None => "absent".to_owned(),
        Some(v) => format!("{:?}@{}", v.value.escape_ascii().to_string(), v.version),
    }
}

/// One line for an operation: id, process, [invoked, completed], op -> outcome.
pub fn describe(op: &OpRecord) -> String {
    let operation = match &op.operation {
        Operation::Get { consistency } => format!("get({consistency:?})"),
        Operation::Put { value } => format!("put({:?})", value.escape_ascii().to_string()),
        Operation::PutTtl { value, ttl_ms } => format!(
            "put({:?}, ttl {ttl_ms} ms)",
            value.escape_ascii().to_string()
        ),
        Operation::Delete => "delete".to_owned(),
        Operation::Cas {
            expected_version,
            new_value,
        } => format!(
            "cas(expected {expected_version:?}, new {:?})",
            new_value.as_ref().map(|v| v.escape_ascii().to_string())
        ),
        Operation::Swap { value } => format!("swap({:?})", value.escape_ascii().to_string()),
    };
    let outcome = match &op.outcome {
        Outcome::Fail => "fail".to_owned(),
        Outcome::Unknown => "unknown".to_owned(),
        Outcome::Ok(Returned::Value(v)) => describe_versioned(v),
        Outcome::Ok(Returned::Written { version }) => format!("ok@{version}"),
        Outcome::Ok(Returned::Swapped { old, version }) => {
            format!("read {} wrote@{version}", describe_versioned(old))
        }
        Outcome::Ok(Returned::Deleted { existed, version }) => {
            format!("existed={existed}@{version}")
        }
        Outcome::Ok(Returned::Cas {
            succeeded,
            version,
            current,
        }) => format!(
            "succeeded={succeeded}@{version} current {}",
            describe_versioned(current)
        ),
    };
    let (completed, took_ms) = match op.outcome {
        Outcome::Unknown => ("inf".to_owned(), "?".to_owned()),
        _ => (
            op.completed_at.to_string(),
            op.completed_unix_ms
                .saturating_sub(op.invoked_unix_ms)
                .to_string(),
        ),
    };
    // The wall clock matters for expiry only; it is shown for every
    // operation so that deadlines can be compared by eye.
    format!(
        "#{} p{} [{}, {}] {operation} -> {outcome} (unix ms {} +{took_ms})",
        op.id, op.process, op.invoked_at, completed, op.invoked_unix_ms
    )
}

/// A history the checker cannot interpret (an outcome that does not belong
/// to its operation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("operation #{op_id}: {reason}")]
pub struct HistoryError {
    pub op_id: usize,
    pub reason: String,
}

// ---------------------------------------------------------------------------
// The model.

type ValueId = u32;

/// The version of the register's current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Version {
    Known(u64),
    /// Written by an operation with an unknown outcome: its log index is
    /// greater than `after` and less than `before` (`u64::MAX`: unbounded).
    Unknown {
        after: u64,
        before: u64,
    },
}

/// Where an expiring value's deadline (unix ms) is known to lie: in
/// `lo..=hi` (see "Expiry" in the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Deadline {
    lo: u64,
    hi: u64,
}

impl Deadline {
    /// The deadline of a value written with `ttl_ms` by an operation that
    /// ran within `wall`: the leader's stamp lies within it.
    fn of_write(wall: Wall, ttl_ms: u64) -> Deadline {
        Deadline {
            lo: wall.start.saturating_add(ttl_ms),
            hi: wall.end.saturating_add(ttl_ms),
        }
    }

    /// Refined by "seen live at some time t within `wall`": t + M <
    /// deadline, and t >= start.
    fn seen_live(self, wall: Wall) -> Option<Deadline> {
        let lo = self.lo.max(
            wall.start
                .saturating_add(EXPIRY_MARGIN_MS)
                .saturating_add(1),
        );
        (lo <= self.hi).then_some(Deadline { lo, hi: self.hi })
    }

    /// Refined by "seen expired at some time t within `wall`": t + M >=
    /// deadline, and t <= end.
    fn seen_expired(self, wall: Wall) -> Option<Deadline> {
        let hi = self.hi.min(wall.end.saturating_add(EXPIRY_MARGIN_MS));
        (self.lo <= hi).then_some(Deadline { lo: self.lo, hi })
    }
}

/// An operation's wall-clock interval, unix ms (`end` = `u64::MAX` for an
/// unknown outcome: a write may be stamped after the client gave up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wall {
    start: u64,
    end: u64,
}

/// The register's value: what, which version, and when it expires (`None`:
/// never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Held {
    value: ValueId,
    version: Version,
    expiry: Option<Deadline>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RegisterState {
    /// The last value written (`None`: deleted). One with a deadline stays
    /// here after it expired: whether an operation sees it depends on that
    /// operation's own time, not on its place in the order.
    value: Option<Held>,
    /// Largest log index known among the operations linearized so far.
    floor: u64,
}

impl RegisterState {
    const EMPTY: RegisterState = RegisterState {
        value: None,
        floor: 0,
    };

    /// The state refined by learning that the current value's version is
    /// `n`, or `None` if it cannot be.
    fn with_version(self, n: u64) -> Option<RegisterState> {
        let held = self.value?;
        match held.version {
            Version::Known(k) if k == n => Some(self),
            Version::Unknown { after, before } if after < n && n < before => Some(RegisterState {
                value: Some(Held {
                    version: Version::Known(n),
                    ..held
                }),
                floor: self.floor.max(n),
            }),
            _ => None,
        }
    }

    /// The state refined by "an operation within `wall` saw a value".
    fn seen_live(self, wall: Wall) -> Option<RegisterState> {
        let held = self.value?;
        let expiry = match held.expiry {
            Some(deadline) => Some(deadline.seen_live(wall)?),
            None => None,
        };
        Some(RegisterState {
            value: Some(Held { expiry, ..held }),
            floor: self.floor,
        })
    }

    /// The state refined by "an operation within `wall` saw no value":
    /// none was written, or the one written had expired.
    fn seen_absent(self, wall: Wall) -> Option<RegisterState> {
        let Some(held) = self.value else {
            return Some(self);
        };
        let expiry = Some(held.expiry?.seen_expired(wall)?);
        Some(RegisterState {
            value: Some(Held { expiry, ..held }),
            floor: self.floor,
        })
    }

    /// The state refined by "the value is `current`" as seen within `wall`,
    /// or `None`.
    fn with_current(self, current: Option<(ValueId, u64)>, wall: Wall) -> Option<RegisterState> {
        let Some((value, n)) = current else {
            return self.seen_absent(wall);
        };
        if self.value?.value != value {
            return None;
        }
        self.with_version(n)?.seen_live(wall)
    }

    /// The state refined by "the version equals `expected`" (`None`:
    /// absent) as seen within `wall`.
    fn with_expected(self, expected: Option<u64>, wall: Wall) -> Option<RegisterState> {
        match expected {
            None => self.seen_absent(wall),
            Some(e) => self.with_version(e)?.seen_live(wall),
        }
    }
}

/// A value a write leaves: what, and its deadline (`None`: never expires).
type Written = (ValueId, Option<Deadline>);

/// An operation as the model sees it (`None` index/outcome = unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelOp {
    Read(Option<(ValueId, u64)>),
    /// A Put, PutTtl, or a Swap whose outcome is unknown.
    Put {
        value: Written,
        version: Option<u64>,
    },
    /// `result`: (existed, version) when known.
    Delete {
        result: Option<(bool, u64)>,
    },
    CasSucceeded {
        expected: Option<u64>,
        new: Option<ValueId>,
        version: u64,
    },
    CasFailed {
        expected: Option<u64>,
        version: u64,
        current: Option<(ValueId, u64)>,
    },
    CasUnknown {
        expected: Option<u64>,
        new: Option<ValueId>,
    },
    /// A read of `observed` and a write of `value` at `version`, atomic.
    Swap {
        observed: Option<(ValueId, u64)>,
        value: ValueId,
        version: u64,
    },
}

impl ModelOp {
    /// Reads and failed Cas only constrain; removing them from a history can
    /// only make it more linearizable.
    fn is_read_like(self) -> bool {
        matches!(self, ModelOp::Read(_) | ModelOp::CasFailed { .. })
    }
}

/// The state after a write of `value` (`None`: a delete) at log index
/// `version`, which must be above every index already linearized.
fn written(state: RegisterState, value: Option<Written>, version: u64) -> Option<RegisterState> {
    (version > state.floor).then_some(RegisterState {
        value: value.map(|(value, expiry)| Held {
            value,
            version: Version::Known(version),
            expiry,
        }),
        floor: version,
    })
}

/// The state after a write of unknown outcome (and so unknown index) that
/// took effect, leaving `value`.
fn written_unknown(state: RegisterState, value: Option<Written>) -> RegisterState {
    RegisterState {
        value: value.map(|(value, expiry)| Held {
            value,
            version: Version::Unknown {
                after: state.floor,
                before: u64::MAX,
            },
            expiry,
        }),
        floor: state.floor,
    }
}

/// The next state if `op`, which ran within `wall`, can be linearized in
/// `state`.
fn step(state: RegisterState, op: ModelOp, wall: Wall) -> Option<RegisterState> {
    // Plain writes (Put, Cas, Swap) leave values that never expire.
    let lasting = |value: ValueId| (value, None);
    match op {
        ModelOp::Read(current) => state.with_current(current, wall),
        ModelOp::Put {
            value,
            version: Some(n),
        } => written(state, Some(value), n),
        ModelOp::Put {
            value,
            version: None,
        } => Some(written_unknown(state, Some(value))),
        ModelOp::Delete {
            result: Some((existed, n)),
        } => {
            let seen = if existed {
                state.seen_live(wall)?
            } else {
                state.seen_absent(wall)?
            };
            written(seen, None, n)
        }
        ModelOp::Delete { result: None } => Some(written_unknown(state, None)),
        ModelOp::Swap {
            observed,
            value,
            version,
        } => written(
            state.with_current(observed, wall)?,
            Some(lasting(value)),
            version,
        ),
        ModelOp::CasSucceeded {
            expected,
            new,
            version,
        } => written(
            state.with_expected(expected, wall)?,
            new.map(lasting),
            version,
        ),
        ModelOp::CasFailed {
            expected,
            version,
            current,
        } => cas_failed(state, expected, version, current, wall),
        ModelOp::CasUnknown { expected, new } => {
            // Linearized means it took effect and its condition held (one
            // whose condition failed changed nothing: "never happened").
            // `wall.end` is infinite, so an expected absence is always
            // possible for an expiring value.
            let matched = state.with_expected(expected, wall)?;
            Some(written_unknown(matched, new.map(lasting)))
        }
    }
}

/// A Cas that failed: `current` is what the key held, its own log index is
/// `version`; the state is unchanged but for what it learned.
fn cas_failed(
    state: RegisterState,
    expected: Option<u64>,
    version: u64,
    current: Option<(ValueId, u64)>,
    wall: Wall,
) -> Option<RegisterState> {
    // The server must not report a failure when the comparison held.
    if current.map(|(_, n)| n) == expected {
        return None;
    }
    let refined = state.with_current(current, wall)?;
    if version <= refined.floor {
        return None;
    }
    // `with_current` left the value's version known, or the value absent,
    // or (seen expired) of unknown version: then it was written before this
    // Cas, so its index is below this one.
    let value = refined.value.map(|held| match held.version {
        Version::Unknown { after, .. } => Held {
            version: Version::Unknown {
                after,
                before: version,
            },
            ..held
        },
        Version::Known(_) => held,
    });
    Some(RegisterState {
        value,
        floor: version,
    })
}

// ---------------------------------------------------------------------------
// Preparing one key's operations.

#[derive(Debug, Clone, Copy)]
struct KeyOp {
    /// Index into the key's record list.
    record: usize,
    call: Tick,
    /// `None`: unknown outcome (return at infinity).
    ret: Option<Tick>,
    wall: Wall,
    model: ModelOp,
}

#[derive(Debug, Default)]
struct Interner {
    ids: HashMap<Bytes, ValueId>,
}

impl Interner {
    fn id(&mut self, value: &Bytes) -> ValueId {
        let next = ValueId::try_from(self.ids.len()).unwrap_or(ValueId::MAX);
        *self.ids.entry(value.clone()).or_insert(next)
    }

    fn versioned(&mut self, v: &Option<Versioned>) -> Option<(ValueId, u64)> {
        v.as_ref().map(|v| (self.id(&v.value), v.version))
    }
}

/// Whether the linearizability check looks at this operation at all.
fn is_checked(op: &OpRecord) -> bool {
    match (&op.operation, &op.outcome) {
        (_, Outcome::Fail) => false,
        (Operation::Get { consistency }, outcome) => {
            !matches!(consistency, Consistency::Follower { .. })
                && matches!(outcome, Outcome::Ok(_))
        }
        _ => true,
    }
}

/// The operation's wall-clock interval; an unknown outcome's ends at
/// infinity, like its return.
fn wall(op: &OpRecord) -> Result<Wall, HistoryError> {
    let end = match op.outcome {
        Outcome::Unknown => u64::MAX,
        _ => op.completed_unix_ms,
    };
    if end < op.invoked_unix_ms {
        // Expiry is judged by the wall clock; one that steps back voids
        // the argument in the module documentation.
        return Err(HistoryError {
            op_id: op.id,
            reason: format!(
                "completed at unix ms {end}, before it was invoked at {}: the wall clock stepped back",
                op.invoked_unix_ms
            ),
        });
    }
    Ok(Wall {
        start: op.invoked_unix_ms,
        end,
    })
}

fn model_op(op: &OpRecord, interner: &mut Interner) -> Result<ModelOp, HistoryError> {
    let wall = wall(op)?;
    let model = match (&op.operation, &op.outcome) {
        (Operation::Get { .. }, Outcome::Ok(Returned::Value(v))) => {
            Some(ModelOp::Read(interner.versioned(v)))
        }
        (Operation::Put { value }, outcome) => put_model_op((interner.id(value), None), outcome),
        (Operation::PutTtl { value, ttl_ms }, outcome) => {
            let deadline = Deadline::of_write(wall, *ttl_ms);
            put_model_op((interner.id(value), Some(deadline)), outcome)
        }
        (Operation::Delete, Outcome::Ok(Returned::Deleted { existed, version })) => {
            Some(ModelOp::Delete {
                result: Some((*existed, *version)),
            })
        }
        (Operation::Delete, Outcome::Unknown) => Some(ModelOp::Delete { result: None }),
        (Operation::Swap { value }, Outcome::Ok(Returned::Swapped { old, version })) => {
            Some(ModelOp::Swap {
                observed: interner.versioned(old),
                value: interner.id(value),
                version: *version,
            })
        }
        // What it read is unknown too: only the write constrains.
        (Operation::Swap { value }, Outcome::Unknown) => {
            put_model_op((interner.id(value), None), &Outcome::Unknown)
        }
        (
            Operation::Cas {
                expected_version,
                new_value,
            },
            outcome,
        ) => {
            let new = new_value.as_ref().map(|v| interner.id(v));
            cas_model_op(*expected_version, new, outcome, interner)
        }
        _ => None,
    };
    model.ok_or_else(|| HistoryError {
        op_id: op.id,
        reason: format!(
            "outcome {:?} does not belong to {:?}",
            op.outcome, op.operation
        ),
    })
}

/// A write of `value` (Put, PutTtl, an unknown Swap); `None`: the outcome
/// does not belong to it.
fn put_model_op(value: Written, outcome: &Outcome) -> Option<ModelOp> {
    match outcome {
        Outcome::Ok(Returned::Written { version }) => Some(ModelOp::Put {
            value,
            version: Some(*version),
        }),
        Outcome::Unknown => Some(ModelOp::Put {
            value,
            version: None,
        }),
        _ => None,
    }
}

/// A Cas; `None`: the outcome does not belong to it.
fn cas_model_op(
    expected: Option<u64>,
    new: Option<ValueId>,
    outcome: &Outcome,
    interner: &mut Interner,
) -> Option<ModelOp> {
    match outcome {
        Outcome::Ok(Returned::Cas {
            succeeded: true,
            version,
            ..
        }) => Some(ModelOp::CasSucceeded {
            expected,
            new,
            version: *version,
        }),
        Outcome::Ok(Returned::Cas {
            succeeded: false,
            version,
            current,
        }) => Some(ModelOp::CasFailed {
            expected,
            version: *version,
            current: interner.versioned(current),
        }),
        Outcome::Unknown => Some(ModelOp::CasUnknown { expected, new }),
        _ => None,
    }
}

fn prepare(records: &[OpRecord]) -> Result<Vec<KeyOp>, HistoryError> {
    let mut interner = Interner::default();
    records
        .iter()
        .enumerate()
        .map(|(index, op)| {
            Ok(KeyOp {
                record: index,
                call: op.invoked_at,
                ret: match op.outcome {
                    Outcome::Unknown => None,
                    _ => Some(op.completed_at),
                },
                wall: wall(op)?,
                model: model_op(op, &mut interner)?,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The search.

const NONE: usize = usize::MAX;
const HEAD: usize = 0;

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Index into the key's `KeyOp`s (unused for the head).
    op: usize,
    is_call: bool,
    prev: usize,
    next: usize,
    /// For a call: its return node, or `NONE` for an unknown outcome.
    matching: usize,
}

struct EventList {
    nodes: Vec<Node>,
}

impl EventList {
    fn new(ops: &[KeyOp]) -> EventList {
        // (time, 0 = call / 1 = return, op): calls before returns at a tie.
        let mut events: Vec<(Tick, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            events.push((op.call, 0, i));
            if let Some(ret) = op.ret {
                events.push((ret, 1, i));
            }
        }
        events.sort_unstable();
        let head = Node {
            op: NONE,
            is_call: false,
            prev: NONE,
            next: NONE,
            matching: NONE,
        };
        let mut nodes = vec![head];
        let mut call_node = vec![NONE; ops.len()];
        for (position, &(_, kind, op)) in events.iter().enumerate() {
            let index = position + 1;
            let prev = index - 1;
            nodes[prev].next = index;
            nodes.push(Node {
                op,
                is_call: kind == 0,
                prev,
                next: NONE,
                matching: NONE,
            });
            if kind == 0 {
                call_node[op] = index;
            } else if let Some(&call) = call_node.get(op) {
                nodes[call].matching = index;
            }
        }
        EventList { nodes }
    }

    fn unlink(&mut self, index: usize) {
        let Node { prev, next, .. } = self.nodes[index];
        self.nodes[prev].next = next;
        if next != NONE {
            self.nodes[next].prev = prev;
        }
    }

    /// Undoes `unlink`; valid because relinks happen in reverse order.
    fn relink(&mut self, index: usize) {
        let Node { prev, next, .. } = self.nodes[index];
        self.nodes[prev].next = index;
        if next != NONE {
            self.nodes[next].prev = index;
        }
    }

    fn lift(&mut self, call: usize) {
        self.unlink(call);
        let ret = self.nodes[call].matching;
        if ret != NONE {
            self.unlink(ret);
        }
    }

    fn unlift(&mut self, call: usize) {
        let ret = self.nodes[call].matching;
        if ret != NONE {
            self.relink(ret);
        }
        self.relink(call);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyVerdict {
    Linearizable,
    /// Op indexes (into the `KeyOp`s) of the longest linearization found.
    NotLinearizable {
        longest: Vec<usize>,
    },
    Timeout,
}

/// WGL search over one key's operations, spending at most `*budget` steps.
fn search(ops: &[KeyOp], budget: &mut u64) -> KeyVerdict {
    let mut list = EventList::new(ops);
    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, RegisterState)> = HashSet::new();
    let mut stack: Vec<(usize, RegisterState)> = Vec::new();
    let mut longest: Vec<usize> = Vec::new();
    let mut state = RegisterState::EMPTY;
    let mut pending_known = ops.iter().filter(|op| op.ret.is_some()).count();
    let mut entry = list.nodes[HEAD].next;
    loop {
        if pending_known == 0 {
            // Unknown operations still unlinearized "never happened".
            return KeyVerdict::Linearizable;
        }
        if *budget == 0 {
            return KeyVerdict::Timeout;
        }
        *budget -= 1;
        let node = if entry == NONE {
            None
        } else {
            Some(list.nodes[entry])
        };
        if let Some(node) = node.filter(|n| n.is_call) {
            let op = ops[node.op];
            if let Some(next_state) = step(state, op.model, op.wall) {
                let (word, bit) = (node.op / 64, 1u64 << (node.op % 64));
                linearized[word] |= bit;
                if seen.insert((linearized.clone(), next_state)) {
                    stack.push((entry, state));
                    state = next_state;
                    if op.ret.is_some() {
                        pending_known -= 1;
                    }
                    list.lift(entry);
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|&(e, _)| list.nodes[e].op).collect();
                    }
                    entry = list.nodes[HEAD].next;
                    continue;
                }
                linearized[word] &= !bit;
            }
            entry = node.next;
        } else {
            // A return entry of an operation not yet linearized (or, which
            // cannot happen while known ones remain, the end): backtrack.
            let Some((call, previous)) = stack.pop() else {
                return KeyVerdict::NotLinearizable { longest };
            };
            let op_index = list.nodes[call].op;
            linearized[op_index / 64] &= !(1u64 << (op_index % 64));
            if ops[op_index].ret.is_some() {
                pending_known += 1;
            }
            state = previous;
            list.unlift(call);
            entry = list.nodes[call].next;
        }
    }
}

fn check_records(records: &[OpRecord], budget: &mut u64) -> Result<KeyVerdict, HistoryError> {
    Ok(search(&prepare(records)?, budget))
}

// ---------------------------------------------------------------------------
// Shrinking a violation.

/// The history as it looked right after tick `cut`: operations invoked later
/// are dropped; writes still running become `Unknown`, reads still running
/// are dropped.
fn prefix(records: &[OpRecord], cut: Tick) -> Vec<OpRecord> {
    records
        .iter()
        .filter(|op| op.invoked_at <= cut)
        .filter_map(|op| {
            if op.effective_completion() <= cut {
                Some(op.clone())
            } else if op.operation.is_read() {
                None
            } else {
                let mut pending = op.clone();
                pending.outcome = Outcome::Unknown;
                Some(pending)
            }
        })
        .collect()
}

fn fails(records: &[OpRecord], budget: &mut u64) -> bool {
    matches!(
        check_records(records, budget),
        Ok(KeyVerdict::NotLinearizable { .. })
    )
}

/// Shrinks a non-linearizable key history; returns (witness, its last
/// operation to complete, finished within budget).
fn shrink(records: &[OpRecord], mut budget: u64) -> (Vec<OpRecord>, Option<OpRecord>, bool) {
    // 1. The shortest failing prefix, by binary search over completion ticks
    // (a prefix of a linearizable history is linearizable, so failure is
    // monotone in the cut).
    let mut cuts: Vec<Tick> = records
        .iter()
        .filter(|op| !matches!(op.outcome, Outcome::Unknown))
        .map(|op| op.completed_at)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let (mut low, mut high) = (0usize, cuts.len().saturating_sub(1));
    let mut complete = true;
    while low < high {
        let middle = low + (high - low) / 2;
        if budget == 0 {
            complete = false;
            break;
        }
        if fails(&prefix(records, cuts[middle]), &mut budget) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let mut witness = match cuts.get(high) {
        Some(&cut) => prefix(records, cut),
        None => records.to_vec(),
    };
    // 2. Drop read-like operations in halving chunks while it still fails.
    let read_like = |op: &OpRecord| {
        let mut interner = Interner::default();
        model_op(op, &mut interner).is_ok_and(ModelOp::is_read_like)
    };
    let mut chunk = witness.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < witness.len() {
            if budget == 0 {
                complete = false;
                break;
            }
            // The next `chunk` read-like operations from `start`.
            let candidates: Vec<usize> = (start..witness.len())
                .filter(|&i| read_like(&witness[i]))
                .take(chunk)
                .collect();
            let Some(&last) = candidates.last() else {
                break;
            };
            let trial: Vec<OpRecord> = witness
                .iter()
                .enumerate()
                .filter(|(i, _)| !candidates.contains(i))
                .map(|(_, op)| op.clone())
                .collect();
            if fails(&trial, &mut budget) {
                witness = trial;
                start = candidates[0];
            } else {
                start = last + 1;
            }
        }
        if chunk == 1 || !complete {
            break;
        }
        chunk = chunk.div_ceil(2);
    }
    let culprit = witness
        .iter()
        .filter(|op| !matches!(op.outcome, Outcome::Unknown))
        .max_by_key(|op| op.completed_at)
        .cloned();
    (witness, culprit, complete)
}

// ---------------------------------------------------------------------------
// Public entry points.

/// The operations on each key, in order of invocation.
fn by_key(history: &History) -> Vec<(Bytes, Vec<OpRecord>)> {
    let mut keys: HashMap<Bytes, Vec<OpRecord>> = HashMap::new();
    for op in &history.ops {
        keys.entry(op.key.clone()).or_default().push(op.clone());
    }
    let mut keys: Vec<(Bytes, Vec<OpRecord>)> = keys.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, ops) in &mut keys {
        ops.sort_by_key(|op| (op.invoked_at, op.id));
    }
    keys
}

/// How many ms any wall reading of `history` (a record's or a server's)
/// may be off the steady timeline: its measured step, rounded up, or 0 for
/// a step within the measurement's own error (each sample is within half
/// of [`WALL_SAMPLE_MAX_US`] of the true offset).
pub fn wall_slack_ms(history: &History) -> u64 {
    if history.wall_clock_step_us <= WALL_SAMPLE_MAX_US {
        0
    } else {
        history.wall_clock_step_us.div_ceil(1_000)
    }
}

/// `history` with every operation's wall interval widened by
/// [`wall_slack_ms`] (borrowed as it is when that is 0).
fn allowing_for_steps(history: &History) -> Cow<'_, History> {
    let slack_ms = wall_slack_ms(history);
    if slack_ms == 0 {
        return Cow::Borrowed(history);
    }
    let mut widened = history.clone();
    for op in &mut widened.ops {
        op.invoked_unix_ms = op.invoked_unix_ms.saturating_sub(slack_ms);
        op.completed_unix_ms = op.completed_unix_ms.saturating_add(slack_ms);
    }
    Cow::Owned(widened)
}

/// Checks every key of `history` against the versioned-register model
/// (module documentation). Follower reads and `Fail` operations are ignored.
pub fn check_history(history: &History, options: CheckOptions) -> Result<Verdict, HistoryError> {
    let history = &*allowing_for_steps(history);
    let mut timed_out = Vec::new();
    for (key, ops) in by_key(history) {
        let records: Vec<OpRecord> = ops.into_iter().filter(is_checked).collect();
        let mut budget = options.max_steps_per_key;
        match check_records(&records, &mut budget)? {
            KeyVerdict::Linearizable => {}
            KeyVerdict::Timeout => timed_out.push(key),
            KeyVerdict::NotLinearizable { .. } => {
                let (witness, culprit, minimized) = shrink(&records, options.max_minimize_steps);
                let mut budget = options.max_steps_per_key;
                let witness_ops = prepare(&witness)?;
                let longest = match search(&witness_ops, &mut budget) {
                    KeyVerdict::NotLinearizable { longest } => longest
                        .into_iter()
                        .map(|i| witness[witness_ops[i].record].id)
                        .collect(),
                    _ => Vec::new(),
                };
                return Ok(Verdict::NotLinearizable(Box::new(Violation {
                    key,
                    witness,
                    culprit,
                    longest_linearized: longest,
                    minimized,
                })));
            }
        }
    }
    if timed_out.is_empty() {
        Ok(Verdict::Linearizable)
    } else {
        Ok(Verdict::Timeout { keys: timed_out })
    }
}

/// A follower read that broke the lag bound (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerViolation {
    pub read: OpRecord,
    /// The largest log index returned before the read was invoked.
    pub committed_before: u64,
    pub reason: String,
}

/// What [`check_follower_reads`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowerReport {
    /// Follower reads with an `Ok` outcome that were checked.
    pub reads_checked: usize,
    pub violations: Vec<FollowerViolation>,
}

/// A known write of one key: its log index, the value it left (`None`:
/// deleted), when it was invoked and when that value expires (PutTtl).
#[derive(Debug, Clone)]
struct KnownWrite {
    version: u64,
    value: Option<Bytes>,
    invoked_at: Tick,
    expiry: Option<Deadline>,
}

fn known_write(op: &OpRecord) -> Option<KnownWrite> {
    let mut expiry = None;
    let (version, value) = match (&op.operation, &op.outcome) {
        (Operation::Put { value }, Outcome::Ok(Returned::Written { version })) => {
            (*version, Some(value.clone()))
        }
        (Operation::PutTtl { value, ttl_ms }, Outcome::Ok(Returned::Written { version })) => {
            expiry = Some(Deadline::of_write(wall(op).ok()?, *ttl_ms));
            (*version, Some(value.clone()))
        }
        (Operation::Delete, Outcome::Ok(Returned::Deleted { version, .. })) => (*version, None),
        (Operation::Swap { value }, Outcome::Ok(Returned::Swapped { version, .. })) => {
            (*version, Some(value.clone()))
        }
        (
            Operation::Cas { new_value, .. },
            Outcome::Ok(Returned::Cas {
                succeeded: true,
                version,
                ..
            }),
        ) => (*version, new_value.clone()),
        _ => return None,
    };
    Some(KnownWrite {
        version,
        value,
        invoked_at: op.invoked_at,
        expiry,
    })
}

/// Whether a value with `deadline` may count as expired to `read` (a read
/// at time t sees it gone iff t + M >= deadline, t <= its completion).
fn may_have_expired(deadline: Deadline, read: &OpRecord) -> bool {
    deadline.lo <= read.completed_unix_ms.saturating_add(EXPIRY_MARGIN_MS)
}

/// Whether `op` may have left its key absent to `read` with a log index
/// above `above`: a delete, or a PutTtl whose value may have expired by then.
fn may_remove_above(op: &OpRecord, above: u64, read: &OpRecord) -> bool {
    let removes = match &op.operation {
        Operation::Delete => true,
        Operation::Cas { new_value, .. } => new_value.is_none(),
        Operation::PutTtl { ttl_ms, .. } => {
            wall(op).is_ok_and(|wall| may_have_expired(Deadline::of_write(wall, *ttl_ms), read))
        }
        _ => false,
    };
    removes
        && match &op.outcome {
            Outcome::Unknown => true,
            Outcome::Ok(
                Returned::Deleted { version, .. }
                | Returned::Written { version }
                | Returned::Cas {
                    succeeded: true,
                    version,
                    ..
                },
            ) => *version > above,
            _ => false,
        }
}

/// Checks every `Ok` follower read against its lag bound.
pub fn check_follower_reads(history: &History) -> FollowerReport {
    follower_reads(history, None, &|_| 0)
}

/// Like [`check_follower_reads`], for the bound as rdkv states it: a
/// replica is at most `max_lag_entries` behind the commit index *as of its
/// last contact with the leader*, and it refuses follower reads once that
/// contact is older than a freshness bound (the election timeout). So only
/// indexes returned at least `freshness_ns` (wall clock) before a read was
/// invoked are taken as committed for that read.
pub fn check_follower_reads_within(history: &History, freshness_ns: u64) -> FollowerReport {
    follower_reads(history, Some(freshness_ns), &|_| 0)
}

/// Like [`check_follower_reads_within`], for a store of several Raft logs
/// (shards): versions are log indexes, comparable only within one log, so
/// a read's bound comes from the indexes returned by operations on keys of
/// the read's log. `log_of` names the log a key belongs to.
pub fn check_follower_reads_per_log(
    history: &History,
    freshness_ns: u64,
    log_of: &dyn Fn(&[u8]) -> u64,
) -> FollowerReport {
    follower_reads(history, Some(freshness_ns), log_of)
}

fn follower_reads(
    history: &History,
    freshness_ns: Option<u64>,
    log_of: &dyn Fn(&[u8]) -> u64,
) -> FollowerReport {
    let history = &*allowing_for_steps(history);
    let completions = committed_by_completion(history, freshness_ns, log_of);
    let committed_before = |log: u64, tick: Tick| {
        let Some(completions) = completions.get(&log) else {
            return 0;
        };
        let count = completions.partition_point(|&(t, _)| t < tick);
        count.checked_sub(1).map_or(0, |i| completions[i].1)
    };
    let writes = known_writes_by_key(history);
    let mut report = FollowerReport::default();
    for read in &history.ops {
        let (
            Operation::Get {
                consistency: Consistency::Follower { max_lag_entries },
            },
            Outcome::Ok(Returned::Value(returned)),
        ) = (&read.operation, &read.outcome)
        else {
            continue;
        };
        report.reads_checked += 1;
        let log = log_of(&read.key);
        let committed = match freshness_ns {
            None => committed_before(log, read.invoked_at),
            Some(ns) => committed_before(log, read.invoked_ns.saturating_sub(ns)),
        };
        let bound = ReadBound {
            committed,
            max_lag_entries: *max_lag_entries,
        };
        let key_writes = writes.get(&read.key).map(Vec::as_slice).unwrap_or_default();
        let reasons = match returned {
            Some(got) => check_returned_value(read, got, key_writes, &bound),
            None => check_returned_absent(history, read, key_writes, &bound),
        };
        report
            .violations
            .extend(reasons.into_iter().map(|reason| FollowerViolation {
                read: read.clone(),
                committed_before: committed,
                reason,
            }));
    }
    report
}

/// Per log: completion time -> largest index returned up to then (a prefix
/// maximum, sorted by time); logical ticks, or wall-clock ns when a
/// freshness bound applies.
fn committed_by_completion(
    history: &History,
    freshness_ns: Option<u64>,
    log_of: &dyn Fn(&[u8]) -> u64,
) -> HashMap<u64, Vec<(Tick, u64)>> {
    let mut by_log: HashMap<u64, Vec<(Tick, u64)>> = HashMap::new();
    for op in &history.ops {
        let Outcome::Ok(returned) = &op.outcome else {
            continue;
        };
        let Some(index) = returned.committed_index() else {
            continue;
        };
        let at = match freshness_ns {
            None => op.completed_at,
            Some(_) => op.completed_ns,
        };
        by_log.entry(log_of(&op.key)).or_default().push((at, index));
    }
    for completions in by_log.values_mut() {
        completions.sort_unstable();
        let mut running_max = 0;
        for entry in completions.iter_mut() {
            running_max = running_max.max(entry.1);
            entry.1 = running_max;
        }
    }
    by_log
}

/// Every write whose version is known, per key, in version order.
fn known_writes_by_key(history: &History) -> HashMap<&Bytes, Vec<KnownWrite>> {
    let mut writes: HashMap<&Bytes, Vec<KnownWrite>> = HashMap::new();
    for op in &history.ops {
        if let Some(write) = known_write(op) {
            writes.entry(&op.key).or_default().push(write);
        }
    }
    for list in writes.values_mut() {
        list.sort_by_key(|w| w.version);
    }
    writes
}

/// What a follower read must reflect: everything committed before it, less
/// the lag it allowed.
struct ReadBound {
    committed: u64,
    max_lag_entries: u64,
}

impl ReadBound {
    fn applied_at_least(&self) -> u64 {
        self.committed.saturating_sub(self.max_lag_entries)
    }

    /// The newest write to the key the replica must have applied.
    fn required<'w>(&self, key_writes: &'w [KnownWrite]) -> Option<&'w KnownWrite> {
        key_writes
            .partition_point(|w| w.version <= self.applied_at_least())
            .checked_sub(1)
            .map(|i| &key_writes[i])
    }
}

/// Why a read that returned `got` is wrong (empty: it is right).
fn check_returned_value(
    read: &OpRecord,
    got: &Versioned,
    key_writes: &[KnownWrite],
    bound: &ReadBound,
) -> Vec<String> {
    let mut reasons = Vec::new();
    if let Some(w) = bound
        .required(key_writes)
        .filter(|w| got.version < w.version)
    {
        reasons.push(format!(
            "returned version {} but the replica must have applied index {} \
             (≥ {} committed − {}), which includes the write at {} to this key",
            got.version,
            bound.applied_at_least(),
            bound.committed,
            bound.max_lag_entries,
            w.version
        ));
    }
    let source = key_writes
        .binary_search_by_key(&got.version, |w| w.version)
        .ok()
        .map(|i| &key_writes[i]);
    if let Some(w) = source {
        let served_late = w.expiry.filter(|deadline| {
            read.invoked_unix_ms.saturating_add(EXPIRY_MARGIN_MS) >= deadline.hi
        });
        if let Some(deadline) = served_late {
            // The deadline's whole range (its write's wall interval plus
            // the TTL), for whoever reads a failure at the edge.
            reasons.push(format!(
                "returned the value written at {} with a TTL, but the read began at \
                 unix ms {}, when its deadline (from {} to {} at the latest) less the \
                 margin had passed",
                got.version, read.invoked_unix_ms, deadline.lo, deadline.hi
            ));
        }
        if w.value.as_ref() != Some(&got.value) {
            reasons.push(format!(
                "returned {:?} at version {}, but that index wrote {:?}",
                got.value, got.version, w.value
            ));
        } else if w.invoked_at > read.completed_at {
            reasons.push(format!(
                "returned the write at {}, which was invoked after the read completed",
                got.version
            ));
        }
    }
    reasons
}

/// Why a read that returned "absent" is wrong (empty: it is right).
fn check_returned_absent(
    history: &History,
    read: &OpRecord,
    key_writes: &[KnownWrite],
    bound: &ReadBound,
) -> Vec<String> {
    let Some(w) = bound.required(key_writes).filter(|w| w.value.is_some()) else {
        return Vec::new();
    };
    let expired = w.expiry.is_some_and(|d| may_have_expired(d, read));
    let explained = expired
        || history.ops.iter().any(|op| {
            op.key == read.key
                && op.invoked_at < read.completed_at
                && may_remove_above(op, w.version, read)
        });
    if explained {
        return Vec::new();
    }
    vec![format!(
        "returned absent but the replica must have applied the write at {} \
         (applied index ≥ {}) and no later delete could have run",
        w.version,
        bound.applied_at_least()
    )]
}

#[cfg(test)]
#[path = "linearizability_tests.rs"]
mod tests;
