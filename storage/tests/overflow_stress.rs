//! Readers against one writer flat out on a region with a tiny index, so
//! that most keys live in overflow tables: chains grow (an anchor's entry
//! moves into a first table, full tables get successors) while readers
//! walk them, and churn keys are inserted into and deleted from table
//! slots. A reader must never return a value that was not written, never
//! see a key's version go backwards, and never call a key absent that was
//! inserted before its read began and is never deleted.
//!
//! Several rounds, each on a fresh region, so that the anchor moves (one
//! per home bucket, while the first keys go in) happen under readers many
//! times. Run with `--nocapture` to see the counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use bytes::Bytes;
use rdkv_proto::region::HashSeed;
use rdkv_storage::region::IndexCache;
use rdkv_storage::{
    MonotonicClock, ReadError, ReaderOptions, RegionConfig, RegionError, RegionReader, RegionStats,
    RegionWriter, Versioned,
};

const ROUNDS: u64 = 12;
/// Inserted one by one while the readers run, then updated, never deleted.
const STEADY_KEYS: u64 = 400;
/// Writes after the steady keys are in: updates, churn inserts and deletes.
const CHURN_WRITES: u64 = 20_000;
/// Churn keys live at once, at most.
const CHURN_LIVE: u64 = 300;
const READERS: usize = 2;
const EXHAUSTED_AT_MOST_ONE_IN: u64 = 1_000;

fn steady(k: u64) -> Vec<u8> {
    format!("steady-{k:04}").into_bytes()
}

fn churn(c: u64) -> Vec<u8> {
    format!("churn-{c:06}").into_bytes()
}

/// `key | version` and a filler derived from both, of a length that varies
/// with the version (so that blocks change size class).
fn value(key: &[u8], version: u64) -> Vec<u8> {
    let mut v = key.to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    let filler = (version.wrapping_mul(7919) % 300) as usize;
    v.extend((0..filler).map(|i| (version as usize ^ i ^ key.len()) as u8));
    v
}

fn is_written_value(key: &[u8], found: &Versioned) -> bool {
    found.value == value(key, found.version).as_slice()
}

/// Four buckets, each its own neighbourhood: eight slots per home before
/// the chain.
fn tiny_region() -> RegionWriter {
    let region_bytes = 16 * 1024 * 1024;
    let config = RegionConfig {
        region_bytes,
        bytes_per_slot: region_bytes / 32,
        neighbourhood_buckets: 1,
        max_key_bytes: 64,
        max_value_bytes: 1024,
        grace_period_us: 2_000,
        hash_seed: HashSeed(0x5157, 0x7e55),
        shared_memory: false,
        ..RegionConfig::default()
    };
    RegionWriter::create(&config, Arc::new(MonotonicClock::new())).unwrap()
}

/// Retries a put while the region waits for blocks in their grace period.
fn put(writer: &mut RegionWriter, key: &[u8], version: u64) {
    loop {
        match writer.put(key, &value(key, version), version) {
            Ok(_) => return,
            Err(RegionError::RegionFull { .. }) => thread::yield_now(),
            Err(other) => panic!("writer: {other}"),
        }
    }
}

/// Inserts the steady keys, publishing in `present` how many are in, then
/// churns; returns the region's stats at the end.
fn write_round(mut writer: RegionWriter, present: &AtomicU64) -> RegionStats {
    let mut version = 0;
    for k in 0..STEADY_KEYS {
        version += 1;
        put(&mut writer, &steady(k), version);
        present.store(k + 1, Ordering::Release);
    }
    let (mut oldest, mut next) = (0, 0);
    for _ in 0..CHURN_WRITES {
        version += 1;
        match version % 4 {
            0 | 3 => put(&mut writer, &steady(version % STEADY_KEYS), version),
            1 => {
                put(&mut writer, &churn(next), version);
                next += 1;
            }
            _ if next - oldest > CHURN_LIVE => {
                writer.delete(&churn(oldest)).unwrap();
                oldest += 1;
            }
            _ => put(&mut writer, &churn(oldest), version),
        }
    }
    writer.stats()
}

#[derive(Debug, Default)]
struct Counts {
    reads: u64,
    wrong: u64,
    absent: u64,
    backwards: u64,
    exhausted: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.reads += other.reads;
        self.wrong += other.wrong;
        self.absent += other.absent;
        self.backwards += other.backwards;
        self.exhausted += other.exhausted;
    }

    /// Judges one read of steady key `k` (present when the read began).
    fn judge(&mut self, k: u64, got: Result<Option<Versioned>, ReadError>, seen: &mut [u64]) {
        self.reads += 1;
        match got {
            Ok(Some(found)) => {
                if !is_written_value(&steady(k), &found) {
                    self.wrong += 1;
                }
                if found.version < seen[k as usize] {
                    self.backwards += 1;
                }
                seen[k as usize] = found.version;
            }
            Ok(None) => self.absent += 1,
            Err(ReadError::Exhausted { .. }) => self.exhausted += 1,
            Err(other) => panic!("reader: {other}"),
        }
    }
}

/// Reads steady keys already in (alone, through the index cache, and in
/// batches of four) until `stop`.
fn read_round(reader: &RegionReader, present: &AtomicU64, stop: &AtomicBool, seed: u64) -> Counts {
    let cache = IndexCache::new(STEADY_KEYS as usize);
    let mut seen = vec![0u64; STEADY_KEYS as usize];
    let mut counts = Counts::default();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ seed;
    while !stop.load(Ordering::Relaxed) {
        let n = present.load(Ordering::Acquire);
        if n == 0 {
            thread::yield_now();
            continue;
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = rng % n;
        match rng % 8 {
            0 => counts.judge(k, reader.get_cached(&steady(k), &cache), &mut seen),
            1 => {
                let ks: Vec<u64> = (0..4).map(|i| (k + i * 97) % n).collect();
                let keys: Vec<Bytes> = ks.iter().map(|&k| Bytes::from(steady(k))).collect();
                match reader.get_many(&keys) {
                    Ok(values) => {
                        for (&k, found) in ks.iter().zip(values) {
                            counts.judge(k, Ok(found), &mut seen);
                        }
                    }
                    Err(error) => counts.judge(k, Err(error), &mut seen),
                }
            }
            _ => counts.judge(k, reader.get(&steady(k)), &mut seen),
        }
    }
    counts
}

#[test]
fn readers_never_miss_or_misread_keys_in_growing_chains() {
    let mut total = Counts::default();
    let mut tables = 0;
    for round in 0..ROUNDS {
        let writer = tiny_region();
        let reader = writer
            .reader(ReaderOptions::for_layout(writer.layout()))
            .unwrap();
        let present = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (reader, present, stop) =
                    (reader.clone(), Arc::clone(&present), Arc::clone(&stop));
                thread::spawn(move || read_round(&reader, &present, &stop, round * 7 + r as u64))
            })
            .collect();
        let stats = write_round(writer, &present);
        stop.store(true, Ordering::Relaxed);
        for handle in readers {
            total.add(&handle.join().unwrap());
        }
        assert!(stats.overflow_tables >= 4, "round {round}: {stats:?}");
        tables += stats.overflow_tables;
    }
    println!("{total:?}; {tables} overflow tables in {ROUNDS} rounds");
    assert_eq!(total.wrong, 0, "a reader returned a value never written");
    assert_eq!(total.absent, 0, "a reader missed a key that was present");
    assert_eq!(total.backwards, 0, "a key's version went backwards");
    assert!(
        total.exhausted * EXHAUSTED_AT_MOST_ONE_IN <= total.reads,
        "{} of {} reads gave up",
        total.exhausted,
        total.reads
    );
    assert!(total.reads > 100_000, "too few reads to mean anything");
}
