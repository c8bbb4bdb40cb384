//! Overflow chains: a region with a deliberately tiny index takes thousands
//! of keys and refuses none with `IndexFull` (only past the chain's bound);
//! every key reads back through the writer and through every lock-free read
//! path (`get`, `get_cached`, `get_many`); updates and deletes reach keys in
//! tables, whose freed slots are reused; a scan yields every pair once, and
//! a region rebuilt from it holds the same pairs. The concurrent test is in
//! `overflow_stress.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use rdkv_proto::region::{
    ANCHOR_SLOT, BLOCK_HEADER_BYTES, BUCKET_BYTES, HashSeed, MAX_OVERFLOW_TABLES, SLOT_BYTES,
    SlotWord, chain_capacity,
};
use rdkv_storage::region::IndexCache;
use rdkv_storage::{
    ManualClock, ReaderOptions, RegionConfig, RegionError, RegionReader, RegionWriter,
};

const REGION_BYTES: u64 = 8 * 1024 * 1024;

type Pairs = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

/// A region of `buckets` index buckets (`neighbourhood` each): a handful of
/// slots for thousands of keys.
fn tiny_index(buckets: u64, neighbourhood: u64) -> RegionConfig {
    RegionConfig {
        region_bytes: REGION_BYTES,
        bytes_per_slot: REGION_BYTES / (buckets * 8),
        neighbourhood_buckets: neighbourhood,
        max_key_bytes: 64,
        max_value_bytes: 4096,
        hash_seed: HashSeed(0x0f1e, 0x2d3c),
        shared_memory: false,
        ..RegionConfig::default()
    }
}

fn writer(config: &RegionConfig) -> RegionWriter {
    let writer = RegionWriter::create(config, Arc::new(ManualClock::default())).unwrap();
    let buckets =
        ((config.region_bytes / config.bytes_per_slot) / 8).max(config.neighbourhood_buckets);
    // A power-of-two index of 1024 buckets or more gets `neighbourhood - 1`
    // more (a power of two of home buckets: `RegionConfig::layout`).
    let extra = if buckets >= 1024 && buckets.is_power_of_two() {
        config.neighbourhood_buckets - 1
    } else {
        0
    };
    assert_eq!(writer.layout().bucket_count, buckets + extra);
    writer
}

fn reader(writer: &RegionWriter) -> RegionReader {
    writer
        .reader(ReaderOptions::for_layout(writer.layout()))
        .unwrap()
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

/// A value that names its key and version, of a length that varies.
fn value(i: u64, version: u64) -> Vec<u8> {
    let mut v = format!("value-{i}-{version}-").into_bytes();
    v.resize(v.len() + (i % 7) as usize * 13, b'.');
    v
}

/// Puts keys `range` at version `version`, recording them in `model`.
fn put_all(w: &mut RegionWriter, model: &mut Pairs, range: std::ops::Range<u64>, version: u64) {
    for i in range {
        let v = value(i, version);
        w.put(&key(i), &v, version)
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
        model.insert(key(i), (v, version));
    }
}

fn pair(found: Option<rdkv_storage::Versioned>) -> Option<(Vec<u8>, u64)> {
    found.map(|v| (v.value.to_vec(), v.version))
}

/// Every pair of `model` (and `absent`, which it must not hold) reads back
/// the same through the writer, `get`, `get_cached` (a miss, then a hit)
/// and `get_many` in batches.
fn check_reads(w: &RegionWriter, model: &Pairs, absent: &[Vec<u8>]) {
    let r = reader(w);
    let cache = IndexCache::new(model.len() + absent.len());
    for k in model.keys().chain(absent) {
        let expected = model.get(k).cloned();
        let name = String::from_utf8_lossy(k);
        assert_eq!(pair(w.get(k).unwrap()), expected, "writer {name}");
        assert_eq!(pair(r.get(k).unwrap()), expected, "get {name}");
        assert_eq!(
            pair(r.get_cached(k, &cache).unwrap()),
            expected,
            "miss {name}"
        );
        assert_eq!(
            pair(r.get_cached(k, &cache).unwrap()),
            expected,
            "hit {name}"
        );
    }
    let keys: Vec<Bytes> = model
        .keys()
        .chain(absent)
        .map(|k| Bytes::copy_from_slice(k))
        .collect();
    for batch in keys.chunks(97) {
        let got = r.get_many(batch).unwrap();
        for (k, found) in batch.iter().zip(got) {
            assert_eq!(pair(found), model.get(&k[..]).cloned(), "get_many {k:?}");
        }
    }
    assert_eq!(r.stats().retries(), 0, "a single-threaded read retried");
    assert_eq!(r.stats().cache_hits, model.len() as u64);
}

/// The live pairs as `for_each_live` yields them, each exactly once.
fn scan(w: &RegionWriter) -> Pairs {
    let mut pairs = Pairs::new();
    w.for_each_live(|pair| {
        let previous = pairs.insert(pair.key.to_vec(), (pair.value.to_vec(), pair.version));
        assert!(previous.is_none(), "{:?} yielded twice", pair.key);
        Ok(())
    })
    .unwrap();
    pairs
}

/// The accounting the model test keeps, with overflow tables in `used`.
fn check_accounting(w: &RegionWriter, model: &Pairs) {
    let stats = w.stats();
    assert_eq!(stats.live_keys, model.len() as u64);
    let payload: usize = model.iter().map(|(k, (v, _))| k.len() + v.len()).sum();
    assert_eq!(stats.payload_bytes, payload as u64);
    assert_eq!(
        stats.used_bytes + stats.free_bytes + stats.pending_reclaim_bytes,
        stats.data_capacity_bytes
    );
    assert!(stats.used_bytes >= stats.overflow_bytes);
    assert_eq!(stats.overflow_tables > 0, stats.overflow_bytes > 0);
}

#[test]
fn a_tiny_index_takes_thousands_of_keys_and_every_read_path_finds_them() {
    for (buckets, neighbourhood) in [(4, 1), (8, 2), (4, 2)] {
        let mut w = writer(&tiny_index(buckets, neighbourhood));
        let mut model = Pairs::new();
        put_all(&mut w, &mut model, 0..4000, 1);
        let stats = w.stats();
        println!("{buckets} buckets of {neighbourhood}: {stats:?}");
        assert!(stats.overflow_tables >= 4, "{stats:?}");
        check_accounting(&w, &model);
        let absent: Vec<Vec<u8>> = (4000..4100).map(key).collect();
        check_reads(&w, &model, &absent);
        assert_eq!(scan(&w), model);
    }
}

#[test]
fn updates_and_deletes_reach_keys_in_tables_and_freed_slots_are_reused() {
    // Two buckets of one neighbourhood: every key has the same home, so
    // slots freed by any key serve any other.
    let mut w = writer(&tiny_index(2, 2));
    let mut model = Pairs::new();
    put_all(&mut w, &mut model, 0..2000, 1);
    let tables = w.stats().overflow_tables;
    assert!(tables >= 8, "{:?}", w.stats());
    put_all(&mut w, &mut model, 0..2000, 2);
    for i in (0..2000).step_by(2) {
        assert_eq!(w.delete(&key(i)).unwrap(), Some(2), "delete {i}");
        model.remove(&key(i));
    }
    assert_eq!(w.delete(&key(0)).unwrap(), None);
    let deleted: Vec<Vec<u8>> = (0..2000).step_by(2).map(key).collect();
    check_reads(&w, &model, &deleted);
    // As many new keys as were deleted fit in the freed slots.
    put_all(&mut w, &mut model, 5000..6000, 3);
    assert_eq!(w.stats().overflow_tables, tables, "freed slots not reused");
    check_accounting(&w, &model);
    check_reads(&w, &model, &deleted);
    assert_eq!(scan(&w), model);
}

#[test]
fn a_region_rebuilt_from_a_scan_holds_the_same_pairs_in_fewer_tables() {
    let config = tiny_index(4, 2);
    let mut w = writer(&config);
    let mut model = Pairs::new();
    put_all(&mut w, &mut model, 0..3000, 1);
    for i in (0..3000).filter(|i| i % 3 != 0) {
        w.delete(&key(i)).unwrap();
        model.remove(&key(i));
    }
    put_all(&mut w, &mut model, 0..300, 2);
    let scanned = scan(&w);
    assert_eq!(scanned, model);
    // What a snapshot install or a re-placement does: a new region, the
    // scan's pairs put into it in scan order.
    for config in [
        config.clone(),
        RegionConfig {
            bytes_per_slot: 128,
            ..config
        },
    ] {
        let mut rebuilt = writer(&config);
        w.for_each_live(|pair| rebuilt.put_pair(pair).map(drop))
            .unwrap();
        assert_eq!(scan(&rebuilt), model);
        check_reads(&rebuilt, &model, &[key(301), key(302)]);
        assert!(rebuilt.stats().overflow_tables <= w.stats().overflow_tables);
    }
}

#[test]
fn a_key_is_refused_only_when_its_chain_is_full_at_the_bound() {
    // One home bucket: its neighbourhood offers 15 slots (the next bucket's
    // anchor belongs to no key), 14 once its anchor is the chain's link,
    // then the chain up to its bound.
    let mut w = writer(&RegionConfig {
        max_value_bytes: 16,
        ..tiny_index(2, 2)
    });
    let capacity = 14 + chain_capacity(MAX_OVERFLOW_TABLES) as u64;
    let short = |i: u64| format!("{i}").into_bytes();
    for i in 0..capacity {
        w.put(&short(i), b"v", i + 1)
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    assert_eq!(w.stats().overflow_tables, MAX_OVERFLOW_TABLES as u64);
    let refused = w.put(b"one more", b"v", capacity + 1);
    assert!(
        matches!(refused, Err(RegionError::IndexFull { slots }) if slots as u64 == capacity),
        "{refused:?}"
    );
    // Nothing changed; updates still work; a delete makes room again.
    assert_eq!(w.stats().live_keys, capacity);
    let last = short(capacity - 1);
    assert_eq!(w.put(&last, b"w", capacity + 2).unwrap(), Some(capacity));
    let r = reader(&w);
    assert_eq!(
        pair(r.get(&last).unwrap()),
        Some((b"w".to_vec(), capacity + 2))
    );
    assert_eq!(r.get(b"one more").unwrap(), None);
    w.delete(&short(7)).unwrap();
    w.put(b"one more", b"v", capacity + 3).unwrap();
    assert_eq!(w.stats().overflow_tables, MAX_OVERFLOW_TABLES as u64);
    assert_eq!(
        pair(r.get(b"one more").unwrap()),
        Some((b"v".to_vec(), capacity + 3))
    );
}

#[test]
fn a_table_that_does_not_fit_is_region_full_and_changes_nothing() {
    // Two buckets of one neighbourhood (15 slots a key may take) in front of
    // a data area of 896 units: three fillers of 768, 112 and 3 units and
    // twelve one-unit keys fill the neighbourhood and leave one unit free.
    let mut w = writer(&RegionConfig {
        region_bytes: 64 * 1024,
        bytes_per_slot: 64 * 1024 / 16,
        max_value_bytes: 64 * 1024,
        ..tiny_index(2, 2)
    });
    assert_eq!(w.stats().free_bytes, 896 * 64);
    for (i, units) in [768u64, 112, 3].into_iter().enumerate() {
        let filler = vec![b'f'; (units * 64) as usize - BLOCK_HEADER_BYTES - 8];
        w.put(format!("filler-{i}").as_bytes(), &filler, 1).unwrap();
    }
    for i in 0..12u64 {
        w.put(&key(i), b"v", i + 2).unwrap();
    }
    let before = w.stats();
    assert_eq!((before.free_bytes, before.overflow_tables), (64, 0));
    // The next key needs a block and a first table: two units. The table
    // is allocated first; the block does not fit; the table goes back.
    let refused = w.put(b"needs-a-table", b"v", 100);
    assert!(
        matches!(
            refused,
            Err(RegionError::RegionFull {
                needed_bytes: 128,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(w.stats(), before);
    let r = reader(&w);
    assert_eq!(r.get(b"needs-a-table").unwrap(), None);
    for i in 0..12u64 {
        assert!(r.get(&key(i)).unwrap().is_some());
    }
    // With a slot freed in the neighbourhood it needs no table and fits.
    w.delete(&key(3)).unwrap();
    w.put(b"needs-a-table", b"v", 101).unwrap();
    assert_eq!(w.stats().overflow_tables, 0);
    assert_eq!(
        pair(r.get(b"needs-a-table").unwrap()),
        Some((b"v".to_vec(), 101))
    );
}

#[test]
fn the_anchor_entry_moves_into_the_first_table_and_the_anchor_links_to_it() {
    // One home bucket (bucket 0): its anchor is the index's slot 7.
    let mut w = writer(&tiny_index(2, 2));
    let layout = *w.layout();
    let memory = Arc::clone(w.memory());
    let word = |at: u64| memory.load_u64(at, Ordering::Acquire).unwrap();
    let anchor_at = layout.index_offset + ANCHOR_SLOT as u64 * SLOT_BYTES;
    let foreign_anchor_at = anchor_at + BUCKET_BYTES;
    for i in 0..15 {
        w.put(&key(i), b"v", i + 1).unwrap();
    }
    // The neighbourhood is full; the home anchor holds a key of this home,
    // and the second bucket's anchor (no key's home) stays empty.
    let anchored = word(anchor_at);
    assert!(matches!(SlotWord::decode(anchored), Ok(SlotWord::Entry(_))));
    assert_eq!(word(foreign_anchor_at), 0);
    assert_eq!(w.stats().overflow_tables, 0);

    w.put(b"spills", b"v", 100).unwrap();
    let Ok(SlotWord::Link(link)) = SlotWord::decode(word(anchor_at)) else {
        panic!("the anchor is no link: {:#x}", word(anchor_at));
    };
    assert_eq!(link.table_units(), 1);
    let (table_at, len) = layout.table_range(link).unwrap();
    let table: Vec<u64> = (0..len / SLOT_BYTES)
        .map(|i| word(table_at + i * SLOT_BYTES))
        .collect();
    // Slot 0: the anchor's entry, unchanged; slot 1: the new key; the rest,
    // the link slot included, empty.
    assert_eq!(table[0], anchored);
    assert!(matches!(SlotWord::decode(table[1]), Ok(SlotWord::Entry(_))));
    assert!(table[2..].iter().all(|&w| w == 0), "{table:x?}");
    let r = reader(&w);
    for i in 0..15 {
        assert!(r.get(&key(i)).unwrap().is_some(), "key {i}");
    }
    assert_eq!(pair(r.get(b"spills").unwrap()), Some((b"v".to_vec(), 100)));
}

/// The apply loop's prefetch hints (`prefetch_neighbourhood`,
/// `prefetch_candidates`, which reads the neighbourhood) change nothing, for keys in
/// the neighbourhoods, keys in tables and keys absent alike.
#[test]
fn prefetching_a_key_changes_nothing_in_the_region() {
    // One-bucket and eight-bucket neighbourhoods (the layout's bounds).
    for (buckets, neighbourhood) in [(4, 1), (8, 8)] {
        let mut w = writer(&tiny_index(buckets, neighbourhood));
        let mut model = Pairs::new();
        put_all(&mut w, &mut model, 0..1000, 1);
        let region = |w: &RegionWriter| {
            let mut bytes = vec![0u8; w.memory().len_bytes()];
            w.memory().read_bytes(0, &mut bytes).unwrap();
            bytes
        };
        let before = region(&w);
        for i in 0..1100 {
            w.prefetch_neighbourhood(&key(i));
            w.prefetch_candidates(&key(i));
        }
        // Empty, the longest the region holds, and longer than that.
        for long in [0, 64, 65, 4096] {
            w.prefetch_neighbourhood(&vec![0xff; long]);
            w.prefetch_candidates(&vec![0xff; long]);
        }
        assert!(region(&w) == before, "a prefetch changed the region");
        let absent: Vec<Vec<u8>> = (1000..1100).map(key).collect();
        check_reads(&w, &model, &absent);
    }
}
