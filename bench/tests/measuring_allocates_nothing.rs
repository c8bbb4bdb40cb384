//! A benchmark thread's bookkeeping per operation allocates nothing once
//! an operation's series and status exist: a one-sided read costs well
//! under a microsecond, so a few allocations per measurement were a
//! sizeable share of what the runner timed (docs/benchmarks.md, issue 17).

use std::time::{Duration, Instant};

use std::sync::Arc;

use rdkv_bench::properties::Properties;
use rdkv_bench::record;
use rdkv_bench::report::{Measurements, Status};
use rdkv_bench::workload::{Operation, Workload, build_key_name};
use rdkv_fabric::alloc_count::CountingAllocator;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const ROUNDS: u64 = 10_000;
const BATCH: u64 = 16;

#[test]
fn measuring_and_checking_reads_allocates_nothing() {
    let mut measurements = Measurements::default();
    let start = Instant::now();
    let end = start + Duration::from_micros(3);
    let record = record::encode([("field0", &b"value"[..]), ("field1", &b"other"[..])]);
    // The first of each registers its series and status.
    measurements.measure("READ", Status::Ok, start, start, end);
    measurements.measure("READ", Status::NotFound, start, start, end);
    measurements.measure_n("READ", Status::Ok, BATCH, start, start, end);

    let before = CountingAllocator::allocations_on_this_thread();
    let mut delivered = 0;
    for _ in 0..ROUNDS {
        measurements.measure("READ", Status::Ok, start, start, end);
        measurements.measure_n("READ", Status::Ok, BATCH, start, start, end);
        measurements.measure_n("READ", Status::NotFound, 2, start, start, end);
        delivered += record::check(&record, None).unwrap_or(0);
        delivered += record::check(&record, Some("field1")).unwrap_or(0);
    }
    let allocations = CountingAllocator::allocations_on_this_thread() - before;
    assert_eq!(allocations, 0, "{ROUNDS} rounds allocated");
    assert_eq!(delivered, ROUNDS as usize * 15);

    // Every operation is counted, with its latency, as one call each would.
    let (service, _) = measurements.summarize(false);
    let read = service
        .iter()
        .find(|s| s.name == "READ")
        .expect("a READ series");
    let ok = 1 + BATCH + ROUNDS * (1 + BATCH);
    let not_found = 1 + ROUNDS * 2;
    assert_eq!(read.operations, ok);
    assert_eq!(read.returns.get("OK"), Some(&ok));
    assert_eq!(read.returns.get("NOT_FOUND"), Some(&not_found));
    assert!((read.average_us - 3.0).abs() < 0.01, "{}", read.average_us);
    let failed = service
        .iter()
        .find(|s| s.name == "READ-FAILED")
        .expect("a READ-FAILED series");
    assert_eq!(failed.operations, not_found);
}

/// A generator whose operations are handed back (`OpGenerator::recycle`)
/// writes each read's key into the string of the last one: a read-only
/// run allocates no key per operation, and every key is the one YCSB
/// names for its number. Seen failing without the reuse (10,000 rounds,
/// 10,000 allocations).
#[test]
fn generating_reads_reuses_the_key_of_the_last_operation() {
    let mut properties = Properties::new();
    for (name, value) in [
        ("recordcount", "1000"),
        ("readproportion", "1"),
        ("updateproportion", "0"),
        ("readallfields", "true"),
        ("requestdistribution", "zipfian"),
    ] {
        properties.set(name, value);
    }
    let workload = Arc::new(Workload::from_properties(&properties).expect("a workload"));
    let mut generator = workload.generator(1, 0);
    let first = generator.next_transaction();
    generator.recycle(first);

    let before = CountingAllocator::allocations_on_this_thread();
    let mut keys_seen = 0;
    for _ in 0..ROUNDS {
        let operation = generator.next_transaction();
        let Operation::Read { key, field: None } = &operation else {
            panic!("a read of all fields: {operation:?}");
        };
        assert!(key.starts_with("user"), "{key}");
        keys_seen += key.len();
        generator.recycle(operation);
    }
    let allocations = CountingAllocator::allocations_on_this_thread() - before;
    assert_eq!(allocations, 0, "{ROUNDS} reads allocated");
    assert!(keys_seen > 4 * ROUNDS as usize);
    // The strings reused hold exactly the names a new string would.
    let mut fresh = workload.generator(1, 0);
    let mut reused = workload.generator(1, 0);
    for _ in 0..100 {
        let (a, b) = (fresh.next_transaction(), reused.next_transaction());
        assert_eq!(a, b);
        if let Operation::Read { key, .. } = &a {
            assert!(key.len() >= 5 && key.len() <= build_key_name(i64::MAX, true, 1).len());
        }
        reused.recycle(b);
    }
}
