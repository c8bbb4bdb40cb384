//! Counters of one-sided reads: how many, and why attempts started over.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Counters shared by all clones of a reader.
#[derive(Debug, Default)]
pub struct ReadCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub retries_slot: AtomicU64,
    pub retries_block: AtomicU64,
    pub retries_invalidated: AtomicU64,
    pub retries_moved: AtomicU64,
    pub retries_slow: AtomicU64,
    pub exhausted: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
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
    pub fn retries(&self) -> u64 {
        self.retries_slot
            + self.retries_block
            + self.retries_invalidated
            + self.retries_moved
            + self.retries_slow
    }
}

impl ReadCounters {
    pub fn retry(&self, cause: RetryCause) {
        let counter = match cause {
            RetryCause::Slot => &self.retries_slot,
            RetryCause::Block => &self.retries_block,
            RetryCause::Invalidated => &self.retries_invalidated,
            RetryCause::Moved => &self.retries_moved,
            RetryCause::Slow => &self.retries_slow,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> ReadStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReadStats {
            // Every read ends as exactly one of these; counting them saves a
            // shared read-modify-write on the hot path.
            reads: get(&self.hits) + get(&self.misses) + get(&self.exhausted),
            hits: get(&self.hits),
            misses: get(&self.misses),
            retries_slot: get(&self.retries_slot),
            retries_block: get(&self.retries_block),
            retries_invalidated: get(&self.retries_invalidated),
            retries_moved: get(&self.retries_moved),
            retries_slow: get(&self.retries_slow),
            exhausted: get(&self.exhausted),
            cache_hits: get(&self.cache_hits),
            cache_misses: get(&self.cache_misses),
        }
    }
}
