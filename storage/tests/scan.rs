//! Range scans: the state machine's ordered key index agrees with the region
//! (and with a `BTreeMap` model) after any sequence of commands, after a
//! restart from a snapshot and after a snapshot install.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bytes::Bytes;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::membership_ent;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rdkv_proto::wire::{SetCondition, Update};
use rdkv_storage::raft::{Command, Entry, TypeConfig};
use rdkv_storage::state_machine::{RegionStateMachine, ScanRange};

use common::{apply, normal};

type Model = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;
/// A pair as a scan returns it: key, value, version.
type Row = (Vec<u8>, Vec<u8>, u64);

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u8),
    Delete(u8),
    CasAbsent(u8, u8),
    MPut(Vec<(u8, u8)>),
    SetIfPresent(u8, u8),
    Clear,
}

/// Keys from a small alphabet so that ops collide, with a shared prefix so
/// that bytewise order (not length) decides: "k", "k\x00", "k1", "k10", ...
fn key(n: u8) -> Vec<u8> {
    let mut key = b"k".to_vec();
    match n % 4 {
        0 => {}
        1 => key.push(0),
        _ => key.extend_from_slice(n.to_string().as_bytes()),
    }
    if n >= 4 {
        key.extend_from_slice(n.to_string().as_bytes());
    }
    key
}

fn value(n: u8) -> Vec<u8> {
    vec![n; usize::from(n) * 3]
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0u8..40;
    prop_oneof![
        6 => (k.clone(), any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        3 => k.clone().prop_map(Op::Delete),
        1 => (k.clone(), any::<u8>()).prop_map(|(k, v)| Op::CasAbsent(k, v)),
        1 => proptest::collection::vec((k.clone(), any::<u8>()), 1..6).prop_map(Op::MPut),
        1 => (k, any::<u8>()).prop_map(|(k, v)| Op::SetIfPresent(k, v)),
        1 => Just(Op::Clear),
    ]
}

fn command(op: &Op) -> Command {
    let b = |v: Vec<u8>| Bytes::from(v);
    match op {
        Op::Put(k, v) => Command::Put {
            key: b(key(*k)),
            value: b(value(*v)),
        },
        Op::Delete(k) => Command::Delete { key: b(key(*k)) },
        Op::CasAbsent(k, v) => Command::Cas {
            key: b(key(*k)),
            expected_version: None,
            new_value: Some(b(value(*v))),
        },
        Op::MPut(pairs) => Command::MPut {
            pairs: pairs
                .iter()
                .map(|(k, v)| (b(key(*k)), b(value(*v))))
                .collect(),
        },
        Op::SetIfPresent(k, v) => Command::Update {
            key: b(key(*k)),
            update: Update::SetIf {
                value: b(value(*v)),
                condition: SetCondition::IfPresent,
                return_old: false,
            },
        },
        Op::Clear => Command::Clear,
    }
}

fn apply_model(model: &mut Model, op: &Op, version: u64) {
    match op {
        Op::Put(k, v) => {
            model.insert(key(*k), (value(*v), version));
        }
        Op::Delete(k) => {
            model.remove(&key(*k));
        }
        Op::CasAbsent(k, v) => {
            model.entry(key(*k)).or_insert_with(|| (value(*v), version));
        }
        Op::MPut(pairs) => {
            for (k, v) in pairs {
                model.insert(key(*k), (value(*v), version));
            }
        }
        Op::SetIfPresent(k, v) => {
            if let Some(entry) = model.get_mut(&key(*k)) {
                *entry = (value(*v), version);
            }
        }
        Op::Clear => model.clear(),
    }
}

fn expected(model: &Model, start: &[u8], end: Option<&[u8]>, limit: usize) -> Vec<Row> {
    if end.is_some_and(|end| end <= start) {
        return Vec::new();
    }
    let upper = end.map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_vec()));
    model
        .range((Bound::Included(start.to_vec()), upper))
        .take(limit)
        .map(|(k, (v, ver))| (k.clone(), v.clone(), *ver))
        .collect()
}

/// The keys from `start` to the end, at most `limit`.
fn from(start: &[u8], limit: usize) -> ScanRange<'_> {
    ScanRange {
        start,
        end: None,
        limit,
    }
}

fn scanned(sm: &RegionStateMachine, start: &[u8], end: Option<&[u8]>, limit: usize) -> Vec<Row> {
    let page = sm
        .scan_local(ScanRange { start, end, limit }, u64::MAX)
        .unwrap();
    assert!(
        !page.more,
        "an unbounded byte budget never cuts a page short"
    );
    page.pairs
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.value.to_vec(), v.version))
        .collect()
}

/// Every start key of interest (each model key, the keys between them, the
/// empty key) with a few limits and ends.
fn check_all_ranges(sm: &RegionStateMachine, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(sm.indexed_keys(), model.len());
    prop_assert_eq!(sm.region_stats().live_keys, model.len() as u64);
    let mut starts: Vec<Vec<u8>> = vec![Vec::new(), b"k".to_vec(), b"l".to_vec()];
    for n in 0..40 {
        let k = key(n);
        let mut after = k.clone();
        after.push(0);
        starts.push(k);
        starts.push(after);
    }
    for start in &starts {
        for limit in [1, 3, 100] {
            for end in [None, Some(&b"k2"[..]), Some(&start[..])] {
                prop_assert_eq!(
                    scanned(sm, start, end, limit),
                    expected(model, start, end, limit),
                    "start {:?} end {:?} limit {}",
                    start,
                    end,
                    limit
                );
            }
        }
    }
    Ok(())
}

/// The log entries of `ops` from index `first` on, and the model after them.
fn entries_and_model(ops: &[Op], first: u64) -> (Vec<Entry>, Model) {
    let mut model = Model::new();
    let mut entries = Vec::new();
    for (index, op) in (first..).zip(ops) {
        entries.push(normal(index, command(op)));
        apply_model(&mut model, op, index);
    }
    (entries, model)
}

#[test]
fn scans_agree_with_a_model_through_applies_restarts_and_installs() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(op(), 1..120);
    runner
        .run(&strategy, |ops| {
            runtime.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let mut sm = common::open(dir.path());
                let mut entries = vec![membership_ent::<TypeConfig>(
                    1,
                    1,
                    1,
                    vec![BTreeSet::from([1])],
                )];
                let (commands, model) = entries_and_model(&ops, 2);
                entries.extend(commands);
                apply(&mut sm, entries).await;
                check_all_ranges(&sm, &model)?;

                // A restart rebuilds the index from the persisted snapshot.
                let snapshot = sm.build_snapshot().await.unwrap();
                drop(sm);
                let reopened = common::open(dir.path());
                check_all_ranges(&reopened, &model)?;

                // A node that installs the snapshot has the same index.
                let other_dir = tempfile::tempdir().unwrap();
                let mut other = common::open(other_dir.path());
                apply(
                    &mut other,
                    vec![normal(
                        2,
                        Command::Put {
                            key: Bytes::from_static(b"stale"),
                            value: Bytes::from_static(b"gone after install"),
                        },
                    )],
                )
                .await;
                other
                    .install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
                    .await
                    .unwrap();
                check_all_ranges(&other, &model)
            })
        })
        .unwrap();
}

#[tokio::test]
async fn a_byte_budget_cuts_a_page_short_but_always_returns_one_pair() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    let big = Bytes::from(vec![b'x'; 10_000]);
    let entries = (0..5u64)
        .map(|i| {
            normal(
                i + 1,
                Command::Put {
                    key: Bytes::from(format!("big{i}")),
                    value: big.clone(),
                },
            )
        })
        .collect();
    apply(&mut sm, entries).await;

    // Room for two pairs (and their framing), not three.
    let page = sm.scan_local(from(b"", 5), 25_000).unwrap();
    assert_eq!(page.pairs.len(), 2);
    assert!(page.more);
    assert_eq!(&page.pairs[1].0[..], b"big1");

    // A budget smaller than one pair still returns that pair, so a client
    // continuing after the last key always makes progress.
    let page = sm.scan_local(from(b"big4", 5), 10).unwrap();
    assert_eq!(page.pairs.len(), 1);
    assert!(!page.more, "nothing follows big4");
    let page = sm.scan_local(from(b"big3", 5), 10).unwrap();
    assert_eq!(page.pairs.len(), 1);
    assert!(page.more);

    // The limit, not the budget, ends this one: no `more`.
    let page = sm.scan_local(from(b"", 2), u64::MAX).unwrap();
    assert_eq!(page.pairs.len(), 2);
    assert!(!page.more);
}

/// The model check can fail, and fails on the bug invariant 7 is about: an
/// index that kept a key the region deleted (played here by a model that
/// missed the delete, since no test hook can break the real index). Both the
/// key count and the scans notice. The same check fails on the real code
/// with the index update removed from `KeyedRegion`'s delete (tried by
/// hand; see the report of issue 23).
#[tokio::test]
async fn the_model_check_catches_a_deleted_key_left_in_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    let ops = [Op::Put(1, 1), Op::Put(2, 2), Op::Delete(1)];
    let (entries, model) = entries_and_model(&ops, 1);
    let (_, missed_delete) = entries_and_model(&ops[..2], 1);
    apply(&mut sm, entries).await;
    assert!(check_all_ranges(&sm, &model).is_ok());
    assert!(check_all_ranges(&sm, &missed_delete).is_err());
    // Scans alone (not only the key count) see the extra key.
    assert_ne!(
        scanned(&sm, b"", None, 100),
        expected(&missed_delete, b"", None, 100)
    );
}
