//! The region engine against a `HashMap` model: random put/update/delete/read
//! sequences, small regions that fill up, a stepped clock so that blocks go
//! through the grace queue and are reclaimed. Every read goes through both the
//! writer's view and the lock-free reader.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rdkv_proto::region::HashSeed;
use rdkv_storage::{ManualClock, ReaderOptions, RegionConfig, RegionError, RegionWriter};

const GRACE_US: u64 = 1_000;
const KEYS: u8 = 48;

#[derive(Debug, Clone)]
enum Op {
    Put { key: u8, value_len: usize },
    Delete { key: u8 },
    Get { key: u8 },
    Advance { us: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS, prop_oneof![0usize..100, 100usize..1500, 1500usize..5000])
            .prop_map(|(key, value_len)| Op::Put { key, value_len }),
        2 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        3 => (0..KEYS).prop_map(|key| Op::Get { key }),
        1 => prop_oneof![0u64..GRACE_US, GRACE_US..3 * GRACE_US].prop_map(|us| Op::Advance { us }),
    ]
}

/// Two shapes: a roomy index with a small data area (fills by bytes), and a
/// two-bucket index (fills by slots, then spills into overflow tables).
fn config(tiny_index: bool) -> RegionConfig {
    RegionConfig {
        region_bytes: 64 * 1024,
        bytes_per_slot: if tiny_index { 64 * 1024 / 16 } else { 128 },
        neighbourhood_buckets: 2,
        max_key_bytes: 300,
        max_value_bytes: 8 * 1024,
        grace_period_us: GRACE_US,
        node_id: 1,
        region_epoch: 1,
        hash_seed: HashSeed(0x5eed, 0xf00d),
        shared_memory: false,
    }
}

fn key_bytes(key: u8) -> Vec<u8> {
    // Every fifth key is long, so blocks of one key span several size classes.
    let mut k = format!("key-{key:03}").into_bytes();
    if key.is_multiple_of(5) {
        k.resize(200 + usize::from(key), b'x');
    }
    k
}

fn value_bytes(version: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (version.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

#[derive(Default)]
struct Events {
    region_full: AtomicU64,
    /// Cases that linked overflow tables.
    overflowed: AtomicU64,
    reclaimed: AtomicU64,
    updates: AtomicU64,
}

fn run_case(tiny_index: bool, ops: &[Op], events: &Events) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::default());
    let cfg = config(tiny_index);
    let mut writer = RegionWriter::create(&cfg, clock.clone()).unwrap();
    let reader = writer
        .reader(ReaderOptions::for_layout(writer.layout()))
        .unwrap();
    let mut model: HashMap<Vec<u8>, (Vec<u8>, u64)> = HashMap::new();
    let mut next_version = 1u64;

    for op in ops {
        match *op {
            Op::Put { key, value_len } => {
                let key = key_bytes(key);
                let value = value_bytes(next_version, value_len);
                match writer.put(&key, &value, next_version) {
                    Ok(previous) => {
                        prop_assert_eq!(previous, model.get(&key).map(|(_, v)| *v));
                        if previous.is_some() {
                            events.updates.fetch_add(1, Ordering::Relaxed);
                        }
                        model.insert(key, (value, next_version));
                        next_version += 1;
                    }
                    Err(RegionError::RegionFull {
                        needed_bytes,
                        largest_free_bytes,
                        ..
                    }) => {
                        // Full only when no free extent fits, after reclaiming.
                        prop_assert!(largest_free_bytes < needed_bytes);
                        prop_assert_eq!(writer.stats().largest_free_bytes, largest_free_bytes);
                        events.region_full.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(other) => return Err(TestCaseError::fail(format!("put: {other}"))),
                }
            }
            Op::Delete { key } => {
                let key = key_bytes(key);
                let removed = writer.delete(&key).unwrap();
                prop_assert_eq!(removed, model.remove(&key).map(|(_, v)| v));
            }
            Op::Get { key } => {
                let key = key_bytes(key);
                let expected = model.get(&key).cloned();
                let got = reader.get(&key).unwrap();
                prop_assert_eq!(got.map(|v| (v.value.to_vec(), v.version)), expected.clone());
                prop_assert_eq!(
                    writer
                        .get(&key)
                        .unwrap()
                        .map(|v| (v.value.to_vec(), v.version)),
                    expected.clone()
                );
                prop_assert_eq!(writer.version_of(&key).unwrap(), expected.map(|(_, v)| v));
            }
            Op::Advance { us } => {
                clock.advance_us(us);
                let reclaimed = writer.reclaim();
                events.reclaimed.fetch_add(reclaimed, Ordering::Relaxed);
            }
        }
        let stats = writer.stats();
        prop_assert_eq!(stats.live_keys, model.len() as u64);
        prop_assert_eq!(
            stats.used_bytes + stats.free_bytes + stats.pending_reclaim_bytes,
            stats.data_capacity_bytes
        );
        // Overflow tables are physical use, never payload or keys.
        prop_assert!(stats.used_bytes >= stats.overflow_bytes);
        let payload: usize = model.iter().map(|(k, (v, _))| k.len() + v.len()).sum();
        prop_assert_eq!(stats.payload_bytes, payload as u64);
    }

    // Every key the model has is readable, and nothing else is.
    for key in 0..KEYS {
        let key = key_bytes(key);
        let got = reader
            .get(&key)
            .unwrap()
            .map(|v| (v.value.to_vec(), v.version));
        prop_assert_eq!(got, model.get(&key).cloned());
    }
    // A batched read of every key agrees too.
    let all: Vec<bytes::Bytes> = (0..KEYS)
        .map(|k| bytes::Bytes::from(key_bytes(k)))
        .collect();
    let batched = reader.get_many(&all).unwrap();
    for (key, got) in all.iter().zip(batched) {
        prop_assert_eq!(
            got.map(|v| (v.value.to_vec(), v.version)),
            model.get(&key[..]).cloned()
        );
    }
    // A full scan (what snapshots use) sees exactly the model.
    let mut scanned = HashMap::new();
    writer
        .for_each_live(|pair| {
            scanned.insert(pair.key.to_vec(), (pair.value.to_vec(), pair.version));
            Ok(())
        })
        .unwrap();
    prop_assert_eq!(&scanned, &model);
    if writer.stats().overflow_tables > 0 {
        events.overflowed.fetch_add(1, Ordering::Relaxed);
    }
    // Delete everything, wait out the grace period: all space but the
    // overflow tables (kept while the region lives) comes back, as one
    // extent when there are none (no leak, full coalescing).
    let keys: Vec<_> = model.keys().cloned().collect();
    for key in keys {
        prop_assert!(writer.delete(&key).unwrap().is_some());
    }
    clock.advance_us(GRACE_US);
    writer.reclaim();
    let stats = writer.stats();
    prop_assert_eq!(stats.live_keys, 0);
    prop_assert_eq!(stats.used_bytes, stats.overflow_bytes);
    prop_assert_eq!(stats.pending_reclaim_bytes, 0);
    prop_assert_eq!(
        stats.free_bytes + stats.overflow_bytes,
        stats.data_capacity_bytes
    );
    if stats.overflow_tables == 0 {
        prop_assert_eq!(stats.largest_free_bytes, stats.data_capacity_bytes);
    }
    prop_assert_eq!(
        reader.stats().retries(),
        0,
        "single-threaded reads never retry"
    );
    Ok(())
}

#[test]
fn region_matches_hashmap_model() {
    let events = Events::default();
    let mut runner = TestRunner::new(Config {
        cases: 1024,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (any::<bool>(), proptest::collection::vec(op(), 1..400));
    let result = runner.run(&strategy, |(tiny_index, ops)| {
        run_case(tiny_index, &ops, &events)
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    // The cases must really have exercised the hard paths.
    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "region full {} / overflowed cases {} / reclaimed blocks {} / updates {}",
        count(&events.region_full),
        count(&events.overflowed),
        count(&events.reclaimed),
        count(&events.updates)
    );
    assert!(count(&events.region_full) > 0, "no case filled the region");
    assert!(
        count(&events.overflowed) > 0,
        "no case filled a neighbourhood"
    );
    assert!(count(&events.reclaimed) > 0, "no case reclaimed a block");
    assert!(count(&events.updates) > 0, "no case updated a key");
}
