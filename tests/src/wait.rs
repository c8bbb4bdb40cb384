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
