//! Applying one log entry to the region.

use openraft::EntryPayload;

use super::State;
use crate::raft::{Command, CommandResult, Entry, StoredMembership};
use crate::region::{RegionError, RegionWriter};

pub(super) enum Applied {
    Done(CommandResult),
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
fn on_error(
    writer: &RegionWriter,
    error: &RegionError,
    next_pair: usize,
    give_up: bool,
) -> Applied {
    if let (RegionError::RegionFull { .. }, false, Some(at_us)) =
        (error, give_up, writer.next_reclaim_at_us())
    {
        return Applied::WaitForReclaim { at_us, next_pair };
    }
    Applied::Done(failed(error))
}

fn apply_command(
    writer: &mut RegionWriter,
    command: &Command,
    version: u64,
    resume_at: usize,
    give_up: bool,
) -> Applied {
    match command {
        Command::Put { key, value } => match writer.put(key, value, version) {
            Ok(_) => Applied::Done(CommandResult::Written { version }),
            Err(e) => on_error(writer, &e, 0, give_up),
        },
        Command::Delete { key } => match writer.delete(key) {
            Ok(previous) => Applied::Done(CommandResult::Deleted {
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
                    Ok(current) => CommandResult::CasDone {
                        succeeded: false,
                        version,
                        current,
                    },
                    Err(e) => failed(&e),
                });
            }
            let written = match new_value {
                Some(value) => writer.put(key, value, version).map(drop),
                None => writer.delete(key).map(drop),
            };
            match written {
                Ok(()) => Applied::Done(CommandResult::CasDone {
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
            Applied::Done(CommandResult::MWritten { version })
        }
    }
}
