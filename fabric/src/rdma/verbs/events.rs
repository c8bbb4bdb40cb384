//! One thread per context reads the device's asynchronous events
//! (`ibv_get_async_event` on the context's async fd, made non-blocking)
//! and hands each to `rdma::async_event::apply`. It sleeps in `poll(2)` on
//! that fd and an eventfd that stops it, so it wakes only for an event or
//! to exit. sideway 0.4 does not wrap these calls; they go to rdma-core
//! through `rdma-mummy-sys`, as the completion channel's do.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use rdma_mummy_sys::{ibv_ack_async_event, ibv_async_event, ibv_context, ibv_get_async_event};
use sideway::ibverbs::device_context::DeviceContext;

use super::connection::ConnShared;
use crate::rdma::async_event::{DeviceEvent, Element, EventKind, apply};
use crate::rdma::connections::Connections;
use crate::rdma::error::RdmaError;

/// What the event thread acts on.
#[derive(Debug, Clone)]
pub(crate) struct EventTargets {
    pub(crate) connections: Arc<Connections<ConnShared>>,
    pub(crate) failed: Arc<AtomicBool>,
}

#[derive(Debug)]
pub(crate) struct EventReader {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

/// The device's `ibv_context`, sent to the thread (which also holds the
/// `DeviceContext` that keeps it open).
struct ContextPtr(*mut ibv_context);

// SAFETY: an `ibv_context` may be used from any thread (rdma-core locks
// internally); the pointer is only dereferenced while the `Arc` to its
// `DeviceContext` held by the same thread keeps it open.
unsafe impl Send for ContextPtr {}

impl EventReader {
    pub(crate) fn start(
        device: Arc<DeviceContext>,
        targets: EventTargets,
        name: &str,
    ) -> Result<EventReader, RdmaError> {
        // SAFETY: `device` is open; the pointer is used only while the
        // thread below holds `device`.
        let context = ContextPtr(unsafe { device.context() }.as_ptr());
        // SAFETY: `context` is a live `ibv_context` (see above) and
        // `async_fd` is a plain field of it.
        let async_fd = unsafe { (*context.0).async_fd };
        // SAFETY: the fd belongs to the context, open as long as `device`;
        // borrowed for this call only.
        let fd = unsafe { BorrowedFd::borrow_raw(async_fd) };
        rustix::io::ioctl_fionbio(fd, true)
            .map_err(|e| RdmaError::verbs("making the async event fd non-blocking", e))?;
        let stop = Arc::new(
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
                .map_err(|e| RdmaError::verbs("eventfd", e))?,
        );
        let device_name = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("rdkv-ev-{name}"))
            .spawn({
                let stop = Arc::clone(&stop);
                move || {
                    let _open = device;
                    read_loop(&context, async_fd, &stop, &targets, &device_name);
                }
            })
            .map_err(|e| RdmaError::verbs("spawning the async event reader", e))?;
        Ok(EventReader {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            // The context can be dropped by this thread itself (failing a
            // connection dropped its last reference): it then exits on the
            // stop signal; a thread cannot join itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn read_loop(
    context: &ContextPtr,
    async_fd: i32,
    stop: &OwnedFd,
    targets: &EventTargets,
    device: &str,
) {
    loop {
        // SAFETY: the context (and so its fd) is open while this thread
        // runs (it holds the `DeviceContext`).
        let events = unsafe { BorrowedFd::borrow_raw(async_fd) };
        let mut fds = [
            rustix::event::PollFd::new(&events, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(stop, rustix::event::PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(
                    device,
                    "polling the rdma async event fd: {e}; events unread"
                );
                return;
            }
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        while let Some(event) = next_event(context) {
            apply(&event, &targets.connections, &targets.failed, device);
        }
    }
}

/// Reads and acknowledges one event (`None`: none pending). It is
/// acknowledged before it is acted on: destroying a QP (failing its
/// connection) waits until every event about it has been acknowledged.
fn next_event(context: &ContextPtr) -> Option<DeviceEvent> {
    let mut raw = std::mem::MaybeUninit::<ibv_async_event>::zeroed();
    // SAFETY: the context is open (see `read_loop`) and its fd
    // non-blocking, so this returns at once; `raw` is a local it fills.
    let got = unsafe { ibv_get_async_event(context.0, raw.as_mut_ptr()) };
    if got != 0 {
        return None;
    }
    let raw_ptr = raw.as_mut_ptr();
    // SAFETY: filled by the successful call above. The type is read as
    // its `u32` representation: a number newer than these bindings would
    // not be a valid value of the Rust enum.
    let kind = EventKind::from_raw(unsafe {
        std::ptr::addr_of!((*raw_ptr).event_type)
            .cast::<u32>()
            .read()
    });
    // SAFETY: the union member read is the one `kind` says is valid; a QP
    // named by an unacknowledged event is not destroyed (see above), so
    // the pointer is live here.
    let (qp_num, port) = unsafe {
        let element = &(*raw_ptr).element;
        match kind.element() {
            Element::Qp if !element.qp.is_null() => (Some((*element.qp).qp_num), None),
            Element::Port => (None, u8::try_from(element.port_num).ok()),
            _ => (None, None),
        }
    };
    // SAFETY: the event was returned by `ibv_get_async_event` and is
    // acknowledged once.
    unsafe { ibv_ack_async_event(raw_ptr) };
    Some(DeviceEvent { kind, qp_num, port })
}
