//! A full region never makes replicas diverge: the quota refuses the same
//! writes on every replica (whatever each region's layout history), a write
//! the quota admitted is placed even in a fragmented region (it waits for
//! reclaim, then compacts), and a replica that cannot place it even then
//! stops instead of recording a different result.

use crate::common;

use std::collections::BTreeSet;

use bytes::Bytes;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::testing::membership_ent;
use rdkv_storage::raft::{Command, Entry, TypeConfig};
use rdkv_storage::state_machine::RegionStateMachine;

use common::{apply, installed_elsewhere, normal};

fn put(key: String, value_bytes: usize, fill: u8) -> Command {
    Command::Put {
        key: Bytes::from(key),
        value: Bytes::from(vec![fill; value_bytes]),
    }
}

fn version_of(sm: &RegionStateMachine, key: &str) -> Option<u64> {
    sm.get_local(key.as_bytes()).unwrap().map(|v| v.version)
}

/// Entries from `first_index` on, one per command.
fn entries(first_index: u64, commands: impl IntoIterator<Item = Command>) -> Vec<Entry> {
    commands
        .into_iter()
        .zip(first_index..)
        .map(|(command, index)| normal(index, command))
        .collect()
}

/// A one-voter membership at index 1, then `commands` from index 2.
fn opening(commands: impl IntoIterator<Item = Command>) -> Vec<Entry> {
    let mut all = vec![membership_ent::<TypeConfig>(
        1,
        1,
        1,
        vec![BTreeSet::from([1])],
    )];
    all.extend(entries(2, commands));
    all
}

/// Fills a 4 MiB region with 1700 2 KiB blocks and deletes every other
/// one: its free space is then 2 KiB holes and a short tail.
fn fragmenting() -> Vec<Entry> {
    let mut all = opening((0..1700).map(|i| put(format!("s{i:04}"), 2000, 1)));
    let deletes = (0..1700).step_by(2).map(|i| Command::Delete {
        key: Bytes::from(format!("s{i:04}")),
    });
    all.extend(entries(1702, deletes));
    all
}

/// `SetQuota` then `puts` 1000-byte values under keys `k0000`, `k0001`, ...
fn quota_then_puts(quota_bytes: u64, puts: usize) -> Vec<Entry> {
    let set_quota = Command::SetQuota { bytes: quota_bytes };
    let puts = (0..puts).map(|i| put(format!("k{i:04}"), 1000, 1));
    opening(std::iter::once(set_quota).chain(puts))
}

/// What a 1000-byte value under a 5-byte key is charged: a 1088-byte
/// block and a slot.
const CHARGE: u64 = 1088 + 8;

/// Replica A fills its 4 MiB region with 2 KiB blocks and deletes every
/// other one, leaving free space only in 2 KiB holes and a short tail; B
/// installs A's snapshot of that state, so its region is compact. Both then
/// apply the same 4 KiB writes, which fit B's free space but not A's holes.
/// Before: A gave up after a short wait and recorded them failed while B
/// applied them (different digests). Now A compacts and places them too.
#[tokio::test]
async fn a_fragmented_replica_places_what_a_compact_one_places() {
    let dir = tempfile::tempdir().unwrap();
    let mut fragmented = common::open(dir.path());
    apply(&mut fragmented, fragmenting()).await;
    let snapshot = fragmented.build_snapshot().await.unwrap();
    let (_compact_dir, mut compact) = installed_elsewhere(&snapshot).await;

    let next = snapshot.meta.last_log_id.unwrap().index + 1;
    let large = entries(next, (0..400).map(|i| put(format!("l{i:04}"), 4000, 2)));
    let epoch_before = fragmented.region_epoch();
    apply(&mut compact, large.clone()).await;
    apply(&mut fragmented, large).await;

    assert_eq!(compact.digest_now(), fragmented.digest_now());
    assert_eq!(compact.region_stats().live_keys, 850 + 400);
    assert_eq!(fragmented.region_stats().live_keys, 850 + 400);
    assert_eq!(version_of(&fragmented, "l0399"), Some(next + 399));
    assert_ne!(
        fragmented.region_epoch(),
        epoch_before,
        "the fragmented region was compacted (rebuilt at a new epoch)"
    );
}

/// Writes past the quota are refused alike by a replica that applied every
/// entry and one that installed a snapshot midway; an MPut is refused whole;
/// an overwrite that does not grow passes; deletes make room and clear the
/// alarm; the quota survives a restart.
#[tokio::test]
async fn the_quota_refuses_the_same_writes_everywhere() {
    const QUOTA: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let mut whole = common::open(dir.path());
    apply(&mut whole, quota_then_puts(QUOTA, 40)).await;
    let snapshot = whole.build_snapshot().await.unwrap();
    let (_joined_dir, mut joined) = installed_elsewhere(&snapshot).await;
    assert_eq!(joined.quota_status().quota_bytes, Some(QUOTA));

    let fits = QUOTA / CHARGE; // 91 pairs
    let mut rest: Vec<Command> = (40..100)
        .map(|i| put(format!("k{i:04}"), 1000, 1))
        .collect();
    // Over the quota: an overwrite of the same size still passes...
    rest.push(put("k0000".into(), 1000, 9));
    // ...an MPut adding one key is refused whole, its overwrite included.
    rest.push(Command::MPut {
        pairs: vec![
            (Bytes::from("k0001"), Bytes::from(vec![9; 1000])),
            (Bytes::from("m0000"), Bytes::from(vec![9; 1000])),
        ],
    });
    let rest = entries(43, rest);
    let overwrite_index = 43 + 60;
    apply(&mut whole, rest.clone()).await;
    apply(&mut joined, rest).await;

    for sm in [&whole, &joined] {
        let quota = sm.quota_status();
        assert_eq!(quota.charged_bytes, fits * CHARGE);
        assert!(quota.no_space_alarm);
        assert_eq!(sm.region_stats().live_keys, fits);
        assert_eq!(version_of(sm, &format!("k{:04}", fits - 1)), Some(2 + fits));
        assert_eq!(version_of(sm, &format!("k{fits:04}")), None);
        assert_eq!(version_of(sm, "k0000"), Some(overwrite_index));
        assert_eq!(
            version_of(sm, "k0001"),
            Some(4),
            "the MPut was refused whole"
        );
        assert_eq!(version_of(sm, "m0000"), None);
    }
    assert_eq!(whole.digest_now(), joined.digest_now());

    // Near the quota, an overwrite that grows but still fits passes: a
    // 1100-byte value takes a 1152-byte block, 64 more than before.
    let next = whole.applied_index() + 1;
    apply(&mut whole, entries(next, [put("k0002".into(), 1100, 7)])).await;
    assert_eq!(version_of(&whole, "k0002"), Some(next));
    assert_eq!(whole.quota_status().charged_bytes, fits * CHARGE + 64);

    // Deleting 10 pairs brings the charge under 90% of the quota.
    let next = whole.applied_index() + 1;
    let deletes = (0..10).map(|i| Command::Delete {
        key: Bytes::from(format!("k{i:04}")),
    });
    apply(&mut whole, entries(next, deletes)).await;
    assert!(!whole.quota_status().no_space_alarm);
    // k0002 was among them, its 64 more with it.
    assert_eq!(whole.quota_status().charged_bytes, (fits - 10) * CHARGE);

    whole.build_snapshot().await.unwrap();
    drop(whole);
    let reopened = common::open(dir.path());
    assert_eq!(reopened.quota_status().quota_bytes, Some(QUOTA));
}

/// A write no compaction can place (no quota limits it here) stops the
/// replica with an error naming the cure; before, it was recorded as failed
/// on this replica alone and applying went on.
#[tokio::test]
async fn a_write_no_region_can_place_stops_the_replica() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    let all = opening((0..2500).map(|i| put(format!("s{i:04}"), 2000, 1)));
    let stream = futures::stream::iter(all.into_iter().map(|e| Ok((e, None))));
    let error = sm
        .apply(stream)
        .await
        .expect_err("the region cannot hold 5 MB");
    let message = error.to_string();
    assert!(message.contains("cannot be placed"), "{message}");
    assert!(message.contains("--quota-bytes"), "{message}");
    let applied = sm.applied_index();
    assert!(applied > 1000 && applied < 2500, "stopped at {applied}");
}

/// The alarm says a write was refused, not that the quota is nearly used:
/// a charge between 90% and 100% of the quota raises nothing until a
/// refusal does.
#[tokio::test]
async fn only_a_refusal_raises_the_no_space_alarm() {
    const QUOTA: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let mut sm = common::open(dir.path());
    // 85 pairs of 1096 bytes: 93,160, over 90% of the quota.
    apply(&mut sm, quota_then_puts(QUOTA, 85)).await;
    let quota = sm.quota_status();
    assert_eq!(quota.charged_bytes, 85 * CHARGE);
    assert!(!quota.no_space_alarm, "raised without a refusal");
    let next = sm.applied_index() + 1;
    apply(
        &mut sm,
        entries(next, (85..100).map(|i| put(format!("k{i:04}"), 1000, 1))),
    )
    .await;
    assert!(sm.quota_status().no_space_alarm);
}

/// A compaction rebuilds the whole region, which takes long in a large one
/// (longer than a lease in 1 GiB, as a snapshot build under the lock did).
/// Held inside its walk, once the first pair is placed in the new region:
/// the lease's publication and a read of the state return meanwhile, the
/// apply's own current-thread runtime runs another task (the walk is off
/// its thread), and what was published meanwhile is in the region served
/// after the swap; the compaction then places the write as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_leaves_the_state_lock_free() {
    let dir = tempfile::tempdir().unwrap();
    let fragmented = common::open(dir.path());
    apply(&mut fragmented.clone(), fragmenting()).await;
    let epoch_before = fragmented.region_epoch();
    let next = fragmented.applied_index() + 1;
    let large = entries(next, (0..400).map(|i| put(format!("l{i:04}"), 4000, 2)));
    let far_us = common::apply_held_at_rebuild(&fragmented, large, "compaction");
    assert_ne!(
        fragmented.region_epoch(),
        epoch_before,
        "the region was compacted"
    );
    let header = fragmented.reader().dynamic_header().unwrap();
    assert_eq!(
        (header.raft_term, header.lease_deadline_unix_us),
        (7, Some(far_us)),
        "what was published during the rebuild is in the region served after it"
    );
    assert_eq!(fragmented.region_stats().live_keys, 850 + 400);
    assert_eq!(version_of(&fragmented, "l0399"), Some(next + 399));
    assert_eq!(version_of(&fragmented, "s0001"), Some(3));
}

/// A local read that loaded the region's reader before a swap may finish
/// on the old region after it (the reader is an `ArcSwap`, not a lock the
/// swap waits on). The old region must then still hold the state at the
/// swap: read through a reader taken before, after a compaction every kept
/// pair is there with its version, and after a clear every pair the clear
/// removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_taken_before_a_swap_reads_the_state_at_the_swap() {
    let dir = tempfile::tempdir().unwrap();
    let sm = common::open(dir.path());
    apply(&mut sm.clone(), fragmenting()).await;
    let kept = |reader: &rdkv_storage::region::RegionReader| {
        for i in (1..1700u64).step_by(2) {
            let key = format!("s{i:04}");
            let found = reader.get(key.as_bytes()).unwrap();
            assert_eq!(
                found.map(|v| (v.version, v.value.len())),
                Some((i + 2, 2000)),
                "{key}"
            );
        }
    };
    let before_compaction = sm.reader();
    let epoch_before = sm.region_epoch();
    let next = sm.applied_index() + 1;
    let large = entries(next, (0..400).map(|i| put(format!("l{i:04}"), 4000, 2)));
    apply(&mut sm.clone(), large).await;
    assert_ne!(sm.region_epoch(), epoch_before, "no compaction ran");
    // `free_replaced` dropped the old region on a blocking thread by now
    // or soon; the reader keeps its memory either way.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    kept(&before_compaction);
    let before_clear = sm.reader();
    let next = sm.applied_index() + 1;
    apply(&mut sm.clone(), entries(next, [Command::Clear])).await;
    assert_eq!(sm.region_stats().live_keys, 0);
    assert_eq!(version_of(&sm, "s0001"), None);
    kept(&before_clear);
    assert!(before_clear.get(b"l0399").unwrap().is_some());
}
