//! Snapshot files (`rdkv_storage::state_machine::snapshot`): a node loads
//! them from disk at start and receives them from the leader over the
//! network, so `read_snapshot` must refuse anything malformed before it
//! replaces the region.
//!
//! Input: one mode byte, then bytes. Checked:
//! - `read_snapshot` over arbitrary bytes never panics and, run under
//!   `-malloc_limit_mb` (see fuzz/run-bounded.sh), never makes an allocation
//!   beyond a bound: records are bounded before they are read and postcard
//!   borrows keys and values from the input;
//! - every pair it hands out lies inside one record, so within the bound;
//! - round trip: a snapshot written by `SnapshotWriter` from fuzzer-chosen
//!   pairs reads back the same pairs in order with the same meta and region
//!   state, and any
//!   truncation or single-byte change of it is refused (every byte is under
//!   a CRC, a length, or the structure check).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdkv_proto::region::BlockRef;
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::SnapshotMeta;
use rdkv_storage::state_machine::snapshot::{
    SnapshotError, SnapshotReader, SnapshotRegion, SnapshotWriter, read_snapshot,
};

/// The state machine's bound for default limits: max key + max value + 4 KiB
/// (`max_snapshot_record_bytes`).
const MAX_RECORD_BYTES: u64 = 1024 + 1024 * 1024 + 4096;

/// Key, value, version, deadline.
type Pair = (Vec<u8>, Vec<u8>, u64, u64);

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    // Arbitrary bytes, with the real bound and with a tiny one.
    for bound in [MAX_RECORD_BYTES, 64] {
        let mut pairs = 0u64;
        let _ = read_snapshot(bytes, bound, |pair| {
            assert!((pair.key.len() + pair.value.len()) as u64 <= bound);
            pairs += 1;
            Ok(())
        });
    }
    if mode & 1 == 1 {
        round_trip(mode, bytes);
    }
});

fn read_all(bytes: &[u8]) -> Option<(SnapshotMeta, SnapshotRegion, Vec<Pair>)> {
    let mut pairs = Vec::new();
    let mut reader = SnapshotReader::open(bytes, MAX_RECORD_BYTES).ok()?;
    let region = reader.region;
    let meta = reader.pairs(collect_into(&mut pairs)).ok()?;
    // The same bytes read as a stream (a backup file) give the same answer.
    let mut streamed_pairs = Vec::new();
    let streamed = SnapshotReader::from_stream(bytes, MAX_RECORD_BYTES).and_then(|mut r| {
        let region = r.region;
        r.pairs(collect_into(&mut streamed_pairs))
            .map(|meta| (meta, region))
    });
    assert_eq!(
        streamed.ok(),
        Some((meta.clone(), region)),
        "streamed read differs"
    );
    assert_eq!(streamed_pairs, pairs);
    Some((meta, region, pairs))
}

/// A reader's `on_pair` that copies each pair into `pairs`.
fn collect_into(pairs: &mut Vec<Pair>) -> impl FnMut(BlockRef<'_>) -> Result<(), SnapshotError> {
    move |pair| {
        pairs.push((
            pair.key.to_vec(),
            pair.value.to_vec(),
            pair.version,
            pair.deadline,
        ));
        Ok(())
    }
}

/// Pairs cut from the input: `[key_len][value_len][version][key][value]`...
/// (the version byte also picks the deadline: none when even).
fn pairs_from(mut bytes: &[u8]) -> Vec<Pair> {
    let mut pairs = Vec::new();
    while let Some((&[key_len, value_len, version], tail)) = bytes.split_first_chunk::<3>() {
        let key_len = usize::from(key_len).min(tail.len());
        let (key, tail) = tail.split_at(key_len);
        let value_len = usize::from(value_len).min(tail.len());
        let (value, tail) = tail.split_at(value_len);
        let deadline = if version % 2 == 0 {
            0
        } else {
            u64::from(version) << 33
        };
        pairs.push((
            key.to_vec(),
            value.to_vec(),
            (u64::from(version) << 40) | 1,
            deadline,
        ));
        bytes = tail;
    }
    pairs
}

fn round_trip(mode: u8, bytes: &[u8]) {
    let pairs = pairs_from(bytes);
    let meta = SnapshotMeta::default();
    let region = SnapshotRegion {
        hash_seed: (mode & 2 == 2).then_some((u64::from(mode), bytes.len() as u64)),
        quota_bytes: (mode & 4 == 4).then_some(bytes.len() as u64),
        clock_unix_ms: u64::from(mode) << 35,
        cluster_id: (mode & 8 == 8).then_some(ClusterId([mode; 16])),
    };
    let mut writer = SnapshotWriter::new(Vec::new(), &meta, region).unwrap();
    for (key, value, version, deadline) in &pairs {
        let pair = BlockRef {
            key,
            value,
            version: *version,
            deadline: *deadline,
        };
        writer.pair(pair).unwrap();
    }
    let snapshot = writer.finish().unwrap();
    let (read_meta, read_region, read_pairs) =
        read_all(&snapshot).expect("a written snapshot reads back");
    assert_eq!(read_meta, meta);
    assert_eq!(read_region, region);
    assert_eq!(read_pairs, pairs);

    // Damage chosen by the mode byte and the input length.
    let at = (usize::from(mode >> 1) * 31 + bytes.len()) % snapshot.len();
    assert!(
        read_all(&snapshot[..at]).is_none(),
        "a truncated snapshot was accepted"
    );
    let mut flipped = snapshot.clone();
    flipped[at] ^= 1 << (mode >> 5);
    // A CRC-32 detects every single-byte change of what it covers; a change
    // to a length or CRC field makes the record fail its CRC or the walk.
    assert!(
        read_all(&flipped).is_none(),
        "a corrupted snapshot was accepted"
    );
}
