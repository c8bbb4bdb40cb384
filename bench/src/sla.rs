//! `--sla 'read.p99<500us,throughput>100000'`: thresholds that turn a run
//! into pass/fail.
//!
//! A clause is `throughput <op> N` (operations per second over the whole
//! phase) or `<operation>.<statistic> <op> <latency>`, where the operation
//! is read, update, insert, scan or rmw (read-modify-write), the statistic
//! p50, p95, p99, p999, avg, min or max, the comparison `<`, `<=`, `>` or
//! `>=`, and the latency a number with a unit: ns, us, ms or s. Latencies
//! are the intended-time (coordinated-omission corrected) ones when the run
//! had a target rate, else the service times.

use std::fmt;

use thiserror::Error;

use crate::report::{OpSummary, PhaseResult};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SlaError {
    #[error("empty SLA: expected clauses like 'read.p99<500us,throughput>100000'")]
    Empty,
    #[error("SLA clause {clause:?}: {problem}")]
    Clause { clause: String, problem: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Comparison {
    fn holds(self, measured: f64, limit: f64) -> bool {
        match self {
            Comparison::Less => measured < limit,
            Comparison::LessOrEqual => measured <= limit,
            Comparison::Greater => measured > limit,
            Comparison::GreaterOrEqual => measured >= limit,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Comparison::Less => "<",
            Comparison::LessOrEqual => "<=",
            Comparison::Greater => ">",
            Comparison::GreaterOrEqual => ">=",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Statistic {
    P50,
    P95,
    P99,
    P999,
    Avg,
    Min,
    Max,
}

impl Statistic {
    fn parse(s: &str) -> Option<Statistic> {
        Some(match s {
            "p50" => Statistic::P50,
            "p95" => Statistic::P95,
            "p99" => Statistic::P99,
            "p999" | "p99.9" => Statistic::P999,
            "avg" | "mean" => Statistic::Avg,
            "min" => Statistic::Min,
            "max" => Statistic::Max,
            _ => return None,
        })
    }

    fn of(self, s: &OpSummary) -> f64 {
        match self {
            Statistic::P50 => s.p50_us,
            Statistic::P95 => s.p95_us,
            Statistic::P99 => s.p99_us,
            Statistic::P999 => s.p999_us,
            Statistic::Avg => s.average_us,
            Statistic::Min => s.min_us,
            Statistic::Max => s.max_us,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    Throughput,
    /// YCSB operation name (`READ`) and statistic.
    Latency {
        op: &'static str,
        statistic: Statistic,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The clause as written.
    pub text: String,
    pub metric: Metric,
    pub comparison: Comparison,
    /// Operations per second, or microseconds.
    pub limit: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sla {
    pub thresholds: Vec<Threshold>,
}

fn op_name(s: &str) -> Option<&'static str> {
    Some(match s {
        "read" => "READ",
        "update" => "UPDATE",
        "insert" => "INSERT",
        "scan" => "SCAN",
        "rmw" | "readmodifywrite" | "read-modify-write" => "READ-MODIFY-WRITE",
        _ => return None,
    })
}

/// `500us` -> 500.0 (microseconds).
fn parse_latency(s: &str) -> Result<f64, String> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("latency {s:?} needs a unit (ns, us, ms or s)"))?;
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let scale = match unit {
        "ns" => 0.001,
        "us" | "µs" => 1.0,
        "ms" => 1000.0,
        "s" => 1_000_000.0,
        other => return Err(format!("unknown unit {other:?}: expected ns, us, ms or s")),
    };
    Ok(value * scale)
}

impl Sla {
    pub fn parse(text: &str) -> Result<Sla, SlaError> {
        let mut thresholds = Vec::new();
        for clause in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let err = |problem: String| SlaError::Clause {
                clause: clause.to_owned(),
                problem,
            };
            let at = clause
                .find(['<', '>'])
                .ok_or_else(|| err("expected a comparison: <, <=, > or >=".into()))?;
            let (left, rest) = clause.split_at(at);
            let (comparison, right) = match rest {
                r if r.starts_with("<=") => (Comparison::LessOrEqual, &r[2..]),
                r if r.starts_with(">=") => (Comparison::GreaterOrEqual, &r[2..]),
                r if r.starts_with('<') => (Comparison::Less, &r[1..]),
                r => (Comparison::Greater, &r[1..]),
            };
            let (left, right) = (left.trim().to_ascii_lowercase(), right.trim());
            if right.is_empty() {
                return Err(err("missing the limit after the comparison".into()));
            }
            let (metric, limit) = if left == "throughput" {
                let limit: f64 = right
                    .strip_suffix("ops/s")
                    .unwrap_or(right)
                    .trim()
                    .parse()
                    .map_err(|_| err(format!("throughput limit {right:?} is not a number")))?;
                (Metric::Throughput, limit)
            } else {
                let (op, statistic) = left.split_once('.').ok_or_else(|| {
                    err(format!(
                        "{left:?}: expected throughput or <op>.<statistic> such as read.p99"
                    ))
                })?;
                let op = op_name(op).ok_or_else(|| {
                    err(format!(
                        "unknown operation {op:?}: expected read, update, insert, scan or rmw"
                    ))
                })?;
                let statistic = Statistic::parse(statistic).ok_or_else(|| {
                    err(format!(
                        "unknown statistic {statistic:?}: expected p50, p95, p99, p999, avg, min or max"
                    ))
                })?;
                (
                    Metric::Latency { op, statistic },
                    parse_latency(right).map_err(err)?,
                )
            };
            if !limit.is_finite() || limit < 0.0 {
                return Err(err(format!(
                    "limit {right:?} must be a non-negative number"
                )));
            }
            thresholds.push(Threshold {
                text: clause.to_owned(),
                metric,
                comparison,
                limit,
            });
        }
        if thresholds.is_empty() {
            return Err(SlaError::Empty);
        }
        Ok(Sla { thresholds })
    }

    pub fn evaluate(&self, result: &PhaseResult) -> SlaReport {
        let corrected = result.target_ops_per_sec.is_some();
        let checks = self
            .thresholds
            .iter()
            .map(|t| {
                let measured = match &t.metric {
                    Metric::Throughput => Some(result.throughput_ops_sec),
                    Metric::Latency { op, statistic } => {
                        let series = if corrected {
                            result.intended_op(op)
                        } else {
                            result.op(op)
                        };
                        series.filter(|s| s.operations > 0).map(|s| statistic.of(s))
                    }
                };
                let passed = measured.is_some_and(|m| t.comparison.holds(m, t.limit));
                Check {
                    threshold: t.clone(),
                    measured,
                    passed,
                }
            })
            .collect();
        SlaReport {
            target: result.target.clone(),
            corrected,
            checks,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub threshold: Threshold,
    /// `None`: the run has no such operation.
    pub measured: Option<f64>,
    pub passed: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SlaReport {
    pub target: String,
    /// Latencies were taken from the intended start times.
    pub corrected: bool,
    pub checks: Vec<Check>,
}

impl SlaReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

fn show(metric: &Metric, value: f64) -> String {
    match metric {
        Metric::Throughput => format!("{value:.1} ops/s"),
        Metric::Latency { .. } => format!("{value:.1}us"),
    }
}

impl fmt::Display for SlaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "SLA for {} ({} latencies): {}",
            self.target,
            if self.corrected {
                "intended-time, coordinated-omission corrected"
            } else {
                "service-time"
            },
            if self.passed() { "PASS" } else { "FAIL" }
        )?;
        for c in &self.checks {
            let t = &c.threshold;
            let measured = match c.measured {
                Some(m) => show(&t.metric, m),
                None => "no such operations in this run".into(),
            };
            writeln!(
                f,
                "  {} {:<28} measured {measured}, limit {} {}",
                if c.passed { "pass" } else { "FAIL" },
                t.text,
                t.comparison.symbol(),
                show(&t.metric, t.limit),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::OpSummary;
    use std::collections::BTreeMap;

    #[test]
    fn parses_clauses_and_units() {
        let sla = Sla::parse(
            "read.p99<500us, throughput>100000,update.max<=2ms,scan.avg>=0.5s,rmw.p999<800ns",
        )
        .unwrap();
        assert_eq!(sla.thresholds.len(), 5);
        assert_eq!(
            sla.thresholds[0].metric,
            Metric::Latency {
                op: "READ",
                statistic: Statistic::P99
            }
        );
        assert_eq!(sla.thresholds[0].comparison, Comparison::Less);
        assert_eq!(sla.thresholds[0].limit, 500.0);
        assert_eq!(sla.thresholds[1].metric, Metric::Throughput);
        assert_eq!(sla.thresholds[1].limit, 100_000.0);
        assert_eq!(sla.thresholds[2].comparison, Comparison::LessOrEqual);
        assert_eq!(sla.thresholds[2].limit, 2000.0);
        assert_eq!(sla.thresholds[3].limit, 500_000.0);
        assert!((sla.thresholds[4].limit - 0.8).abs() < 1e-12);
        assert_eq!(
            sla.thresholds[4].metric,
            Metric::Latency {
                op: "READ-MODIFY-WRITE",
                statistic: Statistic::P999
            }
        );
    }

    #[test]
    fn bad_slas_get_clear_errors() {
        let cases = [
            ("", "empty SLA"),
            ("read.p99", "expected a comparison"),
            ("read.p99<500", "needs a unit"),
            ("read.p99<500h", "unknown unit"),
            ("reed.p99<5ms", "unknown operation"),
            ("read.p42<5ms", "unknown statistic"),
            ("throughput>lots", "not a number"),
            ("latency<5ms", "expected throughput or <op>.<statistic>"),
            ("read.p99<", "missing the limit"),
        ];
        for (text, expected) in cases {
            let err = Sla::parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    fn result(p99_us: f64, throughput: f64) -> PhaseResult {
        let read = OpSummary {
            name: "READ".into(),
            operations: 10,
            average_us: 100.0,
            min_us: 10.0,
            max_us: 900.0,
            p50_us: 90.0,
            p95_us: 300.0,
            p99_us,
            p999_us: 900.0,
            returns: BTreeMap::new(),
        };
        PhaseResult {
            target: "rdkv-shm".into(),
            phase: "run".into(),
            threads: 1,
            concurrency: 1,
            target_ops_per_sec: None,
            warmup_secs: 0.0,
            runtime_ms: 1.0,
            operations: 10,
            throughput_ops_sec: throughput,
            ops: vec![read],
            intended: vec![],
            first_errors: vec![],
        }
    }

    #[test]
    fn evaluation_reports_each_threshold() {
        let sla = Sla::parse("read.p99<500us,throughput>100000").unwrap();
        let good = sla.evaluate(&result(400.0, 150_000.0));
        assert!(good.passed(), "{good}");
        let bad = sla.evaluate(&result(600.0, 150_000.0));
        assert!(!bad.passed());
        assert!(!bad.checks[0].passed && bad.checks[1].passed);
        let text = bad.to_string();
        assert!(text.contains("FAIL read.p99<500us"), "{text}");
        assert!(text.contains("measured 600.0us, limit < 500.0us"), "{text}");
        assert!(text.contains("pass throughput>100000"), "{text}");
        // An operation the run did not issue fails its threshold.
        let missing = Sla::parse("scan.p99<1s")
            .unwrap()
            .evaluate(&result(1.0, 1.0));
        assert!(!missing.passed());
        assert!(missing.to_string().contains("no such operations"));
    }
}
