//! The node's own GETs of its region (`RegionStateMachine::get_local`,
//! and a batch's through [`LocalReads`]: RESP GETs answered at once, native
//! lease and follower reads): the reader's allocation-free path into this
//! thread's buffer, with one clock reading per GET, as a client's read
//! handle reads (the abandon bound counts from this thread's previous
//! reading; only a thread that has not read for longer than the bound reads
//! twice).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use arc_swap::ArcSwap;
use arc_swap::cache::Cache;
use bytes::Bytes;
use rdkv_fabric::clock::{boottime_now_us, unix_now_us, wall_minus_boottime_us};
use rdkv_fabric::{ReadError, ReadTime, RegionReader};
use rdkv_proto::wire::Versioned;

use super::{RegionStateMachine, StateMachineError};

/// How often a thread derives the wall clock from boottime again (so a step
/// of the wall clock reaches expiry decisions within this long).
const WALL_RECHECK_US: u64 = 100_000;
/// The buffer a thread starts with; a longer value grows it once.
const SCRATCH_BYTES: usize = 4096;

/// A thread's clock for its GETs: boottime, with the wall clock derived
/// from it by an offset taken now and then.
#[derive(Debug, Clone, Copy)]
struct ThreadClock {
    /// The previous GET's reading.
    since: ReadTime,
    wall_minus_boot_us: u64,
    recheck_at_us: u64,
}

thread_local! {
    static CLOCK: Cell<ThreadClock> = const {
        Cell::new(ThreadClock {
            since: ReadTime { monotonic_us: 0, unix_ms: 0 },
            wall_minus_boot_us: 0,
            recheck_at_us: 0,
        })
    };
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One reading: boottime, and the wall clock from the thread's offset.
fn now() -> ReadTime {
    let boot_us = boottime_now_us();
    let mut clock = CLOCK.get();
    if boot_us >= clock.recheck_at_us {
        clock.wall_minus_boot_us = wall_minus_boottime_us(boot_us, unix_now_us());
        clock.recheck_at_us = boot_us.saturating_add(WALL_RECHECK_US);
        CLOCK.set(clock);
    }
    ReadTime {
        monotonic_us: boot_us,
        unix_ms: boot_us.saturating_add(clock.wall_minus_boot_us) / 1_000,
    }
}

/// `key` read by `reader` into this thread's buffer, the value (and its
/// version) handed to `found` as a slice of it, not copied. `found` is
/// called once, and only when the read succeeds; it must not read the
/// region itself (the buffer is borrowed while it runs).
pub(super) fn read_with<R>(
    reader: &RegionReader,
    key: &[u8],
    mut found: impl FnMut(Option<(&[u8], u64)>) -> R,
) -> Result<R, ReadError> {
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.is_empty() {
            scratch.resize(SCRATCH_BYTES, 0);
        }
        loop {
            let since = CLOCK.get().since;
            let read = reader.get_into(key, scratch, since, now);
            if let Ok((_, time)) = &read {
                CLOCK.set(ThreadClock {
                    since: *time,
                    ..CLOCK.get()
                });
            }
            match read {
                Ok((got, _)) => {
                    return Ok(found(got.map(|got| (&scratch[..got.len], got.version))));
                }
                Err(ReadError::BufferTooSmall { needed, .. }) => scratch.resize(needed, 0),
                Err(error) => return Err(error),
            }
        }
    })
}

/// A found value copied out of the read buffer, with its version.
pub(super) fn versioned_copy(found: Option<(&[u8], u64)>) -> Option<Versioned> {
    found.map(|(value, version)| Versioned {
        value: Bytes::copy_from_slice(value),
        version,
    })
}

/// The reads of one batch (a RESP connection's buffered commands, an MGET's
/// keys) from a replica's region, through a reader kept for the batch.
///
/// [`RegionStateMachine::get_local`] loads the current reader on every read
/// (an `arc_swap` load: a slot of this thread's debt list taken and given
/// back). Here each read only compares the kept reader with the current one
/// (one atomic load, nothing written) and loads the current one when the
/// region was replaced (a snapshot's install, a compaction, a FLUSHALL's
/// clear, by whichever task) since the last read, so a read is as fresh as
/// one through `get_local`. (A load that sees an older pointer than a swap
/// the reading task has heard of cannot happen: the swap happened before
/// the news reached the task, and a load after it in that order sees it,
/// whatever the load's ordering.)
///
/// Kept while the batch's reads run, not across its waits (its owner drops
/// it before a flush to a slow client, say): the kept reader holds its
/// region's memory, which a replaced region must give back. It borrows the
/// state machine: making one takes one count, on the reader it keeps (a
/// cache line every worker writes, so once per batch, not per read).
pub struct LocalReads<'a> {
    sm: &'a RegionStateMachine,
    reader: Cache<&'a ArcSwap<RegionReader>, Arc<RegionReader>>,
}

impl<'a> LocalReads<'a> {
    pub(super) fn new(sm: &'a RegionStateMachine) -> LocalReads<'a> {
        LocalReads {
            sm,
            reader: Cache::new(&sm.shared.reader),
        }
    }

    /// A read through the kept reader, handing the value and its version to
    /// `found` as a slice of this thread's read buffer instead of a copy (a
    /// RESP GET encodes its reply straight from it). `found` runs once, only
    /// if the read succeeds (the locked writer's view when validation keeps
    /// failing), and must not read this node's region.
    pub fn get_with<R>(
        &mut self,
        key: &[u8],
        mut found: impl FnMut(Option<(&[u8], u64)>) -> R,
    ) -> Result<R, StateMachineError> {
        let read = read_with(self.reader.load(), key, &mut found);
        self.sm.finish_local_read(read, key, found)
    }

    /// [`RegionStateMachine::get_local`], through the kept reader.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Versioned>, StateMachineError> {
        self.get_with(key, versioned_copy)
    }
}

impl std::fmt::Debug for LocalReads<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalReads").finish_non_exhaustive()
    }
}
