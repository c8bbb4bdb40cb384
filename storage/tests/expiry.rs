//! Every one-sided read path (single, cached, batched) treats a pair as
//! absent from `expiry_margin_ms` before its deadline on the reader's wall
//! clock, and serves it until then.

use std::sync::Arc;

use bytes::Bytes;
use rdkv_fabric::clock::unix_now_ms;
use rdkv_proto::region::{BlockRef, NO_DEADLINE};
use rdkv_storage::region::IndexCache;
use rdkv_storage::{ManualClock, ReaderOptions, RegionConfig, RegionWriter};

const MARGIN_MS: u64 = 50;

#[test]
fn readers_drop_pairs_within_the_margin_of_their_deadline() {
    let mut w = RegionWriter::create(
        &RegionConfig {
            region_bytes: 4 * 1024 * 1024,
            ..RegionConfig::default()
        },
        Arc::new(ManualClock::default()),
    )
    .unwrap();
    let options = ReaderOptions {
        expiry_margin_ms: MARGIN_MS,
        ..ReaderOptions::for_layout(w.layout())
    };
    let reader = w.reader(options).unwrap();
    let now = unix_now_ms();
    // (key, deadline, served): an hour ahead is served; within the margin,
    // or past, is not; no deadline is served.
    let cases: [(&[u8], u64, bool); 4] = [
        (b"later", now + 3_600_000, true),
        (b"within-margin", now + MARGIN_MS / 2, false),
        (b"past", now - 1, false),
        (b"never", NO_DEADLINE, true),
    ];
    for (version, (key, deadline, _)) in (1..).zip(cases) {
        let pair = BlockRef {
            key,
            value: b"v",
            version,
            deadline,
        };
        w.put_pair(pair).unwrap();
    }
    let cache = IndexCache::new(16);
    let keys: Vec<Bytes> = cases.iter().map(|c| Bytes::from_static(c.0)).collect();
    let batched = reader.get_many(&keys).unwrap();
    for ((key, deadline, served), batched) in cases.iter().zip(batched) {
        let what = String::from_utf8_lossy(key);
        assert_eq!(reader.get(key).unwrap().is_some(), *served, "get {what}");
        assert_eq!(batched.is_some(), *served, "get_many {what}");
        // Twice: the second read goes through the cached location.
        for _ in 0..2 {
            let cached = reader.get_cached(key, &cache).unwrap();
            assert_eq!(cached.is_some(), *served, "get_cached {what}");
        }
        let with_deadline = reader.get_with_deadline(key).unwrap();
        assert_eq!(with_deadline.map(|(_, d)| d), served.then_some(*deadline));
        // The writer's own view keeps every pair until it is deleted.
        assert!(w.get(key).unwrap().is_some());
    }
}
