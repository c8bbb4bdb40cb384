//! Tests of the linearizability checker: hand-written histories both ways,
//! randomized histories from real sequential executions (with a planted
//! violation), the follower bound both ways, and a size sanity check.

use super::*;
use crate::history::{
    History, OpRecord, Operation, Outcome, ProcessId, Returned, WALL_SAMPLE_MAX_US,
};
use crate::stress_value::splitmix64;

const KEY: &str = "k";

fn versioned(value: &str, version: u64) -> Versioned {
    Versioned {
        value: Bytes::copy_from_slice(value.as_bytes()),
        version,
    }
}

fn current(v: Option<(&str, u64)>) -> Option<Versioned> {
    v.map(|(value, version)| versioned(value, version))
}

/// A CAS as issued: the expected version and the new value (`None`: delete).
type CasCall<'a> = (Option<u64>, Option<&'a str>);
/// A CAS's reply: whether it swapped, the version, and the value it found.
type CasReply<'a> = (bool, u64, Option<(&'a str, u64)>);

fn cas_operation(expected: Option<u64>, new: Option<&str>) -> Operation {
    Operation::Cas {
        expected_version: expected,
        new_value: new.map(|v| Bytes::copy_from_slice(v.as_bytes())),
    }
}

/// Hand-written histories: times are explicit ticks, which also serve as
/// the wall clock (unix ms); `None` completion = unknown outcome.
#[derive(Default)]
struct Builder {
    ops: Vec<OpRecord>,
}

impl Builder {
    fn op(
        &mut self,
        process: ProcessId,
        key: &str,
        span: (Tick, Tick),
        operation: Operation,
        outcome: Outcome,
    ) -> usize {
        let id = self.ops.len();
        self.ops.push(OpRecord {
            id,
            process,
            key: Bytes::copy_from_slice(key.as_bytes()),
            operation,
            outcome,
            invoked_at: span.0,
            completed_at: span.1,
            invoked_ns: span.0,
            completed_ns: span.1,
            invoked_unix_ms: span.0,
            completed_unix_ms: span.1,
        });
        id
    }

    fn put_ttl(
        &mut self,
        p: ProcessId,
        span: (Tick, Tick),
        (value, ttl_ms): (&str, u64),
        version: u64,
    ) -> usize {
        let value = Bytes::copy_from_slice(value.as_bytes());
        self.op(
            p,
            KEY,
            span,
            Operation::PutTtl { value, ttl_ms },
            Outcome::Ok(Returned::Written { version }),
        )
    }

    fn put_ttl_unknown(&mut self, p: ProcessId, invoked: Tick, value: &str, ttl_ms: u64) -> usize {
        let value = Bytes::copy_from_slice(value.as_bytes());
        self.op(
            p,
            KEY,
            (invoked, invoked + 1),
            Operation::PutTtl { value, ttl_ms },
            Outcome::Unknown,
        )
    }

    fn put(&mut self, p: ProcessId, span: (Tick, Tick), value: &str, version: u64) -> usize {
        self.put_on(p, KEY, span, value, version)
    }

    fn put_on(
        &mut self,
        p: ProcessId,
        key: &str,
        span: (Tick, Tick),
        value: &str,
        version: u64,
    ) -> usize {
        let value = Bytes::copy_from_slice(value.as_bytes());
        self.op(
            p,
            key,
            span,
            Operation::Put { value },
            Outcome::Ok(Returned::Written { version }),
        )
    }

    fn put_unknown(&mut self, p: ProcessId, invoked: Tick, value: &str) -> usize {
        let value = Bytes::copy_from_slice(value.as_bytes());
        self.op(
            p,
            KEY,
            (invoked, invoked + 1),
            Operation::Put { value },
            Outcome::Unknown,
        )
    }

    fn put_failed(&mut self, p: ProcessId, span: (Tick, Tick), value: &str) -> usize {
        let value = Bytes::copy_from_slice(value.as_bytes());
        self.op(p, KEY, span, Operation::Put { value }, Outcome::Fail)
    }

    fn get(&mut self, p: ProcessId, span: (Tick, Tick), got: Option<(&str, u64)>) -> usize {
        self.get_with(p, KEY, span, Consistency::Linearizable, got)
    }

    fn get_with(
        &mut self,
        p: ProcessId,
        key: &str,
        span: (Tick, Tick),
        consistency: Consistency,
        got: Option<(&str, u64)>,
    ) -> usize {
        self.op(
            p,
            key,
            span,
            Operation::Get { consistency },
            Outcome::Ok(Returned::Value(current(got))),
        )
    }

    fn follower_get(
        &mut self,
        p: ProcessId,
        key: &str,
        span: (Tick, Tick),
        lag: u64,
        got: Option<(&str, u64)>,
    ) -> usize {
        self.get_with(
            p,
            key,
            span,
            Consistency::Follower {
                max_lag_entries: lag,
            },
            got,
        )
    }

    fn delete(&mut self, p: ProcessId, span: (Tick, Tick), existed: bool, version: u64) -> usize {
        self.op(
            p,
            KEY,
            span,
            Operation::Delete,
            Outcome::Ok(Returned::Deleted { existed, version }),
        )
    }

    fn delete_unknown(&mut self, p: ProcessId, invoked: Tick) -> usize {
        self.op(
            p,
            KEY,
            (invoked, invoked + 1),
            Operation::Delete,
            Outcome::Unknown,
        )
    }

    fn cas(
        &mut self,
        p: ProcessId,
        span: (Tick, Tick),
        (expected, new): CasCall<'_>,
        (succeeded, version, now): CasReply<'_>,
    ) -> usize {
        self.op(
            p,
            KEY,
            span,
            cas_operation(expected, new),
            Outcome::Ok(Returned::Cas {
                succeeded,
                version,
                current: current(now),
            }),
        )
    }

    fn cas_unknown(&mut self, p: ProcessId, invoked: Tick, (expected, new): CasCall<'_>) -> usize {
        self.op(
            p,
            KEY,
            (invoked, invoked + 1),
            cas_operation(expected, new),
            Outcome::Unknown,
        )
    }

    fn history(&self) -> History {
        History {
            ops: self.ops.clone(),
            wall_clock_step_us: 0,
        }
    }

    fn verdict(&self) -> Verdict {
        check_history(&self.history(), CheckOptions::default()).expect("well-formed history")
    }
}

fn assert_linearizable(b: &Builder) {
    let verdict = b.verdict();
    assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
}

/// Asserts a violation whose witness contains `involved` and returns it.
fn assert_violation(b: &Builder, involved: &[usize]) -> Violation {
    match b.verdict() {
        Verdict::NotLinearizable(violation) => {
            let ids: Vec<usize> = violation.witness.iter().map(|op| op.id).collect();
            for id in involved {
                assert!(
                    ids.contains(id),
                    "op #{id} not in the witness:\n{violation}"
                );
            }
            *violation
        }
        other => panic!("expected a violation, got {other:?}"),
    }
}

// ---- linearizable histories ----

#[test]
fn empty_history_is_linearizable() {
    assert_linearizable(&Builder::default());
}

#[test]
fn concurrent_overlapping_puts_and_gets() {
    let mut b = Builder::default();
    b.put(1, (0, 10), "a", 1);
    b.put(2, (1, 11), "b", 2);
    b.get(3, (2, 3), None); // before either put took effect
    b.get(4, (4, 12), Some(("a", 1)));
    b.get(5, (5, 13), Some(("b", 2)));
    b.get(3, (14, 15), Some(("b", 2)));
    assert_linearizable(&b);
}

#[test]
fn concurrent_reads_may_see_either_order_of_a_concurrent_put() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put(2, (2, 20), "b", 2);
    // Both reads overlap the put: one before, one after it is fine, and
    // the earlier-invoked read may see the newer value.
    b.get(3, (3, 10), Some(("b", 2)));
    b.get(4, (4, 11), Some(("a", 1)));
    assert_linearizable(&b);
}

#[test]
fn cas_chain_with_failures_and_deletes() {
    let mut b = Builder::default();
    b.cas(1, (0, 1), (None, Some("a")), (true, 1, None));
    b.cas(2, (2, 3), (Some(1), Some("b")), (true, 2, None));
    b.cas(3, (4, 5), (Some(1), Some("c")), (false, 3, Some(("b", 2))));
    b.cas(1, (6, 7), (Some(2), None), (true, 4, None));
    b.get(2, (8, 9), None);
    b.cas(3, (10, 11), (Some(2), Some("x")), (false, 5, None));
    b.cas(1, (12, 13), (None, Some("d")), (true, 6, None));
    b.get(2, (14, 15), Some(("d", 6)));
    b.delete(3, (16, 17), true, 7);
    b.delete(3, (18, 19), false, 8);
    assert_linearizable(&b);
}

#[test]
fn unknown_write_that_took_effect() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put_unknown(2, 2, "b");
    b.get(3, (5, 6), Some(("b", 3))); // reveals its log index
    b.get(3, (7, 8), Some(("b", 3)));
    b.cas(4, (9, 10), (Some(3), Some("c")), (true, 4, None));
    assert_linearizable(&b);
}

#[test]
fn unknown_write_that_never_took_effect() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put_unknown(2, 2, "b");
    b.get(3, (5, 6), Some(("a", 1)));
    b.put(1, (7, 8), "c", 3);
    b.get(3, (9, 10), Some(("c", 3)));
    assert_linearizable(&b);
}

#[test]
fn unknown_write_may_take_effect_long_after_invocation() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put_unknown(2, 2, "b");
    b.get(3, (3, 4), Some(("a", 1)));
    b.get(3, (50, 51), Some(("a", 1)));
    b.get(3, (60, 61), Some(("b", 2)));
    assert_linearizable(&b);
}

#[test]
fn unknown_cas_and_delete() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.cas_unknown(2, 2, (Some(1), Some("b")));
    b.delete_unknown(3, 3);
    b.get(4, (10, 11), Some(("b", 2)));
    b.get(4, (12, 13), None);
    b.put(1, (14, 15), "c", 4);
    assert_linearizable(&b);
}

#[test]
fn failed_writes_are_ignored_and_follower_reads_are_not_checked_here() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put_failed(2, (2, 3), "never");
    b.put(1, (4, 5), "b", 2);
    // Stale, but a follower read: only the follower check looks at it.
    b.follower_get(3, KEY, (6, 7), 10, Some(("a", 1)));
    b.get_with(3, KEY, (8, 9), Consistency::Lease, Some(("b", 2)));
    assert_linearizable(&b);
}

// ---- non-linearizable histories ----

#[test]
fn stale_read_after_a_completed_write() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let put = b.put(1, (2, 3), "b", 2);
    let read = b.get(2, (4, 5), Some(("a", 1)));
    let violation = assert_violation(&b, &[put, read]);
    assert_eq!(violation.culprit.map(|op| op.id), Some(read));
    assert!(violation.minimized);
}

#[test]
fn stale_lease_read_is_checked() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put(1, (2, 3), "b", 2);
    let read = b.get_with(2, KEY, (4, 5), Consistency::Lease, Some(("a", 1)));
    assert_violation(&b, &[read]);
}

#[test]
fn read_of_a_value_never_written() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let read = b.get(2, (2, 3), Some(("z", 7)));
    assert_violation(&b, &[read]);
}

#[test]
fn read_of_the_right_value_with_a_wrong_version() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let read = b.get(2, (2, 3), Some(("a", 2)));
    assert_violation(&b, &[read]);
}

#[test]
fn two_reads_seeing_writes_in_opposite_orders() {
    let mut b = Builder::default();
    b.put(1, (0, 100), "a", 1);
    b.put(2, (0, 100), "b", 2);
    b.get(3, (1, 2), Some(("a", 1)));
    b.get(3, (3, 4), Some(("b", 2)));
    let r3 = b.get(4, (1, 2), Some(("b", 2)));
    let r4 = b.get(4, (3, 4), Some(("a", 1)));
    // Versions are log indexes, so process 4 alone already saw time run
    // backwards; the witness shrinks to its two reads.
    let violation = assert_violation(&b, &[r3, r4]);
    let reads = violation
        .witness
        .iter()
        .filter(|op| op.operation.is_read())
        .count();
    assert_eq!(reads, 2, "{violation}");
}

#[test]
fn opposite_orders_of_unknown_writes_are_caught_by_values_alone() {
    let mut b = Builder::default();
    b.put_unknown(1, 0, "a");
    b.put_unknown(2, 0, "b");
    b.get(3, (1, 2), Some(("a", 5)));
    b.get(3, (3, 4), Some(("b", 6)));
    b.get(4, (1, 2), Some(("b", 6)));
    b.get(4, (3, 4), Some(("a", 5)));
    let verdict = b.verdict();
    assert!(matches!(verdict, Verdict::NotLinearizable(_)), "{verdict}");
}

#[test]
fn cas_succeeding_on_the_wrong_version() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put(1, (2, 3), "b", 2);
    let cas = b.cas(2, (4, 5), (Some(1), Some("c")), (true, 3, None));
    let violation = assert_violation(&b, &[cas]);
    assert_eq!(violation.culprit.map(|op| op.id), Some(cas));
}

#[test]
fn cas_reported_failed_although_the_comparison_held() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let cas = b.cas(2, (2, 3), (Some(1), Some("c")), (false, 2, Some(("a", 1))));
    assert_violation(&b, &[cas]);
}

#[test]
fn lost_acknowledged_write() {
    let mut b = Builder::default();
    let put = b.put(1, (0, 1), "a", 1);
    let read = b.get(2, (2, 3), None);
    assert_violation(&b, &[put, read]);
}

#[test]
fn versions_going_backwards() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 5);
    let later = b.put(1, (2, 3), "b", 3);
    let violation = assert_violation(&b, &[later]);
    assert_eq!(violation.culprit.map(|op| op.id), Some(later));
}

#[test]
fn delete_reporting_a_missing_key_as_existing() {
    let mut b = Builder::default();
    let delete = b.delete(1, (0, 1), true, 1);
    assert_violation(&b, &[delete]);
}

#[test]
fn an_unknown_write_cannot_explain_a_read_before_its_invocation() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let read = b.get(2, (2, 3), Some(("b", 2)));
    b.put_unknown(3, 4, "b");
    assert_violation(&b, &[read]);
}

#[test]
fn an_unknown_write_revealed_with_an_index_older_than_a_completed_write() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put_unknown(2, 2, "b");
    b.put(1, (3, 4), "c", 3);
    // Only b's revealed index (2 < 3) rules out "b took effect after c".
    let read = b.get(3, (5, 6), Some(("b", 2)));
    assert_violation(&b, &[read]);
}

#[test]
fn malformed_outcomes_are_reported() {
    let mut b = Builder::default();
    b.op(
        1,
        KEY,
        (0, 1),
        Operation::Delete,
        Outcome::Ok(Returned::Written { version: 1 }),
    );
    assert!(check_history(&b.history(), CheckOptions::default()).is_err());
}

#[test]
fn tiny_step_budget_gives_timeout() {
    let mut b = Builder::default();
    for i in 0..20 {
        b.put(i, (0, 100), &format!("v{i}"), i + 1);
    }
    b.get(99, (101, 102), Some(("v19", 20)));
    let options = CheckOptions {
        max_steps_per_key: 5,
        max_minimize_steps: 5,
    };
    let verdict = check_history(&b.history(), options).expect("well-formed");
    assert!(matches!(verdict, Verdict::Timeout { .. }), "{verdict}");
}

// ---- follower bound ----

#[test]
fn follower_read_within_the_bound() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put(1, (2, 3), "b", 2);
    // Committed up to 2 before the read; lag 1 allows a replica at index 1.
    b.follower_get(2, KEY, (4, 5), 1, Some(("a", 1)));
    // Lag 2: even a replica that applied nothing.
    b.follower_get(2, KEY, (6, 7), 2, None);
    // Concurrent with nothing newer: the newest value is fine too.
    b.follower_get(2, KEY, (8, 9), 0, Some(("b", 2)));
    let report = check_follower_reads(&b.history());
    assert_eq!(report.reads_checked, 3);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[test]
fn follower_read_beyond_the_bound() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.put(1, (2, 3), "b", 2);
    let stale = b.follower_get(2, KEY, (4, 5), 0, Some(("a", 1)));
    let absent = b.follower_get(2, KEY, (6, 7), 1, None);
    let report = check_follower_reads(&b.history());
    let flagged: Vec<usize> = report.violations.iter().map(|v| v.read.id).collect();
    assert_eq!(flagged, vec![stale, absent], "{:?}", report.violations);
}

#[test]
fn follower_bound_counts_commits_on_other_keys() {
    let mut b = Builder::default();
    b.put_on(1, KEY, (0, 1), "a", 1);
    b.put_on(1, "other", (2, 3), "z", 10);
    // Committed 10 before the read: lag 5 means applied >= 5 > 1.
    let flagged = b.follower_get(2, KEY, (4, 5), 5, None);
    // Lag 10: the replica may have applied nothing.
    b.follower_get(2, KEY, (6, 7), 10, None);
    let report = check_follower_reads(&b.history());
    let ids: Vec<usize> = report.violations.iter().map(|v| v.read.id).collect();
    assert_eq!(ids, vec![flagged], "{:?}", report.violations);
}

#[test]
fn follower_bound_per_log_ignores_other_logs_indexes() {
    // Two shards: "other" lives in a log whose index 10 says nothing about
    // KEY's log, which has committed only index 1.
    let mut b = Builder::default();
    b.put_on(1, KEY, (0, 1), "a", 1);
    b.put_on(1, "other", (2, 3), "z", 10);
    b.follower_get(2, KEY, (4, 5), 5, None);
    let log_of = |key: &[u8]| u64::from(key == b"other");
    let per_log = check_follower_reads_per_log(&b.history(), 0, &log_of);
    assert!(per_log.violations.is_empty(), "{:?}", per_log.violations);
    // One log for both keys: the same read is out of bound.
    let one_log = check_follower_reads_per_log(&b.history(), 0, &|_| 0);
    assert_eq!(one_log.violations.len(), 1, "{:?}", one_log.violations);
}

#[test]
fn follower_absent_read_explained_by_a_possible_delete() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.delete_unknown(3, 2);
    b.follower_get(2, KEY, (4, 5), 0, None);
    let report = check_follower_reads(&b.history());
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[test]
fn follower_read_of_a_wrong_value_or_a_future_write() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let wrong = b.follower_get(2, KEY, (2, 3), 100, Some(("x", 1)));
    let future = b.follower_get(2, KEY, (4, 5), 100, Some(("b", 2)));
    b.put(1, (6, 7), "b", 2);
    let report = check_follower_reads(&b.history());
    let ids: Vec<usize> = report.violations.iter().map(|v| v.read.id).collect();
    assert_eq!(ids, vec![wrong, future], "{:?}", report.violations);
}

// ---- randomized histories from real sequential executions ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
}

struct Shape {
    processes: u64,
    keys: u64,
    ops: usize,
    /// Writes whose outcome becomes unknown (half of them take effect).
    unknown_permille: u64,
    /// Writes that definitely fail (never applied).
    fail_permille: u64,
}

/// A history of `shape.ops` operations of `shape.processes` clients that
/// each wait for one reply before the next call, with random durations; each
/// operation takes effect at a random point of its interval, in a real
/// sequential execution of the store (global log index per write), and
/// values written with a TTL expire as the server's do (see [`SimStore`]).
fn generate(seed: u64, shape: &Shape) -> History {
    struct Planned {
        process: ProcessId,
        call: Tick,
        ret: Tick,
        point: Tick,
        tiebreak: u64,
    }
    let mut rng = Rng(seed);
    let mut cursor: Vec<Tick> = (0..shape.processes).map(|_| rng.below(10)).collect();
    let mut planned = Vec::with_capacity(shape.ops);
    for i in 0..shape.ops {
        let process = (i as u64) % shape.processes;
        let call = cursor[process as usize] + 1 + rng.below(20);
        let duration = if rng.chance(50) {
            50 + rng.below(200)
        } else {
            1 + rng.below(40)
        };
        let ret = call + duration;
        cursor[process as usize] = ret;
        planned.push(Planned {
            process,
            call,
            ret,
            point: call + rng.below(duration + 1),
            tiebreak: rng.next(),
        });
    }
    let mut order: Vec<usize> = (0..planned.len()).collect();
    order.sort_by_key(|&i| (planned[i].point, planned[i].tiebreak));

    let mut store = SimStore::default();
    let mut last_stamp: Tick = 0;
    let mut ops = Vec::with_capacity(planned.len());
    for (n, &i) in order.iter().enumerate() {
        let plan = &planned[i];
        let key = Bytes::from(format!("key-{}", rng.below(shape.keys)));
        let value = Bytes::from(format!("p{}-{n}", plan.process));
        let kind = rng.below(100);
        let operation = match kind {
            0..40 => Operation::Get {
                consistency: if rng.chance(500) {
                    Consistency::Lease
                } else {
                    Consistency::Linearizable
                },
            },
            40..55 => Operation::Put { value },
            55..65 => Operation::PutTtl {
                value,
                ttl_ms: M + 1 + rng.below(200),
            },
            65..75 => Operation::Delete,
            90.. => Operation::Swap { value },
            _ => Operation::Cas {
                expected_version: match rng.below(10) {
                    0..6 => store.version(&key),
                    6..8 => None,
                    _ => Some(rng.below(store.log_index + 2)),
                },
                new_value: (!rng.chance(200)).then_some(value),
            },
        };
        // A read decides when it is served, at its point in the order; a
        // write decides at its stamp, from its call to its point (the server
        // stamps at proposal and orders at commit), stamps rising in log
        // order as on one leader's clock. The clock is the tick.
        let decided = if operation.is_read() {
            plan.point
        } else {
            let stamp = (plan.call + rng.below(plan.point - plan.call + 1)).max(last_stamp);
            last_stamp = stamp;
            stamp
        };
        let unknown = !operation.is_read() && rng.chance(shape.unknown_permille);
        let failed = !operation.is_read() && !unknown && rng.chance(shape.fail_permille);
        let applied = !failed && (!unknown || rng.chance(500));
        let returned = applied.then(|| store.apply(&key, &operation, decided));
        let outcome = match (unknown, failed, returned) {
            (true, _, _) => Outcome::Unknown,
            (_, true, _) => Outcome::Fail,
            (_, _, Some(returned)) => Outcome::Ok(returned),
            (_, _, None) => Outcome::Fail,
        };
        ops.push(OpRecord {
            id: 0,
            process: plan.process,
            key,
            operation,
            outcome,
            invoked_at: plan.call,
            completed_at: plan.ret,
            invoked_ns: plan.call,
            completed_ns: plan.ret,
            invoked_unix_ms: plan.call,
            completed_unix_ms: plan.ret,
        });
    }
    ops.sort_by_key(|op| op.invoked_at);
    History::from_records(ops)
}

/// The store of [`generate`]: one global log index; values may carry a
/// deadline, and an operation sees a value gone once its decision time plus
/// the margin reaches that deadline, as the server does.
#[derive(Default)]
struct SimStore {
    log_index: u64,
    /// Key -> value and deadline (`None`: never expires).
    pairs: HashMap<Bytes, (Versioned, Option<u64>)>,
}

impl SimStore {
    /// The key's value as an operation deciding at `at` sees it.
    fn live(&self, key: &Bytes, at: Tick) -> Option<Versioned> {
        let (value, deadline) = self.pairs.get(key)?;
        deadline
            .is_none_or(|deadline| at + M < deadline)
            .then(|| value.clone())
    }

    /// The version last written, expired or not (what a client that saw it
    /// would expect).
    fn version(&self, key: &Bytes) -> Option<u64> {
        self.pairs.get(key).map(|(v, _)| v.version)
    }

    fn write(&mut self, key: &Bytes, value: Option<(Bytes, Option<u64>)>) -> u64 {
        self.log_index += 1;
        match value {
            Some((value, deadline)) => {
                let version = self.log_index;
                self.pairs
                    .insert(key.clone(), (Versioned { value, version }, deadline));
            }
            None => {
                self.pairs.remove(key);
            }
        }
        self.log_index
    }

    /// Applies `operation`, which decides at `at`, in log order.
    fn apply(&mut self, key: &Bytes, operation: &Operation, at: Tick) -> Returned {
        let now = self.live(key, at);
        match operation {
            Operation::Get { .. } => Returned::Value(now),
            Operation::Put { value } => Returned::Written {
                version: self.write(key, Some((value.clone(), None))),
            },
            Operation::PutTtl { value, ttl_ms } => Returned::Written {
                version: self.write(key, Some((value.clone(), Some(at + ttl_ms)))),
            },
            Operation::Delete => Returned::Deleted {
                existed: now.is_some(),
                version: self.write(key, None),
            },
            Operation::Swap { value } => Returned::Swapped {
                old: now,
                version: self.write(key, Some((value.clone(), None))),
            },
            Operation::Cas {
                expected_version,
                new_value,
            } => {
                if now.as_ref().map(|v| v.version) == *expected_version {
                    let new = new_value.clone().map(|value| (value, None));
                    Returned::Cas {
                        succeeded: true,
                        version: self.write(key, new),
                        current: None,
                    }
                } else {
                    self.log_index += 1;
                    Returned::Cas {
                        succeeded: false,
                        version: self.log_index,
                        current: now,
                    }
                }
            }
        }
    }
}

/// A write that left a value or removed it, with a known log index.
fn known_state_change(op: &OpRecord) -> Option<(u64, Option<Bytes>)> {
    match (&op.operation, &op.outcome) {
        (
            Operation::Put { value } | Operation::PutTtl { value, .. },
            Outcome::Ok(Returned::Written { version }),
        ) => Some((*version, Some(value.clone()))),
        (Operation::Delete, Outcome::Ok(Returned::Deleted { version, .. })) => {
            Some((*version, None))
        }
        (
            Operation::Cas { new_value, .. },
            Outcome::Ok(Returned::Cas {
                succeeded: true,
                version,
                ..
            }),
        ) => Some((*version, new_value.clone())),
        _ => None,
    }
}

/// Replaces one linearizable read's result by a value from strictly before a
/// write that completed before the read was invoked; returns the read's id.
fn plant_stale_read(history: &mut History, rng: &mut Rng) -> Option<usize> {
    let reads: Vec<usize> = history
        .ops
        .iter()
        .filter(|op| {
            matches!(op.operation, Operation::Get { .. }) && matches!(op.outcome, Outcome::Ok(_))
        })
        .map(|op| op.id)
        .collect();
    let start = rng.below(reads.len().max(1) as u64) as usize;
    for &read_id in reads.iter().cycle().skip(start).take(reads.len()) {
        let read = history.ops[read_id].clone();
        // The newest state change of this key completed before the read.
        let Some((overwritten_at, _)) = history
            .ops
            .iter()
            .filter(|op| op.key == read.key && op.completed_at < read.invoked_at)
            .filter_map(known_state_change)
            .max_by_key(|(version, _)| *version)
        else {
            continue;
        };
        // A known value written before it.
        let stale = history
            .ops
            .iter()
            .filter(|op| op.key == read.key)
            .filter_map(known_state_change)
            .filter(|(version, value)| *version < overwritten_at && value.is_some())
            .max_by_key(|(version, _)| *version);
        let Some((version, Some(value))) = stale else {
            continue;
        };
        let planted = Outcome::Ok(Returned::Value(Some(Versioned { value, version })));
        if planted == read.outcome {
            continue;
        }
        history.ops[read_id].outcome = planted;
        return Some(read_id);
    }
    None
}

/// Replaces one linearizable read's result by the value of a PutTtl whose
/// deadline, less the margin, had passed for certain when the read began;
/// returns the read's id.
fn plant_late_read(history: &mut History, rng: &mut Rng) -> Option<usize> {
    let expired: Vec<(Bytes, u64, Versioned)> = history
        .ops
        .iter()
        .filter_map(|op| match (&op.operation, &op.outcome) {
            (Operation::PutTtl { value, ttl_ms }, Outcome::Ok(Returned::Written { version })) => {
                let versioned = Versioned {
                    value: value.clone(),
                    version: *version,
                };
                Some((op.key.clone(), op.completed_unix_ms + ttl_ms, versioned))
            }
            _ => None,
        })
        .collect();
    let start = rng.below(history.ops.len().max(1) as u64) as usize;
    let count = history.ops.len();
    for read_id in (0..count).cycle().skip(start).take(count) {
        let read = &history.ops[read_id];
        if !matches!(
            (&read.operation, &read.outcome),
            (Operation::Get { .. }, Outcome::Ok(_))
        ) {
            continue;
        }
        let late = expired.iter().find(|(key, latest_deadline, _)| {
            *key == read.key && read.invoked_unix_ms + M >= *latest_deadline
        });
        if let Some((_, _, versioned)) = late {
            history.ops[read_id].outcome = Outcome::Ok(Returned::Value(Some(versioned.clone())));
            return Some(read_id);
        }
    }
    None
}

/// Generated histories over `seeds` are linearizable, and each with a read
/// `plant` could falsify (salting its rng with `salt`) is then caught with
/// that read in the witness; at least 30 of them had one.
fn planted_reads_are_caught(
    seeds: std::ops::Range<u64>,
    salt: u64,
    what: &str,
    plant: fn(&mut History, &mut Rng) -> Option<usize>,
) {
    let shape = Shape {
        processes: 4,
        keys: 3,
        ops: 300,
        unknown_permille: 60,
        fail_permille: 30,
    };
    let mut planted = 0;
    for seed in seeds {
        let mut history = generate(seed, &shape);
        let verdict = check_history(&history, CheckOptions::default()).expect("well-formed");
        assert_eq!(verdict, Verdict::Linearizable, "seed {seed}: {verdict}");
        let mut rng = Rng(seed ^ salt);
        let Some(read) = plant(&mut history, &mut rng) else {
            continue;
        };
        planted += 1;
        match check_history(&history, CheckOptions::default()).expect("well-formed") {
            Verdict::NotLinearizable(violation) => {
                assert!(
                    violation.witness.iter().any(|op| op.id == read),
                    "seed {seed}: the planted read #{read} is not in the witness:\n{violation}"
                );
            }
            other => panic!("seed {seed}: planted {what} read #{read} not caught: {other}"),
        }
    }
    assert!(
        planted >= 30,
        "only {planted} histories had a read to plant"
    );
}

#[test]
fn random_histories_with_expiry_pass_and_planted_late_reads_are_caught() {
    planted_reads_are_caught(100..140, 0x1a7e, "late", plant_late_read);
}

#[test]
fn random_histories_are_linearizable_and_planted_stale_reads_are_caught() {
    planted_reads_are_caught(0..40, 0x5eed, "stale", plant_stale_read);
}

#[test]
fn follower_reads_of_the_true_state_pass_the_bound() {
    // In the generated histories every read returns the current state, so
    // the same reads declared as follower reads with any lag must pass.
    for seed in 0..10u64 {
        let mut history = generate(
            seed,
            &Shape {
                processes: 4,
                keys: 3,
                ops: 300,
                unknown_permille: 60,
                fail_permille: 30,
            },
        );
        for op in &mut history.ops {
            if let Operation::Get { consistency } = &mut op.operation {
                *consistency = Consistency::Follower {
                    max_lag_entries: op.id as u64 % 3,
                };
            }
        }
        let report = check_follower_reads(&history);
        assert!(report.reads_checked > 50);
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
    }
}

#[test]
fn five_clients_two_thousand_ops_five_keys_check_within_budget() {
    let shape = Shape {
        processes: 5,
        keys: 5,
        ops: 2000,
        unknown_permille: 20,
        fail_permille: 10,
    };
    let history = generate(7, &shape);
    let verdict = check_history(&history, CheckOptions::default()).expect("well-formed");
    assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
}

impl Builder {
    fn swap(
        &mut self,
        p: ProcessId,
        span: (Tick, Tick),
        value: &str,
        (read, version): (Option<(&str, u64)>, u64),
    ) -> usize {
        self.op(
            p,
            KEY,
            span,
            Operation::Swap {
                value: Bytes::from(value.to_owned()),
            },
            Outcome::Ok(Returned::Swapped {
                old: current(read),
                version,
            }),
        )
    }
}

#[test]
fn swaps_read_and_write_atomically() {
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    b.swap(2, (2, 3), "b", (Some(("a", 1)), 2));
    b.swap(1, (4, 5), "c", (Some(("b", 2)), 3));
    b.get(3, (6, 7), Some(("c", 3)));
    assert_linearizable(&b);
}

#[test]
fn two_swaps_that_read_the_same_value_are_not_linearizable() {
    // Each read "a" and wrote: one of them must have read the other's write.
    let mut b = Builder::default();
    b.put(1, (0, 1), "a", 1);
    let first = b.swap(2, (2, 10), "b", (Some(("a", 1)), 2));
    let second = b.swap(3, (3, 11), "c", (Some(("a", 1)), 3));
    assert_violation(&b, &[first, second]);
}

// ---- expiry (ticks double as unix ms; M = the expiry margin) ----

const M: u64 = EXPIRY_MARGIN_MS;

#[test]
fn a_correct_interleaving_around_the_deadline_passes() {
    let mut b = Builder::default();
    // Deadline in [200, 210]: live to a read at t iff t + M < deadline.
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    b.get(2, (100, 105), Some(("a", 1)));
    // Began before 210 - M: may have been served before the deadline.
    b.get(3, (140, 170), Some(("a", 1)));
    // Ended at 150 = 200 - M: may have been served when it was gone.
    b.delete(2, (140, 150), false, 2);
    b.get(3, (190, 195), None);
    // A plain put never expires.
    b.put(1, (200, 210), "b", 3);
    b.get(2, (5_000, 5_001), Some(("b", 3)));
    // A Cas takes an expiring value that is still live, leaving one that
    // does not expire; a failed Cas and a Cas expecting absence see the
    // next one gone.
    b.put_ttl(1, (6_000, 6_005), ("c", 100), 4);
    b.cas(2, (6_020, 6_030), (Some(4), Some("d")), (true, 5, None));
    b.get(3, (9_000, 9_001), Some(("d", 5)));
    b.put_ttl(1, (10_000, 10_001), ("e", 100), 6);
    b.cas(2, (10_040, 10_050), (Some(6), Some("f")), (false, 7, None));
    b.cas(3, (10_060, 10_070), (None, Some("g")), (true, 8, None));
    b.get(1, (10_100, 10_101), Some(("g", 8)));
    assert_linearizable(&b);
}

#[test]
fn a_value_served_past_its_deadline_is_a_violation() {
    // Deadline at most 210: a read that began at 210 - M cannot see it.
    let mut ok = Builder::default();
    ok.put_ttl(1, (0, 10), ("a", 200), 1);
    ok.get(2, (210 - M - 1, 300), Some(("a", 1)));
    assert_linearizable(&ok);

    let mut late = Builder::default();
    late.put_ttl(1, (0, 10), ("a", 200), 1);
    let read = late.get(2, (210 - M, 300), Some(("a", 1)));
    assert_violation(&late, &[read]);

    // A Delete that found it, a Swap that read it: the same.
    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    let delete = b.delete(2, (400, 401), true, 2);
    assert_violation(&b, &[delete]);
    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    let swap = b.swap(2, (400, 401), "b", (Some(("a", 1)), 2));
    assert_violation(&b, &[swap]);
}

#[test]
fn a_key_expired_too_early_is_a_violation() {
    // Deadline at least 200: absent only to an operation that ended at or
    // after 200 - M.
    let mut ok = Builder::default();
    ok.put_ttl(1, (0, 10), ("a", 200), 1);
    ok.get(2, (100, 200 - M), None);
    assert_linearizable(&ok);

    let mut early = Builder::default();
    early.put_ttl(1, (0, 10), ("a", 200), 1);
    let read = early.get(2, (100, 200 - M - 1), None);
    assert_violation(&early, &[read]);

    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    let delete = b.delete(2, (20, 30), false, 2);
    assert_violation(&b, &[delete]);
    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    let cas = b.cas(2, (20, 30), (None, Some("b")), (true, 2, None));
    assert_violation(&b, &[cas]);
}

#[test]
fn a_value_seen_again_after_it_was_seen_expired_is_a_resurrection() {
    // The put took 100 ms: the deadline is in [200, 300], so each read
    // alone is explainable.
    let mut b = Builder::default();
    b.put_ttl(1, (0, 100), ("a", 200), 1);
    let gone = b.get(2, (170, 175), None);
    let back = b.get(3, (180, 185), Some(("a", 1)));
    let violation = assert_violation(&b, &[gone, back]);
    assert_eq!(violation.culprit.map(|op| op.id), Some(back));

    let mut alone = Builder::default();
    alone.put_ttl(1, (0, 100), ("a", 200), 1);
    alone.get(3, (180, 185), Some(("a", 1)));
    assert_linearizable(&alone);

    // A Cas that began after the read completed cannot find it live.
    let mut b = Builder::default();
    b.put_ttl(1, (0, 100), ("a", 200), 1);
    b.get(2, (170, 175), None);
    let cas = b.cas(3, (176, 180), (Some(1), Some("b")), (true, 2, None));
    assert_violation(&b, &[cas]);
}

#[test]
fn a_read_that_saw_it_expired_and_an_overlapping_write_that_saw_it_live_pass() {
    // The server decides a write at its stamp (when proposed) but orders it
    // at commit: a read served in between, at 151 (151 + M >= 200), saw the
    // value gone; the Cas stamped at 148 (148 + M < 200) found it live and
    // comes after the read in the log. See "Expiry" in the module doc.
    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    b.get(2, (150, 152), None);
    b.cas(3, (145, 160), (Some(1), Some("b")), (true, 3, None));
    b.get(2, (170, 171), Some(("b", 3)));
    assert_linearizable(&b);
}

#[test]
fn an_unknown_put_ttl_may_land_late_or_never_but_not_expire_early() {
    let mut b = Builder::default();
    b.put_ttl_unknown(1, 0, "a", 200);
    b.get(2, (10, 20), None);
    // Stamped late (its reply was lost): still live long after.
    b.get(3, (1_000, 1_001), Some(("a", 1)));
    b.get(2, (5_000, 5_001), None);
    assert_linearizable(&b);

    let mut never = Builder::default();
    never.put_ttl_unknown(1, 0, "a", 200);
    never.get(2, (5_000, 5_001), None);
    assert_linearizable(&never);

    // Stamped at 0 at the earliest: it cannot be gone at 100.
    let mut early = Builder::default();
    early.put_ttl_unknown(1, 0, "a", 200);
    early.get(2, (10, 20), Some(("a", 1)));
    let read = early.get(2, (30, 100), None);
    assert_violation(&early, &[read]);
}

#[test]
fn an_unknown_cas_expecting_absence_may_count_an_expiring_value_gone() {
    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    b.cas_unknown(2, 20, (None, Some("b")));
    b.get(3, (500, 501), Some(("b", 2)));
    assert_linearizable(&b);

    // A value that never expires: that Cas could not have succeeded.
    let mut lasting = Builder::default();
    lasting.put(1, (0, 10), "a", 1);
    lasting.cas_unknown(2, 20, (None, Some("b")));
    let read = lasting.get(3, (500, 501), Some(("b", 2)));
    assert_violation(&lasting, &[read]);
}

#[test]
fn follower_reads_of_an_expiring_value() {
    let mut b = Builder::default();
    b.put_ttl(1, (0, 10), ("a", 200), 1);
    b.follower_get(2, KEY, (100, 101), 0, Some(("a", 1)));
    // Absent with no lag allowed: explained by the expiry.
    b.follower_get(2, KEY, (300, 301), 0, None);
    let late = b.follower_get(2, KEY, (210 - M, 300), 0, Some(("a", 1)));
    let early = b.follower_get(2, KEY, (20, 30), 0, None);
    // A plain put does not expire.
    b.put(1, (400, 401), "b", 2);
    let lost = b.follower_get(2, KEY, (500, 501), 0, None);
    let report = check_follower_reads(&b.history());
    let ids: Vec<usize> = report.violations.iter().map(|v| v.read.id).collect();
    assert_eq!(ids, vec![late, early, lost], "{:?}", report.violations);
}

#[test]
fn a_stepped_wall_clock_widens_every_wall_reading_by_the_step() {
    // A read and a follower read beginning at `start` (the deadline is at
    // most 210), judged with the wall clock stepped by `step_us`: the ids
    // the linearizability witness and the follower check name.
    let judged = |start: u64, step_us: u64| {
        let mut b = Builder::default();
        b.put_ttl(1, (0, 10), ("a", 200), 1);
        let read = b.get(2, (start, 300), Some(("a", 1)));
        let follower_read = b.follower_get(3, KEY, (start, 300), 0, Some(("a", 1)));
        let mut history = b.history();
        history.wall_clock_step_us = step_us;
        let witness = match check_history(&history, CheckOptions::default()).expect("well-formed") {
            Verdict::NotLinearizable(v) => v.witness.iter().map(|op| op.id).collect(),
            _ => Vec::new(),
        };
        let follower: Vec<usize> = check_follower_reads(&history)
            .violations
            .iter()
            .map(|v| v.read.id)
            .collect();
        (
            witness.contains(&read),
            follower == [follower_read],
            follower.is_empty(),
        )
    };
    // By a steady clock the deadline less the margin had passed at 210 - M.
    assert_eq!(judged(210 - M, 0), (true, true, false));
    // A step within the measurement's own error changes nothing.
    assert_eq!(judged(210 - M, WALL_SAMPLE_MAX_US), (true, true, false));
    // A step of up to 1 ms: any reading may be a ms off, which explains a
    // read at the edge, and one a ms past it, but not one 2 ms past it.
    assert_eq!(judged(210 - M, 900), (false, false, true));
    assert_eq!(judged(211 - M, 900), (false, false, true));
    assert_eq!(judged(212 - M, 900), (true, true, false));
    assert_eq!(judged(212 - M, 1_500), (false, false, true));
}

#[test]
fn a_wall_clock_that_steps_back_is_reported() {
    let mut b = Builder::default();
    let put = b.put(1, (10, 20), "a", 1);
    b.ops[put].completed_unix_ms = 5;
    let error = check_history(&b.history(), CheckOptions::default()).unwrap_err();
    assert_eq!(error.op_id, put);
}

#[test]
fn a_failed_cas_that_saw_an_unknown_value_expired_bounds_its_index() {
    // "w" never expires, so the Cas (index 5) finding the key absent means
    // the unknown put landed before it and had expired: its index is below
    // 5, whatever a read overlapping the Cas reveals.
    let history = |revealed: u64| {
        let mut b = Builder::default();
        b.put(1, (0, 10), "w", 1);
        b.put_ttl_unknown(2, 20, "v", 100);
        b.cas(3, (200, 210), (Some(1), Some("x")), (false, 5, None));
        let read = b.get(4, (205, 215), Some(("v", revealed)));
        (b, read)
    };
    assert_linearizable(&history(4).0);
    let (after, read) = history(10);
    assert_violation(&after, &[read]);
}
