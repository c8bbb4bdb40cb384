//! What the state machine tests share: a state machine over a small region
//! with its snapshots in the test's directory, and log entries applied to it.

use std::path::Path;

use openraft::entry::RaftEntry;
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;
use rdkv_proto::region::HashSeed;
use rdkv_storage::RegionConfig;
use rdkv_storage::raft::{Command, Entry, TypeConfig};
use rdkv_storage::state_machine::{RegionStateMachine, StateMachineConfig};

/// Opens (or reopens) the state machine whose snapshots live in `dir`, over
/// a fresh 4 MiB region.
pub fn open(dir: &Path) -> RegionStateMachine {
    RegionStateMachine::open(StateMachineConfig {
        region: RegionConfig {
            region_bytes: 4 * 1024 * 1024,
            hash_seed: HashSeed(1, 1),
            ..RegionConfig::default()
        },
        snapshot_dir: dir.join("snapshots"),
    })
    .unwrap()
}

/// A normal entry at `index` of term 1.
pub fn normal(index: u64, command: Command) -> Entry {
    Entry::new_normal(log_id::<TypeConfig>(1, 1, index), command)
}

pub async fn apply(sm: &mut RegionStateMachine, entries: Vec<Entry>) {
    let stream = futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.unwrap();
}

/// A fresh state machine (in its own directory) that installed `snapshot`.
#[allow(dead_code)] // Not every test binary that shares this module uses it.
pub async fn installed_elsewhere(
    snapshot: &rdkv_storage::state_machine::Snapshot,
) -> (tempfile::TempDir, RegionStateMachine) {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .unwrap();
    (dir, sm)
}
