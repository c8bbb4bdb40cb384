//! The state machine applies commands to the region, builds snapshots from
//! it, persists them, and installs them only after validating all of them.

use std::collections::BTreeSet;

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::{log_id, membership_ent};
use rdkv_proto::region::HashSeed;
use rdkv_storage::RegionConfig;
use rdkv_storage::raft::{Command, Entry, TypeConfig};
use rdkv_storage::state_machine::{RegionStateMachine, StateMachineConfig};

fn config(dir: &std::path::Path) -> StateMachineConfig {
    StateMachineConfig {
        region: RegionConfig {
            region_bytes: 4 * 1024 * 1024,
            hash_seed: HashSeed(1, 1),
            ..RegionConfig::default()
        },
        snapshot_dir: dir.join("snapshots"),
        region_full_wait_ms: 10,
    }
}

fn normal(index: u64, command: Command) -> Entry {
    Entry::new_normal(log_id::<TypeConfig>(1, 1, index), command)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn apply(sm: &mut RegionStateMachine, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.unwrap();
}

fn value_of(sm: &RegionStateMachine, key: &str) -> Option<(String, u64)> {
    sm.get_local(key.as_bytes())
        .unwrap()
        .map(|v| (String::from_utf8(v.value.to_vec()).unwrap(), v.version))
}

async fn populated(dir: &std::path::Path) -> RegionStateMachine {
    let mut sm = RegionStateMachine::open(config(dir)).unwrap();
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
    let mut reopened = RegionStateMachine::open(config(dir.path())).unwrap();
    assert_contents(&reopened);
    let (applied, _) = reopened.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(8));

    // Another node installs it.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = RegionStateMachine::open(config(other_dir.path())).unwrap();
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

    let bytes = snapshot.snapshot.to_vec();
    for position in [3, 20, bytes.len() / 2, bytes.len() - 2] {
        let mut corrupt = bytes.clone();
        corrupt[position] ^= 0x40;
        let result = other
            .install_snapshot(&snapshot.meta, Bytes::from(corrupt))
            .await;
        assert!(result.is_err(), "flip at {position} accepted");
    }
    let truncated = Bytes::copy_from_slice(&bytes[..bytes.len() - 10]);
    assert!(
        other
            .install_snapshot(&snapshot.meta, truncated)
            .await
            .is_err()
    );
    // Still the state it had.
    assert_eq!(value_of(&other, "z"), Some(("9".into(), 9)));
    assert_eq!(other.applied_index(), 9);
}
