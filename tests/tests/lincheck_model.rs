//! The history recorder and the checkers end to end, without servers:
//! concurrent tokio tasks record operations against in-process model stores.
//!
//! - An atomic store (one mutex, one global log index) must be judged
//!   linearizable, including writes whose outcome is dropped as unknown.
//! - A lagging replica (reads served from the state at an applied index up
//!   to `LAG` entries behind the log) passes the follower check at bound
//!   `LAG`, fails it at bound 0, and read as `Linearizable` is caught.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{Consistency, Versioned};
use rdkv_tests::history::{Operation, Outcome, Recorder, Returned};
use rdkv_tests::linearizability::{CheckOptions, Verdict, check_follower_reads, check_history};
use rdkv_tests::stress_value::splitmix64;

const TASKS: u64 = 4;
const OPS_PER_TASK: u64 = 150;
const KEYS: u64 = 3;
const LAG: u64 = 6;

/// A log-structured store: every write is one log entry; each key keeps the
/// (index, value) history of its writes so that the state at any applied
/// index can be read.
#[derive(Default)]
struct LogStore {
    last_index: u64,
    writes: HashMap<Bytes, Vec<(u64, Option<Bytes>)>>,
}

impl LogStore {
    fn at(&self, key: &Bytes, applied: u64) -> Option<Versioned> {
        let writes = self.writes.get(key)?;
        let position = writes.partition_point(|(index, _)| *index <= applied);
        let (version, value) = writes.get(position.checked_sub(1)?)?;
        value.clone().map(|value| Versioned {
            value,
            version: *version,
        })
    }

    fn current(&self, key: &Bytes) -> Option<Versioned> {
        self.at(key, self.last_index)
    }

    fn write(&mut self, key: &Bytes, value: Option<Bytes>) -> u64 {
        self.last_index += 1;
        self.writes
            .entry(key.clone())
            .or_default()
            .push((self.last_index, value));
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

async fn run_workload(reads: Reads, consistency: Consistency) -> rdkv_tests::history::History {
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
                let key = Bytes::from(format!("key-{}", next() % KEYS));
                let last_seen = store
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .current(&key)
                    .map(|v| v.version);
                let value = Bytes::from(format!("p{process}-{n}"));
                let operation = match next() % 10 {
                    0..5 => Operation::Get { consistency },
                    5..7 => Operation::Put { value },
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
    recorder.history()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_store_is_linearizable() {
    let history = run_workload(Reads::Atomic, Consistency::Linearizable).await;
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
    let history = run_workload(Reads::Lagging, follower).await;
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
