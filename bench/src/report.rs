//! Measurements and how they are reported: YCSB's text format (the lines
//! YCSB's `TextMeasurementsExporter` prints with `measurementtype=hdrhistogram`),
//! JSON, and a side-by-side comparison of targets.
//!
//! As in YCSB's `DBWrapper`, the latency of a successful operation goes to
//! its own series (`READ`), that of a failed one (`NOT_FOUND`, `ERROR`) to
//! `READ-FAILED`, and every outcome is counted as `Return=<status>` under the
//! operation. With a target rate, each series is also kept measured from
//! the operation's intended start time (`Intended-READ`, YCSB's
//! `measurement.interval=both`): that latency includes the time an
//! operation waited because earlier ones were late, which the service time
//! hides (coordinated omission).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// YCSB's `Status` names for the outcomes this benchmark distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    NotFound,
    Error,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::NotFound => "NOT_FOUND",
            Status::Error => "ERROR",
        }
    }
}

/// Latencies are recorded in nanoseconds (3 significant digits) so that
/// sub-microsecond one-sided reads are not all "1 µs".
fn new_histogram() -> Histogram<u64> {
    // 3 significant digits, auto-resizing: cannot fail.
    Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits are valid"))
}

#[derive(Debug, Clone)]
struct Series {
    service_ns: Histogram<u64>,
    intended_ns: Histogram<u64>,
    /// Exact sums for the averages (a histogram's mean is off by its
    /// bucket width).
    service_sum_ns: u128,
    intended_sum_ns: u128,
}

impl Series {
    fn new() -> Series {
        Series {
            service_ns: new_histogram(),
            intended_ns: new_histogram(),
            service_sum_ns: 0,
            intended_sum_ns: 0,
        }
    }
}

/// `saturating_record` clamps instead of growing an auto-resizing
/// histogram; `record` grows it and fails only past what it can represent.
fn record_n(hist: &mut Histogram<u64>, value_ns: u64, count: u64) {
    if hist.record_n(value_ns, count).is_err() {
        hist.saturating_record_n(value_ns, count);
    }
}

/// The series of an operation's failures (`READ-FAILED`), named without
/// an allocation for the operations the workloads issue.
fn failed_series(op: &str) -> Cow<'static, str> {
    const FAILED: [(&str, &str); 4] = [
        ("READ", "READ-FAILED"),
        ("UPDATE", "UPDATE-FAILED"),
        ("INSERT", "INSERT-FAILED"),
        ("SCAN", "SCAN-FAILED"),
    ];
    match FAILED.iter().find(|(name, _)| *name == op) {
        Some((_, failed)) => Cow::Borrowed(failed),
        None => Cow::Owned(format!("{op}-FAILED")),
    }
}

fn saturating_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// What one benchmark thread measured; merged at the end of a phase.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    series: BTreeMap<String, Series>,
    returns: BTreeMap<String, BTreeMap<&'static str, u64>>,
    /// Operations issued (the `[OVERALL]` count, failed ones included).
    pub operations: u64,
    /// The first few error messages, for the user.
    pub errors: Vec<String>,
}

const KEPT_ERRORS: usize = 5;

impl Measurements {
    /// Records one database operation, as `DBWrapper.measure` and
    /// `reportStatus` do.
    pub fn measure(
        &mut self,
        op: &str,
        status: Status,
        intended: Instant,
        start: Instant,
        end: Instant,
    ) {
        self.measure_n(op, status, 1, intended, start, end);
    }

    /// Records `count` operations that started and ended together (the
    /// reads of one batch) at once: the same histograms as `count` calls
    /// of [`Self::measure`], one recording each. Allocates nothing once
    /// the operation's series and status have been seen (a benchmark
    /// thread at millions of operations a second would otherwise spend
    /// more in its bookkeeping than in some stores' reads).
    pub fn measure_n(
        &mut self,
        op: &str,
        status: Status,
        count: u64,
        intended: Instant,
        start: Instant,
        end: Instant,
    ) {
        if count == 0 {
            return;
        }
        if status == Status::Ok {
            self.record_latency_n(op, count, intended, start, end);
        } else {
            self.record_latency_n(&failed_series(op), count, intended, start, end);
        }
        self.report_status_n(op, status, count);
    }

    /// Records a latency without a status (YCSB's `READ-MODIFY-WRITE`).
    pub fn record_latency(&mut self, name: &str, intended: Instant, start: Instant, end: Instant) {
        self.record_latency_n(name, 1, intended, start, end);
    }

    fn record_latency_n(
        &mut self,
        name: &str,
        count: u64,
        intended: Instant,
        start: Instant,
        end: Instant,
    ) {
        // Looked up by `&str` first: the key is allocated once per series.
        if !self.series.contains_key(name) {
            self.series.insert(name.to_owned(), Series::new());
        }
        let Some(series) = self.series.get_mut(name) else {
            return;
        };
        let service_ns = saturating_ns(end - start);
        let intended_ns = saturating_ns(end.saturating_duration_since(intended));
        record_n(&mut series.service_ns, service_ns, count);
        record_n(&mut series.intended_ns, intended_ns, count);
        series.service_sum_ns += u128::from(service_ns) * u128::from(count);
        series.intended_sum_ns += u128::from(intended_ns) * u128::from(count);
    }

    pub fn report_status(&mut self, op: &str, status: Status) {
        self.report_status_n(op, status, 1);
    }

    fn report_status_n(&mut self, op: &str, status: Status, count: u64) {
        if !self.returns.contains_key(op) {
            self.returns.insert(op.to_owned(), BTreeMap::new());
        }
        if let Some(counts) = self.returns.get_mut(op) {
            *counts.entry(status.name()).or_default() += count;
        }
    }

    pub fn note_error(&mut self, message: impl FnOnce() -> String) {
        if self.errors.len() < KEPT_ERRORS {
            self.errors.push(message());
        }
    }

    pub fn merge(&mut self, other: Measurements) {
        for (name, series) in other.series {
            match self.series.get_mut(&name) {
                Some(mine) => {
                    // Same significant digits, auto-resizing: adding cannot fail.
                    let _ = mine.service_ns.add(&series.service_ns);
                    let _ = mine.intended_ns.add(&series.intended_ns);
                    mine.service_sum_ns += series.service_sum_ns;
                    mine.intended_sum_ns += series.intended_sum_ns;
                }
                None => {
                    self.series.insert(name, series);
                }
            }
        }
        for (op, counts) in other.returns {
            let mine = self.returns.entry(op).or_default();
            for (status, n) in counts {
                *mine.entry(status).or_default() += n;
            }
        }
        self.operations += other.operations;
        for e in other.errors {
            if self.errors.len() < KEPT_ERRORS {
                self.errors.push(e);
            }
        }
    }

    /// Summaries of every series (service time, and intended-time latency
    /// when `with_intended`).
    pub fn summarize(&self, with_intended: bool) -> (Vec<OpSummary>, Vec<OpSummary>) {
        let mut names: Vec<&String> = self.series.keys().collect();
        let mut returned: Vec<&String> = self.returns.keys().collect();
        names.append(&mut returned);
        names.sort_by_key(|n| series_order(n));
        names.dedup();
        let empty = Series::new();
        let summary = |name: &str, pick: fn(&Series) -> (&Histogram<u64>, u128)| {
            let series = self.series.get(name).unwrap_or(&empty);
            let (hist, sum_ns) = pick(series);
            OpSummary::of(name, hist, sum_ns, self.returns.get(name))
        };
        let service = names
            .iter()
            .map(|n| summary(n, |s| (&s.service_ns, s.service_sum_ns)))
            .collect();
        let intended = if with_intended {
            names
                .iter()
                .filter(|n| self.series.contains_key(n.as_str()))
                .map(|n| {
                    let mut s = summary(n, |s| (&s.intended_ns, s.intended_sum_ns));
                    s.name = format!("Intended-{n}");
                    s.returns.clear();
                    s
                })
                .collect()
        } else {
            Vec::new()
        };
        (service, intended)
    }
}

/// YCSB prints measurements in hash order; a fixed order reads better.
fn series_order(name: &str) -> (usize, String) {
    let base = name.trim_end_matches("-FAILED");
    let rank = ["READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE"]
        .iter()
        .position(|n| *n == base)
        .unwrap_or(5);
    (
        rank * 2 + usize::from(base.len() != name.len()),
        name.to_owned(),
    )
}

/// One series, in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpSummary {
    pub name: String,
    pub operations: u64,
    pub average_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// `Return=<status>` counts (on the operation's own series only).
    pub returns: BTreeMap<String, u64>,
}

impl OpSummary {
    fn of(
        name: &str,
        hist: &Histogram<u64>,
        sum_ns: u128,
        returns: Option<&BTreeMap<&'static str, u64>>,
    ) -> OpSummary {
        let us = |ns: u64| ns as f64 / 1000.0;
        let empty = hist.is_empty();
        let at = |q: f64| {
            if empty {
                0.0
            } else {
                us(hist.value_at_quantile(q))
            }
        };
        OpSummary {
            name: name.to_owned(),
            operations: hist.len(),
            average_us: if empty {
                0.0
            } else {
                sum_ns as f64 / hist.len() as f64 / 1000.0
            },
            min_us: if empty { 0.0 } else { us(hist.min()) },
            max_us: if empty { 0.0 } else { us(hist.max()) },
            p50_us: at(0.50),
            p95_us: at(0.95),
            p99_us: at(0.99),
            p999_us: at(0.999),
            returns: returns
                .map(|r| r.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
                .unwrap_or_default(),
        }
    }

    pub fn returned(&self, status: Status) -> u64 {
        self.returns.get(status.name()).copied().unwrap_or(0)
    }
}

/// The result of one phase against one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseResult {
    /// `rdkv-shm`, `rdkv-tcp`, `redis`, ...
    pub target: String,
    /// `load` or `run`.
    pub phase: String,
    pub threads: usize,
    pub concurrency: usize,
    pub target_ops_per_sec: Option<f64>,
    pub warmup_secs: f64,
    pub runtime_ms: f64,
    pub operations: u64,
    pub throughput_ops_sec: f64,
    /// Service time: from the moment the operation was issued.
    pub ops: Vec<OpSummary>,
    /// From the intended start time of the schedule (only with a target rate).
    pub intended: Vec<OpSummary>,
    pub first_errors: Vec<String>,
}

impl PhaseResult {
    pub fn op(&self, name: &str) -> Option<&OpSummary> {
        self.ops.iter().find(|s| s.name == name)
    }

    pub fn intended_op(&self, name: &str) -> Option<&OpSummary> {
        self.intended
            .iter()
            .find(|s| s.name.strip_prefix("Intended-") == Some(name))
    }

    /// Every failed operation (`Return=ERROR`), whatever the op.
    pub fn errors(&self) -> u64 {
        self.ops.iter().map(|s| s.returned(Status::Error)).sum()
    }
}

/// How Java prints a double (`Double.toString`) for the values YCSB writes:
/// integral values keep a `.0`.
fn java_double(x: f64) -> String {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e7 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

/// YCSB's `ordinal` for percentile names: `50th`, `99th`, but `99.9`.
fn ordinal(percentile: f64) -> String {
    if percentile.fract() == 0.0 {
        let j = percentile as u64;
        let suffix = match j % 100 {
            11..=13 => "th",
            _ => match j % 10 {
                1 => "st",
                2 => "nd",
                3 => "rd",
                _ => "th",
            },
        };
        format!("{j}{suffix}")
    } else {
        format!("{percentile}")
    }
}

fn write_series(out: &mut String, s: &OpSummary) {
    // YCSB prints latencies as whole microseconds except the average.
    let whole = |us: f64| us.round() as u64;
    let name = &s.name;
    let _ = writeln!(out, "[{name}], Operations, {}", s.operations);
    let _ = writeln!(
        out,
        "[{name}], AverageLatency(us), {}",
        java_double(s.average_us)
    );
    let _ = writeln!(out, "[{name}], MinLatency(us), {}", whole(s.min_us));
    let _ = writeln!(out, "[{name}], MaxLatency(us), {}", whole(s.max_us));
    for (p, v) in [
        (50.0, s.p50_us),
        (95.0, s.p95_us),
        (99.0, s.p99_us),
        (99.9, s.p999_us),
    ] {
        let _ = writeln!(
            out,
            "[{name}], {}PercentileLatency(us), {}",
            ordinal(p),
            whole(v)
        );
    }
    for (status, n) in &s.returns {
        let _ = writeln!(out, "[{name}], Return={status}, {n}");
    }
}

/// YCSB's text output of one phase.
pub fn ycsb_text(result: &PhaseResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "[OVERALL], RunTime(ms), {}",
        result.runtime_ms.round() as u64
    );
    let _ = writeln!(
        out,
        "[OVERALL], Throughput(ops/sec), {}",
        java_double(result.throughput_ops_sec)
    );
    for s in result.ops.iter().chain(&result.intended) {
        write_series(&mut out, s);
    }
    out
}

/// Side by side: throughput and p50/p99 of every op, with the ratio of the
/// first target to each other one.
pub fn comparison_table(results: &[&PhaseResult]) -> String {
    let mut out = String::new();
    let Some(first) = results.first() else {
        return out;
    };
    let mut header = String::from("| metric |");
    let mut rule = String::from("|---|");
    for r in results {
        let _ = write!(header, " {} |", r.target);
        rule.push_str("---|");
    }
    for r in &results[1..] {
        let _ = write!(header, " {}/{} |", first.target, r.target);
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    let mut row = |label: &str, values: Vec<Option<f64>>| {
        let _ = write!(out, "| {label} |");
        for v in &values {
            match v {
                Some(v) => {
                    let _ = write!(out, " {} |", format_number(*v));
                }
                None => out.push_str(" - |"),
            }
        }
        for v in &values[1..] {
            match (values[0], v) {
                (Some(a), Some(b)) if *b > 0.0 => {
                    let _ = write!(out, " {:.2} |", a / b);
                }
                _ => out.push_str(" - |"),
            }
        }
        out.push('\n');
    };
    row(
        "throughput (ops/s)",
        results.iter().map(|r| Some(r.throughput_ops_sec)).collect(),
    );
    let mut names: Vec<&str> = Vec::new();
    for r in results {
        for s in &r.ops {
            if !s.name.ends_with("-FAILED") && s.operations > 0 && !names.contains(&s.name.as_str())
            {
                names.push(&s.name);
            }
        }
    }
    for name in names {
        for (label, pick) in [("p50", 0usize), ("p99", 1)] {
            let values = results
                .iter()
                .map(|r| {
                    r.op(name)
                        .filter(|s| s.operations > 0)
                        .map(|s| if pick == 0 { s.p50_us } else { s.p99_us })
                })
                .collect();
            row(&format!("{name} {label} (us)"), values);
        }
    }
    out
}

fn format_number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// `--json FILE`: every phase of every target.
pub fn write_json(path: &std::path::Path, results: &[PhaseResult]) -> io::Result<()> {
    let text = serde_json::to_string_pretty(results).map_err(io::Error::other)?;
    let mut file = std::fs::File::create(path)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PhaseResult {
        let mut m = Measurements::default();
        let t0 = Instant::now();
        for us in [10u64, 20, 30, 40, 1000] {
            let end = t0 + Duration::from_micros(us);
            m.measure("READ", Status::Ok, t0, t0, end);
        }
        m.measure(
            "READ",
            Status::NotFound,
            t0,
            t0,
            t0 + Duration::from_micros(5),
        );
        m.measure(
            "UPDATE",
            Status::Error,
            t0,
            t0,
            t0 + Duration::from_micros(7),
        );
        m.operations = 7;
        let (ops, intended) = m.summarize(false);
        PhaseResult {
            target: "rdkv-tcp".into(),
            phase: "run".into(),
            threads: 1,
            concurrency: 1,
            target_ops_per_sec: None,
            warmup_secs: 0.0,
            runtime_ms: 7.0,
            operations: 7,
            throughput_ops_sec: 1000.0,
            ops,
            intended,
            first_errors: vec![],
        }
    }

    /// The lines YCSB prints for `op` when each of its `count` operations
    /// took `us` microseconds.
    fn uniform(op: &str, count: u64, us: u64) -> String {
        let mut out = format!("[{op}], Operations, {count}\n[{op}], AverageLatency(us), {us}.0\n");
        for stat in [
            "Min",
            "Max",
            "50thPercentile",
            "95thPercentile",
            "99thPercentile",
            "99.9Percentile",
        ] {
            out += &format!("[{op}], {stat}Latency(us), {us}\n");
        }
        out
    }

    #[test]
    fn text_output_is_ycsbs() {
        let text = ycsb_text(&sample());
        let expected = "\
[OVERALL], RunTime(ms), 7
[OVERALL], Throughput(ops/sec), 1000.0
[READ], Operations, 5
[READ], AverageLatency(us), 220.0
[READ], MinLatency(us), 10
[READ], MaxLatency(us), 1000
[READ], 50thPercentileLatency(us), 30
[READ], 95thPercentileLatency(us), 1000
[READ], 99thPercentileLatency(us), 1000
[READ], 99.9PercentileLatency(us), 1000
[READ], Return=NOT_FOUND, 1
[READ], Return=OK, 5
"
        .to_owned()
            + &uniform("READ-FAILED", 1, 5)
            + &uniform("UPDATE", 0, 0)
            + "[UPDATE], Return=ERROR, 1\n"
            + &uniform("UPDATE-FAILED", 1, 7);
        assert_eq!(text, expected);
        assert_eq!(sample().errors(), 1);
    }

    #[test]
    fn percentile_names_follow_ycsbs_ordinal() {
        assert_eq!(ordinal(50.0), "50th");
        assert_eq!(ordinal(1.0), "1st");
        assert_eq!(ordinal(2.0), "2nd");
        assert_eq!(ordinal(93.0), "93rd");
        assert_eq!(ordinal(11.0), "11th");
        assert_eq!(ordinal(99.9), "99.9");
        assert_eq!(java_double(98.5), "98.5");
        assert_eq!(java_double(3.0), "3.0");
    }

    #[test]
    fn intended_series_are_labelled_and_include_the_wait() {
        let mut m = Measurements::default();
        let intended = Instant::now();
        let start = intended + Duration::from_micros(500);
        m.measure(
            "READ",
            Status::Ok,
            intended,
            start,
            start + Duration::from_micros(10),
        );
        let (ops, intended) = m.summarize(true);
        assert_eq!(ops[0].name, "READ");
        assert!((ops[0].p50_us - 10.0).abs() < 0.1);
        assert_eq!(intended[0].name, "Intended-READ");
        assert!((intended[0].p50_us - 510.0).abs() < 1.0);
        assert!(intended[0].returns.is_empty());
    }

    #[test]
    fn comparison_has_ratios() {
        let a = sample();
        let mut b = sample();
        b.target = "redis".into();
        b.throughput_ops_sec = 500.0;
        let table = comparison_table(&[&a, &b]);
        assert!(
            table.contains("| metric | rdkv-tcp | redis | rdkv-tcp/redis |"),
            "{table}"
        );
        assert!(
            table.contains("| throughput (ops/s) | 1000 | 500 | 2.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| READ p50 (us) | 30.0 | 30.0 | 1.00 |"),
            "{table}"
        );
    }
}
