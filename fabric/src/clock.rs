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
/// off the true wall clock, as after a clock step on the host.
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
