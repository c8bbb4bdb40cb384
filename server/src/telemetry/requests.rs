//! Per-request accounting: one call per answered request feeds both the
//! Prometheus metrics and the per-op figures of `endpoint status`. The
//! metric handles of every (op, transport) are looked up once, on the first
//! request (a lookup by name and labels costs more than a GET); the
//! in-flight gauge is read at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use metrics::{Counter, counter, histogram};
use rdkv_proto::wire::{ErrorCode, Op, OpStats, OpenConnections};

/// How a request reached the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Tcp,
    Unix,
    /// In process (`mem` transport).
    Mem,
    /// The RESP front end.
    Resp,
}

impl Via {
    pub const ALL: [Via; 4] = [Via::Tcp, Via::Unix, Via::Mem, Via::Resp];

    fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Via::Tcp => "tcp",
            Via::Unix => "unix",
            Via::Mem => "mem",
            Via::Resp => "resp",
        }
    }
}

/// The recent-latency window of `endpoint status`: two histograms, the
/// current one and the one before, swapped every `WINDOW`; a p99 covers the
/// last 10-20 s. Bounded memory whatever the load.
const WINDOW: Duration = Duration::from_secs(10);
/// Latencies are clamped to this (µs) so recording never fails.
const MAX_TRACKED_US: u64 = 60_000_000;

#[derive(Debug)]
struct Window {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    started: Instant,
}

impl Window {
    fn new() -> Option<Window> {
        let histogram = Histogram::new_with_bounds(1, MAX_TRACKED_US, 2).ok()?;
        Some(Window {
            current: histogram.clone(),
            previous: histogram,
            started: Instant::now(),
        })
    }

    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.started);
        if age >= WINDOW * 2 {
            self.previous.reset();
            self.current.reset();
            self.started = now;
        } else if age >= WINDOW {
            std::mem::swap(&mut self.previous, &mut self.current);
            self.current.reset();
            self.started = now;
        }
    }

    fn record(&mut self, now: Instant, us: u64, count: u64) {
        self.rotate(now);
        self.current
            .saturating_record_n(us.clamp(1, MAX_TRACKED_US), count);
    }

    fn p99_us(&mut self, now: Instant) -> u64 {
        self.rotate(now);
        let mut both = self.previous.clone();
        if both.add(&self.current).is_err() || both.is_empty() {
            return 0;
        }
        both.value_at_quantile(0.99)
    }
}

#[derive(Debug)]
struct PerOp {
    requests: AtomicU64,
    errors: AtomicU64,
    window: Mutex<Option<Window>>,
}

/// The metric handles one answered request updates.
#[derive(Debug)]
struct Handles {
    /// `rdkv_requests_total`, by op then transport.
    requests: Vec<[Counter; Via::ALL.len()]>,
    /// `rdkv_request_duration_seconds`, by op.
    durations: Vec<metrics::Histogram>,
    /// `rdkv_resp_reads_answered_at_once_total`.
    answered_at_once: Counter,
}

impl Handles {
    /// Registers every handle with the process's recorder (installed by
    /// then: the first request comes after `telemetry::init`).
    fn register() -> Handles {
        Handles {
            requests: Op::ALL
                .iter()
                .map(|op| {
                    Via::ALL.map(|via| {
                        counter!("rdkv_requests_total", "op" => op.name(), "transport" => via.name())
                    })
                })
                .collect(),
            durations: Op::ALL
                .iter()
                .map(|op| histogram!("rdkv_request_duration_seconds", "op" => op.name()))
                .collect(),
            answered_at_once: counter!("rdkv_resp_reads_answered_at_once_total"),
        }
    }
}

/// Request and connection accounting of one node.
#[derive(Debug)]
pub struct RequestStats {
    ops: Vec<PerOp>,
    open_tcp: AtomicU64,
    open_unix: AtomicU64,
    open_resp: AtomicU64,
    accepted_tcp: AtomicU64,
    accepted_unix: AtomicU64,
    in_flight: AtomicU64,
    handles: OnceLock<Handles>,
}

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats {
            ops: Op::ALL
                .iter()
                .map(|_| PerOp {
                    requests: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    window: Mutex::new(Window::new()),
                })
                .collect(),
            open_tcp: AtomicU64::new(0),
            open_unix: AtomicU64::new(0),
            open_resp: AtomicU64::new(0),
            accepted_tcp: AtomicU64::new(0),
            accepted_unix: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            handles: OnceLock::new(),
        }
    }
}

impl RequestStats {
    /// A request is being served until the guard drops.
    pub fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            stats: self,
            started: Instant::now(),
        }
    }

    /// Records an answered request: `error` is the code it was answered
    /// with, if it failed.
    pub fn finish(&self, flight: InFlight<'_>, op: Op, via: Via, error: Option<ErrorCode>) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(flight.started);
        drop(flight);
        self.record(now, op, via, 1, elapsed);
        let Some(code) = error else {
            return;
        };
        if let Some(per_op) = self.ops.get(op.index()) {
            per_op.errors.fetch_add(1, Ordering::Relaxed);
        }
        counter!(
            "rdkv_request_errors_total",
            "op" => op.name(),
            "transport" => via.name(),
            "code" => code.name()
        )
        .increment(1);
    }

    /// Records the reads a RESP connection answered at once from the region
    /// in one batch, from `started` to `now`: `answered` holds how many of
    /// each op, each charged an equal share of the batch's time. One record
    /// per op instead of one per read, through handles registered once (a
    /// registry lookup per batch was a lock both workers wrote).
    pub fn finish_answered_at_once(&self, started: Instant, now: Instant, answered: &[(Op, u64)]) {
        let total: u64 = answered.iter().map(|(_, count)| count).sum();
        if total == 0 {
            return;
        }
        let each = now.saturating_duration_since(started).div_f64(total as f64);
        self.handles().answered_at_once.increment(total);
        for &(op, count) in answered {
            if count > 0 {
                self.record(now, op, Via::Resp, count, each);
            }
        }
    }

    fn handles(&self) -> &Handles {
        self.handles.get_or_init(Handles::register)
    }

    /// Counts `count` requests that took `each` and charges it to the
    /// latency histograms.
    fn record(&self, now: Instant, op: Op, via: Via, count: u64, each: Duration) {
        let handles = self.handles();
        if let Some(by_via) = handles.requests.get(op.index()) {
            by_via[via.index()].increment(count);
        }
        if let Some(duration) = handles.durations.get(op.index()) {
            duration.record_many(each.as_secs_f64(), count as usize);
        }
        let Some(per_op) = self.ops.get(op.index()) else {
            return;
        };
        per_op.requests.fetch_add(count, Ordering::Relaxed);
        let us = u64::try_from(each.as_micros()).unwrap_or(u64::MAX);
        let mut window = per_op
            .window
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(window) = window.as_mut() {
            window.record(now, us, count);
        }
    }

    /// A request that could not even be decoded (no op to charge it to).
    pub fn malformed(&self, via: Via) {
        counter!(
            "rdkv_request_errors_total",
            "op" => "unknown",
            "transport" => via.name(),
            "code" => ErrorCode::Malformed.name()
        )
        .increment(1);
    }

    /// A connection used all its credits: the server stops reading it.
    pub fn backpressure(&self, via: Via) {
        counter!("rdkv_backpressure_events_total", "transport" => via.name()).increment(1);
    }

    /// A client connection refused because the node is at its limit.
    pub fn connection_refused(via: Via) {
        counter!("rdkv_connections_refused_total", "transport" => via.name()).increment(1);
    }

    pub fn auth_failure(path: &'static str) {
        counter!("rdkv_auth_failures_total", "path" => path).increment(1);
    }

    /// Counts an accepted connection as open until the guard drops.
    pub fn connection(&self, via: Via) -> ConnectionGuard<'_> {
        counter!("rdkv_connections_accepted_total", "transport" => via.name()).increment(1);
        match via {
            Via::Tcp => self.accepted_tcp.fetch_add(1, Ordering::Relaxed),
            Via::Unix => self.accepted_unix.fetch_add(1, Ordering::Relaxed),
            Via::Mem | Via::Resp => 0,
        };
        self.open(via).fetch_add(1, Ordering::Relaxed);
        ConnectionGuard { stats: self, via }
    }

    fn open(&self, via: Via) -> &AtomicU64 {
        match via {
            Via::Tcp | Via::Mem => &self.open_tcp,
            Via::Unix => &self.open_unix,
            Via::Resp => &self.open_resp,
        }
    }

    pub fn open_connections(&self) -> OpenConnections {
        OpenConnections {
            tcp: self.open_tcp.load(Ordering::Relaxed),
            unix: self.open_unix.load(Ordering::Relaxed),
            resp: self.open_resp.load(Ordering::Relaxed),
        }
    }

    /// Requests of kind `op` answered since start.
    pub fn requests_of(&self, op: Op) -> u64 {
        self.ops
            .get(op.index())
            .map_or(0, |per_op| per_op.requests.load(Ordering::Relaxed))
    }

    /// Native-protocol connections accepted since start: (TCP, Unix socket).
    pub fn accepted(&self) -> (u64, u64) {
        (
            self.accepted_tcp.load(Ordering::Relaxed),
            self.accepted_unix.load(Ordering::Relaxed),
        )
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Per-op figures for `endpoint status`: ops that have been used.
    pub fn ops(&self) -> Vec<OpStats> {
        let now = Instant::now();
        Op::ALL
            .iter()
            .zip(&self.ops)
            .filter_map(|(op, per_op)| {
                let requests = per_op.requests.load(Ordering::Relaxed);
                (requests > 0).then(|| OpStats {
                    op: op.name().to_owned(),
                    requests,
                    errors: per_op.errors.load(Ordering::Relaxed),
                    recent_p99_us: per_op
                        .window
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .as_mut()
                        .map_or(0, |w| w.p99_us(now)),
                })
            })
            .collect()
    }
}

/// A request in service; see [`RequestStats::start`].
#[derive(Debug)]
pub struct InFlight<'a> {
    stats: &'a RequestStats,
    started: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open connection; see [`RequestStats::connection`].
#[derive(Debug)]
pub struct ConnectionGuard<'a> {
    stats: &'a RequestStats,
    via: Via,
}

impl Drop for ConnectionGuard<'_> {
    fn drop(&mut self) {
        self.stats.open(self.via).fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_forgets_old_latencies() {
        let mut window = Window::new().unwrap();
        let t0 = window.started;
        for _ in 0..100 {
            window.record(t0, 5_000, 1);
        }
        assert!((4_900..=5_100).contains(&window.p99_us(t0)));
        // Still counted one window later (it is the previous window now)...
        let t1 = t0 + WINDOW;
        window.record(t1, 10, 1);
        assert!(window.p99_us(t1) >= 4_900);
        // ...and gone two windows later.
        let t2 = t1 + WINDOW;
        window.record(t2, 10, 1);
        assert!(window.p99_us(t2) < 100);
        assert_eq!(window.p99_us(t2 + WINDOW * 2), 0);
    }

    #[test]
    fn reads_answered_together_count_one_each_at_their_own_time() {
        let stats = RequestStats::default();
        let started = Instant::now();
        let now = started + Duration::from_millis(50);
        stats.finish_answered_at_once(started, now, &[(Op::Get, 0)]);
        assert_eq!(stats.requests_of(Op::Get), 0);
        stats.finish_answered_at_once(started, now, &[(Op::Get, 4), (Op::MGet, 1)]);
        assert_eq!(stats.requests_of(Op::Get), 4);
        assert_eq!(stats.requests_of(Op::MGet), 1);
        assert_eq!(stats.requests_of(Op::Put), 0);
        // 50 ms shared by five reads.
        let get = stats.ops().into_iter().find(|o| o.op == "get").unwrap();
        assert!(
            (9_900..=10_100).contains(&get.recent_p99_us),
            "{}",
            get.recent_p99_us
        );
        assert_eq!(stats.in_flight(), 0);
    }

    #[test]
    fn ops_count_requests_errors_and_connections() {
        let stats = RequestStats::default();
        for error in [None, None, Some(ErrorCode::NotLeader)] {
            let flight = stats.start();
            assert_eq!(stats.in_flight(), 1);
            stats.finish(flight, Op::Put, Via::Tcp, error);
        }
        assert_eq!(stats.in_flight(), 0);
        let ops = stats.ops();
        assert_eq!(ops.len(), 1);
        assert_eq!(
            (ops[0].op.as_str(), ops[0].requests, ops[0].errors),
            ("put", 3, 1)
        );
        assert!(ops[0].recent_p99_us >= 1);
        {
            let _a = stats.connection(Via::Unix);
            let _b = stats.connection(Via::Resp);
            assert_eq!(stats.open_connections().unix, 1);
            assert_eq!(stats.open_connections().resp, 1);
        }
        assert_eq!(stats.open_connections(), OpenConnections::default());
    }
}
