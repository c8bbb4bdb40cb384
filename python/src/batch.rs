//! Splitting a batch into requests that fit the native protocol's limits.
//!
//! A batch read that the one-sided path cannot serve becomes MGET requests,
//! and a batch write MPUT requests; each must fit one frame (8 MiB by
//! default) and hold at most `DEFAULT_MAX_BATCH_KEYS` keys. A batch of 64
//! values of 1 MiB is therefore several requests: consecutive groups, each
//! as large as the limits allow.

use std::ops::Range;

use rdkv_proto::wire::{
    DEFAULT_MAX_BATCH_KEYS, DEFAULT_MAX_FRAME_BYTES, SINGLE_ENTRY_OVERHEAD_BYTES,
};

/// What one request of a batch may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupLimits {
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: u64,
}

/// The limits every server accepts: its frame limit is at least the
/// default (a node with a larger value limit has a larger frame).
pub(crate) const REQUEST_LIMITS: GroupLimits = GroupLimits {
    max_entries: DEFAULT_MAX_BATCH_KEYS as usize,
    max_bytes: DEFAULT_MAX_FRAME_BYTES as u64,
};

/// Frame bytes an entry of a key and a value of these lengths takes, with
/// the protocol's generous per-entry overhead.
pub(crate) fn entry_bytes(key_len: usize, value_len: usize) -> u64 {
    let len = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    len(key_len)
        .saturating_add(len(value_len))
        .saturating_add(u64::from(SINGLE_ENTRY_OVERHEAD_BYTES))
}

/// Consecutive ranges of `sizes` (entry bytes), in order, covering all of
/// them: each at most `limits.max_entries` long and at most
/// `limits.max_bytes` in total, except an entry larger than that alone.
pub(crate) fn groups(sizes: &[u64], limits: GroupLimits) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        let full =
            i - start == limits.max_entries.max(1) || bytes.saturating_add(size) > limits.max_bytes;
        if i > start && full {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes = bytes.saturating_add(size);
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn limits(max_entries: usize, max_bytes: u64) -> GroupLimits {
        GroupLimits {
            max_entries,
            max_bytes,
        }
    }

    #[test]
    fn small_batches_are_one_group_and_an_empty_one_none() {
        assert_eq!(groups(&[10, 20, 30], limits(8, 100)), vec![0..3]);
        assert!(groups(&[], limits(8, 100)).is_empty());
    }

    #[test]
    fn groups_close_at_the_byte_limit_and_the_entry_limit() {
        assert_eq!(
            groups(&[40, 40, 40, 40, 40], limits(8, 100)),
            vec![0..2, 2..4, 4..5]
        );
        assert_eq!(groups(&[1; 5], limits(2, 100)), vec![0..2, 2..4, 4..5]);
        // Exactly at the limit still fits.
        assert_eq!(groups(&[50, 50, 1], limits(8, 100)), vec![0..2, 2..3]);
    }

    #[test]
    fn an_entry_over_the_byte_limit_goes_alone() {
        assert_eq!(
            groups(&[10, 500, 10], limits(8, 100)),
            vec![0..1, 1..2, 2..3]
        );
        assert_eq!(groups(&[500], limits(8, 100)), vec![0..1]);
    }

    #[test]
    fn sixty_four_values_of_one_mib_fit_the_default_frame_seven_at_a_time() {
        let sizes = vec![entry_bytes(16, MIB as usize); 64];
        let got = groups(&sizes, REQUEST_LIMITS);
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|g| g.len() <= 7));
        assert_eq!(got.iter().map(|g| g.len()).sum::<usize>(), 64);
        for group in got {
            let bytes: u64 = sizes[group].iter().sum();
            assert!(bytes <= u64::from(DEFAULT_MAX_FRAME_BYTES));
        }
    }

    #[test]
    fn a_thousand_values_of_four_kib_are_one_group() {
        let sizes = vec![entry_bytes(16, 4096); 1000];
        assert_eq!(groups(&sizes, REQUEST_LIMITS), vec![0..1000]);
    }
}
