//! The node's histograms: fixed buckets of atomic counts, so recording a
//! sample is a bucket search, an atomic add and a compare-and-swap on the
//! sum, with no allocation and no clock reading, and a histogram's memory
//! is fixed when it is registered.
//!
//! Why not the Prometheus exporter's own: it keeps every sample (value and
//! a clock reading) in a list of freshly allocated blocks until its upkeep
//! folds them into buckets. A node answering a million RESP GETs a second
//! recorded a million samples a second that way: 14% of the leader's CPU
//! went to the kernel zeroing the pages those blocks landed on
//! (docs/benchmarks.md, issue 15, eleventh round).
//!
//! [`Histograms`] is the registry the node's recorder hands histogram
//! handles out of (a lookup by the facade's `Key`, which allocates nothing
//! once the series exists), and renders them in the Prometheus text format
//! at scrape time, cumulative buckets ending in `+Inf` (equal to `_count`),
//! `_sum`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use metrics::{HistogramFn, Key};

/// Latency buckets, 10 µs to 10 s: a one-sided miss on a busy node and a
/// stalled fsync both land in a real bucket.
const SECONDS_BUCKETS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Count buckets (entries per fsync, commands per batch, ...), 1 to 4,096.
const COUNT_BUCKETS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// The bucket bounds of a histogram by its name: durations are named
/// `*_seconds`; every other histogram of the node counts things (entries,
/// commands). A histogram of another kind (bytes) needs its own row here.
fn buckets_for(name: &str) -> &'static [f64] {
    if name.ends_with("_seconds") {
        &SECONDS_BUCKETS
    } else {
        &COUNT_BUCKETS
    }
}

/// One histogram series: how many samples fell in each bucket (above the
/// previous bound, at or below this one; the last counts those above every
/// bound) and their sum.
#[derive(Debug)]
pub struct BucketHistogram {
    bounds: &'static [f64],
    /// `bounds.len() + 1` counts; the last is the `+Inf` bucket's own.
    counts: Box<[AtomicU64]>,
    /// The sum of the samples, as `f64` bits.
    sum_bits: AtomicU64,
}

impl BucketHistogram {
    fn new(bounds: &'static [f64]) -> BucketHistogram {
        BucketHistogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    fn add(&self, value: f64, count: u64) {
        // A sample is counted in the first bucket whose bound it does not
        // exceed (Prometheus's `le`); NaN, which has no bucket and would make
        // the sum NaN for good, is not recorded.
        if value.is_nan() || count == 0 {
            return;
        }
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        if let Some(counter) = self.counts.get(bucket) {
            counter.fetch_add(count, Ordering::Relaxed);
        }
        let added = value * count as f64;
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + added).to_bits())
            });
    }

    /// The cumulative count at each bound, then the total (`+Inf`), and the
    /// sum. Read bucket by bucket while samples may arrive: the total is the
    /// buckets' own sum, so `+Inf` always equals `_count`.
    fn snapshot(&self) -> (Vec<u64>, f64) {
        let mut running = 0u64;
        let cumulative = self
            .counts
            .iter()
            .map(|count| {
                running = running.saturating_add(count.load(Ordering::Relaxed));
                running
            })
            .collect();
        (
            cumulative,
            f64::from_bits(self.sum_bits.load(Ordering::Relaxed)),
        )
    }

    /// Appends this series' lines to `out`: `name{labels}`'s buckets, sum
    /// and count; `labels` is already rendered (`a="1",b="2"`, or empty).
    fn render(&self, name: &str, labels: &str, out: &mut String) {
        let (cumulative, sum) = self.snapshot();
        let sep = if labels.is_empty() { "" } else { "," };
        let les = self.bounds.iter().map(|bound| bound.to_string());
        for (le, count) in les
            .chain(std::iter::once(String::from("+Inf")))
            .zip(&cumulative)
        {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {count}");
        }
        let total = cumulative.last().copied().unwrap_or(0);
        let braces = |labels: &str| {
            if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {total}", braces(labels));
    }
}

impl HistogramFn for BucketHistogram {
    fn record(&self, value: f64) {
        self.add(value, 1);
    }

    fn record_many(&self, value: f64, count: usize) {
        self.add(value, count as u64);
    }
}

/// Every histogram of the process by its key, and the help text of each
/// name.
#[derive(Debug, Default)]
pub struct Histograms {
    inner: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    series: HashMap<Key, Arc<BucketHistogram>>,
    help: HashMap<String, String>,
}

impl Histograms {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic elsewhere while holding it leaves the maps whole.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The series of `key` (the same for the same labels in any order, as
    /// the facade's `Key` compares them), registered on first use with its
    /// name's buckets. Call sites that record often keep the handle.
    pub fn series(&self, key: &Key) -> Arc<BucketHistogram> {
        let mut registry = self.lock();
        if let Some(series) = registry.series.get(key) {
            return series.clone();
        }
        let series = Arc::new(BucketHistogram::new(buckets_for(key.name())));
        registry.series.insert(key.clone(), series.clone());
        series
    }

    /// The help text of `name`; the first description given is kept.
    pub fn describe(&self, name: &str, help: &str) {
        self.lock()
            .help
            .entry(name.to_owned())
            .or_insert_with(|| help.to_owned());
    }

    /// Appends every histogram family to `out`: help, type, then each
    /// series, families and series in name and label order. The series
    /// are copied out first, so a scrape does not hold up recording.
    pub fn render(&self, out: &mut String) {
        let (keys, help) = {
            let registry = self.lock();
            let keys: Vec<(Key, Arc<BucketHistogram>)> = registry
                .series
                .iter()
                .map(|(key, series)| (key.clone(), series.clone()))
                .collect();
            (keys, registry.help.clone())
        };
        let mut rows: Vec<(&str, String, &BucketHistogram)> = keys
            .iter()
            .map(|(key, series)| (key.name(), render_labels(key), &**series))
            .collect();
        rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let mut family = None;
        for (name, labels, series) in rows {
            if family != Some(name) {
                family = Some(name);
                if let Some(help) = help.get(name) {
                    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
                }
                let _ = writeln!(out, "# TYPE {name} histogram");
            }
            series.render(name, &labels, out);
        }
    }
}

/// `a="1",b="2"` in label name order, values escaped.
fn render_labels(key: &Key) -> String {
    let mut labels: Vec<&metrics::Label> = key.labels().collect();
    labels.sort_by(|a, b| a.key().cmp(b.key()));
    let mut out = String::new();
    for (i, label) in labels.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{}=\"{}\"", label.key(), escape_value(label.value()));
    }
    out
}

/// A label value as the text format wants it: backslash, quote and newline
/// escaped.
fn escape_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Help text as the text format wants it: backslash and newline escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        Key::from_parts(name, labels)
    }

    #[test]
    fn a_sample_lands_in_the_first_bucket_it_does_not_exceed() {
        let histogram = BucketHistogram::new(&COUNT_BUCKETS);
        for value in [0.5, 1.0, 1.5, 4096.0, 5000.0] {
            histogram.record(value);
        }
        histogram.record_many(3.0, 4);
        histogram.record(f64::NAN);
        let (cumulative, sum) = histogram.snapshot();
        // le=1: 0.5 and 1.0; le=2: + 1.5; le=4: + four 3.0s; ...; le=4096:
        // + 4096; +Inf: + 5000.
        assert_eq!(cumulative[..3], [2, 3, 7]);
        assert_eq!(cumulative[COUNT_BUCKETS.len() - 1], 8);
        assert_eq!(cumulative[COUNT_BUCKETS.len()], 9);
        assert_eq!(sum, 0.5 + 1.0 + 1.5 + 4096.0 + 5000.0 + 12.0);
    }

    #[test]
    fn durations_get_seconds_buckets_and_everything_else_counts() {
        assert_eq!(
            buckets_for("rdkv_request_duration_seconds"),
            &SECONDS_BUCKETS
        );
        assert_eq!(buckets_for("rdkv_write_batch_commands"), &COUNT_BUCKETS);
    }

    #[test]
    fn renders_each_family_once_with_cumulative_buckets() {
        let histograms = Histograms::default();
        histograms.describe("rdkv_x_seconds", "How long \\ x took.\nReally.");
        histograms
            .series(&key("rdkv_x_seconds", &[("op", "get")]))
            .record_many(0.003, 2);
        histograms
            .series(&key("rdkv_x_seconds", &[("op", "put\"")]))
            .record(20.0);
        histograms.series(&key("rdkv_n", &[])).record(2.0);
        // The same key again is the same series.
        histograms
            .series(&key("rdkv_x_seconds", &[("op", "get")]))
            .record(0.003);
        // Labels in another order are the same series, rendered in name order.
        histograms
            .series(&key("rdkv_n", &[("b", "2"), ("a", "1")]))
            .record(1.0);
        histograms
            .series(&key("rdkv_n", &[("a", "1"), ("b", "2")]))
            .record(1.0);
        let mut out = String::new();
        histograms.render(&mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "# TYPE rdkv_n histogram");
        assert!(lines.contains(&"rdkv_n_bucket{le=\"2\"} 1"));
        assert!(lines.contains(&"rdkv_n_count 1"));
        assert!(lines.contains(&"rdkv_n_count{a=\"1\",b=\"2\"} 2"));
        assert!(lines.contains(&"# HELP rdkv_x_seconds How long \\\\ x took.\\nReally."));
        assert!(lines.contains(&"rdkv_x_seconds_bucket{op=\"get\",le=\"0.0025\"} 0"));
        assert!(lines.contains(&"rdkv_x_seconds_bucket{op=\"get\",le=\"0.005\"} 3"));
        assert!(lines.contains(&"rdkv_x_seconds_bucket{op=\"get\",le=\"+Inf\"} 3"));
        assert!(lines.contains(&"rdkv_x_seconds_count{op=\"get\"} 3"));
        assert!(lines.contains(&"rdkv_x_seconds_bucket{op=\"put\\\"\",le=\"10\"} 0"));
        assert!(lines.contains(&"rdkv_x_seconds_bucket{op=\"put\\\"\",le=\"+Inf\"} 1"));
        assert_eq!(lines.iter().filter(|l| l.starts_with("# TYPE")).count(), 2);
    }
}
