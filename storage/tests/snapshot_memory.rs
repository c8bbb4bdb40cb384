//! Snapshots are files, never buffers: a snapshot of 32 MiB of live data is
//! built, persisted, loaded at a restart, served chunk by chunk, received
//! into another node's file and installed there, and no allocation of the
//! process on the way is larger than 8 MiB (a whole-file buffer would be
//! over 32 MiB). The counting allocator keeps the largest allocation of any
//! thread, so the blocking threads that build, load and install are
//! counted too. One test in this binary: another test's allocations would
//! count.

mod common;

use bytes::Bytes;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use rdkv_fabric::alloc_count::CountingAllocator;
use rdkv_storage::raft::Command;

use common::{apply, normal, open_with, received};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const PAIRS: u64 = 32 * 1024;
const VALUE_BYTES: usize = 1000;
/// Room for the pairs at their charge, with the default quota's slack.
const REGION_MIB: u64 = 64;
/// A chunk as large as a peer transfer's.
const CHUNK_BYTES: usize = 4 * 1024 * 1024;
const CAP_BYTES: usize = 8 * 1024 * 1024;

fn value(i: u64) -> Bytes {
    let mut value = format!("{i:010}").into_bytes();
    value.resize(VALUE_BYTES, b'v');
    Bytes::from(value)
}

#[tokio::test]
async fn snapshots_go_through_files_with_bounded_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open_with(dir.path(), REGION_MIB).unwrap();
    // Applied in batches: the entries themselves are not what is measured.
    for batch in 0..PAIRS / 1024 {
        let entries = (batch * 1024..(batch + 1) * 1024)
            .map(|i| {
                let key = Bytes::from(format!("key-{i:08}"));
                normal(
                    i + 1,
                    Command::Put {
                        key,
                        value: value(i),
                    },
                )
            })
            .collect();
        apply(&mut sm, entries).await;
    }
    let digest = sm.digest_now();
    CountingAllocator::reset_largest_allocation();

    let snapshot = sm.build_snapshot().await.unwrap();
    let total = snapshot.snapshot.len();
    assert!(
        total > 4 * CAP_BYTES as u64,
        "the snapshot ({total} bytes) is too small to tell"
    );
    drop(sm);
    // A restart loads the persisted file by streaming it.
    let reopened = open_with(dir.path(), REGION_MIB).unwrap();
    assert_eq!(reopened.digest_now(), digest);

    // Another node receives it chunk by chunk (as the leader reads and
    // sends them) into its own file, and installs it by streaming.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = open_with(other_dir.path(), REGION_MIB).unwrap();
    let mut incoming = other.new_snapshot_file().unwrap();
    let mut offset = 0;
    while offset < total {
        let chunk = snapshot
            .snapshot
            .read_chunk(offset, CHUNK_BYTES)
            .await
            .unwrap();
        incoming.append(&chunk).unwrap();
        offset += chunk.len() as u64;
    }
    let incoming = incoming.finish().unwrap();
    other
        .install_snapshot(&snapshot.meta, incoming)
        .await
        .unwrap();
    assert_eq!(other.digest_now(), digest);
    let largest = CountingAllocator::largest_allocation();
    assert!(
        largest < CAP_BYTES,
        "an allocation of {largest} bytes for a {total}-byte snapshot"
    );

    // The check can fail: buffering the file whole is seen.
    let whole = common::bytes_of(&snapshot.snapshot);
    assert!(CountingAllocator::largest_allocation() >= total as usize);
    // And a truncated copy of the same file is refused, the state kept.
    let cut = received(&other, &whole[..whole.len() - 1]);
    assert!(other.install_snapshot(&snapshot.meta, cut).await.is_err());
    assert_eq!(other.digest_now(), digest);
}
