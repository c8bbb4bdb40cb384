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
//! `Known(n)` or `Unknown { after }` (written by an operation whose outcome
//! we do not know: its log index is greater than `after`, the floor when it
//! was linearized); and `floor`: the largest log index known among the
//! operations linearized so far.
//!
//! Versions are Raft log indexes. Every rdkv write command (Put, Delete, Cas,
//! whether the Cas succeeds or not) is its own log entry, and applying the
//! log in index order *is* the order in which writes take effect, so in the
//! true linearization the log indexes of one key's write operations strictly
//! increase. The model therefore requires every operation with a known index
//! to be linearized above `floor`, and sets `floor` to it:
//!
//! - `Put(v) -> Ok(n)`: needs `n > floor`; state becomes `(v, Known(n))`, floor `n`.
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
//! A version "matches" `n` if it is `Known(n)`, or `Unknown { after }` with
//! `n > after`; in the second case the operation also *refines* the state to
//! `Known(n)` and the floor to `n` (a read or failed Cas that returned the
//! version of a write whose outcome we did not know tells us its log index;
//! no operation with a known index can have been linearized since that write
//! without overwriting or refining it, so `n` is the floor). Values are
//! compared by bytes (interned to small integers for the search).
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
//! state `(v, Unknown { after: floor })` without moving the floor; an unknown
//! Delete makes it absent; an unknown Cas needs its condition to be possible
//! (for an `Unknown` version: `expected > after`, refining it) and then acts
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
//!   completed;
//! - and in any case, if `n` is the index of a known write of this key, that
//!   write must have written `v` and been invoked before the read completed.
//!
//! The bound is relative to the cluster's commit index, as documented; a
//! follower that judges its lag by its own (partitioned, stale) view of the
//! commit index can fail this check (ARCHITECTURE.md lists that as a known
//! limit).

use std::collections::{HashMap, HashSet};
use std::fmt;

use bytes::Bytes;
use rdkv_client::{Consistency, Versioned};

use crate::history::{History, OpRecord, Operation, Outcome, Returned, Tick};

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
    let completed = match op.outcome {
        Outcome::Unknown => "inf".to_owned(),
        _ => op.completed_at.to_string(),
    };
    format!(
        "#{} p{} [{}, {}] {operation} -> {outcome}",
        op.id, op.process, op.invoked_at, completed
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
    /// greater than `after`.
    Unknown {
        after: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RegisterState {
    value: Option<(ValueId, Version)>,
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
        let (value, version) = self.value?;
        match version {
            Version::Known(k) if k == n => Some(self),
            Version::Unknown { after } if n > after => Some(RegisterState {
                value: Some((value, Version::Known(n))),
                floor: self.floor.max(n),
            }),
            _ => None,
        }
    }

    /// The state refined by "the value is `current`", or `None`.
    fn with_current(self, current: Option<(ValueId, u64)>) -> Option<RegisterState> {
        match (current, self.value) {
            (None, None) => Some(self),
            (Some((value, n)), Some((held, _))) if value == held => self.with_version(n),
            _ => None,
        }
    }

    /// The state refined by "the version equals `expected`" (`None`: absent).
    fn with_expected(self, expected: Option<u64>) -> Option<RegisterState> {
        match expected {
            None => self.value.is_none().then_some(self),
            Some(e) => self.with_version(e),
        }
    }
}

/// An operation as the model sees it (`None` index/outcome = unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelOp {
    Read(Option<(ValueId, u64)>),
    Put {
        value: ValueId,
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
fn written(state: RegisterState, value: Option<ValueId>, version: u64) -> Option<RegisterState> {
    (version > state.floor).then_some(RegisterState {
        value: value.map(|v| (v, Version::Known(version))),
        floor: version,
    })
}

/// The next state if `op` can be linearized in `state`.
fn step(state: RegisterState, op: ModelOp) -> Option<RegisterState> {
    let unknown_after = |s: RegisterState| Version::Unknown { after: s.floor };
    match op {
        ModelOp::Read(current) => state.with_current(current),
        ModelOp::Put {
            value,
            version: Some(n),
        } => written(state, Some(value), n),
        ModelOp::Put {
            value,
            version: None,
        } => Some(RegisterState {
            value: Some((value, unknown_after(state))),
            floor: state.floor,
        }),
        ModelOp::Delete {
            result: Some((existed, n)),
        } if existed == state.value.is_some() => written(state, None, n),
        ModelOp::Delete { result: Some(_) } => None,
        ModelOp::Delete { result: None } => Some(RegisterState {
            value: None,
            floor: state.floor,
        }),
        ModelOp::Swap {
            observed,
            value,
            version,
        } => written(state.with_current(observed)?, Some(value), version),
        ModelOp::CasSucceeded {
            expected,
            new,
            version,
        } => written(state.with_expected(expected)?, new, version),
        ModelOp::CasFailed {
            expected,
            version,
            current,
        } => {
            // The server must not report a failure when the comparison held.
            if current.map(|(_, n)| n) == expected {
                return None;
            }
            let refined = state.with_current(current)?;
            if version <= refined.floor {
                return None;
            }
            // `with_current` left the value's version known (or absent).
            Some(RegisterState {
                value: refined.value,
                floor: version,
            })
        }
        ModelOp::CasUnknown { expected, new } => {
            let matched = state.with_expected(expected)?;
            Some(RegisterState {
                value: new.map(|v| (v, unknown_after(matched))),
                floor: matched.floor,
            })
        }
    }
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

fn model_op(op: &OpRecord, interner: &mut Interner) -> Result<ModelOp, HistoryError> {
    let mismatch = || HistoryError {
        op_id: op.id,
        reason: format!(
            "outcome {:?} does not belong to {:?}",
            op.outcome, op.operation
        ),
    };
    Ok(match (&op.operation, &op.outcome) {
        (Operation::Get { .. }, Outcome::Ok(Returned::Value(v))) => {
            ModelOp::Read(interner.versioned(v))
        }
        (Operation::Put { value }, Outcome::Ok(Returned::Written { version })) => ModelOp::Put {
            value: interner.id(value),
            version: Some(*version),
        },
        (Operation::Put { value }, Outcome::Unknown) => ModelOp::Put {
            value: interner.id(value),
            version: None,
        },
        (Operation::Delete, Outcome::Ok(Returned::Deleted { existed, version })) => {
            ModelOp::Delete {
                result: Some((*existed, *version)),
            }
        }
        (Operation::Delete, Outcome::Unknown) => ModelOp::Delete { result: None },
        (Operation::Swap { value }, Outcome::Ok(Returned::Swapped { old, version })) => {
            ModelOp::Swap {
                observed: interner.versioned(old),
                value: interner.id(value),
                version: *version,
            }
        }
        // What it read is unknown too: only the write constrains.
        (Operation::Swap { value }, Outcome::Unknown) => ModelOp::Put {
            value: interner.id(value),
            version: None,
        },
        (
            Operation::Cas {
                expected_version,
                new_value,
            },
            outcome,
        ) => {
            let new = new_value.as_ref().map(|v| interner.id(v));
            match outcome {
                Outcome::Ok(Returned::Cas {
                    succeeded: true,
                    version,
                    ..
                }) => ModelOp::CasSucceeded {
                    expected: *expected_version,
                    new,
                    version: *version,
                },
                Outcome::Ok(Returned::Cas {
                    succeeded: false,
                    version,
                    current,
                }) => ModelOp::CasFailed {
                    expected: *expected_version,
                    version: *version,
                    current: interner.versioned(current),
                },
                Outcome::Unknown => ModelOp::CasUnknown {
                    expected: *expected_version,
                    new,
                },
                _ => return Err(mismatch()),
            }
        }
        _ => return Err(mismatch()),
    })
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
            if let Some(next_state) = step(state, op.model) {
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

/// Checks every key of `history` against the versioned-register model
/// (module documentation). Follower reads and `Fail` operations are ignored.
pub fn check_history(history: &History, options: CheckOptions) -> Result<Verdict, HistoryError> {
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
/// deleted) and when it was invoked.
#[derive(Debug, Clone)]
struct KnownWrite {
    version: u64,
    value: Option<Bytes>,
    invoked_at: Tick,
}

fn known_write(op: &OpRecord) -> Option<KnownWrite> {
    let (version, value) = match (&op.operation, &op.outcome) {
        (Operation::Put { value }, Outcome::Ok(Returned::Written { version })) => {
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
    })
}

/// Whether `op` may have deleted its key with a log index above `above`.
fn may_delete_above(op: &OpRecord, above: u64) -> bool {
    let deletes = match &op.operation {
        Operation::Delete => true,
        Operation::Cas { new_value, .. } => new_value.is_none(),
        _ => false,
    };
    deletes
        && match &op.outcome {
            Outcome::Unknown => true,
            Outcome::Ok(Returned::Deleted { version, .. }) => *version > above,
            Outcome::Ok(Returned::Cas {
                succeeded: true,
                version,
                ..
            }) => *version > above,
            _ => false,
        }
}

/// Checks every `Ok` follower read against its lag bound.
pub fn check_follower_reads(history: &History) -> FollowerReport {
    follower_reads(history, None)
}

/// Like [`check_follower_reads`], for the bound as rdkv states it: a
/// replica is at most `max_lag_entries` behind the commit index *as of its
/// last contact with the leader*, and it refuses follower reads once that
/// contact is older than a freshness bound (the election timeout). So only
/// indexes returned at least `freshness_ns` (wall clock) before a read was
/// invoked are taken as committed for that read.
pub fn check_follower_reads_within(history: &History, freshness_ns: u64) -> FollowerReport {
    follower_reads(history, Some(freshness_ns))
}

fn follower_reads(history: &History, freshness_ns: Option<u64>) -> FollowerReport {
    let completions = committed_by_completion(history, freshness_ns);
    let committed_before = |tick: Tick| {
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
        let committed = match freshness_ns {
            None => committed_before(read.invoked_at),
            Some(ns) => committed_before(read.invoked_ns.saturating_sub(ns)),
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

/// Completion time -> largest index returned up to then (a prefix maximum,
/// sorted by time); logical ticks, or wall-clock ns when a freshness bound
/// applies.
fn committed_by_completion(history: &History, freshness_ns: Option<u64>) -> Vec<(Tick, u64)> {
    let mut completions: Vec<(Tick, u64)> = history
        .ops
        .iter()
        .filter_map(|op| match &op.outcome {
            Outcome::Ok(returned) => returned.committed_index().map(|i| {
                let at = match freshness_ns {
                    None => op.completed_at,
                    Some(_) => op.completed_ns,
                };
                (at, i)
            }),
            _ => None,
        })
        .collect();
    completions.sort_unstable();
    let mut running_max = 0;
    for entry in &mut completions {
        running_max = running_max.max(entry.1);
        entry.1 = running_max;
    }
    completions
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
    let explained = history.ops.iter().any(|op| {
        op.key == read.key && op.invoked_at < read.completed_at && may_delete_above(op, w.version)
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
