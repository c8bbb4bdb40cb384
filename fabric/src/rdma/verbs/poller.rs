//! One thread per completion queue. It polls the queue, looks each
//! completion's `wr_id` up in the work-request table and hands it to what
//! posted it. A completion whose id is stale (its request already completed
//! or was failed at teardown) matches nothing and is dropped.
//!
//! Idle: after a completion it polls again at once (spinning, then
//! yielding), then arms the queue's notification and sleeps on the
//! completion channel until the device signals the next completion
//! (`rdma::poll_policy`: about ten wakeups a second when idle). sideway 0.4
//! creates the channel but does not wrap arming or reading it; those three
//! calls go to rdma-core through `rdma-mummy-sys`, the bindings sideway
//! itself is built on.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sideway::ibverbs::completion::{
    CompletionChannel, CompletionQueue, GenericCompletionQueue, PollCompletionQueueError,
};

use super::connection::{ConnShared, ReadBatch};
use crate::rdma::error::RdmaError;
use crate::rdma::poll_policy::{IdleStep, idle_step};
use crate::rdma::wr_table::WrTable;

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
            WrKind::Read { batch } => batch.conn().id(),
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
        channel: Arc<CompletionChannel>,
        table: Arc<Mutex<WrTable<WrKind>>>,
        device_failed: Arc<AtomicBool>,
        device: &str,
    ) -> Result<Poller, RdmaError> {
        channel
            .set_nonblocking(true)
            .map_err(|e| RdmaError::verbs("making the completion channel non-blocking", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name(format!("rdkv-cq-{device}"))
            .spawn({
                let stop = Arc::clone(&stop);
                move || poll_loop(&cq, &channel, &table, &stop, &device_failed)
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

fn poll_loop(
    cq: &GenericCompletionQueue,
    channel: &CompletionChannel,
    table: &Mutex<WrTable<WrKind>>,
    stop: &AtomicBool,
    device_failed: &AtomicBool,
) {
    let mut empty_polls = 0u32;
    // After a fatal device event (`rdma::async_event`) every connection
    // was failed and the queue may be in error: nothing more completes.
    while !stop.load(Ordering::Relaxed) && !device_failed.load(Ordering::Acquire) {
        match poll_once(cq, table) {
            Ok(true) => empty_polls = 0,
            Ok(false) => {
                match idle_step(empty_polls) {
                    IdleStep::Spin => std::hint::spin_loop(),
                    IdleStep::Yield => std::thread::yield_now(),
                    IdleStep::Sleep(at_most) => {
                        if let Err(e) = sleep_on_channel(cq, channel, table, at_most) {
                            tracing::error!("waiting on the completion channel: {e}");
                            std::thread::sleep(at_most);
                        }
                    }
                }
                empty_polls = empty_polls.saturating_add(1);
            }
            Err(e) => {
                tracing::error!("polling the completion queue failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Polls once, dispatching what completed; `Ok(false)`: the queue was empty.
fn poll_once(
    cq: &GenericCompletionQueue,
    table: &Mutex<WrTable<WrKind>>,
) -> Result<bool, PollCompletionQueueError> {
    let completions = match cq.start_poll() {
        Ok(completions) => completions,
        Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(false),
        Err(e) => return Err(e),
    };
    for wc in completions {
        let kind = table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(wc.wr_id());
        let Some(kind) = kind else {
            tracing::trace!(wr_id = wc.wr_id(), "completion of a stale request ignored");
            continue;
        };
        let error = RdmaError::from_completion(wc.status(), wc.vendor_err());
        dispatch(kind, error, wc.byte_len());
    }
    Ok(true)
}

/// Arms the queue's notification, polls once more (a completion that came
/// before arming raises no event), then sleeps until the channel signals
/// one or `at_most` passes. Every event read is acknowledged at once
/// (`ibv_destroy_cq` waits for unacknowledged events).
fn sleep_on_channel(
    cq: &GenericCompletionQueue,
    channel: &CompletionChannel,
    table: &Mutex<WrTable<WrKind>>,
    at_most: Duration,
) -> Result<(), RdmaError> {
    // SAFETY: `cq` is a live completion queue (the `GenericCompletionQueue`
    // keeps it, and the context joins this thread before dropping it); the
    // pointer is used for this call only.
    let armed = unsafe { rdma_mummy_sys::ibv_req_notify_cq(cq.cq().as_ptr(), 0) };
    if armed != 0 {
        return Err(RdmaError::verbs(
            "ibv_req_notify_cq",
            std::io::Error::from_raw_os_error(armed),
        ));
    }
    if poll_once(cq, table).map_err(|e| RdmaError::verbs("ibv_poll_cq", e))? {
        return Ok(());
    }
    // SAFETY: the channel's fd lives as long as `channel`, borrowed here for
    // this call only.
    let fd = unsafe { BorrowedFd::borrow_raw(channel.as_raw_fd()) };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::event::Timespec {
        tv_sec: i64::try_from(at_most.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(at_most.subsec_nanos()),
    };
    let ready = rustix::event::poll(&mut fds, Some(&timeout))
        .map_err(|e| RdmaError::verbs("poll(completion channel)", e))?;
    if ready == 0 {
        return Ok(());
    }
    let mut event_cq: *mut rdma_mummy_sys::ibv_cq = std::ptr::null_mut();
    let mut context: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: the channel is live (see above) and non-blocking, so this
    // returns at once; both out-pointers point at locals.
    let got = unsafe {
        rdma_mummy_sys::ibv_get_cq_event(
            channel.comp_channel().as_ptr(),
            &mut event_cq,
            &mut context,
        )
    };
    if got == 0 && !event_cq.is_null() {
        // SAFETY: `event_cq` is the queue the event was for (ours: only it
        // uses this channel), and one event was read from it.
        unsafe { rdma_mummy_sys::ibv_ack_cq_events(event_cq, 1) };
    }
    Ok(())
}

fn dispatch(kind: WrKind, error: Option<RdmaError>, byte_len: u32) {
    match kind {
        WrKind::Recv { conn, slot } => conn.on_recv(slot, error, byte_len),
        WrKind::Send { conn, slot } => conn.on_send_done(slot, error),
        WrKind::Read { batch } => batch.complete_one(error),
    }
}
