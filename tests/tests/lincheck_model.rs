//! The history recorder and the checkers end to end, without servers:
//! concurrent tokio tasks record operations against in-process model stores.
//!
//! - An atomic store (one mutex, one global log index) must be judged
//!   linearizable, including writes whose outcome is dropped as unknown and
//!   values written with a TTL that expire during the run (by the wall
//!   clock and the servers' margin rule).
//! - A lagging replica (reads served from the state at an applied index up
//!   to `LAG` entries behind the log) passes the follower check at bound
//!   `LAG`, fails it at bound 0, and read as `Linearizable` is caught.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{Consistency, Versioned};
use rdkv_fabric::clock::unix_now_ms;
use rdkv_proto::region::EXPIRY_MARGIN_MS;
use rdkv_tests::history::{Operation, Outcome, Recorder, Returned};
use rdkv_tests::linearizability::{CheckOptions, Verdict, check_follower_reads, check_history};
use rdkv_tests::stress_value::splitmix64;

const TASKS: u64 = 4;
const OPS_PER_TASK: u64 = 150;
const KEYS: u64 = 3;
/// Keys beyond those, taking half of the operations: each is written only
/// every few tens of ms, so that TTLs run out before the next write.
const QUIET_KEYS: u64 = 16;
const LAG: u64 = 6;

/// A write: its index, the value (`None`: deleted) and its deadline (unix
/// ms; `None`: never expires).
type LogWrite = (u64, Option<Bytes>, Option<u64>);

/// A log-structured store: every write is one log entry; each key keeps the
/// history of its writes so that the state at any applied index can be
/// read. A value with a deadline counts as gone from `deadline - margin`
/// on, by the wall clock, as on the servers.
#[derive(Default)]
struct LogStore {
    last_index: u64,
    writes: HashMap<Bytes, Vec<LogWrite>>,
    /// Operations that found a value gone by its deadline (the workload
    /// must make some, or expiry went unchecked).
    expired_seen: std::cell::Cell<u64>,
}

impl LogStore {
    fn at(&self, key: &Bytes, applied: u64) -> Option<Versioned> {
        let writes = self.writes.get(key)?;
        let position = writes.partition_point(|(index, ..)| *index <= applied);
        let (version, value, deadline) = writes.get(position.checked_sub(1)?)?;
        let live = deadline.is_none_or(|d| unix_now_ms() + EXPIRY_MARGIN_MS < d);
        if value.is_some() && !live {
            self.expired_seen.set(self.expired_seen.get() + 1);
        }
        value.clone().filter(|_| live).map(|value| Versioned {
            value,
            version: *version,
        })
    }

    fn current(&self, key: &Bytes) -> Option<Versioned> {
        self.at(key, self.last_index)
    }

    /// The version of the key's last write, expired or not: what a client
    /// that read it before it expired would expect.
    fn last_version(&self, key: &Bytes) -> Option<u64> {
        let (version, value, _) = self.writes.get(key)?.last()?;
        value.as_ref().map(|_| *version)
    }

    fn write(&mut self, key: &Bytes, value: Option<Bytes>) -> u64 {
        self.write_until(key, value, None)
    }

    fn write_until(&mut self, key: &Bytes, value: Option<Bytes>, deadline: Option<u64>) -> u64 {
        self.last_index += 1;
        self.writes
            .entry(key.clone())
            .or_default()
            .push((self.last_index, value, deadline));
        self.last_index
    }

    /// Applies `operation` atomically (reads at `applied`, or the newest
    /// state when `None`).
    fn apply(&mut self, key: &Bytes, operation: &Operation, applied: Option<u64>) -> Returned {
        match operation {
            Operation::Get { .. } => Returned::Value(match applied {
                Some(index) => self.at(key, index),
                None => self.current(key),
            }),
            Operation::Put { value } => Returned::Written {
                version: self.write(key, Some(value.clone())),
            },
            Operation::PutTtl { value, ttl_ms } => Returned::Written {
                version: self.write_until(key, Some(value.clone()), Some(unix_now_ms() + ttl_ms)),
            },
            Operation::Delete => {
                let existed = self.current(key).is_some();
                Returned::Deleted {
                    existed,
                    version: self.write(key, None),
                }
            }
            Operation::Swap { value } => {
                let old = self.current(key);
                Returned::Swapped {
                    old,
                    version: self.write(key, Some(value.clone())),
                }
            }
            Operation::Cas {
                expected_version,
                new_value,
            } => {
                let now = self.current(key);
                if now.as_ref().map(|v| v.version) == *expected_version {
                    Returned::Cas {
                        succeeded: true,
                        version: self.write(key, new_value.clone()),
                        current: None,
                    }
                } else {
                    self.last_index += 1;
                    Returned::Cas {
                        succeeded: false,
                        version: self.last_index,
                        current: now,
                    }
                }
            }
        }
    }
}

/// How reads are served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reads {
    /// From the newest state.
    Atomic,
    /// From a replica whose applied index trails the log by up to `LAG`.
    Lagging,
}

/// The recorded history, and how many operations found a value expired.
async fn run_workload(
    reads: Reads,
    consistency: Consistency,
) -> (rdkv_tests::history::History, u64) {
    let recorder = Recorder::new();
    let store = Arc::new(Mutex::new(LogStore::default()));
    let mut tasks = Vec::new();
    for process in 0..TASKS {
        let recorder = recorder.clone();
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut rng = splitmix64(process + 1);
            let mut next = move || {
                rng = splitmix64(rng);
                rng
            };
            for n in 0..OPS_PER_TASK {
                let k = if next().is_multiple_of(2) {
                    next() % KEYS
                } else {
                    KEYS + next() % QUIET_KEYS
                };
                let key = Bytes::from(format!("key-{k}"));
                let last_seen = store
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .last_version(&key);
                let value = Bytes::from(format!("p{process}-{n}"));
                let operation = match next() % 10 {
                    0..5 => Operation::Get { consistency },
                    5 => Operation::Put { value },
                    // Short TTLs (a run lasts a few hundred ms), above the
                    // margin, so that values expire mid-run.
                    6 => Operation::PutTtl {
                        value,
                        ttl_ms: EXPIRY_MARGIN_MS + 1 + next() % 40,
                    },
                    7 => Operation::Delete,
                    _ => Operation::Cas {
                        expected_version: last_seen,
                        new_value: Some(value),
                    },
                };
                let pending = recorder.invoke(process, key.clone(), operation.clone());
                // Overlap with the other tasks between invocation, effect
                // and completion.
                tokio::time::sleep(Duration::from_micros(next() % 300)).await;
                let applied_lag = next() % (LAG + 1);
                let dropped = !operation.is_read() && next() % 20 == 0;
                let takes_effect = !dropped || next() % 2 == 0;
                let returned = takes_effect.then(|| {
                    let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
                    let applied = (reads == Reads::Lagging)
                        .then(|| store.last_index.saturating_sub(applied_lag));
                    store.apply(&key, &operation, applied)
                });
                tokio::time::sleep(Duration::from_micros(next() % 300)).await;
                match returned {
                    // The reply is "lost": dropping the pending operation
                    // records it as Unknown, whether it took effect or not.
                    _ if dropped => drop(pending),
                    Some(returned) => pending.complete(Outcome::Ok(returned)),
                    None => pending.complete(Outcome::Fail),
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("workload task");
    }
    let expired_seen = store
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .expired_seen
        .get();
    (recorder.history(), expired_seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_store_is_linearizable() {
    let (history, expired_seen) = run_workload(Reads::Atomic, Consistency::Linearizable).await;
    println!("{expired_seen} operations found a value expired");
    assert!(expired_seen > 0, "no value expired during the run");
    assert_eq!(history.ops.len() as u64, TASKS * OPS_PER_TASK);
    assert!(
        history.ops.iter().any(|op| op.outcome == Outcome::Unknown),
        "the workload should drop some replies"
    );
    let verdict = check_history(&history, CheckOptions::default()).expect("well-formed");
    assert_eq!(verdict, Verdict::Linearizable, "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_meets_its_follower_bound_and_is_not_linearizable() {
    let follower = Consistency::Follower {
        max_lag_entries: LAG,
    };
    let (history, _) = run_workload(Reads::Lagging, follower).await;
    let report = check_follower_reads(&history);
    assert!(report.reads_checked > 100, "{}", report.reads_checked);
    assert!(report.violations.is_empty(), "{:?}", report.violations);

    // The same reads promised with no lag at all: some are too old.
    let mut strict = history.clone();
    for op in &mut strict.ops {
        if let Operation::Get { consistency } = &mut op.operation {
            *consistency = Consistency::Follower { max_lag_entries: 0 };
        }
    }
    assert!(!check_follower_reads(&strict).violations.is_empty());

    // And passed off as linearizable reads, the checker catches them.
    let mut passed_off = history;
    for op in &mut passed_off.ops {
        if let Operation::Get { consistency } = &mut op.operation {
            *consistency = Consistency::Linearizable;
        }
    }
    let verdict = check_history(&passed_off, CheckOptions::default()).expect("well-formed");
    assert!(matches!(verdict, Verdict::NotLinearizable(_)), "{verdict}");
}
