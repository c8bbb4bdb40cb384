//! The state machine applies commands to the region, builds snapshots from
//! it, persists them, and installs them only after validating all of them.

use crate::common;

use std::collections::BTreeSet;

use bytes::Bytes;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::membership_ent;
use rdkv_storage::raft::{Command, TypeConfig};
use rdkv_storage::state_machine::RegionStateMachine;

use common::{apply, installed_elsewhere, normal};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn put(key: &str, value: &str) -> Command {
    Command::Put {
        key: b(key),
        value: b(value),
    }
}

fn value_of(sm: &RegionStateMachine, key: &str) -> Option<(String, u64)> {
    sm.get_local(key.as_bytes())
        .unwrap()
        .map(|v| (String::from_utf8(v.value.to_vec()).unwrap(), v.version))
}

async fn populated(dir: &std::path::Path) -> RegionStateMachine {
    let mut sm = common::open(dir);
    apply(
        &mut sm,
        vec![
            membership_ent::<TypeConfig>(1, 1, 1, vec![BTreeSet::from([1])]),
            normal(
                2,
                Command::Put {
                    key: b("a"),
                    value: b("1"),
                },
            ),
            normal(
                3,
                Command::Put {
                    key: b("b"),
                    value: b("2"),
                },
            ),
            normal(4, Command::Delete { key: b("a") }),
            // Succeeds: b is at version 3.
            normal(
                5,
                Command::Cas {
                    key: b("b"),
                    expected_version: Some(3),
                    new_value: Some(b("3")),
                },
            ),
            // Fails: b is at version 5 now.
            normal(
                6,
                Command::Cas {
                    key: b("b"),
                    expected_version: Some(3),
                    new_value: Some(b("x")),
                },
            ),
            normal(
                7,
                Command::MPut {
                    pairs: vec![(b("c"), b("4")), (b("d"), b("5"))],
                },
            ),
            // Create-if-absent succeeds for a missing key.
            normal(
                8,
                Command::Cas {
                    key: b("e"),
                    expected_version: None,
                    new_value: Some(b("6")),
                },
            ),
        ],
    )
    .await;
    sm
}

fn assert_contents(sm: &RegionStateMachine) {
    assert_eq!(value_of(sm, "a"), None);
    assert_eq!(value_of(sm, "b"), Some(("3".into(), 5)));
    assert_eq!(value_of(sm, "c"), Some(("4".into(), 7)));
    assert_eq!(value_of(sm, "d"), Some(("5".into(), 7)));
    assert_eq!(value_of(sm, "e"), Some(("6".into(), 8)));
}

#[tokio::test]
async fn commands_apply_to_the_region() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = populated(dir.path()).await;
    assert_contents(&sm);
    assert_eq!(sm.applied_index(), 8);
    let (applied, membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(8));
    assert_eq!(membership.log_id().map(|l| l.index), Some(1));
    assert_eq!(sm.region_stats().live_keys, 4);
}

#[tokio::test]
async fn snapshots_persist_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = populated(dir.path()).await;
    let snapshot = sm.build_snapshot().await.unwrap();
    assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(8));
    drop(sm);

    // A restart starts from the persisted snapshot.
    let mut reopened = common::open(dir.path());
    assert_contents(&reopened);
    let (applied, _) = reopened.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(8));

    // Another node installs it.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = common::open(other_dir.path());
    let reader_before = other.reader();
    other
        .install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .unwrap();
    assert_contents(&other);
    assert_eq!(other.applied_index(), 8);
    // The replaced region is marked retired for readers still attached to it.
    assert!(matches!(
        reader_before.check_header().unwrap().state,
        rdkv_proto::region::RegionState::Retired
    ));
    let current = other.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, snapshot.meta);
}

#[tokio::test]
async fn corrupt_or_truncated_snapshots_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = populated(dir.path()).await;
    let snapshot = sm.build_snapshot().await.unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = populated(other_dir.path()).await;
    apply(
        &mut other,
        vec![normal(
            9,
            Command::Put {
                key: b("z"),
                value: b("9"),
            },
        )],
    )
    .await;

    let bytes = common::bytes_of(&snapshot.snapshot);
    for position in [3, 20, bytes.len() / 2, bytes.len() - 2] {
        let mut corrupt = bytes.clone();
        corrupt[position] ^= 0x40;
        let result = other
            .install_snapshot(&snapshot.meta, common::received(&other, &corrupt))
            .await;
        assert!(result.is_err(), "flip at {position} accepted");
    }
    let truncated = common::received(&other, &bytes[..bytes.len() - 10]);
    assert!(
        other
            .install_snapshot(&snapshot.meta, truncated)
            .await
            .is_err()
    );
    // Still the state it had, its own snapshot, and no file of the refused
    // ones left behind.
    assert_eq!(value_of(&other, "z"), Some(("9".into(), 9)));
    assert_eq!(other.applied_index(), 9);
    let current = other.get_current_snapshot().await.unwrap();
    assert_eq!(current.map(|s| s.meta.last_log_id.map(|l| l.index)), None);
    let files = std::fs::read_dir(other_dir.path().join("snapshots"))
        .map(|entries| entries.count())
        .unwrap_or(0);
    assert_eq!(files, 0, "refused snapshots left files");
}

fn update(key: &str, update: rdkv_proto::wire::Update) -> Command {
    Command::Update {
        key: b(key),
        update,
    }
}

/// Read-modify-write commands decide from the region's current value, so
/// every replica applying the same entries ends with the same values.
#[tokio::test]
async fn updates_apply_atomically_from_the_current_value() {
    use rdkv_proto::wire::{SetCondition, Update};
    let set_if = |value: &str, condition, return_old| Update::SetIf {
        value: b(value),
        condition,
        return_old,
    };
    let entries = || {
        vec![
            // Absent counts as 0.
            normal(1, update("n", Update::Incr { delta: 5 })),
            normal(2, update("n", Update::Incr { delta: -7 })),
            normal(
                3,
                Command::Put {
                    key: b("s"),
                    value: b("abc"),
                },
            ),
            // Not an integer: nothing changes.
            normal(4, update("s", Update::Incr { delta: 1 })),
            normal(
                5,
                Command::Put {
                    key: b("z"),
                    value: b("007"),
                },
            ),
            normal(6, update("z", Update::Incr { delta: 1 })),
            // Overflow: nothing changes.
            normal(
                7,
                Command::Put {
                    key: b("max"),
                    value: b(&i64::MAX.to_string()),
                },
            ),
            normal(8, update("max", Update::Incr { delta: 1 })),
            normal(9, update("s", Update::Append { suffix: b("de") })),
            normal(10, update("new", Update::Append { suffix: b("x") })),
            // NX on an existing key and XX on an absent one do nothing.
            normal(11, update("s", set_if("no", SetCondition::IfAbsent, false))),
            normal(
                12,
                update("absent", set_if("no", SetCondition::IfPresent, true)),
            ),
            normal(
                13,
                update("nx", set_if("yes", SetCondition::IfAbsent, false)),
            ),
            normal(
                14,
                update("new", set_if("xx", SetCondition::IfPresent, true)),
            ),
            normal(15, update("g", set_if("first", SetCondition::Always, true))),
            // Too large an append is refused.
            normal(
                16,
                update(
                    "new",
                    Update::Append {
                        suffix: Bytes::from(vec![b'a'; 1024 * 1024]),
                    },
                ),
            ),
        ]
    };
    let check = |sm: &RegionStateMachine| {
        assert_eq!(value_of(sm, "n"), Some(("-2".into(), 2)));
        assert_eq!(value_of(sm, "s"), Some(("abcde".into(), 9)));
        assert_eq!(value_of(sm, "z"), Some(("007".into(), 5)));
        assert_eq!(value_of(sm, "max"), Some((i64::MAX.to_string(), 7)));
        assert_eq!(value_of(sm, "absent"), None);
        assert_eq!(value_of(sm, "nx"), Some(("yes".into(), 13)));
        assert_eq!(value_of(sm, "new"), Some(("xx".into(), 14)));
        assert_eq!(value_of(sm, "g"), Some(("first".into(), 15)));
    };
    // Two replicas: the same entries give the same region.
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = common::open(dir.path());
        apply(&mut sm, entries()).await;
        check(&sm);
        assert_eq!(sm.applied_index(), 16);
    }
}

#[tokio::test]
async fn clear_deletes_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = populated(dir.path()).await;
    assert_eq!(sm.region_stats().live_keys, 4);
    apply(&mut sm, vec![normal(9, Command::Clear)]).await;
    assert_eq!(sm.region_stats().live_keys, 0);
    assert_eq!(value_of(&sm, "b"), None);
    assert_eq!(sm.applied_index(), 9);
    // Writes go on afterwards.
    apply(
        &mut sm,
        vec![normal(
            10,
            Command::Put {
                key: b("b"),
                value: b("again"),
            },
        )],
    )
    .await;
    assert_eq!(value_of(&sm, "b"), Some(("again".into(), 10)));
}

/// A clear replaces the region with an empty one without the state lock
/// (emptying it key by key under the lock held it 2.2 s for 4,000,000 keys
/// of a 1 GiB region): while the new region is made, the lease's
/// publication, the quota's status and the apply's own runtime go on. The
/// new region holds what was published meanwhile and nothing else; the old
/// one is retired, for one-sided readers to attach the new one.
#[test]
fn a_clear_leaves_the_state_lock_free() {
    let dir = tempfile::tempdir().unwrap();
    let sm = common::open(dir.path());
    let filling: Vec<_> = (2..502)
        .map(|index| normal(index, put(&format!("k{index:04}"), "value")))
        .collect();
    common::on_own_runtime({
        let mut sm = sm.clone();
        move || async move { apply(&mut sm, filling).await }
    })
    .join()
    .unwrap();
    assert_eq!(sm.region_stats().live_keys, 500);
    let old_reader = sm.reader();
    let epoch_before = sm.region_epoch();
    let clear = vec![normal(502, Command::Clear)];
    let far_us = common::apply_held_at_rebuild(&sm, clear, "clear");
    assert_ne!(sm.region_epoch(), epoch_before, "a new region");
    let header = sm.reader().dynamic_header().unwrap();
    assert_eq!(
        (header.raft_term, header.lease_deadline_unix_us),
        (7, Some(far_us)),
        "what was published during the clear is in the region served after it"
    );
    let old_state = old_reader.dynamic_header().unwrap().state;
    assert_eq!(old_state, rdkv_proto::region::RegionState::Retired);
    assert_eq!(sm.region_stats().live_keys, 0);
    assert_eq!(value_of(&sm, "k0002"), None);
    assert_eq!(sm.quota_status().charged_bytes, 0);
    assert_eq!(sm.digest_now().digest, 0, "the digest of no pairs");
    assert_eq!(sm.applied_index(), 502);
}

/// A publisher that decided to publish a lease just before a leadership
/// transfer suppressed it must not publish it after the suppression: the
/// check and the publication are one step under the state lock.
#[test]
fn a_suppressed_lease_is_not_republished_by_a_racing_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let sm = common::open(dir.path());
    let (held, hook) = common::held_hook();
    sm.hook_before_publish(hook);
    let far_us = rdkv_fabric::clock::unix_now_us() + 60_000_000;
    let lease = rdkv_proto::region::LeaseDeadline {
        unix_us: far_us,
        boottime_us: far_us,
    };
    let publisher = {
        let sm = sm.clone();
        std::thread::spawn(move || sm.publish_leadership(1, Some(lease)))
    };
    held.arrived.recv().unwrap();
    sm.suppress_lease_until(far_us).unwrap();
    drop(held.go);
    publisher.join().unwrap().unwrap();
    let header = sm.reader().dynamic_header().unwrap();
    assert_eq!(
        (
            header.lease_deadline_unix_us,
            header.lease_deadline_boottime_us
        ),
        (None, None),
        "the lease was published during the suppression"
    );
}

/// A snapshot build walks the region without the state lock, and applies
/// wait for it without blocking a runtime thread. (It held the lock for its
/// whole file: building a 115 MB region took 2 s, and every task that took
/// the lock meanwhile blocked a runtime worker; the leader lost its lease,
/// then its leadership.) A build of about 3.5 MB is held in its walk, once
/// its first pair is written: the lease's publication returns meanwhile; an apply waits for
/// the build (its snapshot stays that of one index, checked by installing
/// it elsewhere) while the apply's own current-thread runtime goes on
/// running other tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_build_leaves_the_state_lock_free_and_applies_wait_for_it() {
    use std::time::Duration;
    // About 3.5 MB of pairs.
    const PAIRS: u64 = 3500;
    let pair_value = |i: u64| {
        let mut value = format!("{i:08}");
        value.push_str(&"v".repeat(992));
        value
    };
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open_with(dir.path(), 16).unwrap();
    let mut entries = vec![membership_ent::<TypeConfig>(
        1,
        1,
        1,
        vec![BTreeSet::from([1])],
    )];
    entries.extend((0..PAIRS).map(|i| normal(i + 2, put(&format!("k{i}"), &pair_value(i)))));
    apply(&mut sm, entries).await;
    let started_at = sm.applied_index();
    let (held, hook) = common::held_hook();
    sm.hook_while_walking_pairs(hook);
    let builder = {
        let mut sm = sm.clone();
        tokio::spawn(async move { sm.build_snapshot().await })
    };
    let walking = held.arrived;
    let waiting =
        tokio::task::spawn_blocking(move || walking.recv_timeout(Duration::from_secs(10)));
    waiting.await.unwrap().expect("the build reached its walk");

    let far_us = rdkv_fabric::clock::unix_now_us() + 60_000_000;
    let lease = rdkv_proto::region::LeaseDeadline {
        unix_us: far_us,
        boottime_us: far_us,
    };
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    {
        let sm = sm.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            let published = sm.publish_leadership(1, Some(lease));
            let _ = done_tx.send(format!("publish {}", published.is_ok()));
        });
    }
    let applying = {
        let mut sm = sm.clone();
        let next = started_at + 1;
        common::on_own_runtime(move || async move {
            let applying = tokio::spawn(async move {
                apply(&mut sm, vec![normal(next, put("late", "write"))]).await;
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = done_tx.send("runtime ran".to_string());
            applying.await.unwrap();
            let _ = done_tx.send("applied".to_string());
        })
    };
    // Each comes while the build is held, or never (a generous bound on a
    // loaded machine: on the old code the publication waits for the build).
    let mut during: Vec<String> = (0..2)
        .map_while(|_| done_rx.recv_timeout(Duration::from_secs(30)).ok())
        .collect();
    drop(held.go);
    let snapshot = builder.await.unwrap().unwrap();
    applying.join().unwrap();
    let after = done_rx.recv_timeout(Duration::from_secs(10));
    during.sort();
    assert_eq!(
        during,
        ["publish true", "runtime ran"],
        "done while the build was held (neither waits for its state lock; the apply waits for the build)"
    );
    assert_eq!(after.as_deref(), Ok("applied"));
    assert_eq!(
        snapshot.meta.last_log_id.map(|l| l.index),
        Some(started_at),
        "the snapshot is of the index its build started at"
    );
    assert_eq!(
        value_of(&sm, "late"),
        Some(("write".into(), started_at + 1))
    );
    // ...and holds that index's pairs, every one, and not the later write.
    let other = tempfile::tempdir().unwrap();
    let mut elsewhere = common::open_with(other.path(), 16).unwrap();
    elsewhere
        .install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .unwrap();
    assert_eq!(elsewhere.region_stats().live_keys, PAIRS);
    assert_eq!(value_of(&elsewhere, "late"), None);
    for i in [0, PAIRS / 2, PAIRS - 1] {
        assert_eq!(
            value_of(&elsewhere, &format!("k{i}")),
            Some((pair_value(i), i + 2))
        );
    }
}

/// The first `SetHashSeed` applied fixes the seed (writes applied before it
/// are placed anew with it), a later one changes nothing, and snapshots
/// carry it to a restart and to another replica.
#[tokio::test]
async fn the_first_hash_seed_applied_is_the_clusters_for_good() {
    use rdkv_proto::region::HashSeed;
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    assert_eq!(sm.reader().layout().hash_seed, HashSeed::default());
    assert!(!sm.has_hash_seed());
    apply(
        &mut sm,
        vec![
            membership_ent::<TypeConfig>(1, 1, 1, vec![BTreeSet::from([1])]),
            normal(2, put("before", "1")),
            normal(3, Command::SetHashSeed { seed: (11, 12) }),
            normal(4, Command::SetHashSeed { seed: (21, 22) }),
            normal(5, put("after", "2")),
        ],
    )
    .await;
    assert!(sm.has_hash_seed());
    assert_eq!(sm.reader().layout().hash_seed, HashSeed(11, 12));
    assert_eq!(value_of(&sm, "before"), Some(("1".into(), 2)));
    assert_eq!(value_of(&sm, "after"), Some(("2".into(), 5)));
    assert_eq!(sm.applied_index(), 5);

    let snapshot = sm.build_snapshot().await.unwrap();
    drop(sm);
    let reopened = common::open(dir.path());
    assert_eq!(reopened.reader().layout().hash_seed, HashSeed(11, 12));
    assert!(reopened.has_hash_seed());
    let (_other_dir, other) = installed_elsewhere(&snapshot).await;
    assert_eq!(other.reader().layout().hash_seed, HashSeed(11, 12));
    assert_eq!(value_of(&other, "before"), Some(("1".into(), 2)));
}

/// Two replicas that reach one applied index by different paths (one
/// applying every entry, one installing a snapshot midway and applying the
/// rest) report the same state digest there; a different state does not.
#[tokio::test]
async fn replicas_at_one_index_have_one_digest() {
    let first = vec![
        membership_ent::<TypeConfig>(1, 1, 1, vec![BTreeSet::from([1])]),
        normal(2, put("a", "1")),
        normal(3, put("b", "2")),
        normal(4, put("a", "3")),
    ];
    let rest = vec![
        normal(5, Command::Delete { key: b("b") }),
        normal(6, put("c", "4")),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut whole = common::open(dir.path());
    apply(&mut whole, first.clone()).await;
    let snapshot = whole.build_snapshot().await.unwrap();
    apply(&mut whole, rest.clone()).await;

    let (_joined_dir, mut joined) = installed_elsewhere(&snapshot).await;
    apply(&mut joined, rest).await;
    assert_eq!(whole.digest_now(), joined.digest_now());
    assert_eq!(whole.digest_now().applied_index, 6);
    let at = |sm: &RegionStateMachine, index: u64| {
        sm.digests()
            .into_iter()
            .find(|d| d.applied_index == index)
            .map(|d| d.digest)
    };
    assert_eq!(at(&whole, 6), at(&joined, 6));
    assert_eq!(at(&whole, 4), at(&joined, 4), "the snapshot's index");
    assert_ne!(at(&whole, 4), at(&whole, 6));

    let diverged_dir = tempfile::tempdir().unwrap();
    let mut diverged = common::open(diverged_dir.path());
    apply(&mut diverged, first).await;
    apply(
        &mut diverged,
        vec![
            normal(5, Command::Delete { key: b("a") }),
            normal(6, put("c", "4")),
        ],
    )
    .await;
    assert_ne!(whole.digest_now(), diverged.digest_now());
}

/// A transaction applies every op in one entry (one version for all) when
/// each watched key still has the version given, and nothing otherwise.
#[tokio::test]
async fn a_transaction_applies_every_op_or_none_when_a_watched_key_changed() {
    use rdkv_proto::wire::{TxnOp, Update};
    let txn = |watch: Vec<(&str, Option<u64>)>, ops: Vec<TxnOp>| Command::Transaction {
        watch: watch.into_iter().map(|(k, v)| (b(k), v)).collect(),
        ops,
    };
    let entries = vec![
        normal(1, put("a", "1")),
        normal(
            2,
            txn(
                vec![("a", Some(1)), ("never", None)],
                vec![
                    TxnOp::Put {
                        key: b("b"),
                        value: b("2"),
                    },
                    TxnOp::Update {
                        key: b("n"),
                        update: Update::Incr { delta: 1 },
                    },
                    TxnOp::Update {
                        key: b("n"),
                        update: Update::Incr { delta: 1 },
                    },
                    TxnOp::Delete { key: b("a") },
                    TxnOp::Get { key: b("b") },
                ],
            ),
        ),
        // b is at version 2 now: the watch fails and nothing is written.
        normal(
            3,
            txn(
                vec![("b", Some(1))],
                vec![TxnOp::Put {
                    key: b("c"),
                    value: b("3"),
                }],
            ),
        ),
        // a was deleted: watching it as absent passes.
        normal(
            4,
            txn(
                vec![("a", None)],
                vec![TxnOp::Put {
                    key: b("d"),
                    value: b("4"),
                }],
            ),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    apply(&mut sm, entries).await;
    assert_eq!(value_of(&sm, "a"), None);
    assert_eq!(value_of(&sm, "b"), Some(("2".into(), 2)));
    assert_eq!(value_of(&sm, "n"), Some(("2".into(), 2)));
    assert_eq!(value_of(&sm, "c"), None);
    assert_eq!(value_of(&sm, "d"), Some(("4".into(), 4)));
    assert_eq!(sm.applied_index(), 4);
}

/// RENAME, RENAMENX and COPY: the destination gets the source's value in
/// the same entry (RENAME also deletes the source), only when the source
/// exists, and without `replace` only when the destination is absent.
#[tokio::test]
async fn copies_and_renames_decide_from_both_keys() {
    use rdkv_proto::wire::Update;
    let copy = |from: &str, to: &str, replace, remove_source| {
        update(
            to,
            Update::CopyFrom {
                source: b(from),
                replace,
                remove_source,
            },
        )
    };
    let entries = vec![
        normal(1, put("a", "1")),
        normal(2, put("b", "2")),
        // RENAME a -> c.
        normal(3, copy("a", "c", true, true)),
        // RENAMENX c -> b: b exists, nothing changes.
        normal(4, copy("c", "b", false, true)),
        // COPY b -> c REPLACE: c takes b's value, b stays.
        normal(5, copy("b", "c", true, false)),
        // COPY of a missing source: nothing.
        normal(6, copy("none", "d", true, false)),
        // RENAME of a key onto itself: nothing moves, nothing is lost.
        normal(7, copy("b", "b", true, true)),
        // RENAMENX b -> e: e is absent.
        normal(8, copy("b", "e", false, true)),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    apply(&mut sm, entries).await;
    assert_eq!(value_of(&sm, "a"), None);
    assert_eq!(value_of(&sm, "b"), None);
    assert_eq!(value_of(&sm, "c"), Some(("2".into(), 5)));
    assert_eq!(value_of(&sm, "d"), None);
    assert_eq!(value_of(&sm, "e"), Some(("2".into(), 8)));
    let stats = sm.region_stats();
    assert_eq!(stats.live_keys, 2);
}

fn set_expiring(key: &str, value: &str, expiry: rdkv_proto::wire::Expiry) -> Command {
    update(
        key,
        rdkv_proto::wire::Update::Set {
            value: b(value),
            condition: rdkv_proto::wire::SetCondition::Always,
            return_old: false,
            expiry,
        },
    )
}

fn deadline_of(sm: &RegionStateMachine, key: &str) -> Option<u64> {
    let found = sm.get_local_with_deadline(key.as_bytes()).unwrap();
    found.map(|(_, deadline)| deadline)
}

/// Deadlines and the apply clock survive a snapshot, a restart from it and
/// an install elsewhere: every replica keeps deciding expiry alike.
#[tokio::test]
async fn deadlines_and_the_apply_clock_survive_snapshots() {
    use rdkv_proto::wire::{Expiry, SetCondition, Update};
    let now = rdkv_fabric::clock::unix_now_ms();
    let hour = 3_600_000;
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    apply(
        &mut sm,
        vec![
            membership_ent::<TypeConfig>(1, 1, 1, vec![BTreeSet::from([1])]),
            normal(
                2,
                set_expiring("long", "v", Expiry::AfterMs(hour)).timed(now),
            ),
            // Expired on the apply clock (stamped later) but not yet on
            // the wall clock of the reads below.
            normal(
                3,
                set_expiring("short", "v", Expiry::AfterMs(hour)).timed(now),
            ),
            normal(4, put("tick", "x").timed(now + 2 * hour)),
            normal(5, put("plain", "x").timed(now)),
        ],
    )
    .await;
    let snapshot = sm.build_snapshot().await.unwrap();
    drop(sm);
    let reopened = common::open(dir.path());
    let (_other_dir, mut other) = installed_elsewhere(&snapshot).await;
    for replica in [&reopened, &other] {
        assert_eq!(deadline_of(replica, "long"), Some(now + hour));
        assert_eq!(deadline_of(replica, "plain"), Some(0));
        assert_eq!(replica.expiring_keys(), 2);
        let due = replica.expired_keys(now + hour, 10).unwrap();
        assert_eq!(due.len(), 2, "{due:?}");
    }
    // The clock came along: an entry stamped before it (a new leader whose
    // clock is behind) still finds "short" expired, so NX writes.
    let nx = Update::Set {
        value: b("new"),
        condition: SetCondition::IfAbsent,
        return_old: false,
        expiry: Expiry::Never,
    };
    apply(&mut other, vec![normal(6, update("short", nx).timed(now))]).await;
    assert_eq!(value_of(&other, "short"), Some(("new".to_owned(), 6)));
}

/// Installs `snapshot` and reads the served region's header.
async fn installed_header(
    sm: &mut RegionStateMachine,
    snapshot: &rdkv_storage::state_machine::Snapshot,
) -> rdkv_proto::region::DynamicHeader {
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .unwrap();
    sm.reader().dynamic_header().unwrap()
}

/// A region swapped in (here by a snapshot's install) keeps what this node
/// published in the one it replaces, which is retired: the term and the
/// lease (its own lease reads go by the same deadline as before), and,
/// once the node has retired its region (it is stopping), the retirement.
#[tokio::test]
async fn an_installed_region_keeps_the_term_lease_and_retirement_published() {
    use rdkv_proto::region::RegionState;
    let source_dir = tempfile::tempdir().unwrap();
    let mut source = populated(source_dir.path()).await;
    let first = source.build_snapshot().await.unwrap();
    let next = first.meta.last_log_id.unwrap().index + 1;
    apply(&mut source, vec![normal(next, put("later", "x"))]).await;
    let second = source.build_snapshot().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    let far_us = rdkv_fabric::clock::unix_now_us() + 60_000_000;
    let lease = rdkv_proto::region::LeaseDeadline {
        unix_us: far_us,
        boottime_us: far_us,
    };
    sm.publish_leadership(7, Some(lease)).unwrap();
    let replaced = sm.reader();
    let header = installed_header(&mut sm, &first).await;
    assert_eq!(
        (
            header.raft_term,
            header.lease_deadline_unix_us,
            header.lease_deadline_boottime_us,
            header.state
        ),
        (7, Some(far_us), Some(far_us), RegionState::Serving)
    );
    assert_eq!(sm.published_lease_boottime_us(), Some(far_us));
    assert_eq!(
        replaced.dynamic_header().unwrap().state,
        RegionState::Retired
    );

    sm.retire().unwrap();
    let header = installed_header(&mut sm, &second).await;
    assert_eq!(
        (
            header.raft_term,
            header.lease_deadline_unix_us,
            header.state
        ),
        (7, None, RegionState::Retired),
        "a stopping node's next region is retired, without a lease"
    );
    assert_eq!(value_of(&sm, "later"), Some(("x".into(), next)));
}
