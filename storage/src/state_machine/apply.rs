//! Applying one log entry to the region.

use bytes::Bytes;
use openraft::EntryPayload;
use rdkv_proto::region::HashSeed;
use rdkv_proto::wire::{Response, SetCondition, Update, UpdateOutcome};

use super::State;
use super::keyed::KeyedRegion;
use crate::raft::{Command, CommandResult, Entry, StoredMembership};
use crate::region::RegionError;

pub(super) enum Applied {
    Done(CommandResult),
    /// `Command::SetHashSeed`: the caller adopts the seed if there is none
    /// yet (it replaces the region, which needs more than the state).
    AdoptSeed(HashSeed),
    /// The region is full but blocks come back at `at_us` (region clock):
    /// retry from pair `next_pair` (for MPut; 0 otherwise).
    WaitForReclaim {
        at_us: u64,
        next_pair: usize,
    },
}

/// Applies `entry`; with `give_up` set a full region fails the command
/// instead of asking to wait.
pub(super) fn apply_entry(
    state: &mut State,
    entry: &Entry,
    resume_at: usize,
    give_up: bool,
) -> Applied {
    let index = entry.log_id.index;
    match &entry.payload {
        EntryPayload::Blank => Applied::Done(CommandResult::None),
        EntryPayload::Membership(membership) => {
            state.last_membership = StoredMembership::new(Some(entry.log_id), membership.clone());
            Applied::Done(CommandResult::None)
        }
        EntryPayload::Normal(command) => {
            apply_command(&mut state.writer, command, index, resume_at, give_up)
        }
    }
}

/// A command applied: its proposer gets `response`.
fn replied(response: Response) -> Applied {
    Applied::Done(CommandResult::Applied(response))
}

fn failed(error: &RegionError) -> CommandResult {
    CommandResult::Failed {
        region_full: matches!(
            error,
            RegionError::RegionFull { .. } | RegionError::IndexFull { .. }
        ),
        message: error.to_string(),
    }
}

/// What to do with an error from one write of a command.
fn on_error(writer: &KeyedRegion, error: &RegionError, next_pair: usize, give_up: bool) -> Applied {
    if let (RegionError::RegionFull { .. }, false, Some(at_us)) =
        (error, give_up, writer.next_reclaim_at_us())
    {
        return Applied::WaitForReclaim { at_us, next_pair };
    }
    Applied::Done(failed(error))
}

fn apply_command(
    writer: &mut KeyedRegion,
    command: &Command,
    version: u64,
    resume_at: usize,
    give_up: bool,
) -> Applied {
    match command {
        Command::Put { key, value } => match writer.put(key, value, version) {
            Ok(_) => replied(Response::Written { version }),
            Err(e) => on_error(writer, &e, 0, give_up),
        },
        Command::Delete { key } => match writer.delete(key) {
            Ok(previous) => replied(Response::Deleted {
                existed: previous.is_some(),
                version,
            }),
            Err(e) => Applied::Done(failed(&e)),
        },
        Command::Cas {
            key,
            expected_version,
            new_value,
        } => {
            let current = match writer.version_of(key) {
                Ok(current) => current,
                Err(e) => return Applied::Done(failed(&e)),
            };
            if current != *expected_version {
                return Applied::Done(match writer.get(key) {
                    Ok(current) => CommandResult::Applied(Response::CasDone {
                        succeeded: false,
                        version,
                        current,
                    }),
                    Err(e) => failed(&e),
                });
            }
            let written = match new_value {
                Some(value) => writer.put(key, value, version).map(drop),
                None => writer.delete(key).map(drop),
            };
            match written {
                Ok(()) => replied(Response::CasDone {
                    succeeded: true,
                    version,
                    current: None,
                }),
                Err(e) => on_error(writer, &e, 0, give_up),
            }
        }
        Command::MPut { pairs } => {
            for (i, (key, value)) in pairs.iter().enumerate().skip(resume_at) {
                if let Err(e) = writer.put(key, value, version) {
                    return match on_error(writer, &e, i, give_up) {
                        Applied::Done(CommandResult::Failed {
                            region_full,
                            message,
                        }) => Applied::Done(CommandResult::Failed {
                            region_full,
                            message: format!(
                                "{message}; {i} of {} pairs were applied",
                                pairs.len()
                            ),
                        }),
                        other => other,
                    };
                }
            }
            replied(Response::MWritten { version })
        }
        Command::Update { key, update } => apply_update(writer, key, update, version, give_up),
        Command::SetHashSeed { seed: (k0, k1) } => Applied::AdoptSeed(HashSeed(*k0, *k1)),
        Command::Clear => match writer.clear() {
            Ok(removed) => replied(Response::Cleared { removed, version }),
            Err(e) => Applied::Done(failed(&e)),
        },
    }
}

/// Reads a value as Redis reads an integer: canonical decimal `i64` only
/// (no spaces, no `+`, no leading zeros).
pub fn parse_integer(value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?;
    let n: i64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

/// A read-modify-write: decided from the key's current value in the region,
/// so every replica reaches the same outcome.
fn apply_update(
    writer: &mut KeyedRegion,
    key: &Bytes,
    update: &Update,
    version: u64,
    give_up: bool,
) -> Applied {
    let current = match writer.get(key) {
        Ok(current) => current.map(|v| v.value),
        Err(e) => return Applied::Done(failed(&e)),
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
            let len = (value.len() + suffix.len()) as u64;
            if len > u64::from(writer.layout().max_value_bytes) {
                return replied(Response::Updated(UpdateOutcome::TooLarge { len, version }));
            }
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
    };
    match writer.put(key, &new_value, version) {
        Ok(_) => replied(Response::Updated(outcome)),
        Err(e) => on_error(writer, &e, 0, give_up),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_integer;

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
}
