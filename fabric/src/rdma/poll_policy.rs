//! What the completion poller does when the queue is empty. Right after a
//! completion the next one is usually microseconds away, so it polls again
//! at once (spinning, then yielding); after that it arms the completion
//! queue's notification and sleeps on the completion channel until the
//! device signals a completion, waking only every [`STOP_CHECK`] to see
//! whether the context is closing. An idle context therefore costs about
//! ten wakeups a second instead of one per fixed short sleep (the old loop
//! slept 50 µs: ~20,000 a second), and a completion that arrives while it
//! sleeps is delivered by the channel, with no sleep to wait out.

use std::time::Duration;

/// Empty polls spent spinning, then yielding, before sleeping.
pub const SPIN_POLLS: u32 = 2_000;
pub const YIELD_POLLS: u32 = 4_000;
/// The longest the poller sleeps on the channel before checking whether
/// it should stop (the channel wakes it at once for a completion).
pub const STOP_CHECK: Duration = Duration::from_millis(100);

/// The next step of an idle poller after `empty_polls` empty polls in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStep {
    Spin,
    Yield,
    /// Arm the notification, poll once more (a completion may have arrived
    /// before arming), then sleep on the channel for at most this long.
    Sleep(Duration),
}

pub fn idle_step(empty_polls: u32) -> IdleStep {
    if empty_polls < SPIN_POLLS {
        IdleStep::Spin
    } else if empty_polls < YIELD_POLLS {
        IdleStep::Yield
    } else {
        IdleStep::Sleep(STOP_CHECK)
    }
}

/// Times the poller thread is woken from a sleep during `idle` of no
/// completions (spins and yields keep it running: they are not wakeups,
/// and they only happen once, right after the last completion).
pub fn sleeps_during(idle: Duration, step: impl Fn(u32) -> IdleStep) -> u64 {
    let mut slept = Duration::ZERO;
    let mut wakeups = 0u64;
    let mut empty_polls = 0u32;
    while slept < idle {
        if let IdleStep::Sleep(d) = step(empty_polls) {
            // A zero sleep would never end an idle period: count it as 1 µs.
            slept += d.max(Duration::from_micros(1));
            wakeups += 1;
        }
        empty_polls = empty_polls.saturating_add(1);
    }
    wakeups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_poller_sleeps_on_the_channel_not_in_short_naps() {
        let per_second = sleeps_during(Duration::from_secs(1), idle_step);
        assert!(
            per_second <= 20,
            "an idle second woke the poller {per_second} times"
        );
    }

    #[test]
    fn after_a_completion_the_poller_spins_first() {
        assert_eq!(idle_step(0), IdleStep::Spin);
        assert_eq!(idle_step(SPIN_POLLS), IdleStep::Yield);
        assert!(matches!(idle_step(YIELD_POLLS), IdleStep::Sleep(_)));
        assert!(matches!(idle_step(u32::MAX), IdleStep::Sleep(_)));
    }
}
