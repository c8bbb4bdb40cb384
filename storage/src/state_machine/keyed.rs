//! The region plus an ordered index of its live keys, for range scans.
//!
//! The region's hash index answers point lookups (and is what one-sided
//! readers walk); it has no order. Scans need one, so the state machine keeps
//! a `BTreeSet` of the live keys beside the region, changed by the same
//! applies. Writes go through [`KeyedRegion`] only (it derefs to the writer
//! read-only), so the two cannot disagree: a key is in the set exactly when
//! the region holds it (invariant 13, tested in `tests/scan.rs` of storage).
//!
//! Cost: each live key is stored a second time, on the heap, plus the set's
//! per-entry overhead (about 40 bytes); the `Bytes` handles own their bytes
//! so a key never pins the log entry it came from.

use std::collections::BTreeSet;
use std::ops::{Bound, Deref};

use bytes::Bytes;
use rdkv_proto::wire::Versioned;

use super::StateMachineError;
use super::digest::StateDigest;
use crate::region::{RegionError, RegionWriter};

/// Reply bytes a pair costs besides its key and value: two length varints,
/// the version varint and the tuple framing, rounded up.
const PAIR_OVERHEAD_BYTES: u64 = 32;

#[derive(Debug)]
pub(super) struct KeyedRegion {
    writer: RegionWriter,
    keys: BTreeSet<Bytes>,
    /// The digest of the live (key, version) pairs (see `digest`).
    digest: StateDigest,
}

/// The keys a scan covers: `start` (inclusive) to `end` (exclusive; `None`:
/// to the end), at most `limit` pairs.
#[derive(Debug, Clone, Copy)]
pub struct ScanRange<'a> {
    pub start: &'a [u8],
    pub end: Option<&'a [u8]>,
    pub limit: usize,
}

/// One page of a scan: pairs in key order; `more` when the byte budget cut it
/// short before the limit and before the end of the range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    pub pairs: Vec<(Bytes, Versioned)>,
    pub more: bool,
}

impl Deref for KeyedRegion {
    type Target = RegionWriter;

    fn deref(&self) -> &RegionWriter {
        &self.writer
    }
}

impl KeyedRegion {
    /// Wraps a freshly created (empty) region.
    pub(super) fn empty(writer: RegionWriter) -> KeyedRegion {
        // Every region is created empty, then filled through this type: a
        // non-empty one here would leave its keys out of the set.
        assert_eq!(
            writer.stats().live_keys,
            0,
            "KeyedRegion::empty of a filled region"
        );
        KeyedRegion {
            writer,
            keys: BTreeSet::new(),
            digest: StateDigest::default(),
        }
    }

    /// Fills a freshly created region with `pairs` (from a snapshot or
    /// another region), building the ordered key set once at the end from
    /// the keys collected (a bulk build, not one tree insert per key).
    pub(super) fn load<E: From<RegionError>>(
        writer: RegionWriter,
        pairs: impl FnOnce(&mut dyn FnMut(&[u8], &[u8], u64) -> Result<(), E>) -> Result<(), E>,
    ) -> Result<KeyedRegion, E> {
        let mut region = KeyedRegion::empty(writer);
        let mut keys = Vec::new();
        pairs(&mut |key, value, version| {
            match region.writer.put(key, value, version)? {
                Some(old) => region.digest.remove(key, old),
                None => keys.push(Bytes::copy_from_slice(key)),
            }
            region.digest.add(key, version);
            Ok(())
        })?;
        region.keys = keys.into_iter().collect();
        Ok(region)
    }

    /// The digest of the live pairs.
    pub(super) fn digest(&self) -> StateDigest {
        self.digest
    }

    pub(super) fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        version: u64,
    ) -> Result<Option<u64>, RegionError> {
        let replaced = self.writer.put(key, value, version)?;
        match replaced {
            Some(old) => self.digest.remove(key, old),
            None => {
                self.keys.insert(Bytes::copy_from_slice(key));
            }
        }
        self.digest.add(key, version);
        Ok(replaced)
    }

    pub(super) fn delete(&mut self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        let removed = self.writer.delete(key)?;
        if let Some(old) = removed {
            self.keys.remove(key);
            self.digest.remove(key, old);
        }
        Ok(removed)
    }

    /// Deletes every key; returns how many there were.
    pub(super) fn clear(&mut self) -> Result<u64, RegionError> {
        let mut removed = 0;
        while let Some(key) = self.keys.first().cloned() {
            if let Some(old) = self.writer.delete(&key)? {
                removed += 1;
                self.digest.remove(&key, old);
            }
            self.keys.remove(&key);
        }
        Ok(removed)
    }

    /// Live keys in the ordered index (equals the region's live key count).
    pub(super) fn indexed_keys(&self) -> usize {
        self.keys.len()
    }

    /// The pairs of `range`, read from the region; stops early (with `more`)
    /// once the keys and values gathered would exceed `max_bytes`, but always
    /// returns at least one pair when there is one, so a scan always makes
    /// progress.
    pub(super) fn scan(
        &self,
        range: ScanRange<'_>,
        max_bytes: u64,
    ) -> Result<ScanPage, StateMachineError> {
        let ScanRange { start, end, limit } = range;
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        if end.is_some_and(|end| end <= start) {
            return Ok(ScanPage {
                pairs: Vec::new(),
                more: false,
            });
        }
        let mut pairs = Vec::new();
        let mut bytes = 0u64;
        for key in self
            .keys
            .range::<[u8], _>((Bound::Included(start), upper))
            .take(limit)
        {
            let Some(value) = self.writer.get(key)? else {
                // The set and the region change together under the state
                // machine's lock; a key missing from the region is a bug.
                return Err(StateMachineError::KeyIndexMismatch { key_len: key.len() });
            };
            bytes += (key.len() + value.value.len()) as u64 + PAIR_OVERHEAD_BYTES;
            if bytes > max_bytes && !pairs.is_empty() {
                return Ok(ScanPage { pairs, more: true });
            }
            pairs.push((key.clone(), value));
        }
        Ok(ScanPage { pairs, more: false })
    }
}
