//! Group commit: one thread takes every append callback queued since its last
//! round, fsyncs the active segment once, and completes all of them.
//!
//! Appends enqueue while they still hold the log's state lock, so the file
//! recorded here is always the segment that holds the newest queued entries;
//! older segments were fsynced when the log rolled past them.

use std::fs::File;
use std::io;
use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use openraft::storage::IOFlushed;

use rdkv_proto::shard::ShardId;

use crate::raft::TypeConfig;

/// Counters shared by the store and the flusher thread.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub fsyncs: AtomicU64,
    pub fsync_nanos: AtomicU64,
    pub appends: AtomicU64,
    pub entries_appended: AtomicU64,
    pub entries_flushed: AtomicU64,
    pub flush_rounds: AtomicU64,
    pub max_batch: AtomicU64,
    pub bytes_zeroed_ahead: AtomicU64,
    /// Failpoint (tests only): every segment fsync first sleeps this long.
    pub fsync_delay_us: AtomicU64,
    /// Planted bug (power-loss tests only): group commits complete their
    /// append callbacks without the fsync.
    pub skip_append_fsync: AtomicBool,
    /// The `shard` label of this log's histograms.
    pub shard_label: String,
}

impl Counters {
    pub fn for_shard(shard: ShardId) -> Counters {
        Counters {
            shard_label: shard.to_string(),
            ..Counters::default()
        }
    }

    /// `sync_data` on a segment whose first `written_len()` bytes are its
    /// header and records (the rest is preallocated), counted and timed.
    pub fn sync(&self, file: &File, written_len: impl FnOnce() -> u64) -> io::Result<()> {
        let start = Instant::now();
        let delay_us = self.fsync_delay_us.load(Ordering::Relaxed);
        if delay_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
        }
        let result = crate::durability::sync_data_written(file, written_len);
        let elapsed = start.elapsed();
        metrics::histogram!("rdkv_raft_log_fsync_duration_seconds", "shard" => self.shard_label.clone())
            .record(elapsed.as_secs_f64());
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_nanos.fetch_add(nanos, Ordering::Relaxed);
        result
    }
}

#[derive(Default)]
struct State {
    callbacks: Vec<IOFlushed<TypeConfig>>,
    entries: u64,
    /// The segment holding the newest queued entries, and its written
    /// length (read when the sync starts: a later write it covers too).
    file: Option<(Arc<File>, Arc<AtomicU64>)>,
    /// Set by the first failed fsync, never cleared.
    failed: Option<(io::ErrorKind, String)>,
    /// Tests only: no round starts while set, so appends pile up as they
    /// would behind a slow fsync, without depending on timing.
    held: bool,
    shutdown: bool,
}

struct Queue {
    state: Mutex<State>,
    wake: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic in io_completed (only
        // whole fields are replaced), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) struct Flusher {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub fn start(counters: Arc<Counters>) -> io::Result<Flusher> {
        let queue = Arc::new(Queue {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("rdkv-log-flush".into())
            .spawn(move || run(&q, &counters))?;
        Ok(Flusher {
            queue,
            thread: Some(thread),
        })
    }

    /// Queues `callback` for the next fsync of `file` (the active segment
    /// and its written length).
    pub fn enqueue(
        &self,
        callback: IOFlushed<TypeConfig>,
        entries: u64,
        file: Option<(Arc<File>, Arc<AtomicU64>)>,
    ) {
        let mut st = self.queue.lock();
        st.callbacks.push(callback);
        st.entries += entries;
        if file.is_some() {
            st.file = file;
        }
        drop(st);
        self.queue.wake.notify_one();
    }

    /// Tests only: holds (or releases) the next rounds; what is queued while
    /// held is completed by one round once released.
    pub fn hold(&self, held: bool) {
        self.queue.lock().held = held;
        self.queue.wake.notify_one();
    }

    /// The error of the first failed fsync, if one failed.
    pub fn failure(&self) -> Option<String> {
        self.queue.lock().failed.as_ref().map(|(_, m)| m.clone())
    }

    /// Records a failed fsync done outside the flusher (roll, truncate).
    pub fn poison(&self, error: &io::Error) {
        let mut st = self.queue.lock();
        if st.failed.is_none() {
            st.failed = Some((error.kind(), error.to_string()));
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.queue.lock().shutdown = true;
        self.queue.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // The thread completes everything queued before it exits.
            let _ = thread.join();
        }
    }
}

fn run(queue: &Queue, counters: &Counters) {
    loop {
        let (callbacks, entries, file, failed) = {
            let mut st = queue.lock();
            while (st.callbacks.is_empty() || st.held) && !st.shutdown {
                st = queue.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            if st.callbacks.is_empty() {
                return;
            }
            (
                mem::take(&mut st.callbacks),
                mem::take(&mut st.entries),
                st.file.clone(),
                st.failed.clone(),
            )
        };
        let result = match (failed, file) {
            (Some(failed), _) => Err(failed),
            (None, None) => Ok(()),
            (None, Some(_)) if counters.skip_append_fsync.load(Ordering::Relaxed) => Ok(()),
            // The length is read inside the call, after the sync's place in
            // the durability journal is taken (test mode): a roll syncing
            // this segment meanwhile is then the newer sync there.
            (None, Some((file, written))) => counters.sync(&file, || written.load(Ordering::Acquire)).map_err(|e| {
                tracing::error!(error = %e, "raft log fsync failed; completing {} appends with the error", callbacks.len());
                let failed = (e.kind(), format!("raft log fsync failed: {e}"));
                let mut st = queue.lock();
                if st.failed.is_none() {
                    st.failed = Some(failed.clone());
                }
                failed
            }),
        };
        counters.flush_rounds.fetch_add(1, Ordering::Relaxed);
        counters
            .max_batch
            .fetch_max(callbacks.len() as u64, Ordering::Relaxed);
        if result.is_ok() {
            counters
                .entries_flushed
                .fetch_add(entries, Ordering::Relaxed);
            metrics::histogram!("rdkv_raft_log_entries_per_fsync", "shard" => counters.shard_label.clone())
                .record(entries as f64);
        }
        for callback in callbacks {
            let r = match &result {
                Ok(()) => Ok(()),
                Err((kind, message)) => Err(io::Error::new(*kind, message.clone())),
            };
            callback.io_completed(r);
        }
    }
}
