//! Region engine benchmarks, each next to an in-process peer baseline so that
//! results are quoted as ratios from the same run (the CI box is a noisy
//! 2-core VM; absolute times drift, ratios much less).
//!
//! - `get_100B`, `get_1KiB`: the local one-sided read path (`RegionReader::get`)
//!   for 16-byte keys over a region holding `PREFILL_KEYS` keys, hit and miss
//!   (a miss is a key never inserted), against a
//!   `RwLock<HashMap<Vec<u8>, Bytes>>` (read lock, lookup, clone the `Bytes`).
//! - `apply_100B`, `apply_1KiB`: `RegionWriter::put` over existing keys
//!   (out-of-place update, retire, reclaim), `put` of fresh keys (insert) and
//!   `delete` + `put` pairs (one element = one pair), against `HashMap`
//!   insert/remove of cloned key and value under the write lock.
//!
//! Keys are visited in a fixed pseudo-random order, cycling through a
//! precomputed list, so caches see a realistic spread rather than one key.
//!
//! Run with `cargo bench -p rdkv-storage --bench region`; results are in
//! docs/benchmarks.md.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use rdkv_proto::region::{SizeClass, encoded_block_bytes};
use rdkv_storage::{MonotonicClock, ReaderOptions, RegionConfig, RegionWriter};

/// Keys present in every region (and hash map) before measuring.
const PREFILL_KEYS: usize = 100_000;
/// Fresh keys the insert benchmarks add on top of the prefill before an
/// untimed reset removes them again.
const FRESH_KEYS: usize = 100_000;
const KEY_BYTES: usize = 16;
/// Grace period of the regions written by the apply benchmarks: 1 ms, so that
/// retired blocks come back to the allocator within the run and the region
/// reaches a steady state of reclamation instead of filling up.
const APPLY_GRACE_US: u64 = 1_000;

type Key = [u8; KEY_BYTES];
type LockedMap = RwLock<HashMap<Vec<u8>, Bytes>>;

/// A 16-byte key: a 4-byte tag and a 12-digit index.
fn key(tag: &[u8; 4], index: usize) -> Key {
    let mut key = [0u8; KEY_BYTES];
    key[..4].copy_from_slice(tag);
    key[4..].copy_from_slice(format!("{index:012}").as_bytes());
    key
}

fn keys(tag: &[u8; 4], count: usize) -> Vec<Key> {
    (0..count).map(|i| key(tag, i)).collect()
}

/// A deterministic shuffle (splitmix64-driven Fisher-Yates).
fn shuffled(mut items: Vec<Key>, seed: u64) -> Vec<Key> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
    items
}

fn value(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

/// A region with room for `live_keys` blocks of `value_len`-byte values at
/// least twice over (for the blocks waiting out their grace period and for
/// fragmentation), rounded up to a power of two.
fn region_config(live_keys: usize, value_len: usize, grace_period_us: u64) -> RegionConfig {
    let block_bytes = SizeClass::for_bytes(encoded_block_bytes(KEY_BYTES, value_len))
        .expect("bench value fits a size class")
        .bytes();
    let region_bytes = (live_keys as u64 * block_bytes * 2)
        .next_power_of_two()
        .max(64 << 20);
    RegionConfig {
        region_bytes,
        grace_period_us,
        ..RegionConfig::default()
    }
}

/// Puts or panics with a message saying which benchmark failed and why.
fn put(writer: &mut RegionWriter, key: &[u8], value: &[u8], version: u64, what: &str) {
    if let Err(error) = writer.put(key, value, version) {
        panic!(
            "{what}: region put of version {version} failed: {error} \
             (region too small for the benchmark?); stats: {:?}",
            writer.stats()
        );
    }
}

fn delete(writer: &mut RegionWriter, key: &[u8], what: &str) {
    match writer.delete(key) {
        Ok(Some(_)) => {}
        Ok(None) => panic!("{what}: deleted key {key:?} was absent"),
        Err(error) => panic!("{what}: region delete failed: {error}"),
    }
}

/// A region (with the given grace period) sized for `capacity_keys` and
/// holding `hit_keys` with `value_len`-byte values.
fn prefilled_region(
    hit_keys: &[Key],
    value_len: usize,
    capacity_keys: usize,
    grace_period_us: u64,
) -> RegionWriter {
    let config = region_config(capacity_keys, value_len, grace_period_us);
    let mut writer = RegionWriter::create(&config, Arc::new(MonotonicClock::new()))
        .unwrap_or_else(|e| panic!("cannot create a {} byte region: {e}", config.region_bytes));
    let value = value(value_len, 0x5a);
    for (i, key) in hit_keys.iter().enumerate() {
        put(&mut writer, key, &value, i as u64 + 1, "prefill");
    }
    writer
}

/// The peer baseline holding the same keys and values.
fn prefilled_map(hit_keys: &[Key], value_len: usize) -> LockedMap {
    let value = value(value_len, 0x5a);
    let mut map = HashMap::with_capacity(PREFILL_KEYS + FRESH_KEYS);
    for key in hit_keys {
        map.insert(key.to_vec(), Bytes::copy_from_slice(&value));
    }
    RwLock::new(map)
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    group
}

fn bench_get(c: &mut Criterion, label: &str, value_len: usize) {
    let hit_keys = keys(b"key-", PREFILL_KEYS);
    // Reads need no churn: the region keeps the default grace period.
    let writer = prefilled_region(
        &hit_keys,
        value_len,
        PREFILL_KEYS,
        RegionConfig::default().grace_period_us,
    );
    let map = prefilled_map(&hit_keys, value_len);
    let reader = writer
        .reader(ReaderOptions::for_layout(writer.layout()))
        .expect("attach reader");
    let hits = shuffled(hit_keys, 1);
    let misses = shuffled(keys(b"mis-", PREFILL_KEYS), 2);

    // Untimed sanity check: hits return the full value, misses nothing.
    for key in hits.iter().step_by(997) {
        let found = reader
            .get(key)
            .expect("get")
            .expect("prefilled key present");
        assert_eq!(found.value.len(), value_len);
        assert_eq!(
            map.read().unwrap().get(&key[..]).map(Bytes::len),
            Some(value_len)
        );
    }
    for key in misses.iter().step_by(997) {
        assert!(reader.get(key).expect("get").is_none());
        assert!(!map.read().unwrap().contains_key(&key[..]));
    }

    let mut group = group(c, &format!("get_{label}"));
    for (name, keys) in [("hit", &hits), ("miss", &misses)] {
        let mut keys = Cycle::new(keys);
        group.bench_function(format!("rdkv_region_{name}"), |b| {
            b.iter(|| {
                let key = keys.next_key();
                black_box(reader.get(black_box(key)).expect("region get"))
            })
        });
    }
    for (name, keys) in [("hit", &hits), ("miss", &misses)] {
        let mut keys = Cycle::new(keys);
        group.bench_function(format!("rwlock_hashmap_{name}"), |b| {
            b.iter(|| {
                let key = keys.next_key();
                let found = map.read().unwrap().get(&black_box(key)[..]).cloned();
                black_box(found)
            })
        });
    }
    group.finish();
    drop(reader);
    drop(writer);
}

/// `keys` in order, over and over: the key of each timed iteration.
struct Cycle<'a> {
    keys: &'a [Key],
    next: usize,
}

impl<'a> Cycle<'a> {
    fn new(keys: &'a [Key]) -> Self {
        Cycle { keys, next: 0 }
    }

    fn next_key(&mut self) -> &'a Key {
        let key = &self.keys[self.next];
        self.next = (self.next + 1) % self.keys.len();
        key
    }
}

/// Times `iters` operations `op(state, key)` over `keys` in order, starting
/// at `*cursor`; whenever the list is used up, `reset(state)` runs untimed and
/// the list starts over.
fn timed_rounds<S>(
    iters: u64,
    keys: &[Key],
    cursor: &mut usize,
    state: &mut S,
    mut op: impl FnMut(&mut S, &Key),
    mut reset: impl FnMut(&mut S),
) -> Duration {
    let mut elapsed = Duration::ZERO;
    let mut remaining = iters;
    while remaining > 0 {
        if *cursor == keys.len() {
            reset(state);
            *cursor = 0;
        }
        let chunk = remaining.min((keys.len() - *cursor) as u64) as usize;
        let start = Instant::now();
        for key in &keys[*cursor..*cursor + chunk] {
            op(state, key);
        }
        elapsed += start.elapsed();
        *cursor += chunk;
        remaining -= chunk as u64;
    }
    elapsed
}

/// Benchmarks `insert` of fresh keys: each timed round inserts keys not yet
/// inserted; when they run out, `reset` (untimed) removes them all.
fn bench_fresh_inserts<S>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    fresh: &[Key],
    state: &mut S,
    mut insert: impl FnMut(&mut S, &Key),
    mut reset: impl FnMut(&mut S),
) {
    let mut cursor = 0;
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            timed_rounds(iters, fresh, &mut cursor, state, &mut insert, &mut reset)
        })
    });
}

fn bench_apply(c: &mut Criterion, label: &str, value_len: usize) {
    let hit_keys = keys(b"key-", PREFILL_KEYS);
    let order = shuffled(hit_keys.clone(), 3);
    let fresh = shuffled(keys(b"new-", FRESH_KEYS), 4);
    let values = [value(value_len, 0x11), value(value_len, 0x22)];
    let region = |hit_keys: &[Key]| {
        prefilled_region(
            hit_keys,
            value_len,
            PREFILL_KEYS + FRESH_KEYS,
            APPLY_GRACE_US,
        )
    };
    let mut group = group(c, &format!("apply_{label}"));

    // Update of existing keys: new block, slot store, retire, reclaim.
    {
        let mut writer = region(&hit_keys);
        let mut version = PREFILL_KEYS as u64;
        let mut keys = Cycle::new(&order);
        group.bench_function("rdkv_region_update", |b| {
            b.iter(|| {
                version += 1;
                let key = keys.next_key();
                let value = &values[(version & 1) as usize];
                put(&mut writer, black_box(key), value, version, "update");
            })
        });
        let stats = writer.stats();
        assert_eq!(stats.live_keys, PREFILL_KEYS as u64);
        // A filter (`-- apply_1KiB/rdkv_region_insert`) skips the bench:
        // then no update ran and there is nothing reclaimed to check.
        let updated = version > PREFILL_KEYS as u64;
        assert!(
            !updated || stats.reclaimed_blocks_total > 0,
            "no block was reclaimed"
        );
    }

    // Insert of fresh keys, PREFILL_KEYS..PREFILL_KEYS + FRESH_KEYS live; the
    // untimed reset deletes the fresh keys and reclaims their blocks.
    {
        let mut writer = region(&hit_keys);
        let mut version = PREFILL_KEYS as u64;
        bench_fresh_inserts(
            &mut group,
            "rdkv_region_insert",
            &fresh,
            &mut (&mut writer, &mut version),
            |(writer, version), key| {
                **version += 1;
                put(writer, black_box(key), &values[0], **version, "insert");
            },
            |(writer, _)| {
                for key in &fresh {
                    delete(writer, key, "insert reset");
                }
                // Let the deleted blocks' grace period pass and return
                // them to the allocator before the timer restarts.
                std::thread::sleep(Duration::from_micros(2 * APPLY_GRACE_US));
                writer.reclaim();
            },
        );
    }

    // Delete then put of an existing key: two slot stores, one retire.
    {
        let mut writer = region(&hit_keys);
        let mut version = PREFILL_KEYS as u64;
        let mut keys = Cycle::new(&order);
        group.bench_function("rdkv_region_delete_put", |b| {
            b.iter(|| {
                version += 1;
                let key = black_box(keys.next_key());
                delete(&mut writer, key, "delete_put");
                put(&mut writer, key, &values[0], version, "delete_put");
            })
        });
        assert_eq!(writer.stats().live_keys, PREFILL_KEYS as u64);
    }

    // Peer baseline: the same operations on a locked hash map, each cloning
    // key and value into fresh allocations under the write lock.
    let map = || prefilled_map(&hit_keys, value_len);
    {
        let map = map();
        let mut keys = Cycle::new(&order);
        let mut flip = 0usize;
        group.bench_function("rwlock_hashmap_update", |b| {
            b.iter(|| {
                flip ^= 1;
                let key = black_box(keys.next_key());
                let old = map
                    .write()
                    .unwrap()
                    .insert(key.to_vec(), Bytes::copy_from_slice(&values[flip]));
                black_box(old)
            })
        });
    }
    {
        let map = map();
        bench_fresh_inserts(
            &mut group,
            "rwlock_hashmap_insert",
            &fresh,
            &mut (),
            |_, key| {
                let old = map
                    .write()
                    .unwrap()
                    .insert(black_box(key).to_vec(), Bytes::copy_from_slice(&values[0]));
                black_box(old);
            },
            |_| {
                let mut map = map.write().unwrap();
                for key in &fresh {
                    map.remove(&key[..]).expect("fresh key present");
                }
            },
        );
    }
    {
        let map = map();
        let mut keys = Cycle::new(&order);
        group.bench_function("rwlock_hashmap_delete_insert", |b| {
            b.iter(|| {
                let key = black_box(keys.next_key());
                let old = map.write().unwrap().remove(&key[..]);
                black_box(old).expect("key present");
                map.write()
                    .unwrap()
                    .insert(key.to_vec(), Bytes::copy_from_slice(&values[0]));
            })
        });
    }
    group.finish();
}

fn region_benches(c: &mut Criterion) {
    bench_get(c, "100B", 100);
    bench_get(c, "1KiB", 1024);
    bench_apply(c, "100B", 100);
    bench_apply(c, "1KiB", 1024);
}

criterion_group! {
    name = benches;
    // 20 benchmarks at ~1 s warm-up + 3 s measurement: a few minutes in all.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = region_benches
}
criterion_main!(benches);
