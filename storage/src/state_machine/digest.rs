//! The state digest: a fingerprint of a replica's logical state, the same
//! on every replica that applied the same log (etcd's `hashkv` check, for
//! rdkv). It is the wrapping sum, over the live pairs, of SipHash-1-3 with
//! fixed keys of (key, version); a version is the log index that wrote the
//! value, so equal digests at one applied index mean the same pairs. A sum
//! updates in O(1) per write and does not depend on the order pairs were
//! written in or where the region placed them.
//!
//! Each replica keeps the digests of its last [`HISTORY_LEN`] applied
//! indexes, so that replicas at different indexes can still be compared at
//! one they all passed.

use std::collections::VecDeque;
use std::hash::Hasher;

use rdkv_proto::wire::StateDigestAt;
use siphasher::sip::SipHasher13;

/// Applied indexes whose digests a replica keeps.
pub const HISTORY_LEN: usize = 1024;
/// Fixed SipHash keys: the digest must not depend on the build or process.
const KEYS: (u64, u64) = (0x7264_6b76_6469_6765, 0x7374_5f76_315f_6b76);

/// A running digest of the live (key, version) pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateDigest(u64);

impl StateDigest {
    pub fn value(self) -> u64 {
        self.0
    }

    /// A pair became live.
    pub fn add(&mut self, key: &[u8], version: u64) {
        self.0 = self.0.wrapping_add(pair_hash(key, version));
    }

    /// A pair is no longer live (deleted, or replaced by a newer version).
    pub fn remove(&mut self, key: &[u8], version: u64) {
        self.0 = self.0.wrapping_sub(pair_hash(key, version));
    }
}

fn pair_hash(key: &[u8], version: u64) -> u64 {
    let mut hasher = SipHasher13::new_with_keys(KEYS.0, KEYS.1);
    hasher.write(key);
    hasher.write_u64(version);
    hasher.finish()
}

/// The digests of the last applied indexes, oldest first.
#[derive(Debug, Clone, Default)]
pub struct DigestHistory {
    entries: VecDeque<StateDigestAt>,
}

impl DigestHistory {
    /// Records `digest` as the state at `applied_index` (indexes only grow;
    /// a smaller one means the state was replaced, and history starts over).
    pub fn record(&mut self, applied_index: u64, digest: StateDigest) {
        if self
            .entries
            .back()
            .is_some_and(|last| last.applied_index >= applied_index)
        {
            self.entries.clear();
        }
        if self.entries.len() == HISTORY_LEN {
            self.entries.pop_front();
        }
        self.entries.push_back(StateDigestAt {
            applied_index,
            digest: digest.value(),
        });
    }

    /// The recorded digests, oldest first.
    pub fn entries(&self) -> Vec<StateDigestAt> {
        self.entries.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_depends_on_the_pairs_not_the_order_of_writes() {
        let mut one = StateDigest::default();
        one.add(b"a", 1);
        one.add(b"b", 2);
        one.remove(b"a", 1);
        one.add(b"a", 3);
        let mut other = StateDigest::default();
        other.add(b"a", 3);
        other.add(b"b", 2);
        assert_eq!(one, other);
        assert_ne!(one.value(), 0);
        let mut older = StateDigest::default();
        older.add(b"a", 1);
        older.add(b"b", 2);
        assert_ne!(one, older, "another version of a key");
        let mut renamed = StateDigest::default();
        renamed.add(b"c", 3);
        renamed.add(b"b", 2);
        assert_ne!(one, renamed, "another key");
        one.remove(b"a", 3);
        one.remove(b"b", 2);
        assert_eq!(one, StateDigest::default());
    }

    #[test]
    fn history_keeps_the_last_indexes_and_restarts_when_the_state_is_replaced() {
        let mut history = DigestHistory::default();
        let mut digest = StateDigest::default();
        for index in 1..=(HISTORY_LEN as u64 + 5) {
            digest.add(b"k", index);
            history.record(index, digest);
        }
        let entries = history.entries();
        assert_eq!(entries.len(), HISTORY_LEN);
        assert_eq!(entries.first().map(|e| e.applied_index), Some(6));
        assert_eq!(
            entries.last(),
            Some(&StateDigestAt {
                applied_index: HISTORY_LEN as u64 + 5,
                digest: digest.value()
            })
        );
        history.record(3, StateDigest::default());
        assert_eq!(
            history.entries(),
            vec![StateDigestAt {
                applied_index: 3,
                digest: 0
            }]
        );
    }
}
