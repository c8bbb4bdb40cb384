//! The durable Raft log: restart, torn and corrupt tails, corruption that
//! must stop the node, truncate/purge durability, segment rolling, group
//! commit and bounded allocation on hostile lengths.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::log_id;
use openraft::type_config::TypeConfigExt;
use rdkv_storage::raft::{Command, Entry, LogId, TypeConfig, Vote};
use rdkv_storage::raft_log::segment;
use rdkv_storage::raft_log::{DEFAULT_MAX_RECORD_SIZE, Damage, LogError, LogOptions, LogStore};

// ---------------------------------------------------------------- allocation probe

/// Records the largest single allocation made on a thread while tracking is
/// on there, so a test can show that a hostile length is never allocated.
struct Probe;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

// SAFETY: forwards to the system allocator unchanged; the bookkeeping only
// touches const-initialised thread-locals and never allocates.
unsafe impl GlobalAlloc for Probe {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Probe = Probe;

/// Runs `f` and returns its result with the largest allocation it made on
/// this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    TRACKING.with(|t| t.set(true));
    let out = f();
    TRACKING.with(|t| t.set(false));
    (out, LARGEST.with(|l| l.get()))
}

// ---------------------------------------------------------------- helpers

fn lid(term: u64, index: u64) -> LogId {
    log_id::<TypeConfig>(term, 1, index)
}

/// A Put whose value size varies with the index (up to ~3 KiB).
fn entry(term: u64, index: u64) -> Entry {
    let size = (index as usize * 37) % 3000;
    let value: Vec<u8> = (0..size).map(|i| (i as u64 ^ index) as u8).collect();
    Entry::new_normal(
        lid(term, index),
        Command::Put {
            key: Bytes::from(format!("key-{index}")),
            value: Bytes::from(value),
        },
    )
}

fn entries(term: u64, range: std::ops::Range<u64>) -> Vec<Entry> {
    range.map(|i| entry(term, i)).collect()
}

/// Appends and waits for the fsync callback.
async fn append(store: &mut LogStore, entries: Vec<Entry>) -> io::Result<()> {
    let (tx, rx) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await?;
    rx.await.map_err(io::Error::other)?
}

async fn all_entries(store: &mut LogStore) -> Vec<Entry> {
    store.try_get_log_entries(..).await.unwrap()
}

/// Equal entries, reported by log id (values are too long to print).
#[track_caller]
fn assert_entries(actual: &[Entry], expected: &[Entry]) {
    let ids = |es: &[Entry]| es.iter().map(|e| e.log_id).collect::<Vec<_>>();
    assert_eq!(ids(actual), ids(expected));
    assert!(actual == expected, "same log ids, different payloads");
}

/// A new directory holding a log of `written` (appended with `options`),
/// closed again.
async fn closed_log(options: LogOptions, written: Vec<Entry>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), options).unwrap();
    append(&mut store, written).await.unwrap();
    store.trim_preallocation().unwrap();
    dir
}

/// Opens the log in `dir` again and checks that it holds exactly `expected`.
async fn reopen(dir: &Path, options: LogOptions, expected: &[Entry]) -> LogStore {
    let mut store = LogStore::open(dir, options).unwrap();
    assert_entries(&all_entries(&mut store).await, expected);
    store
}

fn small_segments() -> LogOptions {
    LogOptions {
        segment_size: 8 * 1024,
        cache_bytes: 0,
        ..LogOptions::default()
    }
}

fn segment_files(dir: &Path) -> Vec<(u64, PathBuf)> {
    segment::segment_files(dir).unwrap().into_iter().collect()
}

fn last_segment(dir: &Path) -> PathBuf {
    segment_files(dir).pop().unwrap().1
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x40;
    fs::write(path, bytes).unwrap();
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// Where a segment file's intact records end (its preallocated tail, if
/// any, after).
fn written_len(path: &Path) -> u64 {
    segment::read_segment(path, DEFAULT_MAX_RECORD_SIZE)
        .unwrap()
        .end
}

/// Offsets of the intact records in a segment file.
fn record_offsets(path: &Path) -> Vec<u64> {
    segment::read_segment(path, DEFAULT_MAX_RECORD_SIZE)
        .unwrap()
        .records
        .iter()
        .map(|r| r.offset)
        .collect()
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn a_damaged_committed_file_reads_as_unknown() {
    // The committed index is advisory (written without fsync): a crash can
    // leave its file empty or torn, and the log must still open.
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
        append(&mut store, entries(1, 0..10)).await.unwrap();
        store.save_committed(Some(lid(1, 9))).await.unwrap();
    }
    std::fs::write(dir.path().join("committed"), b"").unwrap();
    let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(store.read_committed().await.unwrap(), None);
    assert_entries(&all_entries(&mut store).await, &entries(1, 0..10));
    drop(store);
    std::fs::write(dir.path().join("committed"), b"\x05\0\0\0garbage").unwrap();
    let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
    assert_eq!(store.read_committed().await.unwrap(), None);
}

#[tokio::test]
async fn reopen_restores_entries_vote_and_committed() {
    let dir = tempfile::tempdir().unwrap();
    let written = entries(1, 0..200);
    let vote = Vote::new_committed(3, 2);
    {
        let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), None);
        assert_eq!(store.read_committed().await.unwrap(), None);
        for chunk in written.chunks(17) {
            append(&mut store, chunk.to_vec()).await.unwrap();
        }
        store.save_vote(&vote).await.unwrap();
        store.save_committed(Some(lid(1, 150))).await.unwrap();
        let stats = store.stats();
        assert_eq!(stats.entries_appended, 200);
        assert_eq!(stats.entries_flushed, 200);
        assert_eq!((stats.first_index, stats.last_index), (Some(0), Some(199)));
    }
    let mut store = reopen(dir.path(), LogOptions::default(), &written).await;
    assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    assert_eq!(store.persisted_vote().get(), Some(vote));
    assert_eq!(store.read_committed().await.unwrap(), Some(lid(1, 150)));
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(lid(1, 199)));
    assert_eq!(state.last_purged_log_id, None);
    assert_entries(
        &store.try_get_log_entries(50..53).await.unwrap(),
        &written[50..53],
    );
    // Appending continues where the log ends, and nowhere else.
    let err = append(&mut store, vec![entry(1, 201)]).await.unwrap_err();
    assert!(err.to_string().contains("not contiguous"), "{err}");
    append(&mut store, vec![entry(2, 200)]).await.unwrap();
    assert_eq!(store.stats().last_index, Some(200));
}

#[tokio::test]
async fn a_torn_last_record_is_cut_off_and_appends_continue() {
    let dir = closed_log(LogOptions::default(), entries(1, 0..10)).await;
    // Cut the last record in half.
    let seg = last_segment(dir.path());
    let last = *record_offsets(&seg).last().unwrap();
    let half = last + (file_len(&seg) - last) / 2;
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(half)
        .unwrap();

    let mut store = reopen(dir.path(), LogOptions::default(), &entries(1, 0..9)).await;
    assert_eq!(written_len(&seg), last, "the torn bytes are truncated away");
    assert_eq!(
        store.get_log_state().await.unwrap().last_log_id,
        Some(lid(1, 8))
    );
    // The lost index is written again (by a new leader), then more.
    append(&mut store, entries(2, 9..12)).await.unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
    let mut expected = entries(1, 0..9);
    expected.extend(entries(2, 9..12));
    assert_entries(&all_entries(&mut store).await, &expected);
}

#[tokio::test]
async fn garbage_after_the_last_record_is_cut_off() {
    let dir = closed_log(LogOptions::default(), entries(1, 0..10)).await;
    let seg = last_segment(dir.path());
    let intact = file_len(&seg);
    for garbage in [&[0xde, 0xad, 0xbe][..], &[0u8; 4096][..], &[7u8; 100][..]] {
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(garbage).unwrap();
        drop(f);
        let store = reopen(dir.path(), LogOptions::default(), &entries(1, 0..10)).await;
        assert_eq!(written_len(&seg), intact);
        // The next garbage goes right after the last record again.
        store.trim_preallocation().unwrap();
        assert_eq!(file_len(&seg), intact);
    }
}

#[tokio::test]
async fn a_crc_flip_in_the_last_record_truncates_it() {
    let dir = closed_log(LogOptions::default(), entries(1, 0..10)).await;
    let seg = last_segment(dir.path());
    let last = *record_offsets(&seg).last().unwrap();
    flip_byte(&seg, file_len(&seg) - 1);
    let store = reopen(dir.path(), LogOptions::default(), &entries(1, 0..9)).await;
    assert_eq!(written_len(&seg), last);
    // A flipped CRC field (not payload) is found the same way.
    drop(store);
    let last = *record_offsets(&seg).last().unwrap();
    flip_byte(&seg, last + 5);
    reopen(dir.path(), LogOptions::default(), &entries(1, 0..8)).await;
}

#[tokio::test]
async fn corruption_in_a_middle_segment_fails_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), small_segments()).unwrap();
        append(&mut store, entries(1, 0..60)).await.unwrap();
        assert!(store.stats().segments >= 4, "{:?}", store.stats());
    }
    let segs = segment_files(dir.path());
    let (_, middle) = &segs[segs.len() / 2];
    let offsets = record_offsets(middle);
    flip_byte(middle, offsets[offsets.len() / 2] + 12);
    let err = LogStore::open(dir.path(), small_segments()).unwrap_err();
    match &err {
        LogError::CorruptSegment {
            path,
            offset,
            damage,
        } => {
            assert_eq!(path, middle);
            assert_eq!(*offset, offsets[offsets.len() / 2]);
            assert!(matches!(damage, Damage::Record(_)), "{damage:?}");
        }
        other => panic!("expected CorruptSegment, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("corrupt") && message.contains(&middle.display().to_string()));
    // openraft sees it as InvalidData.
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn a_missing_middle_segment_is_a_gap() {
    let dir = closed_log(small_segments(), entries(1, 0..60)).await;
    let segs = segment_files(dir.path());
    let (_, middle) = &segs[segs.len() / 2];
    let (next_first, _) = segs[segs.len() / 2 + 1];
    let (middle_first, _) = segs[segs.len() / 2];
    fs::remove_file(middle).unwrap();
    match LogStore::open(dir.path(), small_segments()) {
        Err(LogError::Gap {
            expected, found, ..
        }) => {
            assert_eq!(expected, middle_first);
            assert_eq!(found, next_first);
        }
        other => panic!("expected a gap, got {other:?}"),
    }
}

#[tokio::test]
async fn truncate_after_and_purge_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), small_segments()).unwrap();
        append(&mut store, entries(1, 0..60)).await.unwrap();
        store.truncate_after(Some(lid(1, 40))).await.unwrap();
        store.purge(lid(1, 12)).await.unwrap();
        // Conflicting entries replaced by a new leader's.
        append(&mut store, entries(2, 41..45)).await.unwrap();
        assert_eq!(store.stats().first_index, Some(13));
    }
    let expected: Vec<Entry> = entries(1, 13..41)
        .into_iter()
        .chain(entries(2, 41..45))
        .collect();
    let mut store = reopen(dir.path(), small_segments(), &expected).await;
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(lid(1, 12)));
    assert_eq!(state.last_log_id, Some(lid(2, 44)));
    assert!(store.try_get_log_entries(0..13).await.unwrap().is_empty());
    // Purged entries are missing at the start only.
    assert_entries(
        &store.try_get_log_entries(10..15).await.unwrap(),
        &entries(1, 13..15),
    );
    // Whole segments at or below the purge point are gone from the disk.
    let segs = segment_files(dir.path());
    assert!(segs[0].0 <= 13, "{segs:?}");
    assert!(segs.len() < 2 || segs[1].0 > 13, "{segs:?}");

    // Truncating into an earlier segment deletes the later ones.
    store.truncate_after(Some(lid(1, 20))).await.unwrap();
    drop(store);
    let mut store = reopen(dir.path(), small_segments(), &entries(1, 13..21)).await;
    assert!(
        segment_files(dir.path())
            .iter()
            .all(|(first, _)| *first <= 20)
    );

    // Purging past the end empties the log; it resumes after the purge point.
    store.purge(lid(3, 30)).await.unwrap();
    assert!(segment_files(dir.path()).is_empty());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(lid(3, 30)));
    append(&mut store, entries(3, 31..33)).await.unwrap();
    drop(store);
    let mut store = reopen(dir.path(), small_segments(), &entries(3, 31..33)).await;
    assert_eq!(
        store.get_log_state().await.unwrap().last_purged_log_id,
        Some(lid(3, 30))
    );

    // truncate_after(None) removes everything after the purge point.
    store.truncate_after(None).await.unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path(), small_segments()).unwrap();
    assert!(all_entries(&mut store).await.is_empty());
    assert_eq!(
        store.get_log_state().await.unwrap().last_log_id,
        Some(lid(3, 30))
    );
}

#[tokio::test]
async fn segments_roll_at_the_configured_size() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions {
        segment_size: 4096,
        ..LogOptions::default()
    };
    let written = entries(1, 5..105);
    {
        let mut store = LogStore::open(dir.path(), options.clone()).unwrap();
        // One append spanning many segments, then many small ones.
        append(&mut store, written[..50].to_vec()).await.unwrap();
        for e in &written[50..] {
            append(&mut store, vec![e.clone()]).await.unwrap();
        }
        store.trim_preallocation().unwrap();
        let stats = store.stats();
        let segs = segment_files(dir.path());
        assert_eq!(stats.segments, segs.len() as u64);
        assert!(segs.len() > 10, "{} segments", segs.len());
        assert_eq!(
            stats.bytes_on_disk,
            segs.iter().map(|(_, p)| file_len(p)).sum::<u64>()
        );
    }
    let segs = segment_files(dir.path());
    assert_eq!(segs[0].0, 5);
    for (_, path) in &segs {
        let len = file_len(path);
        let records = record_offsets(path).len();
        assert!(records >= 1);
        // Over the size only when a single record does not fit.
        assert!(
            len <= 4096 || records == 1,
            "{path:?}: {len} bytes, {records} records"
        );
    }
    // Each segment is named after its first entry.
    let mut store = LogStore::open(dir.path(), options).unwrap();
    let mut expected_first = 5;
    for (first, path) in &segs {
        assert_eq!(*first, expected_first, "{path:?}");
        expected_first += record_offsets(path).len() as u64;
    }
    assert_eq!(expected_first, 105);
    assert_entries(&all_entries(&mut store).await, &written);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_queued_behind_an_fsync_share_the_next_one() {
    const APPENDS: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
    // The first append creates the segment (whose header has its own fsync).
    let (tx, rx) = TypeConfig::oneshot();
    store
        .append(vec![entry(1, 0)], IOFlushed::signal(tx))
        .await
        .unwrap();
    rx.await.unwrap().unwrap();
    let before = store.stats();
    // As behind a slow fsync: every append is written and queued before the
    // flusher may start a round.
    store.hold_flushes(true);
    let mut flushed = Vec::new();
    for index in 1..=APPENDS {
        let (tx, rx) = TypeConfig::oneshot();
        store
            .append(vec![entry(1, index)], IOFlushed::signal(tx))
            .await
            .unwrap();
        flushed.push(rx);
    }
    tokio::task::yield_now().await;
    let held = store.stats();
    assert_eq!(held.entries_flushed, 1, "acknowledged while held: {held:?}");
    store.hold_flushes(false);
    for rx in flushed {
        rx.await.unwrap().unwrap();
    }
    let stats = store.stats();
    println!(
        "group commit: {} appends, {} fsyncs, {} flush rounds, largest batch {}",
        stats.appends, stats.fsyncs, stats.flush_rounds, stats.max_batch
    );
    assert_eq!(stats.appends, APPENDS + 1);
    assert_eq!(stats.entries_flushed, APPENDS + 1, "every callback fired");
    assert_eq!(stats.flush_rounds - before.flush_rounds, 1, "{stats:?}");
    assert_eq!(stats.fsyncs - before.fsyncs, 1, "{stats:?}");
    // The fsync's time is counted too (the metric of fsync latency).
    assert!(stats.fsync_nanos > before.fsync_nanos, "{stats:?}");
    assert_eq!(stats.max_batch, APPENDS, "{stats:?}");
    assert_entries(&all_entries(&mut store).await, &entries(1, 0..APPENDS + 1));
}

#[test]
fn a_huge_declared_length_at_the_tail_is_torn_not_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
        append(&mut store, entries(1, 0..5)).await.unwrap();
    });
    let seg = last_segment(dir.path());
    let intact = file_len(&seg);
    // Above the limit (4 GiB) and below it but past the end of the file.
    for declared in [0xffff_fff0u32, 60 * 1024 * 1024] {
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&declared.to_le_bytes()).unwrap();
        f.write_all(&[0x55; 4]).unwrap();
        f.write_all(&[1u8; 100]).unwrap();
        drop(f);
        let (store, largest) =
            largest_allocation(|| LogStore::open(dir.path(), LogOptions::default()));
        let mut store = store.unwrap();
        assert!(largest < 4 * 1024 * 1024, "allocated {largest} bytes");
        assert_eq!(file_len(&seg), intact);
        rt.block_on(async {
            assert_entries(&all_entries(&mut store).await, &entries(1, 0..5));
        });
    }
}

#[tokio::test]
async fn a_corrupt_vote_file_is_an_error_not_none() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
        store.save_vote(&Vote::new(4, 1)).await.unwrap();
        store.save_vote(&Vote::new_committed(5, 2)).await.unwrap();
        assert!(!dir.path().join("vote.tmp").exists());
    }
    let vote = dir.path().join("vote");
    flip_byte(&vote, file_len(&vote) - 1);
    match LogStore::open(dir.path(), LogOptions::default()) {
        Err(LogError::CorruptFile { path, .. }) => assert_eq!(path, vote),
        other => panic!("expected a corrupt vote file, got {other:?}"),
    }
    // A torn (empty) vote file too.
    fs::write(&vote, b"").unwrap();
    assert!(matches!(
        LogStore::open(dir.path(), LogOptions::default()),
        Err(LogError::CorruptFile { .. })
    ));
}

#[tokio::test]
async fn the_directory_is_locked_and_oversized_entries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions {
        max_record_size: 1024,
        ..LogOptions::default()
    };
    let mut store = LogStore::open(dir.path(), options.clone()).unwrap();
    assert!(matches!(
        LogStore::open(dir.path(), options.clone()),
        Err(LogError::Locked { .. })
    ));
    let big = Entry::new_normal(
        lid(1, 1),
        Command::Put {
            key: Bytes::from_static(b"big"),
            value: Bytes::from(vec![9u8; 2000]),
        },
    );
    let err = append(&mut store, vec![entry(1, 0), big])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    drop(store);
    // Nothing of the refused append was kept (or locked).
    let mut store = LogStore::open(dir.path(), options).unwrap();
    assert!(all_entries(&mut store).await.is_empty());
}

/// A Put of `bytes` value bytes at `index`.
fn sized_entry(index: u64, bytes: usize) -> Entry {
    Entry::new_normal(
        lid(1, index),
        Command::Put {
            key: Bytes::from(format!("key-{index}")),
            value: Bytes::from(vec![index as u8; bytes]),
        },
    )
}

#[tokio::test]
async fn a_segment_takes_records_up_to_exactly_its_size() {
    let written: Vec<Entry> = (1..=3).map(|i| sized_entry(i, 100 * i as usize)).collect();
    // The three records' sizes, from a log whose segment holds them all.
    let probe = closed_log(LogOptions::default(), written.clone()).await;
    let offsets = record_offsets(&last_segment(probe.path()));
    assert_eq!(offsets.len(), 3);
    // The first two records fill the segment to the byte; the third one
    // would take it over by its whole size.
    let exact = LogOptions {
        segment_size: offsets[2],
        ..small_segments()
    };
    for one_append in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path(), exact.clone()).unwrap();
        if one_append {
            append(&mut store, written.clone()).await.unwrap();
        } else {
            for e in &written {
                append(&mut store, vec![e.clone()]).await.unwrap();
            }
        }
        let segs = segment_files(dir.path());
        let firsts: Vec<u64> = segs.iter().map(|(first, _)| *first).collect();
        assert_eq!(firsts, [1, 3], "one append: {one_append}");
        assert_eq!(file_len(&segs[0].1), exact.segment_size);
        assert_entries(&all_entries(&mut store).await, &written);
    }
}

#[tokio::test]
async fn a_last_segment_cut_back_to_its_header_is_removed_at_open() {
    let options = LogOptions {
        segment_size: 1024,
        ..small_segments()
    };
    let written: Vec<Entry> = (1..=3).map(|i| sized_entry(i, 3000)).collect();
    let dir = closed_log(options.clone(), written.clone()).await;
    // Each oversized record has a segment of its own. Cut the last one back
    // to its header, as a crash right after the segment's roll can leave it.
    let segs = segment_files(dir.path());
    assert_eq!(segs.len(), 3);
    let offsets = record_offsets(&segs[2].1);
    OpenOptions::new()
        .write(true)
        .open(&segs[2].1)
        .unwrap()
        .set_len(offsets[0])
        .unwrap();
    let mut store = reopen(dir.path(), options, &written[..2]).await;
    assert_eq!(
        segment_files(dir.path()).len(),
        2,
        "the empty segment stayed"
    );
    // The entry that replaces it starts a segment of the same name.
    append(&mut store, vec![sized_entry(3, 5000)])
        .await
        .unwrap();
    let firsts: Vec<u64> = segment_files(dir.path()).iter().map(|s| s.0).collect();
    assert_eq!(firsts, [1, 2, 3]);
    assert_eq!(store.stats().last_index, Some(3));
}

#[tokio::test]
async fn a_leftover_temporary_file_that_cannot_be_removed_fails_open() {
    let dir = closed_log(LogOptions::default(), entries(1, 0..3)).await;
    // A directory where the vote's temporary file would be: removing it
    // fails with something other than "not found", which must not be ignored.
    fs::create_dir_all(dir.path().join("vote.tmp").join("inside")).unwrap();
    let err = LogStore::open(dir.path(), LogOptions::default()).err();
    assert!(matches!(err, Some(LogError::Io { .. })), "{err:?}");
    fs::remove_dir_all(dir.path().join("vote.tmp")).unwrap();
    reopen(dir.path(), LogOptions::default(), &entries(1, 0..3)).await;
}

#[tokio::test]
async fn an_injected_fsync_delay_delays_the_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
    let delay = std::time::Duration::from_millis(300);
    store.set_fsync_delay(delay);
    // A lower bound only: the delay is a sleep, which never ends early.
    let started = std::time::Instant::now();
    append(&mut store, entries(1, 0..2)).await.unwrap();
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    store.set_fsync_delay(std::time::Duration::ZERO);
    append(&mut store, entries(1, 2..4)).await.unwrap();
}

#[test]
fn a_zero_segment_size_or_record_size_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    for (segment_size, max_record_size) in [(0, 1024), (4096, 0), (0, 0)] {
        let options = LogOptions {
            segment_size,
            max_record_size,
            ..LogOptions::default()
        };
        let err = LogStore::open(dir.path(), options).err();
        assert!(
            matches!(err, Some(LogError::InvalidOptions(_))),
            "{segment_size}/{max_record_size}: {err:?}"
        );
    }
}

#[tokio::test]
async fn a_damaged_header_of_the_last_segment_fails_open() {
    // A header that was written and is wrong is damage, not an interrupted
    // roll: recovery refuses it instead of deleting acknowledged entries.
    let dir = closed_log(small_segments(), entries(1, 0..40)).await;
    let segs = segment_files(dir.path());
    assert!(segs.len() >= 2);
    flip_byte(&last_segment(dir.path()), 0);
    let err = LogStore::open(dir.path(), small_segments()).err();
    assert!(
        matches!(err, Some(LogError::BadSegmentHeader { .. })),
        "{err:?}"
    );
    assert_eq!(
        segment_files(dir.path()).len(),
        segs.len(),
        "a segment was removed"
    );
}

#[tokio::test]
async fn a_missing_first_segment_after_a_purge_is_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), small_segments()).unwrap();
        append(&mut store, entries(1, 0..60)).await.unwrap();
        store.purge(lid(1, 5)).await.unwrap();
    }
    // The oldest remaining segment holds entries right after the purge
    // point; without it the log would start past purged + 1.
    let segs = segment_files(dir.path());
    assert!(segs.len() >= 3 && segs[0].0 <= 6, "{segs:?}");
    fs::remove_file(&segs[0].1).unwrap();
    let err = LogStore::open(dir.path(), small_segments()).err();
    assert!(matches!(err, Some(LogError::Gap { .. })), "{err:?}");
}

#[tokio::test]
async fn a_committed_index_past_the_recovered_end_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path(), LogOptions::default()).unwrap();
        append(&mut store, entries(1, 0..10)).await.unwrap();
        store.save_committed(Some(lid(1, 9))).await.unwrap();
    }
    // Entry 9's record torn off: the log now ends at 8.
    let path = last_segment(dir.path());
    let last_record = *record_offsets(&path).last().unwrap();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(last_record + 3)
        .unwrap();
    let mut store = reopen(dir.path(), LogOptions::default(), &entries(1, 0..9)).await;
    assert_eq!(store.read_committed().await.unwrap(), Some(lid(1, 8)));
}

/// The flags `filefrag -v` gives the extent holding byte `offset` of
/// `path`, or `None` where the tool is missing (the check is then skipped).
fn extent_flags(path: &Path, offset: u64) -> Option<String> {
    let out = std::process::Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let block = offset / 4096;
    // Extent lines: "   0:        0..     108:   64487939..  64488046:    109:   flags".
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        let range = fields.get(1)?;
        let (first, last) = range.split_once("..")?;
        let (first, last) = (
            first.trim().parse::<u64>().ok()?,
            last.trim().parse::<u64>().ok()?,
        );
        (first..=last).contains(&block).then(|| {
            fields
                .last()
                .map_or(String::new(), |f| f.trim().to_string())
        })
    })
}

#[tokio::test]
async fn zeros_are_written_ahead_of_the_records_and_never_over_them() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions {
        segment_size: 4 * 1024 * 1024,
        cache_bytes: 0,
        ..LogOptions::default()
    };
    let written: Vec<Entry> = (0..2_500).map(|i| sized_entry(i, 1_000)).collect();
    let mut store = LogStore::open(dir.path(), options.clone()).unwrap();
    for batch in written.chunks(25) {
        append(&mut store, batch.to_vec()).await.unwrap();
    }
    let stats = store.stats();
    let seg = last_segment(dir.path());
    let end = written_len(&seg);
    assert_eq!(stats.segments, 1);
    // Zeros ran ahead of every record written, within the segment.
    assert!(
        stats.bytes_zeroed_ahead >= end && stats.bytes_zeroed_ahead <= options.segment_size,
        "zeroed {} for {end} bytes of records",
        stats.bytes_zeroed_ahead
    );
    assert_eq!(
        file_len(&seg),
        options.segment_size,
        "the size is the preallocation's"
    );
    // Past the last record the file holds written zeros, not unwritten
    // extents (ext4 and XFS report those; other filesystems skip this).
    match extent_flags(&seg, end + 4096) {
        Some(flags) => assert!(
            !flags.contains("unwritten"),
            "extent past the records: {flags}"
        ),
        None => eprintln!("filefrag is missing: extent check skipped"),
    }
    // Records are intact after a cut in the middle and more appends.
    store.truncate_after(Some(lid(1, 1_999))).await.unwrap();
    let more: Vec<Entry> = (2_000..3_000).map(|i| sized_entry(i, 900)).collect();
    for batch in more.chunks(50) {
        append(&mut store, batch.to_vec()).await.unwrap();
    }
    drop(store);
    let expected: Vec<Entry> = written[..2_000].iter().chain(&more).cloned().collect();
    reopen(dir.path(), options, &expected).await;
}

#[tokio::test]
async fn the_active_segment_is_preallocated_and_its_zero_tail_is_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let options = small_segments();
    {
        let mut store = LogStore::open(dir.path(), options.clone()).unwrap();
        append(&mut store, entries(1, 0..3)).await.unwrap();
        let seg = last_segment(dir.path());
        assert_eq!(file_len(&seg), options.segment_size, "not preallocated");
        assert!(written_len(&seg) < options.segment_size);
        // Dropped without `trim_preallocation`, as a killed node leaves it.
    }
    let store = reopen(dir.path(), options.clone(), &entries(1, 0..3)).await;
    let seg = last_segment(dir.path());
    assert_eq!(file_len(&seg), options.segment_size, "preallocated again");
    store.trim_preallocation().unwrap();
    assert_eq!(file_len(&seg), written_len(&seg));
    assert_eq!(record_offsets(&seg).len(), 3);
    drop(store);

    let unallocated = LogOptions {
        preallocate: false,
        ..options
    };
    let mut store = reopen(dir.path(), unallocated, &entries(1, 0..3)).await;
    append(&mut store, entries(1, 3..4)).await.unwrap();
    assert_eq!(file_len(&seg), written_len(&seg));
}
