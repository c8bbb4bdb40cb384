//! Applying one log entry to the region.

use bytes::Bytes;
use openraft::EntryPayload;
use rdkv_proto::region::{BlockRef, DeadlineUnixMs, HashSeed, NO_DEADLINE, charged_bytes};
use rdkv_proto::wire::{
    ErrorCode, ErrorReply, ExpireCondition, Expiry, KeyExpiry, Response, SetCondition, TxnOp,
    TxnResult, Update, UpdateOutcome,
};

use super::State;
use super::keyed::KeyedRegion;
use super::shard_map;
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
    /// `Command::Clear` at log index `version`: the caller replaces the
    /// region with an empty one (which, like adopting a seed, needs more
    /// than the state) and answers `Response::Cleared`.
    Clear {
        version: u64,
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
        EntryPayload::Normal(command) => apply_normal(state, command, index, resume_at, limits),
    }
}

/// A command entry; a `Timed` one first moves the apply clock.
fn apply_normal(
    state: &mut State,
    command: &Command,
    index: u64,
    resume_at: usize,
    limits: Limits,
) -> Applied {
    match command {
        Command::Timed {
            now_unix_ms,
            command,
        } => {
            state.writer.advance_clock(*now_unix_ms);
            apply_normal(state, command, index, resume_at, limits)
        }
        Command::SetQuota { bytes } => {
            state.quota_bytes = Some(*bytes);
            replied(Response::Done)
        }
        Command::SetClusterId { id } => {
            // The first identity applied is the cluster's for good.
            state.cluster_id.get_or_insert(*id);
            replied(Response::Done)
        }
        Command::Transaction { watch, ops } => {
            apply_transaction(state, watch, ops, index, resume_at, limits)
        }
        Command::PublishShardMap { map } => apply_shard_map(&mut state.writer, limits, map, index),
        command => {
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

/// Writes one pair that never expires within the quota.
fn put_within(
    writer: &mut KeyedRegion,
    limits: Limits,
    key: &[u8],
    value: &[u8],
    version: u64,
) -> Result<(), Applied> {
    let pair = BlockRef {
        key,
        value,
        version,
        deadline: NO_DEADLINE,
    };
    put_pair_within(writer, limits, pair)
}

/// Writes one pair within the quota; a pair already expired on the apply
/// clock is not written: the key is deleted instead (as Redis does for a
/// SET or EXPIRE with a time in the past).
fn put_pair_within(
    writer: &mut KeyedRegion,
    limits: Limits,
    pair: BlockRef<'_>,
) -> Result<(), Applied> {
    if writer.is_expired(pair.deadline) {
        return writer.delete(pair.key).map(drop).map_err(|e| failed(&e));
    }
    check_quota(writer, limits, &[(pair.key, pair.value.len())])?;
    writer
        .put_pair(pair)
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
        Command::Delete { key } => match writer.delete_live(key) {
            Ok(existed) => replied(Response::Deleted { existed, version }),
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
        Command::ExpireKeys { keys } => apply_expire_keys(writer, keys, version),
        // Applied by `apply_normal`, which holds the clock, the quota and
        // the transaction's results.
        Command::SetQuota { .. }
        | Command::SetClusterId { .. }
        | Command::PublishShardMap { .. }
        | Command::Transaction { .. }
        | Command::Timed { .. } => replied(Response::Done),
        Command::Clear => Applied::Clear { version },
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
            // An expired key counts as absent: a watched key that expired
            // aborts the transaction (as in Redis 6.0.9 and later).
            match state.writer.live_version(key) {
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
                .live_get(key)
                .map(|found| TxnResult::Value(found.map(|(value, _)| value)))
                .map_err(|e| failed(&e));
        }
        TxnOp::Ttl { key } => return txn_ttl(writer, key),
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
    let current = match writer.live_version(key) {
        Ok(current) => current,
        Err(e) => return failed(&e),
    };
    if current != expected_version {
        return match writer.live_get(key) {
            Ok(current) => replied(Response::CasDone {
                succeeded: false,
                version,
                current: current.map(|(value, _)| value),
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

/// The metadata group's compare-and-set on the map's version: `map` is
/// recorded only if it is exactly one version above the applied one.
fn apply_shard_map(
    writer: &mut KeyedRegion,
    limits: Limits,
    map: &rdkv_proto::shard::ShardMap,
    version: u64,
) -> Applied {
    let applied = match shard_map::recorded(writer) {
        Ok(applied) => applied,
        Err(e) => {
            return Applied::Done(CommandResult::Failed {
                message: e.to_string(),
            });
        }
    };
    let record = match shard_map::next_record(applied.as_ref(), map) {
        Ok(record) => record,
        Err(refusal) => return replied(refusal),
    };
    match put_within(writer, limits, shard_map::SHARD_MAP_KEY, &record, version) {
        Ok(()) => replied(Response::Written { version }),
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
    // The copy keeps the source's deadline, as RENAME and COPY do in Redis.
    let (value, deadline) = match writer.live_get(source) {
        Ok(Some((found, deadline))) => (found.value, deadline),
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
    let pair = BlockRef {
        key,
        value: &value,
        version,
        deadline,
    };
    if let Err(applied) = put_pair_within(writer, limits, pair) {
        return applied;
    }
    if remove_source && let Err(e) = writer.delete(source) {
        return failed(&e);
    }
    outcome(true, false)
}

/// The key's pair as an update sees it: live on the apply clock.
struct Current {
    value: Bytes,
    deadline: DeadlineUnixMs,
}

/// What an update decided from the key's current pair.
enum Decided {
    /// Nothing to write.
    Answer(UpdateOutcome),
    /// Write the key (with a deadline already past, it is deleted).
    Write {
        value: Bytes,
        deadline: DeadlineUnixMs,
        outcome: UpdateOutcome,
    },
    Delete(UpdateOutcome),
}

/// A read-modify-write: decided from the key's current pair in the region
/// and the apply clock, so every replica reaches the same outcome.
fn apply_update(
    writer: &mut KeyedRegion,
    limits: Limits,
    key: &Bytes,
    update: &Update,
    version: u64,
) -> Applied {
    let current = match writer.live_get(key) {
        Ok(current) => current.map(|(found, deadline)| Current {
            value: found.value,
            deadline,
        }),
        Err(e) => return failed(&e),
    };
    let clock = writer.clock_unix_ms();
    let max_value_bytes = writer.layout().max_value_bytes;
    let decided = match update {
        Update::Incr { delta } => decide_incr(current, *delta, version),
        Update::Append { suffix } => decide_append(current, suffix, max_value_bytes, version),
        Update::SetIf {
            value,
            condition,
            return_old,
        } => {
            let set = SetArgs {
                value,
                condition: *condition,
                return_old: *return_old,
                expiry: Expiry::Never,
            };
            decide_set(current, set, clock, version)
        }
        Update::Set {
            value,
            condition,
            return_old,
            expiry,
        } => {
            let set = SetArgs {
                value,
                condition: *condition,
                return_old: *return_old,
                expiry: *expiry,
            };
            decide_set(current, set, clock, version)
        }
        Update::Expire { expiry, condition } => {
            decide_expire(current, *expiry, *condition, clock, version)
        }
        Update::GetEx { expiry } => decide_get_ex(current, *expiry, clock, version),
        Update::GetDel => match current {
            None => Decided::Answer(UpdateOutcome::Got {
                value: None,
                version,
            }),
            Some(current) => Decided::Delete(UpdateOutcome::Got {
                value: Some(current.value),
                version,
            }),
        },
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
    carry_out(writer, limits, key, version, decided)
}

/// Does what an update decided.
fn carry_out(
    writer: &mut KeyedRegion,
    limits: Limits,
    key: &[u8],
    version: u64,
    decided: Decided,
) -> Applied {
    match decided {
        Decided::Answer(outcome) => replied(Response::Updated(outcome)),
        Decided::Write {
            value,
            deadline,
            outcome,
        } => {
            let pair = BlockRef {
                key,
                value: &value,
                version,
                deadline,
            };
            match put_pair_within(writer, limits, pair) {
                Ok(()) => replied(Response::Updated(outcome)),
                Err(applied) => applied,
            }
        }
        Decided::Delete(outcome) => match writer.delete(key) {
            Ok(_) => replied(Response::Updated(outcome)),
            Err(e) => failed(&e),
        },
    }
}

/// The deadline `expiry` gives a pair written at apply clock `clock` over
/// a key whose deadline is `kept` ([`NO_DEADLINE`] when it has none or is
/// absent). Never 0 for a time given: 0 means no deadline.
fn deadline_of(expiry: Expiry, kept: DeadlineUnixMs, clock: u64) -> DeadlineUnixMs {
    match expiry {
        Expiry::Never => NO_DEADLINE,
        Expiry::Keep => kept,
        Expiry::AfterMs(ms) => clock.saturating_add(ms).max(1),
        Expiry::AtUnixMs(at) => at.max(1),
    }
}

/// INCR keeps the key's deadline, as in Redis.
fn decide_incr(current: Option<Current>, delta: i64, version: u64) -> Decided {
    let (base, deadline) = match current {
        None => (0, NO_DEADLINE),
        Some(current) => match parse_integer(&current.value) {
            Some(n) => (n, current.deadline),
            None => return Decided::Answer(UpdateOutcome::NotAnInteger { version }),
        },
    };
    let Some(value) = base.checked_add(delta) else {
        return Decided::Answer(UpdateOutcome::NotAnInteger { version });
    };
    Decided::Write {
        value: Bytes::from(value.to_string()),
        deadline,
        outcome: UpdateOutcome::Integer { value, version },
    }
}

/// APPEND keeps the key's deadline, as in Redis.
fn decide_append(
    current: Option<Current>,
    suffix: &[u8],
    max_value_bytes: u32,
    version: u64,
) -> Decided {
    let (mut value, deadline) = current.map_or((Vec::new(), NO_DEADLINE), |c| {
        (c.value.to_vec(), c.deadline)
    });
    let len = match appended_len(value.len(), suffix.len(), max_value_bytes) {
        Ok(len) => len,
        Err(len) => return Decided::Answer(UpdateOutcome::TooLarge { len, version }),
    };
    value.extend_from_slice(suffix);
    Decided::Write {
        value: Bytes::from(value),
        deadline,
        outcome: UpdateOutcome::Length { len, version },
    }
}

/// A SET's arguments.
struct SetArgs<'u> {
    value: &'u Bytes,
    condition: SetCondition,
    return_old: bool,
    expiry: Expiry,
}

fn decide_set(current: Option<Current>, set: SetArgs<'_>, clock: u64, version: u64) -> Decided {
    let write = match set.condition {
        SetCondition::Always => true,
        SetCondition::IfAbsent => current.is_none(),
        SetCondition::IfPresent => current.is_some(),
    };
    let kept = current.as_ref().map_or(NO_DEADLINE, |c| c.deadline);
    let outcome = UpdateOutcome::Set {
        written: write,
        old: current.filter(|_| set.return_old).map(|c| c.value),
        version,
    };
    if !write {
        return Decided::Answer(outcome);
    }
    Decided::Write {
        value: set.value.clone(),
        deadline: deadline_of(set.expiry, kept, clock),
        outcome,
    }
}

/// A transaction's TTL read: the key's deadline on the apply clock, the
/// clock its writes (`SET ... EX`) count from, so a TTL after a SET in the
/// same transaction reads the full time given.
fn txn_ttl(writer: &KeyedRegion, key: &[u8]) -> Result<TxnResult, Applied> {
    let found = writer.live_get(key).map_err(|e| failed(&e))?;
    Ok(TxnResult::Expiry(found.map(|(value, deadline)| {
        KeyExpiry::of_block(value.version, deadline, writer.clock_unix_ms())
    })))
}

/// Whether EXPIRE's `condition` lets `new` replace `current` (no deadline
/// counts as an infinitely late one, as in Redis).
fn expire_condition_holds(
    condition: ExpireCondition,
    current: DeadlineUnixMs,
    new: DeadlineUnixMs,
) -> bool {
    let as_time = |deadline| {
        if deadline == NO_DEADLINE {
            u64::MAX
        } else {
            deadline
        }
    };
    match condition {
        ExpireCondition::Always => true,
        ExpireCondition::IfNone => current == NO_DEADLINE,
        ExpireCondition::IfSome => current != NO_DEADLINE,
        ExpireCondition::IfLater => as_time(new) > as_time(current),
        ExpireCondition::IfEarlier => as_time(new) < as_time(current),
        ExpireCondition::IfSomeEarlier => current != NO_DEADLINE && new < current,
    }
}

/// EXPIRE and PERSIST: the same value under a new deadline (a new
/// version, as any write), or nothing. An EXPIRE to the deadline the key
/// already has still counts as a change and a write, as in Redis (which
/// answers 1 and signals the key); PERSIST of a key without one does not.
fn decide_expire(
    current: Option<Current>,
    expiry: Expiry,
    condition: ExpireCondition,
    clock: u64,
    version: u64,
) -> Decided {
    let unchanged = Decided::Answer(UpdateOutcome::ExpiryChanged {
        changed: false,
        version,
    });
    let Some(current) = current else {
        return unchanged;
    };
    let new = deadline_of(expiry, current.deadline, clock);
    let persists_nothing = new == NO_DEADLINE && current.deadline == NO_DEADLINE;
    if persists_nothing || !expire_condition_holds(condition, current.deadline, new) {
        return unchanged;
    }
    Decided::Write {
        value: current.value,
        deadline: new,
        outcome: UpdateOutcome::ExpiryChanged {
            changed: true,
            version,
        },
    }
}

/// GETEX: the value, and the deadline changed when it differs.
fn decide_get_ex(current: Option<Current>, expiry: Expiry, clock: u64, version: u64) -> Decided {
    let Some(current) = current else {
        return Decided::Answer(UpdateOutcome::Got {
            value: None,
            version,
        });
    };
    let outcome = UpdateOutcome::Got {
        value: Some(current.value.clone()),
        version,
    };
    let new = deadline_of(expiry, current.deadline, clock);
    if new == current.deadline {
        return Decided::Answer(outcome);
    }
    Decided::Write {
        value: current.value,
        deadline: new,
        outcome,
    }
}

/// The active expire cycle's deletes: each key that still has the version
/// the leader saw and has expired on the apply clock.
fn apply_expire_keys(writer: &mut KeyedRegion, keys: &[(Bytes, u64)], version: u64) -> Applied {
    let mut removed = 0;
    for (key, expected) in keys {
        match writer.header_of(key) {
            Ok(Some(header))
                if header.version == *expected && writer.is_expired(header.deadline) =>
            {
                if let Err(e) = writer.delete(key) {
                    return failed(&e);
                }
                removed += 1;
            }
            Ok(_) => {}
            Err(e) => return failed(&e),
        }
    }
    replied(Response::Cleared { removed, version })
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
        use rdkv_proto::region::{EXPIRY_MARGIN_MS, HashSeed};
        use rdkv_proto::wire::{
            ErrorCode, ExpireCondition, Expiry, KeyExpiry, Response, SetCondition, TxnOp,
            TxnResult, Update, UpdateOutcome, Versioned,
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
                    shard: rdkv_proto::shard::ShardId(0),
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
                    Applied::AdoptSeed(_) | Applied::Full { .. } | Applied::Clear { .. } => {
                        panic!("not done")
                    }
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

        fn map_version(version: u64, leader: u64) -> Command {
            use rdkv_proto::shard::{FIRST_SLOT, LAST_SLOT, NodeInfo, ShardId, ShardInfo};
            use rdkv_proto::shard::{ShardMap, SlotRange};
            let nodes = [1, 2]
                .map(|id| NodeInfo {
                    id,
                    client_addr: None,
                    resp_addr: None,
                })
                .to_vec();
            let shards = vec![ShardInfo {
                id: ShardId(0),
                members: vec![1, 2],
                leader: Some(leader),
            }];
            let ranges = vec![SlotRange {
                first: FIRST_SLOT,
                last: LAST_SLOT,
                shard: ShardId(0),
            }];
            Command::PublishShardMap {
                map: ShardMap::new(version, nodes, shards, ranges).unwrap(),
            }
        }

        fn applied_map(a: &Applier) -> Option<(u64, Option<u64>)> {
            let map = a.sm.applied_shard_map().unwrap()?;
            Some((map.version(), map.shards()[0].leader))
        }

        #[test]
        fn a_shard_map_is_applied_only_one_version_above_the_applied_one() {
            let mut a = Applier::new();
            assert_eq!(applied_map(&a), None);
            // The first map is version 1: a later one is refused.
            let refused = a.apply(map_version(2, 1));
            assert!(
                matches!(&refused, Response::Error(e) if e.code == ErrorCode::InvalidRequest
                && e.message.starts_with(crate::state_machine::shard_map::STALE_MAP_PREFIX))
            );
            assert_eq!(applied_map(&a), None);
            assert_eq!(a.apply(map_version(1, 1)), Response::Written { version: 2 });
            assert_eq!(applied_map(&a), Some((1, Some(1))));
            assert_eq!(a.apply(map_version(2, 2)), Response::Written { version: 3 });
            // Built from version 1 once 2 was applied: the same version
            // again, or the one it replaced, changes nothing.
            for stale in [map_version(2, 1), map_version(1, 1), map_version(4, 1)] {
                assert!(
                    matches!(a.apply(stale), Response::Error(e)
                    if e.code == ErrorCode::InvalidRequest),
                    "a stale map applied"
                );
                assert_eq!(applied_map(&a), Some((2, Some(2))));
            }
            assert_eq!(a.apply(map_version(3, 1)), Response::Written { version: 7 });
            assert_eq!(applied_map(&a), Some((3, Some(1))));
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

        /// The clock every expiry test starts from (unix ms).
        const T0: u64 = 1_700_000_000_000;

        fn set(key: &str, value: &str, condition: SetCondition, expiry: Expiry) -> Command {
            Command::Update {
                key: b(key),
                update: Update::Set {
                    value: b(value),
                    condition,
                    return_old: false,
                    expiry,
                },
            }
        }

        fn expire(key: &str, expiry: Expiry, condition: ExpireCondition) -> Command {
            Command::Update {
                key: b(key),
                update: Update::Expire { expiry, condition },
            }
        }

        impl Applier {
            fn at(&mut self, now_unix_ms: u64, command: Command) -> Response {
                self.apply(command.timed(now_unix_ms))
            }

            /// The key's deadline in the region, expired or not (`None`:
            /// absent; `Some(0)`: no deadline).
            fn deadline(&self, key: &str) -> Option<u64> {
                let state = self.sm.lock();
                let found = state.writer.get_with_deadline(key.as_bytes()).unwrap();
                found.map(|(_, deadline)| deadline)
            }

            fn written(&mut self, now: u64, command: Command) -> bool {
                match self.at(now, command) {
                    Response::Updated(UpdateOutcome::Set { written, .. }) => written,
                    other => panic!("not a set: {other:?}"),
                }
            }

            fn changed(&mut self, now: u64, command: Command) -> bool {
                match self.at(now, command) {
                    Response::Updated(UpdateOutcome::ExpiryChanged { changed, .. }) => changed,
                    other => panic!("not an expire: {other:?}"),
                }
            }
        }

        #[test]
        fn a_relative_ttl_counts_from_the_stamp_and_an_expired_key_is_absent_to_apply() {
            let mut a = Applier::new();
            let always = SetCondition::Always;
            assert!(a.written(T0, set("k", "v", always, Expiry::AfterMs(1_000))));
            assert_eq!(a.deadline("k"), Some(T0 + 1_000));
            // Until the margin before the deadline the key is there: NX
            // refuses.
            let nx = SetCondition::IfAbsent;
            let gone_at = T0 + 1_000 - EXPIRY_MARGIN_MS;
            assert!(!a.written(gone_at - 1, set("k", "w", nx, Expiry::Never)));
            // From then on it is absent: DEL says 0, NX writes.
            assert_eq!(
                a.at(gone_at, Command::Delete { key: b("k") }),
                Response::Deleted {
                    existed: false,
                    version: 3,
                }
            );
            assert_eq!(a.deadline("k"), None, "DEL removed the expired pair");
            a.at(gone_at, set("k", "v", always, Expiry::AfterMs(1_000)));
            assert!(a.written(gone_at + 1_000, set("k", "w", nx, Expiry::Never)));
            assert_eq!(a.deadline("k"), Some(0), "a plain SET has no deadline");
        }

        #[test]
        fn the_apply_clock_never_goes_back() {
            let mut a = Applier::new();
            a.at(
                T0,
                set("k", "v", SetCondition::Always, Expiry::AfterMs(100)),
            );
            a.at(T0 + 100, put("other", "x"));
            // A new leader whose clock is behind does not bring it back.
            let get = txn(Vec::new(), vec![TxnOp::Get { key: b("k") }]);
            assert_eq!(
                a.at(T0, get),
                Response::Transaction {
                    aborted: false,
                    results: vec![TxnResult::Value(None)],
                    version: 3,
                }
            );
        }

        #[test]
        fn incr_and_append_keep_the_deadline_keepttl_keeps_it_and_set_clears_it() {
            let mut a = Applier::new();
            let always = SetCondition::Always;
            a.at(T0, set("n", "1", always, Expiry::AfterMs(5_000)));
            let incr = Command::Update {
                key: b("n"),
                update: Update::Incr { delta: 1 },
            };
            a.at(T0 + 1, incr);
            assert_eq!(a.deadline("n"), Some(T0 + 5_000));
            let append = Command::Update {
                key: b("n"),
                update: Update::Append { suffix: b("0") },
            };
            a.at(T0 + 2, append);
            assert_eq!(a.deadline("n"), Some(T0 + 5_000));
            a.at(T0 + 3, set("n", "x", always, Expiry::Keep));
            assert_eq!(a.deadline("n"), Some(T0 + 5_000));
            a.at(T0 + 4, set("n", "y", always, Expiry::AtUnixMs(T0 + 9_000)));
            assert_eq!(a.deadline("n"), Some(T0 + 9_000));
            a.at(T0 + 5, set("n", "z", always, Expiry::Never));
            assert_eq!(a.deadline("n"), Some(0));
            // A deadline already past deletes instead of writing.
            assert!(a.written(T0 + 6, set("n", "z", always, Expiry::AtUnixMs(T0))));
            assert_eq!(a.deadline("n"), None);
        }

        #[test]
        fn expire_follows_its_condition_and_a_past_time_deletes() {
            let mut a = Applier::new();
            use ExpireCondition::{Always, IfEarlier, IfLater, IfNone, IfSome};
            a.apply(put("k", "v"));
            assert!(!a.changed(T0, expire("missing", Expiry::AfterMs(10), Always)));
            assert!(
                !a.changed(T0, expire("k", Expiry::Never, Always)),
                "PERSIST of none"
            );
            assert!(!a.changed(T0, expire("k", Expiry::AfterMs(10), IfSome)));
            assert!(
                !a.changed(T0, expire("k", Expiry::AfterMs(10), IfLater)),
                "none is infinite"
            );
            assert!(a.changed(T0, expire("k", Expiry::AfterMs(1_000), IfEarlier)));
            assert_eq!(a.deadline("k"), Some(T0 + 1_000));
            assert!(!a.changed(T0, expire("k", Expiry::AfterMs(10), IfNone)));
            assert!(!a.changed(T0, expire("k", Expiry::AfterMs(2_000), IfEarlier)));
            assert!(a.changed(T0, expire("k", Expiry::AfterMs(2_000), IfLater)));
            assert_eq!(a.deadline("k"), Some(T0 + 2_000));
            assert!(a.changed(T0, expire("k", Expiry::Never, Always)), "PERSIST");
            assert_eq!(a.deadline("k"), Some(0));
            assert!(a.changed(T0, expire("k", Expiry::AfterMs(0), Always)));
            assert_eq!(a.deadline("k"), None, "a TTL of 0 deletes");
        }

        #[test]
        fn getex_and_getdel_answer_the_value_they_found() {
            let mut a = Applier::new();
            a.apply(put("k", "v"));
            let get_ex = |expiry| Command::Update {
                key: b("k"),
                update: Update::GetEx { expiry },
            };
            let got = |value: Option<&str>, version| {
                Response::Updated(UpdateOutcome::Got {
                    value: value.map(b),
                    version,
                })
            };
            assert_eq!(a.at(T0, get_ex(Expiry::AfterMs(100))), got(Some("v"), 2));
            assert_eq!(a.deadline("k"), Some(T0 + 100));
            assert_eq!(a.at(T0, get_ex(Expiry::Never)), got(Some("v"), 3));
            assert_eq!(a.deadline("k"), Some(0));
            let get_del = Command::Update {
                key: b("k"),
                update: Update::GetDel,
            };
            assert_eq!(a.at(T0, get_del.clone()), got(Some("v"), 4));
            assert_eq!(a.at(T0, get_del), got(None, 5));
            assert_eq!(a.deadline("k"), None);
        }

        #[test]
        fn expire_keys_removes_only_expired_pairs_at_the_version_seen() {
            let mut a = Applier::new();
            let always = SetCondition::Always;
            a.at(T0, set("old", "v", always, Expiry::AfterMs(100))); // version 1
            a.at(T0, set("again", "v", always, Expiry::AfterMs(100))); // 2
            a.at(T0, set("live", "v", always, Expiry::AfterMs(10_000))); // 3
            a.at(T0 + 100, set("again", "w", always, Expiry::AfterMs(100))); // 4
            let expire_keys = Command::ExpireKeys {
                keys: vec![(b("old"), 1), (b("again"), 2), (b("live"), 3)],
            };
            assert_eq!(
                a.at(T0 + 100, expire_keys),
                Response::Cleared {
                    removed: 1,
                    version: 5,
                }
            );
            assert_eq!(a.deadline("old"), None);
            assert_eq!(a.deadline("again"), Some(T0 + 200), "written again: kept");
            assert_eq!(a.deadline("live"), Some(T0 + 10_000), "not expired: kept");
        }

        #[test]
        fn a_watched_key_that_expired_aborts_and_renames_keep_the_deadline() {
            let mut a = Applier::new();
            a.at(
                T0,
                set("w", "v", SetCondition::Always, Expiry::AfterMs(100)),
            );
            a.at(T0, copy("w", "c", true, false));
            assert_eq!(a.deadline("c"), Some(T0 + 100), "COPY keeps the TTL");
            let watched = txn(vec![("w", Some(1))], vec![TxnOp::Get { key: b("w") }]);
            assert!(matches!(
                a.at(T0 + 100, watched),
                Response::Transaction { aborted: true, .. }
            ));
        }

        #[test]
        fn expire_answers_as_redis_does() {
            use ExpireCondition::{Always, IfSomeEarlier};
            let at = |ms| Expiry::AtUnixMs(T0 + ms);
            let mut a = Applier::new();
            a.at(T0, put("k", "v"));
            assert!(!a.changed(T0, expire("none", at(9_000), Always)));
            let persist = expire("k", Expiry::Never, Always);
            assert!(!a.changed(T0, persist.clone()), "no deadline to clear");
            assert!(
                !a.changed(T0, expire("k", at(9_000), IfSomeEarlier)),
                "XX LT needs a deadline"
            );
            assert!(a.changed(T0, expire("k", at(9_000), Always)));
            assert!(
                a.changed(T0, expire("k", at(9_000), Always)),
                "the same deadline again still answers 1 in Redis"
            );
            assert!(!a.changed(T0, expire("k", at(9_500), IfSomeEarlier)));
            assert!(a.changed(T0, expire("k", at(8_000), IfSomeEarlier)));
            assert_eq!(a.deadline("k"), Some(T0 + 8_000));
            assert!(a.changed(T0, persist));
            assert_eq!(a.deadline("k"), Some(0));
            assert!(
                a.changed(T0, expire("k", Expiry::AtUnixMs(1), Always)),
                "a past deadline deletes the key, answering 1"
            );
            assert_eq!(a.deadline("k"), None);
        }

        #[test]
        fn a_transaction_reads_ttls_on_its_apply_clock() {
            let mut a = Applier::new();
            let set_ex = TxnOp::Update {
                key: b("k"),
                update: Update::Set {
                    value: b("v"),
                    condition: SetCondition::Always,
                    return_old: false,
                    expiry: Expiry::AfterMs(100_000),
                },
            };
            let ttl = |key| TxnOp::Ttl { key: b(key) };
            let ops = vec![set_ex, ttl("k"), ttl("none")];
            let Response::Transaction { results, .. } = a.at(T0, txn(Vec::new(), ops)) else {
                panic!("not a transaction's results");
            };
            let expiry = KeyExpiry {
                version: 1,
                deadline_unix_ms: Some(T0 + 100_000),
                now_unix_ms: T0,
            };
            assert_eq!(results[1], TxnResult::Expiry(Some(expiry)));
            assert_eq!(results[2], TxnResult::Expiry(None));
            let gone_at = T0 + 100_000 - EXPIRY_MARGIN_MS;
            let read = |a: &mut Applier, now| match a.at(now, txn(Vec::new(), vec![ttl("k")])) {
                Response::Transaction { results, .. } => results,
                other => panic!("not a transaction: {other:?}"),
            };
            assert!(matches!(
                read(&mut a, gone_at - 1)[..],
                [TxnResult::Expiry(Some(_))]
            ));
            assert_eq!(
                read(&mut a, gone_at),
                vec![TxnResult::Expiry(None)],
                "expired on the apply clock"
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
