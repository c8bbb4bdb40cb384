//! A strict reader of the Prometheus text exposition format (0.0.4), for
//! checking what `/metrics` serves: every line must parse, every sample
//! must belong to a family declared by `# TYPE` just before it, a family
//! appears once, and histograms are well formed (cumulative buckets ending
//! in `+Inf` equal to `_count`).

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

/// A sample's name and its labels, sorted.
pub type SampleKey = (String, BTreeMap<String, String>);

#[derive(Debug, Default)]
pub struct Exposition {
    pub types: BTreeMap<String, String>,
    pub samples: BTreeMap<SampleKey, f64>,
}

impl Exposition {
    /// The value of `name` with exactly these labels.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples.get(&(name.to_owned(), labels)).copied()
    }

    /// The sum of `name` over every sample whose labels include these.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(text: &str) -> Result<f64> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text
            .parse()
            .with_context(|| format!("bad sample value {text:?}")),
    }
}

/// Parses `{a="x",b="y"}`; returns the labels and the rest of the line.
fn parse_labels(text: &str) -> Result<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = text.strip_prefix('{').context("labels must start with {")?;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let (name, after) = rest.split_once("=\"").context("label without =\"")?;
        ensure!(valid_name(name), "bad label name {name:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => bail!("bad escape in label value: {other:?}"),
                },
                Some((_, c)) => value.push(c),
                None => bail!("unterminated label value"),
            }
        };
        ensure!(
            labels.insert(name.to_owned(), value).is_none(),
            "label {name} repeated"
        );
        rest = &after[end + 1..];
    }
}

/// The family a sample belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
        {
            return Some(base);
        }
    }
    None
}

pub fn parse(text: &str) -> Result<Exposition> {
    let mut out = Exposition::default();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    ensure!(valid_name(name), "bad metric name, {}", at());
                    ensure!(
                        matches!(
                            kind,
                            "counter" | "gauge" | "histogram" | "summary" | "untyped"
                        ),
                        "bad type, {}",
                        at()
                    );
                    ensure!(
                        !finished.contains(name) && !out.types.contains_key(name),
                        "family {name} declared twice, {}",
                        at()
                    );
                    if let Some(previous) = current.replace(name.to_owned()) {
                        finished.insert(previous);
                    }
                    out.types.insert(name.to_owned(), kind.to_owned());
                }
                (Some("HELP"), Some(name), _) => {
                    ensure!(valid_name(name), "bad metric name, {}", at());
                }
                _ => {} // other comments are allowed
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .with_context(|| format!("no value, {}", at()))?;
        let name = &line[..name_end];
        ensure!(valid_name(name), "bad metric name, {}", at());
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).with_context(at)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest.split_whitespace();
        let value = parse_value(
            fields
                .next()
                .with_context(|| format!("no value, {}", at()))?,
        )
        .with_context(at)?;
        if let Some(timestamp) = fields.next() {
            timestamp
                .parse::<i64>()
                .with_context(|| format!("bad timestamp, {}", at()))?;
        }
        ensure!(fields.next().is_none(), "trailing text, {}", at());
        let family = family_of(name, &out.types)
            .with_context(|| format!("sample without a # TYPE, {}", at()))?;
        ensure!(
            current.as_deref() == Some(family),
            "sample of {family} outside its family's block, {}",
            at()
        );
        ensure!(
            out.samples
                .insert((name.to_owned(), labels), value)
                .is_none(),
            "duplicate sample, {}",
            at()
        );
    }
    check_histograms(&out)?;
    Ok(out)
}

fn check_histograms(out: &Exposition) -> Result<()> {
    for (family, _) in out.types.iter().filter(|(_, t)| *t == "histogram") {
        let bucket_name = format!("{family}_bucket");
        let count_name = format!("{family}_count");
        // Group buckets by their labels without `le`.
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for ((name, labels), value) in &out.samples {
            if *name == bucket_name {
                let mut rest = labels.clone();
                let le = rest.remove("le").context("bucket without le")?;
                series
                    .entry(rest)
                    .or_default()
                    .push((parse_value(&le)?, *value));
            }
        }
        for (labels, mut buckets) in series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            ensure!(
                buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                "{family}{labels:?}: buckets are not cumulative"
            );
            let last = buckets.last().context("no buckets")?;
            ensure!(
                last.0 == f64::INFINITY,
                "{family}{labels:?}: no +Inf bucket"
            );
            let count = out
                .samples
                .get(&(count_name.clone(), labels.clone()))
                .with_context(|| format!("{family}{labels:?}: no _count"))?;
            ensure!(
                *count == last.1,
                "{family}{labels:?}: +Inf bucket {} != count {count}",
                last.1
            );
        }
    }
    Ok(())
}

/// The `/metrics` of the node whose HTTP port is `addr`, parsed (refused
/// unless it answered 200 with valid exposition text). Blocking.
pub fn scrape(addr: SocketAddr) -> Result<Exposition> {
    let (status, body) = http_get(addr, "/metrics")?;
    ensure!(status == 200, "/metrics of {addr} answered {status}");
    parse(&body).with_context(|| format!("the /metrics of {addr} is not valid exposition text"))
}

/// `GET path` over HTTP/1.1 (connection: close); returns status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("no end of headers")?;
    let status = head
        .split(' ')
        .nth(1)
        .context("no status")?
        .parse()
        .context("bad status")?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn accepts_good_exposition_and_rejects_bad() {
        let good = "# HELP a_total x\n# TYPE a_total counter\na_total{op=\"get\",t=\"a\\\"b\"} 3\n\n\
                    # TYPE h histogram\nh_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.3\nh_count 2\n";
        let parsed = parse(good).unwrap();
        assert_eq!(
            parsed.get("a_total", &[("op", "get"), ("t", "a\"b")]),
            Some(3.0)
        );
        for bad in [
            "a 1\n",                                                    // no TYPE
            "# TYPE a gauge\na{x=\"1} 1\n",                             // unterminated
            "# TYPE a gauge\na one\n",                                  // bad value
            "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n",          // family split
            "# TYPE a gauge\n# TYPE a gauge\n",                         // declared twice
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n", // count mismatch
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
            "# TYPE 1a gauge\n",
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
