//! One thread per completion queue. It polls the queue (sideway 0.4 does
//! not wrap `ibv_req_notify_cq`, so there is no completion-channel wakeup to
//! wait on), looks each completion's `wr_id` up in the work-request table
//! and hands it to what posted it. A completion whose id is stale (its
//! request already completed or was failed at teardown) matches nothing and
//! is dropped.
//!
//! Idle cost: the thread spins briefly after a completion (the next one is
//! usually microseconds away), then yields, then sleeps 50 µs between polls:
//! a few thousand wakeups a second at most, and at most 50 µs of added
//! latency after an idle period.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sideway::ibverbs::completion::{GenericCompletionQueue, PollCompletionQueueError};

use super::connection::{ConnShared, ReadBatch};
use crate::rdma::error::RdmaError;
use crate::rdma::wr_table::WrTable;

const SPIN_POLLS: u32 = 2_000;
const YIELD_POLLS: u32 = 4_000;
const IDLE_SLEEP: Duration = Duration::from_micros(50);

/// What a posted work request was for.
#[derive(Debug)]
pub(crate) enum WrKind {
    /// A receive buffer (`slot`) of a connection.
    Recv { conn: Arc<ConnShared>, slot: u32 },
    /// A send buffer (`slot`) of a connection.
    Send { conn: Arc<ConnShared>, slot: u32 },
    /// One READ of a batch.
    Read { batch: Arc<ReadBatch> },
}

impl WrKind {
    pub(crate) fn conn_id(&self) -> u64 {
        match self {
            WrKind::Recv { conn, .. } | WrKind::Send { conn, .. } => conn.id(),
            WrKind::Read { batch } => batch.conn_id(),
        }
    }

    /// Teardown: the request will never complete.
    pub(crate) fn abandon(self, reason: &RdmaError) {
        if let WrKind::Read { batch } = self {
            batch.complete_one(Some(reason.clone()));
        }
    }
}

#[derive(Debug)]
pub(crate) struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    pub(crate) fn start(
        cq: GenericCompletionQueue,
        table: Arc<Mutex<WrTable<WrKind>>>,
        device: &str,
    ) -> Result<Poller, RdmaError> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name(format!("rdkv-cq-{device}"))
            .spawn({
                let stop = Arc::clone(&stop);
                move || poll_loop(&cq, &table, &stop)
            })
            .map_err(|e| RdmaError::verbs("spawning the completion poller", e))?;
        Ok(Poller {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // The last reference to the context can be dropped by the poller
            // itself (a completion that held the last connection): it then
            // just exits its loop; a thread cannot join itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn poll_loop(cq: &GenericCompletionQueue, table: &Mutex<WrTable<WrKind>>, stop: &AtomicBool) {
    let mut idle_polls = 0u32;
    while !stop.load(Ordering::Relaxed) {
        match cq.start_poll() {
            Ok(completions) => {
                idle_polls = 0;
                for wc in completions {
                    let kind = table
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take(wc.wr_id());
                    let Some(kind) = kind else {
                        tracing::trace!(
                            wr_id = wc.wr_id(),
                            "completion of a stale request ignored"
                        );
                        continue;
                    };
                    let error = RdmaError::from_completion(wc.status(), wc.vendor_err());
                    dispatch(kind, error, wc.byte_len());
                }
            }
            Err(PollCompletionQueueError::CompletionQueueEmpty) => {
                idle_polls = idle_polls.saturating_add(1);
                if idle_polls < SPIN_POLLS {
                    std::hint::spin_loop();
                } else if idle_polls < YIELD_POLLS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(IDLE_SLEEP);
                }
            }
            Err(e) => {
                tracing::error!("polling the completion queue failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn dispatch(kind: WrKind, error: Option<RdmaError>, byte_len: u32) {
    match kind {
        WrKind::Recv { conn, slot } => conn.on_recv(slot, error, byte_len),
        WrKind::Send { conn, slot } => conn.on_send_done(slot, error),
        WrKind::Read { batch } => batch.complete_one(error),
    }
}
