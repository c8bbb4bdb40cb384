//! YCSB's `CounterGenerator` (the load phase's key sequence) and
//! `AcknowledgedCounterGenerator` (the run phase's insert sequence, whose
//! `lastValue` only moves past keys whose insert has completed, so that
//! readers never pick a key that is still being inserted).

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use thiserror::Error;

/// Shared by every task of a run.
#[derive(Debug)]
pub struct CounterGenerator {
    counter: AtomicI64,
}

impl CounterGenerator {
    pub fn new(count_start: i64) -> CounterGenerator {
        CounterGenerator {
            counter: AtomicI64::new(count_start),
        }
    }

    pub fn next_value(&self) -> i64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    pub fn last_value(&self) -> i64 {
        self.counter.load(Ordering::Relaxed) - 1
    }
}

/// YCSB's window: at most this many inserts may be outstanding.
pub const WINDOW_SIZE: usize = 1 << 20;
const WINDOW_MASK: i64 = WINDOW_SIZE as i64 - 1;

#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "too many unacknowledged insertion keys (more than {WINDOW_SIZE} inserts outstanding; value {value})"
)]
pub struct TooManyUnacknowledged {
    pub value: i64,
}

#[derive(Debug)]
struct Window {
    acked: Vec<bool>,
    limit: i64,
}

#[derive(Debug)]
pub struct AcknowledgedCounterGenerator {
    counter: CounterGenerator,
    window: Mutex<Window>,
    /// Mirror of `window.limit` for lock-free `last_value`.
    limit: AtomicI64,
}

impl AcknowledgedCounterGenerator {
    pub fn new(count_start: i64) -> AcknowledgedCounterGenerator {
        AcknowledgedCounterGenerator {
            counter: CounterGenerator::new(count_start),
            window: Mutex::new(Window {
                acked: vec![false; WINDOW_SIZE],
                limit: count_start - 1,
            }),
            limit: AtomicI64::new(count_start - 1),
        }
    }

    pub fn next_value(&self) -> i64 {
        self.counter.next_value()
    }

    /// The highest value below which every value has been acknowledged.
    pub fn last_value(&self) -> i64 {
        self.limit.load(Ordering::Acquire)
    }

    /// Marks `value` done (whether its insert succeeded or not, as YCSB's
    /// `finally` does) and advances the limit over the acknowledged prefix.
    pub fn acknowledge(&self, value: i64) -> Result<(), TooManyUnacknowledged> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (value & WINDOW_MASK) as usize;
        if window.acked[slot] {
            return Err(TooManyUnacknowledged { value });
        }
        window.acked[slot] = true;
        let before_first_slot = window.limit & WINDOW_MASK;
        let mut index = window.limit + 1;
        while index != before_first_slot {
            let slot = (index & WINDOW_MASK) as usize;
            if !window.acked[slot] {
                break;
            }
            window.acked[slot] = false;
            index += 1;
        }
        window.limit = index - 1;
        self.limit.store(window.limit, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_counts_from_its_start() {
        let c = CounterGenerator::new(5);
        assert_eq!(c.last_value(), 4);
        assert_eq!(c.next_value(), 5);
        assert_eq!(c.next_value(), 6);
        assert_eq!(c.last_value(), 6);
    }

    #[test]
    fn the_limit_waits_for_the_contiguous_prefix() {
        let c = AcknowledgedCounterGenerator::new(100);
        assert_eq!(c.last_value(), 99);
        let (a, b, d) = (c.next_value(), c.next_value(), c.next_value());
        assert_eq!((a, b, d), (100, 101, 102));
        c.acknowledge(b).unwrap();
        assert_eq!(c.last_value(), 99, "100 is still outstanding");
        c.acknowledge(a).unwrap();
        assert_eq!(c.last_value(), 101);
        c.acknowledge(d).unwrap();
        assert_eq!(c.last_value(), 102);
    }

    #[test]
    fn a_full_window_is_an_error() {
        let c = AcknowledgedCounterGenerator::new(0);
        // 0 stays outstanding; WINDOW_SIZE later its slot is reused.
        c.acknowledge(1).unwrap();
        assert_eq!(
            c.acknowledge(1 + WINDOW_SIZE as i64),
            Err(TooManyUnacknowledged {
                value: 1 + WINDOW_SIZE as i64
            })
        );
    }
}
