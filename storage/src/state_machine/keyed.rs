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
//!
//! Expiry: the keys that have a deadline are also in `deadlines`, ordered by
//! deadline, so the leader finds the expired ones without a scan (the
//! active expire cycle). Apply decides with the *apply clock*: the latest
//! time a leader stamped on an applied entry (`Command::Timed`), never
//! going back, so every replica sees the same keys expired at the same
//! entry. A pair past its deadline stays in the region until a replicated
//! `Command::ExpireKeys` removes it, but apply treats it as absent.

use std::collections::BTreeSet;
use std::ops::{Bound, Deref};

use bytes::Bytes;
use rdkv_proto::region::{
    BlockHeader, BlockRef, DeadlineUnixMs, EXPIRY_MARGIN_MS, NO_DEADLINE, expired_at,
    expired_within,
};
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
    /// The keys that have a deadline, by deadline.
    deadlines: BTreeSet<(DeadlineUnixMs, Bytes)>,
    /// The apply clock (unix ms): the latest leader stamp applied.
    clock_unix_ms: u64,
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
            deadlines: BTreeSet::new(),
            clock_unix_ms: 0,
            digest: StateDigest::default(),
        }
    }

    /// Fills a freshly created region with `pairs` (from a snapshot or
    /// another region) at apply clock `clock_unix_ms`, building the ordered
    /// key set once at the end from the keys collected (a bulk build, not
    /// one tree insert per key).
    pub(super) fn load<E: From<RegionError>>(
        writer: RegionWriter,
        clock_unix_ms: u64,
        pairs: impl FnOnce(&mut dyn FnMut(BlockRef<'_>) -> Result<(), E>) -> Result<(), E>,
    ) -> Result<KeyedRegion, E> {
        let mut region = KeyedRegion::empty(writer);
        region.clock_unix_ms = clock_unix_ms;
        let mut keys = Vec::new();
        pairs(&mut |pair| {
            let replaced = region.writer.put_pair(pair)?;
            region.forget_deadline(pair.key, replaced);
            region.note_deadline(pair.key, pair.deadline);
            match replaced {
                Some(old) => region.digest.remove(pair.key, old.version),
                None => keys.push(Bytes::copy_from_slice(pair.key)),
            }
            region.digest.add(pair.key, pair.version);
            Ok(())
        })?;
        region.keys = keys.into_iter().collect();
        Ok(region)
    }

    /// The apply clock (unix ms).
    pub(super) fn clock_unix_ms(&self) -> u64 {
        self.clock_unix_ms
    }

    /// Moves the apply clock to a leader's stamp, never back: a new leader
    /// whose clock is behind the old one's does not bring keys back.
    pub(super) fn advance_clock(&mut self, stamp_unix_ms: u64) {
        self.clock_unix_ms = self.clock_unix_ms.max(stamp_unix_ms);
    }

    /// Whether `deadline` has passed on the apply clock, counting the
    /// expiry margin as every read does.
    pub(super) fn is_expired(&self, deadline: DeadlineUnixMs) -> bool {
        expired_within(deadline, self.clock_unix_ms, EXPIRY_MARGIN_MS)
    }

    fn note_deadline(&mut self, key: &[u8], deadline: DeadlineUnixMs) {
        if deadline != NO_DEADLINE {
            self.deadlines
                .insert((deadline, Bytes::copy_from_slice(key)));
        }
    }

    fn forget_deadline(&mut self, key: &[u8], old: Option<BlockHeader>) {
        if let Some(old) = old.filter(|old| old.deadline != NO_DEADLINE) {
            self.deadlines
                .remove(&(old.deadline, Bytes::copy_from_slice(key)));
        }
    }

    /// The pair of `key` with its deadline, absent when expired on the
    /// apply clock: what every decision of apply reads.
    pub(super) fn live_get(
        &self,
        key: &[u8],
    ) -> Result<Option<(Versioned, DeadlineUnixMs)>, RegionError> {
        Ok(self
            .writer
            .get_with_deadline(key)?
            .filter(|(_, deadline)| !self.is_expired(*deadline)))
    }

    /// The version of `key`, absent when expired on the apply clock.
    pub(super) fn live_version(&self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        Ok(self
            .writer
            .header_of(key)?
            .filter(|header| !self.is_expired(header.deadline))
            .map(|header| header.version))
    }

    /// Up to `limit` keys expired on the leader's clock `now_unix_ms` (with
    /// the margin), with the version each has: what the leader's next
    /// `ExpireKeys` removes.
    pub(super) fn expired_keys(
        &self,
        now_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<(Bytes, u64)>, RegionError> {
        let mut expired = Vec::new();
        for (deadline, key) in self.deadlines.iter().take(limit) {
            if !expired_within(*deadline, now_unix_ms, EXPIRY_MARGIN_MS) {
                break;
            }
            if let Some(header) = self.writer.header_of(key)? {
                expired.push((key.clone(), header.version));
            }
        }
        Ok(expired)
    }

    /// Keys with a deadline (expired or not).
    pub(super) fn expiring_keys(&self) -> usize {
        self.deadlines.len()
    }

    /// The digest of the live pairs.
    pub(super) fn digest(&self) -> StateDigest {
        self.digest
    }

    /// Writes a pair that never expires; returns the replaced pair's header.
    pub(super) fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        version: u64,
    ) -> Result<Option<BlockHeader>, RegionError> {
        self.put_pair(BlockRef {
            key,
            value,
            version,
            deadline: NO_DEADLINE,
        })
    }

    /// Writes a pair; returns the replaced pair's header.
    pub(super) fn put_pair(
        &mut self,
        pair: BlockRef<'_>,
    ) -> Result<Option<BlockHeader>, RegionError> {
        let replaced = self.writer.put_pair(pair)?;
        self.forget_deadline(pair.key, replaced);
        self.note_deadline(pair.key, pair.deadline);
        match replaced {
            Some(old) => self.digest.remove(pair.key, old.version),
            None => {
                self.keys.insert(Bytes::copy_from_slice(pair.key));
            }
        }
        self.digest.add(pair.key, pair.version);
        Ok(replaced)
    }

    /// Removes `key`, expired or not; returns the removed pair's header.
    pub(super) fn delete(&mut self, key: &[u8]) -> Result<Option<BlockHeader>, RegionError> {
        let removed = self.writer.delete_pair(key)?;
        if let Some(old) = removed {
            self.keys.remove(key);
            self.forget_deadline(key, removed);
            self.digest.remove(key, old.version);
        }
        Ok(removed)
    }

    /// Removes `key` and says whether it was there for apply: present and
    /// not expired on the apply clock (DEL of an expired key answers 0).
    pub(super) fn delete_live(&mut self, key: &[u8]) -> Result<bool, RegionError> {
        let removed = self.delete(key)?;
        Ok(removed.is_some_and(|old| !self.is_expired(old.deadline)))
    }

    /// Live keys not expired on the apply clock: what a clear removes
    /// (the expired ones are already gone for every reader).
    pub(super) fn unexpired_keys(&self) -> u64 {
        let expired = self
            .deadlines
            .iter()
            .take_while(|(deadline, _)| self.is_expired(*deadline))
            .count();
        self.keys.len().saturating_sub(expired) as u64
    }

    /// Live keys in the ordered index (equals the region's live key count).
    pub(super) fn indexed_keys(&self) -> usize {
        self.keys.len()
    }

    /// The pairs of `range` not expired at `expired_from_unix_ms` (the
    /// reader's clock plus its margin), read from the region; stops early (with `more`)
    /// once the keys and values gathered would exceed `max_bytes`, but always
    /// returns at least one pair when there is one, so a scan always makes
    /// progress.
    pub(super) fn scan(
        &self,
        range: ScanRange<'_>,
        max_bytes: u64,
        expired_from_unix_ms: u64,
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
        let range = self.keys.range::<[u8], _>((Bound::Included(start), upper));
        let mut taken = 0;
        for key in range {
            if taken == limit {
                break;
            }
            let Some((value, deadline)) = self.writer.get_with_deadline(key)? else {
                // The set and the region change together under the state
                // machine's lock; a key missing from the region is a bug.
                return Err(StateMachineError::KeyIndexMismatch { key_len: key.len() });
            };
            if expired_at(deadline, expired_from_unix_ms) {
                continue;
            }
            taken += 1;
            bytes += (key.len() + value.value.len()) as u64 + PAIR_OVERHEAD_BYTES;
            if bytes > max_bytes && !pairs.is_empty() {
                return Ok(ScanPage { pairs, more: true });
            }
            pairs.push((key.clone(), value));
        }
        Ok(ScanPage { pairs, more: false })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::region::{MonotonicClock, RegionConfig};

    fn keyed_region() -> KeyedRegion {
        let config = RegionConfig {
            region_bytes: 1 << 20,
            ..RegionConfig::default()
        };
        let writer = RegionWriter::create(&config, Arc::new(MonotonicClock::new()));
        KeyedRegion::empty(writer.expect("a 1 MiB region"))
    }

    fn put(region: &mut KeyedRegion, key: &str, version: u64, deadline: DeadlineUnixMs) {
        let pair = BlockRef {
            key: key.as_bytes(),
            value: b"v",
            version,
            deadline,
        };
        region.put_pair(pair).expect("room for a pair");
    }

    /// A clear reports the keys a reader could still see: not those past
    /// their deadline (with the margin) on the apply clock, which apply
    /// already treats as absent.
    #[test]
    fn a_clear_counts_the_keys_not_expired_on_the_apply_clock() {
        let mut region = keyed_region();
        let now_ms = 1_000_000;
        put(&mut region, "forever", 1, NO_DEADLINE);
        put(&mut region, "past", 2, now_ms - 1);
        put(
            &mut region,
            "within-the-margin",
            3,
            now_ms + EXPIRY_MARGIN_MS - 1,
        );
        put(&mut region, "at-the-margin", 6, now_ms + EXPIRY_MARGIN_MS);
        put(&mut region, "later", 4, now_ms + EXPIRY_MARGIN_MS + 1);
        put(&mut region, "much-later", 5, now_ms * 2);
        assert_eq!(region.unexpired_keys(), 6, "nothing expired at clock 0");
        region.advance_clock(now_ms);
        // A deadline exactly at the clock plus the margin is past, as a
        // reader judges it.
        assert_eq!(region.unexpired_keys(), 3, "forever, later, much-later");
        region.advance_clock(now_ms * 3);
        assert_eq!(region.unexpired_keys(), 1, "forever");
    }
}
