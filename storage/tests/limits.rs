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
