//! Recording what a node serves allocates nothing once a series exists: a
//! node answering a million requests a second records a million samples a
//! second (docs/benchmarks.md, issue 15, eleventh round).

use std::time::{Duration, Instant};

use rdkv_fabric::alloc_count::CountingAllocator;
use rdkv_proto::wire::Op;
use rdkv_server::telemetry::{RequestStats, prometheus};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const ROUNDS: u64 = 100_000;
const READS_PER_BATCH: u64 = 16;

#[test]
fn recording_requests_and_histogram_samples_allocates_nothing() {
    let handle = prometheus();
    let stats = RequestStats::default();
    let batch = [(Op::Get, READS_PER_BATCH)];
    // Each read of a batch took 20 µs: the batch 320 µs.
    let started = Instant::now();
    let finished = started + Duration::from_micros(20 * READS_PER_BATCH);
    // The first record of each registers its series.
    stats.finish_answered_at_once(started, finished, &batch);
    let batches = metrics::histogram!("rdkv_raft_apply_batch_entries", "shard" => "7");
    batches.record(3.0);

    let before = CountingAllocator::allocations_on_this_thread();
    for _ in 0..ROUNDS {
        stats.finish_answered_at_once(started, finished, &batch);
        batches.record(3.0);
    }
    let allocations = CountingAllocator::allocations_on_this_thread() - before;
    assert_eq!(allocations, 0, "{ROUNDS} rounds of records allocated");

    // Every sample is counted, none is lost to the lack of allocation.
    let text = handle.render();
    let reads = (ROUNDS + 1) * READS_PER_BATCH;
    let expected = [
        format!("rdkv_request_duration_seconds_count{{op=\"get\"}} {reads}"),
        format!("rdkv_request_duration_seconds_bucket{{op=\"get\",le=\"0.000025\"}} {reads}"),
        format!("rdkv_resp_reads_answered_at_once_total {reads}"),
        format!(
            "rdkv_raft_apply_batch_entries_count{{shard=\"7\"}} {}",
            ROUNDS + 1
        ),
    ];
    for line in expected {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
}
