//! Time for grace periods and read abandonment, injectable so that property
//! tests can step it. Microseconds since an arbitrary origin, monotonic.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + Debug {
    fn now_us(&self) -> u64;
}

#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_us: AtomicU64,
}

impl ManualClock {
    pub fn advance_us(&self, us: u64) {
        self.now_us.fetch_add(us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}

/// Microseconds of `CLOCK_BOOTTIME`: since this host booted, counting
/// suspend, never stepped (NTP slews it at most). Every process on the host
/// reads the same clock, so a lease deadline on it means the same instant to
/// a leader and to a client on its host, whatever happens to the wall clock.
#[inline]
pub fn boottime_now_us() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    let micros = u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// Test hook: microseconds added to this process's wall clock, to stage a
/// clock step (NTP, an operator) without changing the host's clock.
static WALL_CLOCK_STEP_US: AtomicI64 = AtomicI64::new(0);

/// Test hook: from now on [`unix_now_us`] in this process reads `step_us`
/// off the true wall clock, as after a clock step on the host. The whole
/// process reads it: a test that calls it must be alone in its test binary
/// (`tests/tests/lease.rs` is, for that reason).
#[doc(hidden)]
pub fn step_wall_clock_for_tests(step_us: i64) {
    WALL_CLOCK_STEP_US.store(step_us, Ordering::SeqCst);
}

pub use rdkv_proto::region::DEFAULT_MAX_CLOCK_DRIFT_MS;

/// Wall-clock milliseconds since the unix epoch: the clock of key expiry
/// deadlines (they are absolute times users give, EXPIREAT, and must mean
/// the same instant on every host).
pub fn unix_now_ms() -> u64 {
    unix_now_us() / 1_000
}

/// Wall-clock microseconds since the unix epoch (0 if the clock is before it).
/// The one reader of the wall clock for leases and apply stamps: every crate
/// that compares against a region header's unix-microsecond fields uses it.
pub fn unix_now_us() -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    now_us.saturating_add_signed(WALL_CLOCK_STEP_US.load(Ordering::Relaxed))
}

/// How far a µs reading of a clock may be behind the clock: it is
/// truncated from ns.
const TRUNCATION_US: u64 = 1;

/// Wall clock minus boottime, µs, from a boottime reading `boot_us` and a
/// wall-clock reading `wall_us_after` taken after it, for a wall clock
/// derived later as boottime + this offset (one clock reading per GET).
/// The derived clock is never behind the wall clock read at the same
/// moment: reading the wall clock second puts it ahead by the time between
/// the two readings, and the two readings that truncation may leave up to
/// 1 µs behind their clocks while the subtracted one is not (the derived
/// boottime reading and `wall_us_after`) are made up for (1 µs would do;
/// the second is spare). So expiry judged by it is never later than by the
/// wall clock, to the ms: a derived clock 1 µs behind, just past a ms
/// boundary, would serve a value a ms past `deadline - margin`. The caller
/// reads the two clocks side by side: anything between them puts the
/// derived clock ahead by as much. A step of the wall clock reaches a
/// derived clock with its next offset.
#[inline]
pub fn wall_minus_boottime_us(boot_us: u64, wall_us_after: u64) -> u64 {
    wall_us_after
        .saturating_sub(boot_us)
        .saturating_add(2 * TRUNCATION_US)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ms of a wall clock derived from readings truncated to µs, with
    /// the wall clock `offset_ns` ahead of boottime: boottime read at
    /// `boot_ns`, the wall clock `after_ns` later, and the derived clock
    /// read at boottime `now_ns`.
    fn derived_ms(offset_ns: u64, boot_ns: u64, after_ns: u64, now_ns: u64) -> u64 {
        let offset_us =
            wall_minus_boottime_us(boot_ns / 1_000, (boot_ns + after_ns + offset_ns) / 1_000);
        (now_ns / 1_000 + offset_us) / 1_000
    }

    #[test]
    fn a_derived_wall_clock_is_never_behind_the_wall_clock() {
        // The sub-µs phases of the offset and of the three readings, and
        // the derived reading taken just past a ms boundary of the wall
        // clock, where one µs behind is a ms behind.
        let base_ns = 1_796_601_743_764_000_000;
        for offset_phase_ns in [0, 1, 500, 998, 999] {
            let offset_ns = base_ns + offset_phase_ns;
            for boot_ns in [7_000_000_000, 7_000_000_001, 7_000_000_500, 7_000_000_999] {
                for after_ns in [0, 1, 500, 999, 2_500] {
                    for past_boundary_ns in 0..3_000 {
                        // The first moment after the offset's readings at
                        // which the wall clock is `past_boundary_ns` into a ms.
                        let earliest_ns = boot_ns + after_ns;
                        let phase = (earliest_ns + offset_ns) % 1_000_000;
                        let now_ns =
                            earliest_ns + (1_000_000 + past_boundary_ns - phase) % 1_000_000;
                        let wall_ms = (now_ns + offset_ns) / 1_000_000;
                        assert!(
                            derived_ms(offset_ns, boot_ns, after_ns, now_ns) >= wall_ms,
                            "offset {offset_ns} boot {boot_ns} after {after_ns} now {now_ns}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_derived_wall_clock_is_at_most_a_few_us_ahead() {
        let offset_ns = 1_796_601_743_764_558_000;
        let (boot_ns, after_ns) = (7_000_000, 400);
        let offset_us =
            wall_minus_boottime_us(boot_ns / 1_000, (boot_ns + after_ns + offset_ns) / 1_000);
        assert!(offset_us * 1_000 >= offset_ns);
        assert!(offset_us * 1_000 <= offset_ns + after_ns + 3_000);
    }
}
