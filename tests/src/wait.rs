//! The one way tests wait: on a condition, with a deadline, failing with
//! what was awaited and the last reason it did not hold. No test sleeps a
//! fixed time and hopes.

use std::time::{Duration, Instant};

use anyhow::Result;

/// How long to wait between two attempts: short against the deadlines the
/// tests use (seconds), long enough not to spin a loaded machine.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Retries `attempt` until it succeeds or `timeout` passes; then fails with
/// the last error, saying what was awaited.
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut attempt: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("{what}: not within {timeout:?}")));
            }
            Err(_) => tokio::time::sleep(POLL_EVERY).await,
        }
    }
}

/// What [`calls_beside`] counted.
#[derive(Debug, Clone, Copy)]
pub struct CallsBeside {
    pub calls: usize,
    /// Calls that completed while the adversary was still busy.
    pub while_busy: usize,
}

/// Makes `call` (numbered from 0) every 100 ms while `go_on(round)` holds,
/// and counts the calls that completed while `busy()` still held. Fairness
/// tests need the count: a node that served a client only after an
/// adversary (a flood, slow handshakes) finished would still serve every call.
pub async fn calls_beside(
    mut go_on: impl FnMut(usize) -> bool,
    busy: impl Fn() -> bool,
    mut call: impl AsyncFnMut(usize) -> Result<()>,
) -> Result<CallsBeside> {
    let mut counted = CallsBeside {
        calls: 0,
        while_busy: 0,
    };
    while go_on(counted.calls) {
        call(counted.calls).await?;
        counted.calls += 1;
        if busy() {
            counted.while_busy += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(counted)
}
