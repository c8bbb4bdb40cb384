//! Size limits, full regions and full neighbourhoods: clear errors or an
//! overflow table, nothing lost.

use std::sync::Arc;

use rdkv_proto::region::HeaderError;
use rdkv_storage::{ManualClock, ReaderOptions, RegionConfig, RegionError, RegionWriter};

fn writer(config: RegionConfig) -> RegionWriter {
    RegionWriter::create(&config, Arc::new(ManualClock::default())).unwrap()
}

#[test]
fn one_mib_values_and_one_kib_keys_by_default() {
    let mut w = writer(RegionConfig {
        region_bytes: 16 * 1024 * 1024,
        ..RegionConfig::default()
    });
    let reader = w.reader(ReaderOptions::for_layout(w.layout())).unwrap();
    let key = vec![b'k'; 1024];
    let value: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    w.put(&key, &value, 1).unwrap();
    let got = reader.get(&key).unwrap().unwrap();
    assert_eq!(got.version, 1);
    assert!(got.value == value);

    assert!(matches!(
        w.put(&vec![b'k'; 1025], b"v", 2),
        Err(RegionError::KeyTooLarge {
            len: 1025,
            max: 1024
        })
    ));
    assert!(matches!(
        w.put(b"k", &vec![0; 1024 * 1024 + 1], 2),
        Err(RegionError::ValueTooLarge {
            len: 1_048_577,
            max: 1_048_576
        })
    ));
    assert!(matches!(
        w.put(b"k", b"v", 0),
        Err(RegionError::ZeroVersion)
    ));
}

#[test]
fn limits_are_configurable() {
    let mut w = writer(RegionConfig {
        region_bytes: 32 * 1024 * 1024,
        max_key_bytes: 4096,
        max_value_bytes: 8 * 1024 * 1024,
        ..RegionConfig::default()
    });
    let reader = w.reader(ReaderOptions::for_layout(w.layout())).unwrap();
    let value = vec![7u8; 8 * 1024 * 1024];
    w.put(&[b'x'; 4096], &value, 1).unwrap();
    assert_eq!(
        reader.get(&[b'x'; 4096]).unwrap().unwrap().value.len(),
        value.len()
    );
}

#[test]
fn bad_configs_are_refused() {
    let bad =
        |config: RegionConfig| RegionWriter::create(&config, Arc::new(ManualClock::default()));
    assert!(matches!(
        bad(RegionConfig {
            region_bytes: 4097,
            ..RegionConfig::default()
        }),
        Err(RegionError::Config(_))
    ));
    assert!(matches!(
        bad(RegionConfig {
            max_value_bytes: u32::MAX,
            ..RegionConfig::default()
        }),
        Err(RegionError::Header(HeaderError::Geometry(_)))
    ));
    assert!(matches!(
        bad(RegionConfig {
            region_bytes: 8192,
            bytes_per_slot: 1,
            ..RegionConfig::default()
        }),
        Err(RegionError::Header(HeaderError::Geometry(_)))
    ));
}

#[test]
fn a_full_region_refuses_writes_and_keeps_every_value() {
    let mut w = writer(RegionConfig {
        region_bytes: 256 * 1024,
        ..RegionConfig::default()
    });
    let reader = w.reader(ReaderOptions::for_layout(w.layout())).unwrap();
    let value = vec![1u8; 1000];
    let mut stored = 0u64;
    let error = loop {
        match w.put(format!("k{stored}").as_bytes(), &value, stored + 1) {
            Ok(_) => stored += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(error, RegionError::RegionFull { .. }), "{error}");
    assert!(error.to_string().contains("region full"));
    assert!(stored > 100);
    for i in 0..stored {
        let got = reader.get(format!("k{i}").as_bytes()).unwrap().unwrap();
        assert_eq!(got.value.len(), 1000);
    }
    // A smaller value still fits in what is left, and a delete frees space
    // only after the grace period.
    let stats = w.stats();
    assert!(stats.free_bytes < 1088);
    assert_eq!(stats.live_keys, stored);
    w.delete(b"k0").unwrap();
    assert!(
        matches!(w.put(b"new", &value, 10_000), Err(RegionError::RegionFull { pending_reclaim_bytes, .. }) if pending_reclaim_bytes > 0)
    );
    assert!(w.next_reclaim_at_us().is_some());
}

#[test]
fn a_full_neighbourhood_spills_into_an_overflow_table() {
    // Two buckets in all: one home bucket, whose neighbourhood offers a key
    // 15 slots (the second bucket's anchor belongs to no key). Replicas
    // place keys differently, so a full neighbourhood must not refuse one:
    // the 16th key goes to an overflow table (it was `IndexFull` before).
    let mut w = writer(RegionConfig {
        region_bytes: 64 * 1024,
        bytes_per_slot: 4096,
        ..RegionConfig::default()
    });
    let reader = w.reader(ReaderOptions::for_layout(w.layout())).unwrap();
    for i in 0..16u64 {
        w.put(format!("k{i}").as_bytes(), b"v", i + 1).unwrap();
    }
    assert_eq!(w.stats().overflow_tables, 1);
    assert_eq!(w.put(b"one-more", b"v", 100).unwrap(), None);
    assert_eq!(w.put(b"k3", b"updated", 101).unwrap(), Some(4));
    assert_eq!(&reader.get(b"k3").unwrap().unwrap().value[..], b"updated");
    assert_eq!(&reader.get(b"one-more").unwrap().unwrap().value[..], b"v");
    for i in 0..16u64 {
        assert!(reader.get(format!("k{i}").as_bytes()).unwrap().is_some());
    }
    let stats = w.stats();
    assert_eq!((stats.live_keys, stats.overflow_tables), (17, 1));
    assert_eq!(stats.overflow_bytes, 64);
}

/// The writer's accounting, byte for byte: what a pair is charged, what a
/// block uses, what is free and in one piece, what waits for its grace
/// period and what came back.
#[test]
fn stats_and_charges_account_every_byte() {
    use rdkv_proto::region::{SLOT_BYTES, SizeClass, charged_bytes, encoded_block_bytes};
    let clock = Arc::new(ManualClock::default());
    let config = RegionConfig::default();
    let mut w = RegionWriter::create(&config, clock.clone()).unwrap();
    let empty = w.stats();
    assert_eq!(empty.free_bytes, empty.data_capacity_bytes);
    assert_eq!(empty.largest_free_bytes, empty.free_bytes);
    assert_eq!(empty.fragmentation, 0.0);
    let value = vec![7u8; 200];
    let block_bytes = SizeClass::for_bytes(encoded_block_bytes(2, value.len()))
        .unwrap()
        .bytes();
    for (i, key) in [b"k0", b"k1", b"k2"].iter().enumerate() {
        w.put(*key, &value, i as u64 + 1).unwrap();
    }
    let charge = charged_bytes(2, value.len()).unwrap();
    assert_eq!(charge, block_bytes + SLOT_BYTES);
    assert_eq!(w.charge_of(b"k1").unwrap(), Some(charge));
    assert_eq!(w.charge_of(b"none").unwrap(), None);
    let stats = w.stats();
    assert_eq!(stats.used_bytes, 3 * block_bytes);
    assert_eq!(stats.charged_bytes, 3 * charge);
    assert_eq!(stats.free_bytes, empty.free_bytes - 3 * block_bytes);
    // A delete retires the block: pending until its grace period ends.
    w.delete(b"k1").unwrap();
    let stats = w.stats();
    assert_eq!(
        (stats.pending_reclaim_bytes, stats.pending_reclaim_blocks),
        (block_bytes, 1)
    );
    assert_eq!(w.reclaim(), 0, "reclaimed before the grace period");
    clock.advance_us(config.grace_period_us + 1);
    assert_eq!(w.reclaim(), 1);
    let stats = w.stats();
    assert_eq!(stats.pending_reclaim_bytes, 0);
    assert_eq!(
        (stats.reclaimed_blocks_total, stats.reclaimed_bytes_total),
        (1, block_bytes)
    );
    // k1's block is a hole between k0's and k2's: free space in two pieces.
    assert_eq!(stats.free_bytes, empty.free_bytes - 2 * block_bytes);
    assert!(stats.largest_free_bytes < stats.free_bytes);
    let expected = 1.0 - stats.largest_free_bytes as f64 / stats.free_bytes as f64;
    assert!(stats.fragmentation > 0.0);
    assert!((stats.fragmentation - expected).abs() < 1e-12, "{stats:?}");
}

/// A full region's error says what the write needed and what is free, as
/// the stats count it.
#[test]
fn a_full_regions_error_reports_its_space_exactly() {
    use rdkv_proto::region::{SizeClass, encoded_block_bytes};
    let mut w = writer(RegionConfig {
        region_bytes: 256 * 1024,
        ..RegionConfig::default()
    });
    let value = vec![1u8; 1000];
    let mut i = 0u64;
    let error = loop {
        match w.put(format!("k{i:05}").as_bytes(), &value, i + 1) {
            Ok(_) => i += 1,
            Err(e) => break e,
        }
    };
    let stats = w.stats();
    let needed = SizeClass::for_bytes(encoded_block_bytes(6, value.len()))
        .unwrap()
        .bytes();
    let RegionError::RegionFull {
        needed_bytes,
        free_bytes,
        largest_free_bytes,
        pending_reclaim_bytes,
    } = error
    else {
        panic!("{error}");
    };
    assert_eq!(needed_bytes, needed);
    assert_eq!(free_bytes, stats.free_bytes);
    assert_eq!(largest_free_bytes, stats.largest_free_bytes);
    assert_eq!(pending_reclaim_bytes, stats.pending_reclaim_bytes);
    assert!(free_bytes < needed && free_bytes > 0, "{free_bytes} free");
}

/// Retiring a replaced block writes only inside that block: a neighbour
/// whose bytes fill its class to the end stays valid.
#[test]
fn replacing_a_block_leaves_its_neighbours_intact() {
    use rdkv_proto::region::{UNIT_BYTES, encoded_block_bytes};
    let mut w = writer(RegionConfig::default());
    let reader = w.reader(ReaderOptions::for_layout(w.layout())).unwrap();
    // One unit exactly: the block's last byte is the value's last byte.
    let value_len = (UNIT_BYTES - encoded_block_bytes(1, 0)) as usize;
    assert_eq!(encoded_block_bytes(1, value_len), UNIT_BYTES);
    let left = vec![b'L'; value_len];
    w.put(b"a", &left, 1).unwrap();
    w.put(b"b", &vec![b'R'; value_len], 2).unwrap();
    w.put(b"c", &vec![b'S'; value_len], 3).unwrap();
    // b's block (between a's and c's) is replaced, then deleted outright.
    w.put(
        b"b",
        b"longer value in a new block of two units at least......",
        4,
    )
    .unwrap();
    w.delete(b"b").unwrap();
    assert_eq!(reader.get(b"a").unwrap().unwrap().value.as_ref(), &left[..]);
    assert_eq!(reader.get(b"c").unwrap().unwrap().version, 3);
}

/// What the writer publishes in the header, readers see.
#[test]
fn published_term_and_applied_index_reach_readers() {
    let w = writer(RegionConfig::default());
    let reader = w.reader(ReaderOptions::for_layout(w.layout())).unwrap();
    w.publish_term(7).unwrap();
    w.publish_applied(42, 1_700_000_000_000_000).unwrap();
    let header = reader.dynamic_header().unwrap();
    assert_eq!(header.raft_term, 7);
    assert_eq!(header.applied_index, 42);
    assert_eq!(header.applied_at_unix_us, 1_700_000_000_000_000);
    assert_eq!(reader.applied_index().unwrap(), 42);
    // The lease: both clocks' deadlines, a deadline of 0 published as 1
    // (expired, not "no lease"), and None clears both.
    let lease = |unix_us, boottime_us| {
        Some(rdkv_proto::region::LeaseDeadline {
            unix_us,
            boottime_us,
        })
    };
    w.publish_lease(lease(5_000, 6_000)).unwrap();
    let header = reader.dynamic_header().unwrap();
    assert_eq!(header.lease_deadline_unix_us, Some(5_000));
    assert_eq!(header.lease_deadline_boottime_us, Some(6_000));
    w.publish_lease(lease(0, 0)).unwrap();
    let header = reader.dynamic_header().unwrap();
    assert_eq!(header.lease_deadline_unix_us, Some(1));
    assert_eq!(header.lease_deadline_boottime_us, Some(1));
    w.publish_lease(None).unwrap();
    let header = reader.dynamic_header().unwrap();
    assert_eq!(header.lease_deadline_unix_us, None);
    assert_eq!(header.lease_deadline_boottime_us, None);
    assert_eq!(header.state, rdkv_proto::region::RegionState::Serving);
    w.retire_region().unwrap();
    let header = reader.dynamic_header().unwrap();
    assert_eq!(header.state, rdkv_proto::region::RegionState::Retired);
}

/// A key that needs a new overflow table when the region cannot hold both
/// the table and the key's block is refused with both counted, whether the
/// table or the block is the one that does not fit; nothing is lost.
#[test]
fn a_key_needing_a_new_table_counts_it_when_the_region_is_full() {
    use rdkv_proto::region::{UNIT_BYTES, overflow_table_units};
    // Two buckets: every key has the one home, so keys go to its overflow
    // chain once its neighbourhood is full.
    let config = RegionConfig {
        region_bytes: 64 * 1024,
        bytes_per_slot: 4096,
        ..RegionConfig::default()
    };
    // Which key makes the chain's second table: placement is the same for
    // the same keys, so a region holding the keys before it has a full
    // chain of one table.
    let mut probe = writer(config.clone());
    let mut keys = 0u64;
    while probe.stats().overflow_tables < 2 {
        probe
            .put(format!("k{keys}").as_bytes(), b"v", keys + 1)
            .unwrap();
        keys += 1;
    }
    let keys = keys - 1;
    let mut w = writer(config);
    for i in 0..keys {
        w.put(format!("k{i}").as_bytes(), b"v", i + 1).unwrap();
    }
    assert_eq!(w.stats().overflow_tables, 1);
    let table_bytes = overflow_table_units(1) * UNIT_BYTES;
    let needed = UNIT_BYTES + table_bytes;
    let mut version = keys;
    // Overwrites take fresh one-unit blocks (the old ones wait for a grace
    // period that this clock never passes): eat the free space down to
    // exactly the table's size (the table fits, the block does not), then
    // to nothing (the table does not fit).
    for free_target in [table_bytes, 0] {
        let mut k = 0;
        while w.stats().free_bytes > free_target {
            version += 1;
            w.put(format!("k{}", k % keys).as_bytes(), b"w", version)
                .unwrap();
            k += 1;
        }
        assert_eq!(w.stats().free_bytes, free_target);
        let error = w.put(format!("k{keys}").as_bytes(), b"v", version + 1);
        let Err(RegionError::RegionFull { needed_bytes, .. }) = error else {
            panic!("{error:?}");
        };
        assert_eq!(needed_bytes, needed, "with {free_target} bytes free");
        // A table allocated for it was released again.
        let stats = w.stats();
        assert_eq!(stats.free_bytes, free_target);
        assert_eq!((stats.overflow_tables, stats.live_keys), (1, keys));
    }
}

/// A home whose chain has every overflow table it may have is full: the
/// error counts the slots a key of that home may take, all of them held.
#[test]
fn a_full_chain_reports_the_slots_it_holds() {
    use rdkv_proto::region::{MAX_OVERFLOW_TABLES, chain_capacity};
    // Two buckets (one home), and room for the whole chain's blocks.
    let mut w = writer(RegionConfig {
        region_bytes: 4 * 1024 * 1024,
        bytes_per_slot: 256 * 1024,
        ..RegionConfig::default()
    });
    let mut stored = 0u64;
    let error = loop {
        match w.put(format!("k{stored}").as_bytes(), b"v", stored + 1) {
            Ok(_) => stored += 1,
            Err(e) => break e,
        }
    };
    let RegionError::IndexFull { slots } = error else {
        panic!("{error}");
    };
    let stats = w.stats();
    assert_eq!(stats.overflow_tables as usize, MAX_OVERFLOW_TABLES);
    assert_eq!(slots as u64, stored, "every slot the key may take is held");
    assert!(slots > chain_capacity(MAX_OVERFLOW_TABLES));
}
