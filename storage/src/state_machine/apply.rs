//! Applying one log entry to the region.

use bytes::Bytes;
use openraft::EntryPayload;
use rdkv_proto::region::{HashSeed, charged_bytes};
use rdkv_proto::wire::{
    ErrorCode, ErrorReply, Response, SetCondition, TxnOp, TxnResult, Update, UpdateOutcome,
};

use super::State;
use super::keyed::KeyedRegion;
use crate::raft::{Command, CommandResult, Entry, StoredMembership};
use crate::region::RegionError;

pub(super) enum Applied {
    Done(CommandResult),
    /// `Command::SetHashSeed`: the caller adopts the seed if there is none
    /// yet (it replaces the region, which needs more than the state).
    AdoptSeed(HashSeed),
    /// The quota admitted the write but this region cannot place it now
    /// (blocks in their grace period, fragments, overflow tables: none of
    /// which the quota counts). The caller waits until `reclaim_at_us`
    /// (region clock) when blocks come back, else compacts the region, and
    /// applies again from pair `next_pair` (for MPut; 0 otherwise). It is
    /// never recorded as a result: another replica placed it. `cause` is the
    /// writer's refusal, reported if even a compacted region refuses.
    Full {
        reclaim_at_us: Option<u64>,
        next_pair: usize,
        cause: RegionError,
    },
}

/// What apply checks writes against: replicated, so the same everywhere.
#[derive(Debug, Clone, Copy)]
struct Limits {
    quota_bytes: Option<u64>,
}

/// Applies `entry` from pair `resume_at` of an MPut (0 otherwise).
pub(super) fn apply_entry(state: &mut State, entry: &Entry, resume_at: usize) -> Applied {
    let index = entry.log_id.index;
    let limits = Limits {
        quota_bytes: state.quota_bytes,
    };
    match &entry.payload {
        EntryPayload::Blank => Applied::Done(CommandResult::None),
        EntryPayload::Membership(membership) => {
            state.last_membership = StoredMembership::new(Some(entry.log_id), membership.clone());
            Applied::Done(CommandResult::None)
        }
        EntryPayload::Normal(Command::SetQuota { bytes }) => {
            state.quota_bytes = Some(*bytes);
            replied(Response::Done)
        }
        EntryPayload::Normal(Command::Transaction { watch, ops }) => {
            apply_transaction(state, watch, ops, index, resume_at, limits)
        }
        EntryPayload::Normal(command) => {
            let applied = apply_command(&mut state.writer, command, index, resume_at, limits);
            if is_quota_refusal(&applied) {
                state.no_space_alarm = true;
            }
            applied
        }
    }
}

/// A command applied: its proposer gets `response`.
fn replied(response: Response) -> Applied {
    Applied::Done(CommandResult::Applied(response))
}

fn failed(error: &RegionError) -> Applied {
    Applied::Done(CommandResult::Failed {
        message: error.to_string(),
    })
}

fn is_quota_refusal(applied: &Applied) -> bool {
    matches!(
        applied,
        Applied::Done(CommandResult::Applied(Response::Error(reply))) if reply.code == ErrorCode::NoSpace
    )
}

/// What to do with an error from the write of pair `next_pair` (0 for a
/// single write): a region that cannot place it waits or compacts.
fn on_error(writer: &KeyedRegion, error: RegionError, next_pair: usize) -> Applied {
    match error {
        RegionError::RegionFull { .. } | RegionError::IndexFull { .. } => Applied::Full {
            reclaim_at_us: writer.next_reclaim_at_us(),
            next_pair,
            cause: error,
        },
        _ => failed(&error),
    }
}

/// Refuses, the same way on every replica, writes that would grow the live
/// pairs' charge past the quota. `writes` are (key, value length) in the
/// order applied. Writes that do not grow the charge (overwrites with
/// smaller values) pass even over the quota, as deletes do, so an operator
/// can always make room.
fn check_quota(
    writer: &KeyedRegion,
    limits: Limits,
    writes: &[(&[u8], usize)],
) -> Result<(), Applied> {
    let Some(quota) = limits.quota_bytes else {
        return Ok(());
    };
    let charged = writer.charged_bytes();
    // Far from the quota (the common case) the writes fit even counted as
    // new keys: no lookup, no allocation.
    let at_most: u64 = writes.iter().map(|&(key, len)| charge(key, len)).sum();
    if charged.saturating_add(at_most) <= quota {
        return Ok(());
    }
    let growth = exact_growth(writer, writes)?;
    if growth == 0 || charged.saturating_add(growth) <= quota {
        return Ok(());
    }
    Err(replied(Response::Error(no_space(charged, growth, quota))))
}

/// What `writes` add to the charge: each key once, with its last value,
/// less what its current pair is charged (one lookup per key).
fn exact_growth(writer: &KeyedRegion, writes: &[(&[u8], usize)]) -> Result<u64, Applied> {
    let mut seen = std::collections::HashSet::new();
    let (mut incoming, mut replaced) = (0u64, 0u64);
    for &(key, value_len) in writes.iter().rev() {
        if !seen.insert(key) {
            continue;
        }
        incoming += charge(key, value_len);
        replaced += writer.charge_of(key).map_err(|e| failed(&e))?.unwrap_or(0);
    }
    Ok(incoming.saturating_sub(replaced))
}

/// A pair's charge; one no class holds counts 0 here, as the writer
/// refuses it with its own error.
fn charge(key: &[u8], value_len: usize) -> u64 {
    charged_bytes(key.len(), value_len).unwrap_or(0)
}

/// The refusal of a write past the quota.
pub fn no_space(charged_bytes: u64, growth_bytes: u64, quota_bytes: u64) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::NoSpace,
        format!(
            "no space: the write needs {growth_bytes} more bytes of quota, \
             {charged_bytes} of {quota_bytes} are used (delete keys or raise --quota-bytes)"
        ),
    )
}

/// Writes one pair within the quota.
fn put_within(
    writer: &mut KeyedRegion,
    limits: Limits,
    key: &[u8],
    value: &[u8],
    version: u64,
) -> Result<(), Applied> {
    check_quota(writer, limits, &[(key, value.len())])?;
    writer
        .put(key, value, version)
        .map(drop)
        .map_err(|e| on_error(writer, e, 0))
}

fn apply_command(
    writer: &mut KeyedRegion,
    command: &Command,
    version: u64,
    resume_at: usize,
    limits: Limits,
) -> Applied {
    match command {
        Command::Put { key, value } => match put_within(writer, limits, key, value, version) {
            Ok(()) => replied(Response::Written { version }),
            Err(applied) => applied,
        },
        Command::Delete { key } => match writer.delete(key) {
            Ok(previous) => replied(Response::Deleted {
                existed: previous.is_some(),
                version,
            }),
            Err(e) => failed(&e),
        },
        Command::Cas {
            key,
            expected_version,
            new_value,
        } => apply_cas(writer, limits, key, *expected_version, new_value, version),
        Command::MPut { pairs } => apply_mput(writer, limits, pairs, version, resume_at),
        Command::Update { key, update } => apply_update(writer, limits, key, update, version),
        Command::SetHashSeed { seed: (k0, k1) } => Applied::AdoptSeed(HashSeed(*k0, *k1)),
        // Applied by `apply_entry`, which holds the quota and the
        // transaction's results.
        Command::SetQuota { .. } | Command::Transaction { .. } => replied(Response::Done),
        Command::Clear => match writer.clear() {
            Ok(removed) => replied(Response::Cleared { removed, version }),
            Err(e) => failed(&e),
        },
    }
}

/// A transaction: nothing if a watched key changed, else every op in order
/// (from op `resume_at` when its entry resumes after waiting for room; the
/// earlier ops' results are in `state.txn_results`).
fn apply_transaction(
    state: &mut State,
    watch: &[(Bytes, Option<u64>)],
    ops: &[TxnOp],
    version: u64,
    resume_at: usize,
    limits: Limits,
) -> Applied {
    if resume_at == 0 {
        state.txn_results.clear();
        for (key, expected) in watch {
            match state.writer.version_of(key) {
                Ok(current) if current == *expected => {}
                Ok(_) => {
                    return replied(Response::Transaction {
                        aborted: true,
                        results: Vec::new(),
                        version,
                    });
                }
                Err(e) => return failed(&e),
            }
        }
    }
    for (i, op) in ops.iter().enumerate().skip(resume_at) {
        match apply_op(&mut state.writer, op, version, limits) {
            Ok(result) => state.txn_results.push(result),
            Err(Applied::Full {
                reclaim_at_us,
                cause,
                ..
            }) => {
                return Applied::Full {
                    reclaim_at_us,
                    next_pair: i,
                    cause,
                };
            }
            Err(other) => return other,
        }
    }
    if state.txn_results.iter().any(is_quota_refused_op) {
        state.no_space_alarm = true;
    }
    replied(Response::Transaction {
        aborted: false,
        results: std::mem::take(&mut state.txn_results),
        version,
    })
}

/// One op of a transaction, applied as the command of its kind is.
fn apply_op(
    writer: &mut KeyedRegion,
    op: &TxnOp,
    version: u64,
    limits: Limits,
) -> Result<TxnResult, Applied> {
    let command = match op {
        TxnOp::Get { key } => {
            return writer
                .get(key)
                .map(TxnResult::Value)
                .map_err(|e| failed(&e));
        }
        TxnOp::Put { key, value } => Command::Put {
            key: key.clone(),
            value: value.clone(),
        },
        TxnOp::Delete { key } => Command::Delete { key: key.clone() },
        TxnOp::Update { key, update } => Command::Update {
            key: key.clone(),
            update: update.clone(),
        },
    };
    match apply_command(writer, &command, version, 0, limits) {
        Applied::Done(CommandResult::Applied(response)) => match response {
            Response::Written { .. } => Ok(TxnResult::Written),
            Response::Deleted { existed, .. } => Ok(TxnResult::Deleted { existed }),
            Response::Updated(outcome) => Ok(TxnResult::Updated(outcome)),
            Response::Error(error) => Ok(TxnResult::Error(error)),
            other => Err(Applied::Done(CommandResult::Failed {
                message: format!("a transaction's {command} answered {other:?}"),
            })),
        },
        other => Err(other),
    }
}

fn is_quota_refused_op(result: &TxnResult) -> bool {
    matches!(result, TxnResult::Error(reply) if reply.code == ErrorCode::NoSpace)
}

fn apply_cas(
    writer: &mut KeyedRegion,
    limits: Limits,
    key: &Bytes,
    expected_version: Option<u64>,
    new_value: &Option<Bytes>,
    version: u64,
) -> Applied {
    let current = match writer.version_of(key) {
        Ok(current) => current,
        Err(e) => return failed(&e),
    };
    if current != expected_version {
        return match writer.get(key) {
            Ok(current) => replied(Response::CasDone {
                succeeded: false,
                version,
                current,
            }),
            Err(e) => failed(&e),
        };
    }
    let written = match new_value {
        Some(value) => put_within(writer, limits, key, value, version),
        None => writer.delete(key).map(drop).map_err(|e| failed(&e)),
    };
    match written {
        Ok(()) => replied(Response::CasDone {
            succeeded: true,
            version,
            current: None,
        }),
        Err(applied) => applied,
    }
}

/// All pairs or none against the quota (checked once, before the first
/// pair); a region that cannot place pair `i` resumes there.
fn apply_mput(
    writer: &mut KeyedRegion,
    limits: Limits,
    pairs: &[(Bytes, Bytes)],
    version: u64,
    resume_at: usize,
) -> Applied {
    if resume_at == 0 {
        let writes: Vec<(&[u8], usize)> =
            pairs.iter().map(|(k, v)| (k.as_ref(), v.len())).collect();
        if let Err(refused) = check_quota(writer, limits, &writes) {
            return refused;
        }
    }
    for (i, (key, value)) in pairs.iter().enumerate().skip(resume_at) {
        if let Err(e) = writer.put(key, value, version) {
            return match on_error(writer, e, i) {
                Applied::Done(CommandResult::Failed { message }) => {
                    Applied::Done(CommandResult::Failed {
                        message: format!("{message}; {i} of {} pairs were applied", pairs.len()),
                    })
                }
                other => other,
            };
        }
    }
    replied(Response::MWritten { version })
}

/// Reads a value as Redis reads an integer: canonical decimal `i64` only
/// (no spaces, no `+`, no leading zeros).
pub fn parse_integer(value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?;
    let n: i64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

/// The length of a value after an APPEND: `Ok` up to `max_value_bytes`,
/// else `Err` with the length it would have had (refused, as Redis refuses
/// a string past its limit, before anything is written).
fn appended_len(value_len: usize, suffix_len: usize, max_value_bytes: u32) -> Result<u64, u64> {
    let len = value_len as u64 + suffix_len as u64;
    if len > u64::from(max_value_bytes) {
        Err(len)
    } else {
        Ok(len)
    }
}

/// An `Update::CopyFrom` to apply; `may_write`: the key is absent or the
/// update replaces it.
struct Copy<'u> {
    source: &'u Bytes,
    may_write: bool,
    remove_source: bool,
}

/// RENAME, RENAMENX and COPY: `source`'s value to `key` in one entry.
fn apply_copy(
    writer: &mut KeyedRegion,
    limits: Limits,
    copy: Copy<'_>,
    key: &Bytes,
    version: u64,
) -> Applied {
    let Copy {
        source,
        may_write,
        remove_source,
    } = copy;
    let outcome = |copied, source_missing| {
        replied(Response::Updated(UpdateOutcome::Copied {
            copied,
            source_missing,
            version,
        }))
    };
    let value = match writer.get(source) {
        Ok(Some(found)) => found.value,
        Ok(None) => return outcome(false, true),
        Err(e) => return failed(&e),
    };
    if !may_write {
        return outcome(false, false);
    }
    if source == key {
        // Nothing moves: RENAME of a key onto itself succeeds as in Redis.
        return outcome(true, false);
    }
    if let Err(applied) = put_within(writer, limits, key, &value, version) {
        return applied;
    }
    if remove_source && let Err(e) = writer.delete(source) {
        return failed(&e);
    }
    outcome(true, false)
}

/// A read-modify-write: decided from the key's current value in the region,
/// so every replica reaches the same outcome.
fn apply_update(
    writer: &mut KeyedRegion,
    limits: Limits,
    key: &Bytes,
    update: &Update,
    version: u64,
) -> Applied {
    let current = match writer.get(key) {
        Ok(current) => current.map(|v| v.value),
        Err(e) => return failed(&e),
    };
    let (new_value, outcome) = match update {
        Update::Incr { delta } => {
            let base = match current.as_deref().map(parse_integer) {
                None => 0,
                Some(Some(n)) => n,
                Some(None) => {
                    return replied(Response::Updated(UpdateOutcome::NotAnInteger { version }));
                }
            };
            let Some(value) = base.checked_add(*delta) else {
                return replied(Response::Updated(UpdateOutcome::NotAnInteger { version }));
            };
            (
                Bytes::from(value.to_string()),
                UpdateOutcome::Integer { value, version },
            )
        }
        Update::Append { suffix } => {
            let mut value = current.map(|c| c.to_vec()).unwrap_or_default();
            let max = writer.layout().max_value_bytes;
            let len = match appended_len(value.len(), suffix.len(), max) {
                Ok(len) => len,
                Err(len) => {
                    return replied(Response::Updated(UpdateOutcome::TooLarge { len, version }));
                }
            };
            value.extend_from_slice(suffix);
            (Bytes::from(value), UpdateOutcome::Length { len, version })
        }
        Update::SetIf {
            value,
            condition,
            return_old,
        } => {
            let write = match condition {
                SetCondition::Always => true,
                SetCondition::IfAbsent => current.is_none(),
                SetCondition::IfPresent => current.is_some(),
            };
            let outcome = UpdateOutcome::Set {
                written: write,
                old: if *return_old { current } else { None },
                version,
            };
            if !write {
                return replied(Response::Updated(outcome));
            }
            (value.clone(), outcome)
        }
        Update::CopyFrom {
            source,
            replace,
            remove_source,
        } => {
            let copy = Copy {
                source,
                may_write: *replace || current.is_none(),
                remove_source: *remove_source,
            };
            return apply_copy(writer, limits, copy, key, version);
        }
    };
    match put_within(writer, limits, key, &new_value, version) {
        Ok(()) => replied(Response::Updated(outcome)),
        Err(applied) => applied,
    }
}

#[cfg(test)]
mod tests {
    use super::{appended_len, parse_integer};

    #[test]
    fn an_append_may_reach_the_value_limit_but_not_pass_it() {
        assert_eq!(appended_len(3, 4, 10), Ok(7));
        assert_eq!(appended_len(6, 4, 10), Ok(10));
        assert_eq!(appended_len(7, 4, 10), Err(11));
        assert_eq!(appended_len(0, 11, 10), Err(11));
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        assert_eq!(parse_integer(b"0"), Some(0));
        assert_eq!(parse_integer(b"-12"), Some(-12));
        assert_eq!(parse_integer(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"+1",
            b" 1",
            b"1 ",
            b"01",
            b"-0",
            b"1.5",
            b"9223372036854775808",
            b"\xff",
        ] {
            assert_eq!(parse_integer(bad), None, "{bad:?}");
        }
    }

    mod results {
        //! What each command answers, seen straight from `apply_entry`
        //! (openraft's responders cannot be built outside openraft).
        use bytes::Bytes;
        use openraft::entry::RaftEntry;
        use rdkv_proto::region::HashSeed;
        use rdkv_proto::wire::{
            ErrorCode, Response, SetCondition, TxnOp, TxnResult, Update, UpdateOutcome, Versioned,
        };

        use super::super::{Applied, apply_entry};
        use crate::RegionConfig;
        use crate::raft::{Command, CommandResult, Entry, TypeConfig};
        use crate::state_machine::{RegionStateMachine, StateMachineConfig};

        fn b(s: &str) -> Bytes {
            Bytes::copy_from_slice(s.as_bytes())
        }

        struct Applier {
            sm: RegionStateMachine,
            index: u64,
            _dir: tempfile::TempDir,
        }

        impl Applier {
            fn new() -> Applier {
                let dir = tempfile::tempdir().unwrap();
                let sm = RegionStateMachine::open(StateMachineConfig {
                    region: RegionConfig {
                        region_bytes: 4 * 1024 * 1024,
                        hash_seed: HashSeed(1, 1),
                        ..RegionConfig::default()
                    },
                    snapshot_dir: dir.path().join("snapshots"),
                })
                .unwrap();
                Applier {
                    sm,
                    index: 0,
                    _dir: dir,
                }
            }

            fn apply(&mut self, command: Command) -> Response {
                self.index += 1;
                let entry = Entry::new_normal(
                    openraft::testing::log_id::<TypeConfig>(1, 1, self.index),
                    command,
                );
                match apply_entry(&mut self.sm.lock(), &entry, 0) {
                    Applied::Done(CommandResult::Applied(response)) => response,
                    Applied::Done(other) => panic!("not applied: {other:?}"),
                    Applied::AdoptSeed(_) | Applied::Full { .. } => panic!("not done"),
                }
            }

            fn set_quota(&mut self, bytes: u64) {
                self.apply(Command::SetQuota { bytes });
            }

            fn alarm(&self) -> bool {
                self.sm.lock().no_space_alarm
            }
        }

        fn put(key: &str, value: &str) -> Command {
            Command::Put {
                key: b(key),
                value: b(value),
            }
        }

        fn copy(from: &str, to: &str, replace: bool, remove_source: bool) -> Command {
            Command::Update {
                key: b(to),
                update: Update::CopyFrom {
                    source: b(from),
                    replace,
                    remove_source,
                },
            }
        }

        fn copied(copied: bool, source_missing: bool, version: u64) -> Response {
            Response::Updated(UpdateOutcome::Copied {
                copied,
                source_missing,
                version,
            })
        }

        #[test]
        fn copies_answer_whether_they_wrote_and_why_not() {
            let mut a = Applier::new();
            a.apply(put("a", "1"));
            a.apply(put("b", "2"));
            assert_eq!(
                a.apply(copy("none", "x", true, true)),
                copied(false, true, 3)
            );
            assert_eq!(
                a.apply(copy("a", "b", false, false)),
                copied(false, false, 4)
            );
            assert_eq!(
                a.apply(copy("a", "a", false, true)),
                copied(false, false, 5)
            );
            assert_eq!(a.apply(copy("a", "a", true, true)), copied(true, false, 6));
            assert_eq!(a.apply(copy("a", "c", false, true)), copied(true, false, 7));
        }

        fn txn(watch: Vec<(&str, Option<u64>)>, ops: Vec<TxnOp>) -> Command {
            Command::Transaction {
                watch: watch.into_iter().map(|(k, v)| (b(k), v)).collect(),
                ops,
            }
        }

        #[test]
        fn a_transaction_answers_each_op_or_that_it_aborted() {
            let mut a = Applier::new();
            a.apply(put("a", "1"));
            let ops = vec![
                TxnOp::Get { key: b("a") },
                TxnOp::Put {
                    key: b("a"),
                    value: b("2"),
                },
                TxnOp::Update {
                    key: b("a"),
                    update: Update::Incr { delta: 1 },
                },
                TxnOp::Update {
                    key: b("s"),
                    update: Update::SetIf {
                        value: b("x"),
                        condition: SetCondition::IfPresent,
                        return_old: false,
                    },
                },
                TxnOp::Delete { key: b("a") },
                TxnOp::Get { key: b("a") },
            ];
            let expected = vec![
                TxnResult::Value(Some(Versioned {
                    value: b("1"),
                    version: 1,
                })),
                TxnResult::Written,
                TxnResult::Updated(UpdateOutcome::Integer {
                    value: 3,
                    version: 2,
                }),
                TxnResult::Updated(UpdateOutcome::Set {
                    written: false,
                    old: None,
                    version: 2,
                }),
                TxnResult::Deleted { existed: true },
                TxnResult::Value(None),
            ];
            assert_eq!(
                a.apply(txn(vec![("a", Some(1))], ops.clone())),
                Response::Transaction {
                    aborted: false,
                    results: expected,
                    version: 2,
                }
            );
            assert!(!a.alarm(), "no op was refused for the quota");
            assert_eq!(
                a.apply(txn(vec![("a", Some(1))], ops)),
                Response::Transaction {
                    aborted: true,
                    results: Vec::new(),
                    version: 3,
                }
            );
        }

        #[test]
        fn a_refused_op_is_its_own_error_and_raises_the_alarm() {
            let mut a = Applier::new();
            a.set_quota(1000);
            assert!(!a.alarm());
            let big = "v".repeat(2000);
            let ops = vec![
                TxnOp::Put {
                    key: b("big"),
                    value: b(&big),
                },
                TxnOp::Put {
                    key: b("small"),
                    value: b("v"),
                },
            ];
            let Response::Transaction {
                aborted: false,
                results,
                ..
            } = a.apply(txn(Vec::new(), ops))
            else {
                panic!("not a transaction's results");
            };
            assert!(
                matches!(&results[0], TxnResult::Error(e) if e.code == ErrorCode::NoSpace),
                "{results:?}"
            );
            assert_eq!(results[1], TxnResult::Written);
            assert!(a.alarm(), "a refused op raises the no-space alarm");
        }
    }
}
