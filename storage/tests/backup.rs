//! Backups (`backup::status`, `backup::restore`) of a state machine's
//! snapshot, and the cluster identity it carries: the first identity applied
//! stays, snapshots keep it, a snapshot of another cluster is not installed;
//! every strict prefix and every flipped byte of a backup is reported as
//! damage; members restored from one file start identical, with the new
//! membership and a new identity.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use openraft::storage::RaftStateMachine;
use rdkv_storage::RegionConfig;
use rdkv_storage::backup::{self, BackupError, RestoreTarget};
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::Command;
use rdkv_storage::state_machine::{RegionStateMachine, StateMachineError};

use common::{apply, normal, open};

const OLD_CLUSTER: ClusterId = ClusterId([0xA5; 16]);

/// A state machine with a cluster identity and 50 pairs, and its snapshot
/// saved as a backup file in `dir`.
async fn backed_up(dir: &Path) -> (RegionStateMachine, std::path::PathBuf) {
    let mut sm = open(&dir.join("source"));
    let mut entries = vec![
        normal(1, Command::SetClusterId { id: OLD_CLUSTER }),
        normal(
            2,
            Command::SetClusterId {
                id: ClusterId([1; 16]),
            },
        ),
    ];
    for i in 0..50u64 {
        let command = Command::Put {
            key: Bytes::from(format!("key-{i:03}")),
            value: Bytes::from(vec![i as u8; 100 + i as usize]),
        };
        entries.push(normal(3 + i, command));
    }
    apply(&mut sm, entries).await;
    let (_, snapshot) = sm.snapshot_file().await.unwrap();
    let file = dir.join("backup.snap");
    std::fs::write(&file, common::bytes_of(&snapshot)).unwrap();
    (sm, file)
}

fn members(spec: &str) -> BTreeMap<u64, String> {
    backup::parse_initial_cluster(spec).unwrap()
}

#[tokio::test]
async fn the_first_identity_stays_and_snapshots_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let (sm, _) = backed_up(dir.path()).await;
    assert_eq!(sm.cluster_id(), Some(OLD_CLUSTER));
    let reopened = open(&dir.path().join("source"));
    assert_eq!(reopened.cluster_id(), Some(OLD_CLUSTER));

    // A node of another cluster does not install this one's snapshot.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = open(other_dir.path());
    apply(
        &mut other,
        vec![normal(
            1,
            Command::SetClusterId {
                id: ClusterId([2; 16]),
            },
        )],
    )
    .await;
    let (meta, snapshot) = sm.snapshot_file().await.unwrap();
    let installed = other.install_snapshot(&meta, snapshot).await;
    assert!(installed.is_err(), "installed another cluster's snapshot");
    assert_eq!(other.cluster_id(), Some(ClusterId([2; 16])));
}

#[tokio::test]
async fn status_reads_what_the_snapshot_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (sm, file) = backed_up(dir.path()).await;
    let status = backup::status(&file).unwrap();
    assert_eq!(status.last_log_index, 52);
    assert_eq!(status.keys, 50);
    assert_eq!(status.digest, sm.digest_now().digest);
    assert_eq!(status.cluster_id, Some(OLD_CLUSTER));
    assert_eq!(status.format_version, 5);
    assert_eq!(status.total_bytes, std::fs::metadata(&file).unwrap().len());
}

#[tokio::test]
async fn every_prefix_and_every_flipped_byte_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (_, file) = backed_up(dir.path()).await;
    let bytes = std::fs::read(&file).unwrap();
    let damaged = dir.path().join("damaged.snap");
    for len in 0..bytes.len() {
        std::fs::write(&damaged, &bytes[..len]).unwrap();
        match backup::status(&damaged) {
            Err(BackupError::Damaged { .. }) => {}
            other => panic!("a {len}-byte prefix: {other:?}"),
        }
    }
    for at in 0..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x01;
        std::fs::write(&damaged, &flipped).unwrap();
        let status = backup::status(&damaged);
        assert!(
            matches!(status, Err(BackupError::Damaged { .. })),
            "a bit flipped at byte {at}: {status:?}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    std::fs::write(&damaged, &longer).unwrap();
    assert!(backup::status(&damaged).is_err(), "a byte after the end");
}

#[tokio::test]
async fn members_restored_from_one_file_start_identical_in_a_new_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (sm, file) = backed_up(dir.path()).await;
    let new_members = members("1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003");
    let mut restored = Vec::new();
    for id in 1..=3 {
        let data_dir = dir.path().join(format!("node-{id}"));
        let target = RestoreTarget {
            data_dir: &data_dir,
            node_id: id,
            members: &new_members,
            cluster_name: "",
            region: &common::region(4),
            quota_bytes: None,
        };
        let done = backup::restore(&file, &target).unwrap();
        assert_eq!((done.keys, done.last_log_index), (50, 52));
        assert_ne!(done.cluster_id, OLD_CLUSTER);
        restored.push((done.cluster_id, std::fs::read(&done.snapshot).unwrap()));
        let mut node = open(&data_dir);
        assert_eq!(node.digest_now().digest, sm.digest_now().digest);
        assert_eq!(node.applied_index(), 52);
        assert_eq!(node.cluster_id(), Some(done.cluster_id));
        let (applied, membership) = node.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| (l.leader_id.term, l.index)), Some((0, 52)));
        let ids: Vec<u64> = membership.membership().voter_ids().collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(
            node.get_local(b"key-007").unwrap().unwrap().value,
            vec![7u8; 107]
        );
    }
    assert!(restored.iter().all(|r| *r == restored[0]), "members differ");

    let other_name = dir.path().join("other-name");
    let named = RestoreTarget {
        data_dir: &other_name,
        node_id: 1,
        members: &new_members,
        cluster_name: "second",
        region: &common::region(4),
        quota_bytes: None,
    };
    let second = backup::restore(&file, &named).unwrap();
    assert_ne!(
        second.cluster_id, restored[0].0,
        "another name, another cluster"
    );
}

#[tokio::test]
async fn a_restore_refuses_a_used_directory_a_stranger_and_a_damaged_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_, file) = backed_up(dir.path()).await;
    let new_members = members("1=127.0.0.1:7001");
    let used = dir.path().join("source");
    let region = common::region(4);
    let target = |data_dir, node_id| RestoreTarget {
        data_dir,
        node_id,
        members: &new_members,
        cluster_name: "",
        region: &region,
        quota_bytes: None,
    };
    assert!(matches!(
        backup::restore(&file, &target(&used, 1)),
        Err(BackupError::DataDirNotEmpty(_))
    ));
    let fresh = dir.path().join("fresh");
    assert!(matches!(
        backup::restore(&file, &target(&fresh, 2)),
        Err(BackupError::NotAMember { id: 2, .. })
    ));
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.path().join("cut.snap");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    assert!(matches!(
        backup::restore(&cut, &target(&fresh, 1)),
        Err(BackupError::Damaged { .. })
    ));
    let left: Vec<_> = std::fs::read_dir(&fresh).unwrap().collect();
    assert!(left.is_empty(), "a failed restore left {left:?}");
    // The directory is usable afterwards.
    backup::restore(&file, &target(&fresh, 1)).unwrap();
}

/// A state machine over a 16 MiB region with about 6 MiB of pairs: more
/// than a 4 MiB region holds.
async fn large(dir: &Path) -> RegionStateMachine {
    let mut sm = common::open_with(dir, 16).unwrap();
    let entries = (0..6000u64)
        .map(|i| {
            let command = Command::Put {
                key: Bytes::from(format!("big-{i:05}")),
                value: Bytes::from(vec![7u8; 1000]),
            };
            normal(i + 1, command)
        })
        .collect();
    apply(&mut sm, entries).await;
    sm
}

#[tokio::test]
async fn a_snapshot_larger_than_the_node_is_refused_at_restore_install_and_start() {
    let dir = tempfile::tempdir().unwrap();
    let big = large(&dir.path().join("big")).await;
    let (meta, snapshot) = big.snapshot_file().await.unwrap();
    let file = dir.path().join("big.snap");
    std::fs::write(&file, common::bytes_of(&snapshot)).unwrap();

    // Restore: refused for a node that could not hold it, the directory
    // left empty; done for one that can.
    let new_members = members("1=127.0.0.1:7001");
    let restore = |data_dir: &Path, region: RegionConfig, quota_bytes| {
        let target = RestoreTarget {
            data_dir,
            node_id: 1,
            members: &new_members,
            cluster_name: "",
            region: &region,
            quota_bytes,
        };
        backup::restore(&file, &target)
    };
    let refused = dir.path().join("refused");
    let small_value = RegionConfig {
        max_value_bytes: 500,
        ..common::region(16)
    };
    for (region, quota, reason) in [
        (common::region(4), None, "quota"),
        (common::region(16), Some(1024 * 1024), "quota"),
        (small_value, None, "--max-value-bytes 500"),
    ] {
        match restore(&refused, region, quota) {
            Err(e @ BackupError::DoesNotFit(_)) => {
                assert!(e.to_string().contains(reason), "{e}")
            }
            other => panic!("a backup the node cannot hold: {other:?}"),
        }
        let left: Vec<_> = std::fs::read_dir(&refused).unwrap().collect();
        assert!(left.is_empty(), "a refused restore left {left:?}");
    }
    let fits = dir.path().join("fits");
    assert_eq!(restore(&fits, common::region(16), None).unwrap().keys, 6000);

    // Install: a 4 MiB node refuses it, says why, and keeps its state.
    let mut small = common::open(&dir.path().join("small"));
    let mine = Command::Put {
        key: Bytes::from_static(b"mine"),
        value: Bytes::from_static(b"1"),
    };
    apply(&mut small, vec![normal(1, mine)]).await;
    let error = small
        .install_snapshot(&meta, snapshot.clone())
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("does not fit this node's 4 MiB region"),
        "{error}"
    );
    assert_eq!(
        small.get_local(b"mine").unwrap().map(|v| v.version),
        Some(1)
    );
    assert_eq!(small.applied_index(), 1);

    // Start: the same snapshot as a 4 MiB node's own stops its start.
    let starter = dir.path().join("starter");
    let snapshots = starter.join(rdkv_storage::state_machine::SNAPSHOTS_DIR_NAME);
    std::fs::create_dir_all(&snapshots).unwrap();
    let path = snapshot.adopted_path().unwrap();
    std::fs::copy(&path, snapshots.join(path.file_name().unwrap())).unwrap();
    match common::open_with(&starter, 4) {
        Err(StateMachineError::SnapshotDoesNotFit { placed, .. }) => {
            assert!(placed > 0 && placed < 6000, "{placed} placed")
        }
        other => panic!("a start from a snapshot too large: {other:?}"),
    }
    assert!(common::open_with(&starter, 16).is_ok());
}
