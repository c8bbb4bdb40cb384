//! Counters of one-sided reads: how many, and why attempts started over.

use std::sync::atomic::{AtomicU64, Ordering};

use rdkv_proto::wire::ReadReport;

use crate::striped::Striped;

/// Why a lock-free read had to start over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCause {
    /// A slot failed its check byte or pointed outside the data area.
    Slot,
    /// The block did not validate (CRC, magic, lengths, version): torn or corrupt.
    Block,
    /// The block had been taken out of service by the writer (it is being
    /// replaced or deleted): read the slot again.
    Invalidated,
    /// The block held another key and the slot had changed since it was read.
    Moved,
    /// The read took longer than the abandon bound (half the grace period).
    Slow,
}

/// Counters shared by all clones of a reader, striped per thread
/// ([`Striped`]) so that readers on several threads do not contend.
#[derive(Debug, Default)]
pub struct ReadCounters {
    stripes: Striped<CounterSet>,
}

/// One stripe of [`ReadCounters`].
#[derive(Debug, Default)]
struct CounterSet {
    hits: AtomicU64,
    misses: AtomicU64,
    retries_slot: AtomicU64,
    retries_block: AtomicU64,
    retries_invalidated: AtomicU64,
    retries_moved: AtomicU64,
    retries_slow: AtomicU64,
    exhausted: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
}

/// A point-in-time copy of [`ReadCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadStats {
    pub reads: u64,
    pub hits: u64,
    pub misses: u64,
    pub retries_slot: u64,
    pub retries_block: u64,
    pub retries_invalidated: u64,
    pub retries_moved: u64,
    pub retries_slow: u64,
    pub exhausted: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

impl ReadStats {
    /// Every field, in declaration order: the arithmetic below walks this
    /// table so that adding a counter is one line here.
    const FIELDS: [fn(&mut ReadStats) -> &mut u64; 11] = [
        |s| &mut s.reads,
        |s| &mut s.hits,
        |s| &mut s.misses,
        |s| &mut s.retries_slot,
        |s| &mut s.retries_block,
        |s| &mut s.retries_invalidated,
        |s| &mut s.retries_moved,
        |s| &mut s.retries_slow,
        |s| &mut s.exhausted,
        |s| &mut s.cache_hits,
        |s| &mut s.cache_misses,
    ];

    fn combine(mut self, mut other: ReadStats, op: fn(u64, u64) -> u64) -> ReadStats {
        for field in Self::FIELDS {
            let theirs = *field(&mut other);
            let ours = field(&mut self);
            *ours = op(*ours, theirs);
        }
        self
    }

    /// What happened since `before` (counters only grow; a reset saturates at 0).
    pub fn since(self, before: ReadStats) -> ReadStats {
        self.combine(before, u64::saturating_sub)
    }

    /// The field-wise sum.
    pub fn plus(self, other: ReadStats) -> ReadStats {
        self.combine(other, u64::saturating_add)
    }

    pub fn retries(&self) -> u64 {
        self.retries_slot
            + self.retries_block
            + self.retries_invalidated
            + self.retries_moved
            + self.retries_slow
    }
}

/// The counters as a client reports them to a node (and the node's own
/// metrics show them): reads that gave up count as RPC fallbacks; refusals
/// are not the reader's to count, they start at 0.
impl From<ReadStats> for ReadReport {
    fn from(stats: ReadStats) -> ReadReport {
        ReadReport {
            reads: stats.reads,
            retries_slot: stats.retries_slot,
            retries_block: stats.retries_block,
            retries_invalidated: stats.retries_invalidated,
            retries_moved: stats.retries_moved,
            retries_slow: stats.retries_slow,
            rpc_fallbacks: stats.exhausted,
            cache_hits: stats.cache_hits,
            cache_misses: stats.cache_misses,
            lease_refusals: 0,
            lag_refusals: 0,
        }
    }
}

impl ReadCounters {
    /// Adds one to a counter of this thread's stripe (a plain load and
    /// store on a stripe the thread owns: [`Striped::add`]).
    #[inline]
    fn bump(&self, counter: fn(&CounterSet) -> &AtomicU64) {
        self.stripes.add(counter, 1);
    }

    /// Counts one read that ended with an answer: a hit or a miss.
    #[inline]
    pub fn finished(&self, hit: bool) {
        if hit {
            self.bump(|set| &set.hits);
        } else {
            self.bump(|set| &set.misses);
        }
    }

    pub fn retry(&self, cause: RetryCause) {
        self.bump(match cause {
            RetryCause::Slot => |set| &set.retries_slot,
            RetryCause::Block => |set| &set.retries_block,
            RetryCause::Invalidated => |set| &set.retries_invalidated,
            RetryCause::Moved => |set| &set.retries_moved,
            RetryCause::Slow => |set| &set.retries_slow,
        });
    }

    /// A read that gave up after its attempts.
    pub fn exhausted(&self) {
        self.bump(|set| &set.exhausted);
    }

    /// A read answered from the index cache's location (a hit).
    pub fn cache_hit(&self) {
        self.bump(|set| &set.cache_hits);
        self.bump(|set| &set.hits);
    }

    pub fn cache_miss(&self) {
        self.bump(|set| &set.cache_misses);
    }

    pub fn snapshot(&self) -> ReadStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut stats = ReadStats::default();
        for set in self.stripes.iter() {
            stats = stats.plus(ReadStats {
                // Every read ends as exactly one of these; counting them
                // saves a read-modify-write on the hot path.
                reads: get(&set.hits) + get(&set.misses) + get(&set.exhausted),
                hits: get(&set.hits),
                misses: get(&set.misses),
                retries_slot: get(&set.retries_slot),
                retries_block: get(&set.retries_block),
                retries_invalidated: get(&set.retries_invalidated),
                retries_moved: get(&set.retries_moved),
                retries_slow: get(&set.retries_slow),
                exhausted: get(&set.exhausted),
                cache_hits: get(&set.cache_hits),
                cache_misses: get(&set.cache_misses),
            });
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::ReadStats;

    fn numbered(start: u64) -> ReadStats {
        let mut stats = ReadStats::default();
        for (i, field) in ReadStats::FIELDS.iter().enumerate() {
            *field(&mut stats) = start + i as u64;
        }
        stats
    }

    #[test]
    fn arithmetic_touches_every_field() {
        let a = numbered(100);
        let b = numbered(1);
        let sum = a.plus(b);
        let diff = a.since(b);
        for (i, field) in ReadStats::FIELDS.iter().enumerate() {
            let i = i as u64;
            assert_eq!(*field(&mut sum.clone()), 101 + 2 * i);
            assert_eq!(*field(&mut diff.clone()), 99);
        }
        assert_eq!(b.since(a), ReadStats::default());
        // Exhaustive on purpose: a new field fails to compile here until it
        // is added to FIELDS (and to this list).
        let ReadStats {
            reads: _,
            hits: _,
            misses: _,
            retries_slot: _,
            retries_block: _,
            retries_invalidated: _,
            retries_moved: _,
            retries_slow: _,
            exhausted: _,
            cache_hits: _,
            cache_misses: _,
        } = sum;
    }
}
