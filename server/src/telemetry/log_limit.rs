//! Log lines that a peer can trigger at will (refused handshakes) are rate
//! limited: at most one per period, carrying the count of those suppressed.

use std::fmt::Arguments;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub struct RateLimitedLog {
    period_secs: u64,
    /// Unix second of the last line written (0: never).
    last_secs: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    pub const fn new(period_secs: u64) -> Self {
        RateLimitedLog {
            period_secs,
            last_secs: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be written at `now_secs`; if so, how many were
    /// suppressed since the last one.
    fn admit(&self, now_secs: u64) -> Option<u64> {
        let last = self.last_secs.load(Ordering::Relaxed);
        let due = last == 0 || now_secs >= last.saturating_add(self.period_secs);
        if due
            && self
                .last_secs
                .compare_exchange(last, now_secs.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }

    pub fn warn(&self, message: Arguments<'_>) {
        let now_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if let Some(suppressed) = self.admit(now_secs) {
            tracing::warn!(suppressed_since_last = suppressed, "{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RateLimitedLog;

    #[test]
    fn one_line_per_period_with_the_count_of_the_rest() {
        let log = RateLimitedLog::new(10);
        assert_eq!(log.admit(1000), Some(0));
        assert_eq!(log.admit(1001), None);
        assert_eq!(log.admit(1009), None);
        assert_eq!(log.admit(1010), Some(2));
        assert_eq!(log.admit(1010), None);
        assert_eq!(log.admit(1025), Some(1));
    }
}
