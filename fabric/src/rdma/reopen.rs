//! A device opened on first use, whose failure is remembered for a while
//! and then retried: a client started before the RDMA module was loaded,
//! the link came up or the memlock limit was raised reads over RDMA once
//! that is fixed, without a restart, and does not retry on every read.

use std::time::{Duration, Instant};

/// How long a failed open is remembered before it is tried again.
pub const REOPEN_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum State<T> {
    Untried,
    Open(T),
    Failed { reason: String, at: Instant },
}

/// The opened `T`, or why not (retried `retry_after` after a failure).
#[derive(Debug)]
pub struct Reopen<T> {
    state: State<T>,
    retry_after: Duration,
}

impl<T: Clone> Reopen<T> {
    pub fn new(retry_after: Duration) -> Reopen<T> {
        Reopen {
            state: State::Untried,
            retry_after,
        }
    }

    /// The opened value; `open` runs on first use and again once a failure
    /// is older than `retry_after`. `Err` carries the reason and whether
    /// it is new (to be logged).
    pub fn get(
        &mut self,
        now: Instant,
        open: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, (String, bool)> {
        match &self.state {
            State::Open(value) => return Ok(value.clone()),
            State::Failed { reason, at } if now.duration_since(*at) < self.retry_after => {
                return Err((reason.clone(), false));
            }
            State::Failed { .. } | State::Untried => {}
        }
        match open() {
            Ok(value) => {
                self.state = State::Open(value.clone());
                Ok(value)
            }
            Err(reason) => {
                self.state = State::Failed {
                    reason: reason.clone(),
                    at: now,
                };
                Err((reason, true))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_open_is_retried_after_the_delay_and_then_kept() {
        let mut device: Reopen<u32> = Reopen::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let mut opens = 0;
        let failing = |opens: &mut u32| {
            *opens += 1;
            Err::<u32, _>("no device".to_owned())
        };
        assert_eq!(
            device.get(t0, || failing(&mut opens)),
            Err(("no device".into(), true))
        );
        // Remembered, not retried on every read.
        for s in [0, 1, 29] {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(
                device.get(at, || failing(&mut opens)),
                Err(("no device".into(), false))
            );
        }
        assert_eq!(opens, 1);
        // The module was loaded meanwhile: the retry opens it, for good.
        let later = t0 + Duration::from_secs(30);
        assert_eq!(device.get(later, || Ok(7)), Ok(7));
        assert_eq!(
            device.get(later + Duration::from_secs(3600), || failing(&mut opens)),
            Ok(7)
        );
        assert_eq!(opens, 1);
    }
}
