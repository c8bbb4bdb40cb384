//! Runs one phase of a workload against one target: `--threads` OS threads,
//! each with its own current-thread tokio runtime and its own driver
//! (client), each running `--concurrency` tasks that issue one operation at
//! a time.
//!
//! With `--target-ops`, every task follows a fixed schedule (its share of
//! the rate, phase-shifted so tasks interleave); an operation's intended
//! start is its slot in that schedule, whether or not the previous one
//! finished in time, so latencies measured from it (`Intended-*`) are
//! corrected for coordinated omission as in YCSB's
//! `measurement.interval=intended` and wrk2.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use thiserror::Error;

use crate::driver::{Driver, DriverError, DriverFactory, ReadResult};
use crate::record;
use crate::report::{Measurements, PhaseResult, Status};
use crate::workload::{OpKind, Operation, Workload};

#[derive(Debug, Error)]
pub enum RunError {
    #[error("{target}: connecting: {source}")]
    Connect { target: String, source: DriverError },
    #[error("{target}: {message}")]
    Unsupported { target: String, message: String },
    #[error("starting a benchmark thread: {0}")]
    Thread(std::io::Error),
    #[error("a benchmark thread panicked")]
    Panicked,
    #[error("{0}")]
    Fatal(String),
    #[error("interrupted")]
    Interrupted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Load,
    Run,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Run => "run",
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub threads: usize,
    /// Operations in flight per thread.
    pub concurrency: usize,
    /// Total operations per second over all threads; `None`: as fast as possible.
    pub target_ops_per_sec: Option<f64>,
    /// Run phase only: operations during this time are issued but not measured.
    pub warmup: Duration,
    /// Run phase only: stop after this long (after the warm-up) instead of
    /// after `operationcount` operations.
    pub duration: Option<Duration>,
    pub seed: u64,
    /// Show a progress bar (only ever drawn on a terminal).
    pub progress: bool,
    /// Set by Ctrl-C: tasks stop issuing operations.
    pub stop: Arc<AtomicBool>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: 1,
            concurrency: 1,
            target_ops_per_sec: None,
            warmup: Duration::ZERO,
            duration: None,
            seed: 1,
            progress: false,
            stop: Arc::default(),
        }
    }
}

/// Operations a task claims at once from the phase's count, and
/// completions it reports at once: both counters are shared by every
/// thread, and a read-modify-write per operation on a line two cores pass
/// back and forth costs about as much as a one-sided GET (the same for
/// every target).
const CLAIM_BATCH: u64 = 64;

/// A task's claimed share of the operations to measure, taken
/// [`CLAIM_BATCH`] at a time.
#[derive(Debug, Default)]
struct Claims {
    next: u64,
    end: u64,
}

impl Claims {
    /// Claims one more operation; `false` once the count is used up.
    fn take(&mut self, shared: &Shared<'_>) -> bool {
        if self.next == self.end {
            let start = shared.claimed.fetch_add(CLAIM_BATCH, Ordering::Relaxed);
            if start >= shared.operation_count {
                return false;
            }
            self.next = start;
            self.end = start
                .saturating_add(CLAIM_BATCH)
                .min(shared.operation_count);
        }
        self.next += 1;
        true
    }
}

/// What every task of a phase shares.
struct Shared<'a> {
    phase: Phase,
    workload: &'a Arc<Workload>,
    options: &'a RunOptions,
    /// Operations to measure (count mode); `u64::MAX` in duration mode.
    operation_count: u64,
    claimed: AtomicU64,
    completed: AtomicU64,
    start: OnceLock<Instant>,
    fatal: Mutex<Option<String>>,
    stop: AtomicBool,
    /// Tasks per thread.
    concurrency: usize,
    tasks_total: usize,
}

impl Shared<'_> {
    fn start(&self) -> Instant {
        *self.start.get_or_init(Instant::now)
    }

    fn warmup_end(&self) -> Instant {
        self.start() + self.options.warmup
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.options.stop.load(Ordering::Relaxed)
    }

    fn fail(&self, message: String) {
        let mut fatal = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
        fatal.get_or_insert(message);
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs `phase` of `workload` against the target `factory` builds.
pub fn run_phase<F: DriverFactory>(
    phase: Phase,
    workload: &Arc<Workload>,
    factory: &F,
    options: &RunOptions,
) -> Result<PhaseResult, RunError> {
    let target = factory.label();
    let (options, operation_count) = phase_options(phase, workload, options);
    let threads = options.threads.max(1);
    let concurrency = options.concurrency.max(1);
    let shared = Shared {
        phase,
        workload,
        options: &options,
        operation_count,
        claimed: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        start: OnceLock::new(),
        fatal: Mutex::new(None),
        stop: AtomicBool::new(false),
        concurrency,
        tasks_total: threads * concurrency,
    };
    let start_line = StartLine::new(threads);
    let outcome = run_threads(&shared, factory, &start_line, threads)?;
    start_line.verdict(&target)?;
    if let Some(message) = shared.fatal.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(RunError::Fatal(message));
    }
    if options.stop.load(Ordering::Relaxed) {
        return Err(RunError::Interrupted);
    }
    let measure_start = shared.start.get().copied().unwrap_or_else(Instant::now) + options.warmup;
    Ok(summarize(
        PhaseShape {
            target,
            phase,
            threads,
            concurrency,
            options: &options,
        },
        measure_start,
        outcome,
    ))
}

/// The options as `phase` uses them (a load has no warm-up and no duration),
/// and the operations it measures (`u64::MAX` in duration mode).
fn phase_options(phase: Phase, workload: &Workload, options: &RunOptions) -> (RunOptions, u64) {
    let spec = &workload.spec;
    let (operation_count, warmup, duration) = match phase {
        Phase::Load => (spec.insert_count, Duration::ZERO, None),
        Phase::Run => match options.duration {
            Some(d) => (u64::MAX, options.warmup, Some(d)),
            None => (spec.operation_count, options.warmup, None),
        },
    };
    let options = RunOptions {
        warmup,
        duration,
        ..options.clone()
    };
    (options, operation_count)
}

/// Starts the phase's threads, shows progress until they end, and collects
/// what each measured.
fn run_threads<F: DriverFactory>(
    shared: &Shared<'_>,
    factory: &F,
    start_line: &StartLine,
    threads: usize,
) -> Result<Vec<(Measurements, Instant)>, RunError> {
    let running = AtomicUsize::new(threads);
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        for thread_index in 0..threads {
            let running = &running;
            let handle = std::thread::Builder::new()
                .name(format!("bench-{thread_index}"))
                .spawn_scoped(scope, move || {
                    let result = bench_thread(shared, factory, thread_index, start_line);
                    running.fetch_sub(1, Ordering::Relaxed);
                    result
                })
                .map_err(RunError::Thread);
            match handle {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The threads already started wait at the barrier: let them go.
                    shared.stop.store(true, Ordering::Relaxed);
                    for _ in handles.len()..threads {
                        start_line.barrier.wait();
                    }
                    return Err(e);
                }
            }
        }
        start_line.barrier.wait();
        let started = shared.start();
        show_progress(shared, &running, started);
        let mut per_thread = Vec::with_capacity(threads);
        for handle in handles {
            match handle.join() {
                Ok(Some(result)) => per_thread.push(result),
                Ok(None) => {}
                Err(_) => return Err(RunError::Panicked),
            }
        }
        Ok(per_thread)
    })
}

/// What a phase ran as: the labels of its result.
struct PhaseShape<'a> {
    target: String,
    phase: Phase,
    threads: usize,
    concurrency: usize,
    options: &'a RunOptions,
}

/// Merges the threads' measurements into the phase's result; the runtime is
/// from the end of the warm-up to the last task's end.
fn summarize(
    shape: PhaseShape<'_>,
    measure_start: Instant,
    outcome: Vec<(Measurements, Instant)>,
) -> PhaseResult {
    let mut merged = Measurements::default();
    let mut end = measure_start;
    for (m, finished) in outcome {
        merged.merge(m);
        end = end.max(finished);
    }
    let runtime = end.saturating_duration_since(measure_start);
    let runtime_ms = runtime.as_secs_f64() * 1000.0;
    let target_ops_per_sec = shape.options.target_ops_per_sec;
    let (ops, intended) = merged.summarize(target_ops_per_sec.is_some());
    PhaseResult {
        target: shape.target,
        phase: shape.phase.name().into(),
        threads: shape.threads,
        concurrency: shape.concurrency,
        target_ops_per_sec,
        warmup_secs: shape.options.warmup.as_secs_f64(),
        runtime_ms,
        operations: merged.operations,
        throughput_ops_sec: if runtime_ms > 0.0 {
            merged.operations as f64 * 1000.0 / runtime_ms
        } else {
            0.0
        },
        ops,
        intended,
        first_errors: merged.errors,
    }
}

fn show_progress(shared: &Shared<'_>, running: &AtomicUsize, started: Instant) {
    let visible = shared.options.progress && std::io::stderr().is_terminal();
    let bar = if !visible {
        ProgressBar::hidden()
    } else if shared.operation_count != u64::MAX {
        let bar = ProgressBar::new(shared.operation_count);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{prefix} {spinner} [{elapsed_precise}] {pos} ops {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar
    };
    bar.set_prefix(shared.phase.name());
    let mut last = (started, 0u64);
    while running.load(Ordering::Relaxed) > 0 {
        std::thread::sleep(Duration::from_millis(100));
        let now = Instant::now();
        let done = shared.completed.load(Ordering::Relaxed);
        let measured = shared
            .claimed
            .load(Ordering::Relaxed)
            .min(shared.operation_count);
        if shared.operation_count != u64::MAX {
            bar.set_position(measured);
        } else {
            bar.set_position(done);
        }
        let elapsed = now - last.0;
        if elapsed >= Duration::from_secs(1) {
            let rate = (done - last.1) as f64 / elapsed.as_secs_f64();
            let warming = now < shared.warmup_end();
            bar.set_message(format!(
                "{rate:.0} ops/s{}",
                if warming { " (warm-up)" } else { "" }
            ));
            last = (now, done);
        }
    }
    bar.finish_and_clear();
}

/// Where the threads of a phase meet before any starts: each reports here
/// that it could not connect or cannot run the workload, then waits for all,
/// so that connection set-up is not measured and the start time is common.
struct StartLine {
    barrier: Barrier,
    connect_error: Mutex<Option<DriverError>>,
    unsupported: Mutex<Option<String>>,
}

impl StartLine {
    /// For `threads` bench threads and the thread that shows progress.
    fn new(threads: usize) -> StartLine {
        StartLine {
            barrier: Barrier::new(threads + 1),
            connect_error: Mutex::new(None),
            unsupported: Mutex::new(None),
        }
    }

    /// Keeps the first connection error.
    fn connect_failed(&self, error: DriverError) {
        self.connect_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(error);
    }

    fn unsupported(&self, message: &str) {
        self.unsupported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| message.into());
    }

    /// Whether no thread has reported a problem.
    fn clear(&self) -> bool {
        self.connect_error
            .lock()
            .map(|e| e.is_none())
            .unwrap_or(false)
            && self
                .unsupported
                .lock()
                .map(|e| e.is_none())
                .unwrap_or(false)
    }

    /// The first problem reported, as the phase's error.
    fn verdict(self, target: &str) -> Result<(), RunError> {
        let connect_error = self.connect_error.into_inner();
        if let Some(source) = connect_error.unwrap_or_else(|p| p.into_inner()) {
            let target = target.into();
            return Err(RunError::Connect { target, source });
        }
        if let Some(message) = self
            .unsupported
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
        {
            let target = target.into();
            return Err(RunError::Unsupported { target, message });
        }
        Ok(())
    }
}

fn bench_thread<F: DriverFactory>(
    shared: &Shared<'_>,
    factory: &F,
    thread_index: usize,
    start_line: &StartLine,
) -> Option<(Measurements, Instant)> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            start_line.connect_failed(DriverError::Config(format!(
                "starting a tokio runtime: {e}"
            )));
            None
        }
    };
    let driver = runtime
        .as_ref()
        .and_then(|rt| match rt.block_on(factory.connect()) {
            Ok(driver) => Some(driver),
            Err(e) => {
                start_line.connect_failed(e);
                None
            }
        });
    if let Some(driver) = &driver
        && shared.phase == Phase::Run
        && shared.workload.issues(OpKind::Scan)
        && !driver.supports_scan()
    {
        start_line
            .unsupported("this workload scans (scanproportion > 0) and this driver cannot scan");
    }
    if driver.is_none() || !start_line.clear() {
        shared.stop.store(true, Ordering::Relaxed);
    }
    start_line.barrier.wait();
    let (runtime, driver) = (runtime?, driver?);
    if shared.stopped() {
        return None;
    }
    let concurrency = shared.concurrency;
    let measurements = RefCell::new(Measurements::default());
    let finished = runtime.block_on(async {
        if shared.phase == Phase::Run && driver.batches_reads() {
            return run_batched(shared, &driver, thread_index * concurrency, &measurements).await;
        }
        let tasks = (0..concurrency).map(|task| {
            let global = thread_index * concurrency + task;
            run_task(shared, &driver, global, &measurements)
        });
        let ends = futures::future::join_all(tasks).await;
        ends.into_iter().max().unwrap_or_else(Instant::now)
    });
    Some((measurements.into_inner(), finished))
}

/// One task: issues operations one after another until the count, the
/// duration or a stop ends the phase. Returns when it finished.
async fn run_task<D: Driver>(
    shared: &Shared<'_>,
    driver: &D,
    global_task: usize,
    measurements: &RefCell<Measurements>,
) -> Instant {
    let options = shared.options;
    let mut generator = shared.workload.generator(options.seed, global_task as u64);
    let start = shared.start();
    let warmup_end = shared.warmup_end();
    let deadline = options.duration.map(|d| warmup_end + d);
    // Each task's share of the target rate, offset so tasks interleave.
    let interval = options
        .target_ops_per_sec
        .filter(|r| *r > 0.0)
        .map(|rate| Duration::from_secs_f64(shared.tasks_total as f64 / rate));
    let offset = interval
        .map(|i| i.mul_f64(global_task as f64 / shared.tasks_total as f64))
        .unwrap_or_default();
    let mut slot: u32 = 0;
    let mut claims = Claims::default();
    // Completions not yet added to the shared count (for the progress bar).
    let mut unreported = 0u64;
    // Warm-up operations are recorded here and dropped.
    let warmup = RefCell::new(Measurements::default());
    // When this task was free to issue its next operation: the end of its
    // last one, read again only after the task waited. One clock reading
    // fewer an operation than reading it here (about 25-35 ns on this VM, a
    // few percent of a one-sided read's operation).
    let mut free_at = Instant::now();
    loop {
        if shared.stopped() {
            break;
        }
        let intended = match interval {
            Some(interval) => {
                let at = start + offset + interval.mul_f64(f64::from(slot));
                slot = slot.saturating_add(1);
                tokio::time::sleep_until(at.into()).await;
                free_at = Instant::now();
                Some(at)
            }
            None => None,
        };
        if deadline.is_some_and(|d| free_at >= d) {
            break;
        }
        let measuring = free_at >= warmup_end;
        if measuring && !claims.take(shared) {
            break;
        }
        let mut operation = match shared.phase {
            Phase::Load => generator.next_load_insert(),
            Phase::Run => generator.next_transaction(),
        };
        let intended = intended.unwrap_or(free_at);
        let record_into = if measuring { measurements } else { &warmup };
        match execute(shared, driver, &mut operation, intended, record_into).await {
            Ok(end) => free_at = end,
            Err(message) => {
                shared.fail(message);
                break;
            }
        }
        generator.recycle(operation);
        if measuring {
            record_into.borrow_mut().operations += 1;
        }
        unreported += 1;
        if unreported == CLAIM_BATCH {
            shared.completed.fetch_add(unreported, Ordering::Relaxed);
            unreported = 0;
            // A task's turn ends with each report: an operation answered
            // without waiting (a one-sided read) never yields, and a task
            // whose operation waited (a read that fell back to the server)
            // would be polled again only after the others used up the
            // phase. Not tokio's `consume_budget`: the running tasks spend
            // the budget the waiter's channel needs to take its answer.
            tokio::task::yield_now().await;
            free_at = Instant::now();
        }
    }
    shared.completed.fetch_add(unreported, Ordering::Relaxed);
    // The end of the last operation (the loop only checked the count since).
    Instant::now()
}

/// A thread's operations as a user with `--concurrency` of them in flight
/// issues them through a batch interface: `concurrency` operations are
/// generated (the same generator, key strings and claims as a task's),
/// their reads issued as one [`Driver::read_batch`], and each measured
/// and its record checked as `timed_read` does. One clock reading starts
/// a batch and one ends it: every read of a batch gets the batch's
/// latency. A group that is not all reads runs one operation after
/// another. No `--target-ops` schedule: operations start when the
/// previous batch ended.
async fn run_batched<D: Driver>(
    shared: &Shared<'_>,
    driver: &D,
    stream: usize,
    measurements: &RefCell<Measurements>,
) -> Instant {
    let options = shared.options;
    let mut generator = shared.workload.generator(options.seed, stream as u64);
    let warmup_end = shared.warmup_end();
    let deadline = options.duration.map(|d| warmup_end + d);
    let mut claims = Claims::default();
    let mut unreported = 0u64;
    let warmup = RefCell::new(Measurements::default());
    let mut group = Vec::with_capacity(shared.concurrency);
    while !shared.stopped() {
        let issued = Instant::now();
        if deadline.is_some_and(|d| issued >= d) {
            break;
        }
        let measuring = issued >= warmup_end;
        group.clear();
        while group.len() < shared.concurrency && (!measuring || claims.take(shared)) {
            group.push(generator.next_transaction());
        }
        if group.is_empty() {
            break;
        }
        let record_into = if measuring { measurements } else { &warmup };
        if let Err(message) = execute_group(shared, driver, &mut group, issued, record_into).await {
            shared.fail(message);
            break;
        }
        let count = group.len() as u64;
        if measuring {
            record_into.borrow_mut().operations += count;
        }
        unreported += count;
        if unreported >= CLAIM_BATCH {
            shared.completed.fetch_add(unreported, Ordering::Relaxed);
            unreported = 0;
        }
    }
    shared.completed.fetch_add(unreported, Ordering::Relaxed);
    Instant::now()
}

/// One group of `run_batched`: its reads as one batch if it holds nothing
/// else, else each operation in turn.
async fn execute_group<D: Driver>(
    shared: &Shared<'_>,
    driver: &D,
    group: &mut Vec<Operation>,
    issued: Instant,
    measurements: &RefCell<Measurements>,
) -> Result<(), String> {
    let reads: Option<Vec<(&str, Option<&str>)>> = group
        .iter()
        .map(|op| match op {
            Operation::Read { key, field } => Some((key.as_str(), field.as_deref())),
            _ => None,
        })
        .collect();
    let Some(reads) = reads else {
        for mut operation in group.drain(..) {
            execute(shared, driver, &mut operation, issued, measurements).await?;
        }
        return Ok(());
    };
    let keys: Vec<&str> = reads.iter().map(|(key, _)| *key).collect();
    // Counted by status: every read of a batch has the batch's latency, so
    // each status is recorded once with its count.
    let mut answered = 0;
    let mut counts = StatusCounts::default();
    let mut each = |i: usize, result: ReadResult<'_>| {
        let (key, field) = reads[i];
        counts.add(read_status(key, field, result, measurements));
        answered += 1;
    };
    driver.read_batch(&keys, &mut each).await;
    let end = Instant::now();
    debug_assert!(answered <= reads.len() as u64, "a read answered twice");
    // A read the driver gave no answer for is an error, as in `timed_read`.
    let unanswered = (reads.len() as u64).saturating_sub(answered);
    let mut measurements = measurements.borrow_mut();
    if unanswered > 0 {
        counts.error += unanswered;
        measurements
            .note_error(|| format!("READ: the driver gave no answer for {unanswered} of a batch"));
    }
    for (status, count) in counts.by_status() {
        measurements.measure_n("READ", status, count, issued, issued, end);
    }
    Ok(())
}

/// How many reads of a batch ended with each status.
#[derive(Debug, Default)]
struct StatusCounts {
    ok: u64,
    not_found: u64,
    error: u64,
}

impl StatusCounts {
    fn add(&mut self, status: Status) {
        match status {
            Status::Ok => self.ok += 1,
            Status::NotFound => self.not_found += 1,
            Status::Error => self.error += 1,
        }
    }

    fn by_status(&self) -> [(Status, u64); 3] {
        [
            (Status::Ok, self.ok),
            (Status::NotFound, self.not_found),
            (Status::Error, self.error),
        ]
    }
}

fn status_of<T, E: std::fmt::Display>(
    op: &str,
    result: &Result<T, E>,
    measurements: &RefCell<Measurements>,
) -> Option<Status> {
    match result {
        Ok(_) => None,
        Err(e) => {
            measurements
                .borrow_mut()
                .note_error(|| format!("{op}: {e}"));
            Some(Status::Error)
        }
    }
}

/// A READ's status: its record checked (the field asked for, or all), an
/// absent key, or the driver's error, noted.
fn read_status(
    key: &str,
    field: Option<&str>,
    result: ReadResult<'_>,
    measurements: &RefCell<Measurements>,
) -> Status {
    match result {
        Ok(Some(record)) => match record::check(record, field) {
            Ok(_) => Status::Ok,
            Err(e) => {
                measurements
                    .borrow_mut()
                    .note_error(|| format!("READ {key}: bad record: {e}"));
                Status::Error
            }
        },
        Ok(None) => Status::NotFound,
        Err(e) => {
            measurements
                .borrow_mut()
                .note_error(|| format!("READ: {e}"));
            Status::Error
        }
    }
}

async fn timed_read<D: Driver>(
    driver: &D,
    key: &str,
    field: Option<&str>,
    intended: Instant,
    measurements: &RefCell<Measurements>,
) -> Instant {
    let start = Instant::now();
    // The read ends when its record is known; the check is not timed.
    let mut answer = None;
    driver
        .read_with(key, &mut |result| {
            let end = Instant::now();
            answer = Some((end, read_status(key, field, result, measurements)));
        })
        .await;
    let (end, status) = answer.unwrap_or_else(|| {
        measurements
            .borrow_mut()
            .note_error(|| format!("READ {key}: the driver gave no answer"));
        (Instant::now(), Status::Error)
    });
    measurements
        .borrow_mut()
        .measure("READ", status, intended, start, end);
    end
}

async fn timed_write<D: Driver>(
    driver: &D,
    op: &str,
    key: &str,
    value: bytes::Bytes,
    intended: Instant,
    measurements: &RefCell<Measurements>,
) -> Instant {
    let start = Instant::now();
    let result = if op == "INSERT" {
        driver.insert(key, value).await
    } else {
        driver.update(key, value).await
    };
    let end = Instant::now();
    let status = status_of(op, &result, measurements).unwrap_or(Status::Ok);
    measurements
        .borrow_mut()
        .measure(op, status, intended, start, end);
    end
}

/// Issues one operation and records it; returns when it ended. The
/// operation's values are taken out of it (its key stays, for the
/// generator to reuse). `Err` is fatal for the run.
async fn execute<D: Driver>(
    shared: &Shared<'_>,
    driver: &D,
    operation: &mut Operation,
    intended: Instant,
    measurements: &RefCell<Measurements>,
) -> Result<Instant, String> {
    let end = match operation {
        Operation::Read { key, field } => {
            timed_read(driver, key, field.as_deref(), intended, measurements).await
        }
        Operation::Update { key, value } => {
            let value = std::mem::take(value);
            timed_write(driver, "UPDATE", key, value, intended, measurements).await
        }
        Operation::Insert {
            key,
            keynum,
            value,
            acknowledge,
        } => {
            let value = std::mem::take(value);
            let end = timed_write(driver, "INSERT", key, value, intended, measurements).await;
            if *acknowledge {
                shared
                    .workload
                    .acknowledge_insert(*keynum)
                    .map_err(|e| e.to_string())?;
            }
            end
        }
        Operation::Scan {
            start_key,
            count,
            field,
        } => {
            timed_scan(
                driver,
                start_key,
                *count,
                field.as_deref(),
                intended,
                measurements,
            )
            .await
        }
        Operation::ReadModifyWrite { key, field, value } => {
            // As YCSB: the read and the update are measured on their own and
            // together, and the update happens whatever the read returned.
            let start = Instant::now();
            timed_read(driver, key, field.as_deref(), intended, measurements).await;
            let value = std::mem::take(value);
            let end = timed_write(driver, "UPDATE", key, value, intended, measurements).await;
            measurements
                .borrow_mut()
                .record_latency("READ-MODIFY-WRITE", intended, start, end);
            end
        }
    };
    Ok(end)
}

/// A scan of `count` records from `start_key`, every record checked;
/// returns when it ended.
async fn timed_scan<D: Driver>(
    driver: &D,
    start_key: &str,
    count: usize,
    field: Option<&str>,
    intended: Instant,
    measurements: &RefCell<Measurements>,
) -> Instant {
    let start = Instant::now();
    let result = driver.scan(start_key, count).await;
    let end = Instant::now();
    let status = status_of("SCAN", &result, measurements).unwrap_or_else(|| {
        let records = result.as_deref().unwrap_or_default();
        match records
            .iter()
            .try_for_each(|r| record::check(r, field).map(drop))
        {
            Ok(()) => Status::Ok,
            Err(e) => {
                measurements
                    .borrow_mut()
                    .note_error(|| format!("SCAN {start_key}: bad record: {e}"));
                Status::Error
            }
        }
    });
    measurements
        .borrow_mut()
        .measure("SCAN", status, intended, start, end);
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::properties::Properties;
    use bytes::Bytes;

    /// The writes and scans of a test driver that only reads: all answered
    /// at once, nothing stored.
    macro_rules! writes_do_nothing {
        () => {
            async fn update(&self, _key: &str, _record: Bytes) -> Result<(), DriverError> {
                Ok(())
            }

            async fn insert(&self, _key: &str, _record: Bytes) -> Result<(), DriverError> {
                Ok(())
            }

            async fn scan(&self, _start: &str, _count: usize) -> Result<Vec<Bytes>, DriverError> {
                Ok(Vec::new())
            }
        };
    }

    /// Reads answered at once, except the first `waits` of the phase (one
    /// per task, as when every task's first one-sided read falls back to
    /// the server before the topology is known): each waits for an answer
    /// another task sends (a connection's), and notes how many reads the
    /// other tasks completed meanwhile.
    struct FirstReadsWait {
        reads_done: AtomicU64,
        waits_left: AtomicU64,
        others_during: Mutex<Vec<u64>>,
    }

    impl Driver for &FirstReadsWait {
        fn supports_scan(&self) -> bool {
            false
        }

        async fn read(&self, _key: &str) -> Result<Option<Bytes>, DriverError> {
            let waits =
                self.waits_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                        left.checked_sub(1)
                    });
            if waits.is_ok() {
                let before = self.reads_done.load(Ordering::Relaxed);
                let (answer, answered) = tokio::sync::oneshot::channel();
                tokio::spawn(async move { answer.send(()) });
                answered.await.unwrap();
                let during = self.reads_done.load(Ordering::Relaxed) - before;
                self.others_during.lock().unwrap().push(during);
            }
            self.reads_done.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }

        writes_do_nothing!();
    }

    impl<'d> DriverFactory for &'d FirstReadsWait {
        type Driver = &'d FirstReadsWait;

        fn label(&self) -> String {
            "first-reads-wait".into()
        }

        async fn connect(&self) -> Result<&'d FirstReadsWait, DriverError> {
            Ok(*self)
        }
    }

    /// A task whose operation waited is polled again among the others,
    /// not after they used up the phase: tasks whose operations never
    /// wait (one-sided reads) would otherwise run the whole count first,
    /// and the waiting operation's latency would be the phase's length.
    #[test]
    fn a_waiting_operation_is_not_starved_by_tasks_that_never_wait() {
        const TASKS: usize = 16;
        let mut p = Properties::new();
        p.set("readproportion", "1");
        p.set("updateproportion", "0");
        p.set("recordcount", "1000");
        p.set("operationcount", "100000");
        let workload = Arc::new(Workload::from_properties(&p).unwrap());
        let driver = FirstReadsWait {
            reads_done: AtomicU64::new(0),
            waits_left: AtomicU64::new(TASKS as u64),
            others_during: Mutex::new(Vec::new()),
        };
        let options = RunOptions {
            concurrency: TASKS,
            ..RunOptions::default()
        };
        let result = run_phase(Phase::Run, &workload, &&driver, &options).unwrap();
        assert_eq!(result.operations, 100_000);
        let during = driver.others_during.into_inner().unwrap();
        assert_eq!(during.len(), TASKS);
        // Each of the other tasks may run a turn (CLAIM_BATCH operations)
        // before a waiting one is polled again.
        let bound = TASKS as u64 * CLAIM_BATCH;
        let most = during.iter().copied().max().unwrap_or(0);
        assert!(
            most <= bound,
            "{most} reads ran while one waited: {during:?}"
        );
    }

    /// Hands its records over borrowed (`read_with`); its `read` fails, so
    /// a READ that went through it would be an error. For `silent` it
    /// breaks the contract and gives no answer.
    struct Borrowed {
        good: Bytes,
    }

    impl Driver for Borrowed {
        fn supports_scan(&self) -> bool {
            false
        }

        async fn read(&self, _key: &str) -> Result<Option<Bytes>, DriverError> {
            Err(DriverError::Unsupported("read called".into()))
        }

        async fn read_with(&self, key: &str, each: &mut dyn FnMut(ReadResult<'_>)) {
            match key {
                "good" => each(Ok(Some(&self.good))),
                "bad" => each(Ok(Some(b"\xff\xff not a record"))),
                "silent" => {}
                _ => each(Ok(None)),
            }
        }

        writes_do_nothing!();
    }

    /// A single READ is judged on the record its driver hands over borrowed
    /// (a whole record checked, a damaged one an error, an absent key not
    /// found), as a batch's reads are; no answer at all is an error.
    #[test]
    fn a_single_read_judges_the_record_handed_over() {
        let driver = Borrowed {
            good: record::encode([("field0", &b"value"[..])]),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let errors_after = |key: &str| {
            let measurements = RefCell::new(Measurements::default());
            runtime.block_on(timed_read(
                &driver,
                key,
                None,
                Instant::now(),
                &measurements,
            ));
            measurements.into_inner().errors
        };
        assert!(errors_after("good").is_empty());
        assert!(errors_after("absent").is_empty());
        let bad = errors_after("bad");
        assert_eq!(bad.len(), 1);
        assert!(bad[0].contains("READ bad: bad record"), "{bad:?}");
        let silent = errors_after("silent");
        assert!(silent[0].contains("gave no answer"), "{silent:?}");

        let measurements = RefCell::new(Measurements::default());
        let good = record::encode([("field0", &b"value"[..])]);
        assert_eq!(
            read_status("k", Some("field0"), Ok(Some(&good)), &measurements),
            Status::Ok
        );
        assert_eq!(
            read_status("k", Some("field9"), Ok(Some(&good)), &measurements),
            Status::Error
        );
        assert_eq!(
            read_status("k", None, Ok(None), &measurements),
            Status::NotFound
        );
    }
}
