//! What the state machine tests share: a state machine over a small region
//! with its snapshots in the test's directory, and log entries applied to it.

use std::path::Path;

use openraft::entry::RaftEntry;
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;
use rdkv_proto::region::HashSeed;
use rdkv_storage::RegionConfig;
use rdkv_storage::raft::{Command, Entry, TypeConfig};
use rdkv_storage::state_machine::snapshot_store::SnapshotFile;
use rdkv_storage::state_machine::{RegionStateMachine, StateMachineConfig, StateMachineError};

/// The tests' region: `mib` MiB, a fixed seed.
pub fn region(mib: u64) -> RegionConfig {
    RegionConfig {
        region_bytes: mib * 1024 * 1024,
        hash_seed: HashSeed(1, 1),
        ..RegionConfig::default()
    }
}

/// Opens (or reopens) the state machine whose snapshots live in `dir`, over
/// a fresh 4 MiB region.
pub fn open(dir: &Path) -> RegionStateMachine {
    open_with(dir, 4).unwrap()
}

/// Opens the state machine of `dir` over a fresh region of `mib` MiB.
#[allow(dead_code)] // Not every test binary that shares this module uses it.
pub fn open_with(dir: &Path, mib: u64) -> Result<RegionStateMachine, StateMachineError> {
    RegionStateMachine::open(StateMachineConfig {
        region: region(mib),
        snapshot_dir: dir.join("snapshots"),
        shard: rdkv_proto::shard::ShardId(0),
    })
}

/// The whole of a snapshot file.
#[allow(dead_code)]
pub fn bytes_of(file: &SnapshotFile) -> Vec<u8> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file.reader(), &mut bytes).unwrap();
    bytes
}

/// `bytes` received by `sm` as a snapshot, as the peer service receives
/// one: in chunks, into a new file of its snapshot directory.
#[allow(dead_code)]
pub fn received(sm: &RegionStateMachine, bytes: &[u8]) -> SnapshotFile {
    let mut file = sm.new_snapshot_file().unwrap();
    for chunk in bytes.chunks(1000) {
        file.append(chunk).unwrap();
    }
    file.finish().unwrap()
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

/// A test hook that holds whatever runs it (a walk of the pairs at its
/// first pair, a publisher before the state lock): `arrived` says it got
/// there; it goes on once `go` is dropped (as it is when the test ends, or
/// unwinds from a failed assertion).
#[allow(dead_code)]
pub struct Held {
    pub arrived: std::sync::mpsc::Receiver<()>,
    pub go: std::sync::mpsc::Sender<()>,
}

/// A `Held` and the hook to set (`hook_while_walking_pairs`,
/// `hook_before_publish`).
#[allow(dead_code)]
pub fn held_hook() -> (Held, impl Fn() + Send + Sync + 'static) {
    let (arrived_tx, arrived) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let hook = move || {
        let _ = arrived_tx.send(());
        let _ = go_rx.lock().unwrap().recv();
    };
    (Held { arrived, go }, hook)
}

/// Runs `work` on a thread of its own in a current-thread runtime (with
/// time), so that a test can tell whether that thread stays free while
/// something `work` started waits.
#[allow(dead_code)]
pub fn on_own_runtime<F>(work: impl FnOnce() -> F + Send + 'static) -> std::thread::JoinHandle<()>
where
    F: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(work())
    })
}

/// Applies `entries` on a current-thread runtime of its own thread while the
/// walk hook holds the region rebuild they make (a compaction, a clear), and
/// checks that meanwhile the lease's publication (term 7, a lease a minute
/// ahead), the quota's status and another task of that runtime all go on:
/// none waits for the state lock or the rebuild. Then releases the rebuild
/// and waits for the apply. Returns the lease's deadline (unix µs), for the
/// caller to find in the header of the region served afterwards.
#[allow(dead_code)]
pub fn apply_held_at_rebuild(sm: &RegionStateMachine, entries: Vec<Entry>, what: &str) -> u64 {
    use std::time::Duration;
    let (held, hook) = held_hook();
    sm.hook_while_walking_pairs(hook);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (held_seen_tx, held_seen) = tokio::sync::oneshot::channel::<()>();
    let applying = {
        let mut sm = sm.clone();
        let done_tx = done_tx.clone();
        on_own_runtime(move || async move {
            let applying = tokio::spawn(async move { apply(&mut sm, entries).await });
            // Runs only if the runtime's thread is free while the rebuild is held.
            let _ = held_seen.await;
            let _ = done_tx.send("runtime ran".to_string());
            applying.await.unwrap();
        })
    };
    held.arrived
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("the {what} rebuilt the region"));
    held_seen_tx.send(()).unwrap();

    let far_us = rdkv_fabric::clock::unix_now_us() + 60_000_000;
    let lease = rdkv_proto::region::LeaseDeadline {
        unix_us: far_us,
        boottime_us: far_us,
    };
    {
        let sm = sm.clone();
        std::thread::spawn(move || {
            let published = sm.publish_leadership(7, Some(lease));
            let _ = done_tx.send(format!("publish {}", published.is_ok()));
            let charged = sm.quota_status().charged_bytes;
            let _ = done_tx.send(format!("quota status {}", charged > 0));
        });
    }
    // Each comes while the rebuild is held, or never (a generous bound on a
    // loaded machine: on the old code they wait for the rebuild's release).
    let mut during: Vec<String> = (0..3)
        .map_while(|_| done_rx.recv_timeout(Duration::from_secs(30)).ok())
        .collect();
    drop(held.go);
    applying.join().unwrap();
    during.sort();
    assert_eq!(
        during,
        ["publish true", "quota status true", "runtime ran"],
        "done while the {what} was held (none waits for the state lock or the rebuild)"
    );
    far_us
}
