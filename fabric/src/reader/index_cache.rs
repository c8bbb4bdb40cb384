//! The client's index cache: where a key's block was last found, so that a
//! repeated GET reads the block alone (one read instead of two).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

/// Where a key's block was, and which version it held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedLocation {
    pub epoch: u64,
    pub block_offset: u64,
    pub block_len: u64,
    pub version: u64,
}

/// A client's map from key to block location, bounded in entries. Shared by
/// the readers of all regions (entries carry the region epoch).
#[derive(Debug)]
pub struct IndexCache {
    entries: Mutex<HashMap<Bytes, CachedLocation>>,
    max_entries: usize,
}

impl IndexCache {
    pub fn new(max_entries: usize) -> IndexCache {
        IndexCache {
            entries: Mutex::new(HashMap::new()),
            max_entries,
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<Bytes, CachedLocation>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lookup(&self, key: &[u8], epoch: u64) -> Option<CachedLocation> {
        self.entries()
            .get(key)
            .copied()
            .filter(|l| l.epoch == epoch)
    }

    pub(super) fn forget(&self, key: &[u8]) {
        self.entries().remove(key);
    }

    pub(super) fn remember(&self, key: &[u8], location: CachedLocation) {
        let mut entries = self.entries();
        if entries.len() >= self.max_entries && !entries.contains_key(key) {
            // Bounded memory: drop an arbitrary entry (the map's iteration
            // order is effectively random).
            if let Some(victim) = entries.keys().next().cloned() {
                entries.remove(&victim);
            }
        }
        if self.max_entries > 0 {
            entries.insert(Bytes::copy_from_slice(key), location);
        }
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
