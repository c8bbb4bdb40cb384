//! How a synchronous caller (the one-sided reader's `RemoteRegion::read`)
//! waits for a future the completion poller completes, without a Condvar
//! wait that would stall a tokio worker thread and every task queued on it;
//! and [`blocking`], the part any blocking wait of a synchronous read uses
//! (the libfabric transport's sleep in its completion queue too).
//!
//! The future is polled on the calling thread, a few times first (a READ
//! completes in microseconds, and on a runtime worker the hand-off below
//! costs more than that), then with a waker that unparks this thread. On a
//! multi-threaded runtime's worker the parked part runs inside
//! `block_in_place`, so the runtime moves the worker's other tasks to
//! another thread while this one waits. A current-thread runtime cannot do
//! that; there the wait blocks its thread like any other synchronous call.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

use tokio::runtime::{Handle, RuntimeFlavor};

/// Polls before the wait is handed to `block_in_place` and parking.
const EAGER_POLLS: u32 = 256;

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// `future`'s output, or `None` once `deadline` passed first.
pub fn wait_until<F: Future>(future: F, deadline: Instant) -> Option<F::Output> {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    for _ in 0..EAGER_POLLS {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        std::hint::spin_loop();
    }
    blocking(|| {
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return Some(out);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::park_timeout(deadline - now);
        }
    })
}

/// Runs `wait`, a blocking wait, so that it holds no tokio worker: on a
/// multi-threaded runtime's worker inside `block_in_place` (the runtime
/// moves the worker's other tasks to another thread meanwhile); elsewhere
/// (no runtime, a current-thread one, which cannot hand its tasks over)
/// as it is.
pub fn blocking<T>(wait: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    #[test]
    fn a_future_completed_by_another_thread_wakes_the_waiter() {
        let (tx, rx) = oneshot::channel();
        let completer = std::thread::spawn(move || tx.send(7u32));
        let got = wait_until(rx, Instant::now() + Duration::from_secs(60));
        assert_eq!(got, Some(Ok(7)));
        completer.join().unwrap().unwrap();
    }

    #[test]
    fn a_past_deadline_gives_up() {
        let (_tx, rx) = oneshot::channel::<u32>();
        assert_eq!(wait_until(rx, Instant::now()), None);
    }

    /// A read waiting on the only worker of a runtime, for a completion
    /// that a task queued behind it on that worker delivers. A Condvar (or
    /// any blocking) wait keeps the worker, so that task never runs and the
    /// read gives up at its deadline; `wait_until` hands the worker's queue
    /// to another thread while it waits.
    #[test]
    fn a_waiting_read_does_not_hold_its_runtime_worker() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let got = runtime.block_on(async {
            let reader = tokio::spawn(async {
                let (tx, rx) = oneshot::channel();
                // Queued on this worker, behind the waiting read.
                tokio::spawn(async move {
                    let _ = tx.send("completed");
                });
                wait_until(rx, Instant::now() + Duration::from_secs(10))
            });
            reader.await.unwrap()
        });
        assert_eq!(got, Some(Ok("completed")), "the waiter held the worker");
    }
}
