//! Cross-process stress of one-sided GETs, over any one-sided transport
//! ([`Over`]): this test process updates and deletes 8 hot keys through
//! Raft as fast as it can while three `shm_reader` processes (each its own
//! client, default options: one-sided `Lease` reads of the leader's region,
//! over shm on this host or over ofi when the nodes offer no shm socket)
//! GET them continuously and check every value. Zero wrong, torn or
//! backwards values; the readers' retries (torn, invalidated, moved or
//! too-slow reads caught by validation) are reported.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkv_client::Client;

use crate::over::Over;
use crate::stress_value::{encode, fnv1a, splitmix64};
use crate::{Cluster, Intent, LEADER_TIMEOUT};

const HOT_KEYS: usize = 8;
const READERS: usize = 3;
/// How long the writer and the readers race.
const STRESS: Duration = Duration::from_secs(5);
/// One write in this many is a delete.
const DELETE_EVERY: u64 = 8;

/// The counters every reader's summary line carries, summed.
const SUMMARY_FIELDS: [&str; 15] = [
    "reads",
    "served",
    "fallbacks",
    "lease_refusals",
    "retries_slot",
    "retries_block",
    "retries_invalidated",
    "retries_moved",
    "retries_slow",
    "exhausted",
    "absent",
    "advances",
    "errors",
    "wrong",
    "backwards",
];

// ---- reader processes ----

struct Reader {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Reader {
    fn spawn(name: &str, endpoints: &[String], keys: &[String]) -> Result<Reader> {
        let mut child = Command::new(crate::binary("shm_reader"))
            .args(["--name", name])
            .args(["--endpoints", &endpoints.join(",")])
            .args(["--keys", &keys.join(",")])
            .args(["--max-secs", "30"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning shm_reader")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("reader stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Reader {
            child,
            stdin,
            lines,
        })
    }

    fn line(&self, deadline: Instant) -> Result<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines
            .recv_timeout(left)
            .context("no line from the reader in time (or it exited)")
    }

    /// Waits for the process to exit (it does after its summary).
    fn exit_status(&mut self, by: Instant) -> Result<std::process::ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > by {
                bail!("the reader did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Only a failed test gets here with a live reader.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `key=value` fields of a reader's summary line.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn count(fields: &BTreeMap<String, String>, name: &str) -> Result<u64> {
    fields
        .get(name)
        .with_context(|| format!("summary has no {name}"))?
        .parse()
        .with_context(|| format!("summary field {name}"))
}

#[derive(Debug, Default)]
struct Written {
    puts: u64,
    deletes: u64,
    errors: u64,
}

/// Updates (and every `DELETE_EVERY`th time deletes) `key` until `until`.
async fn write_key(client: Client, key: String, until: Instant) -> Written {
    let mut written = Written::default();
    let mut seq = 0;
    let mut rng = splitmix64(fnv1a(key.as_bytes()));
    while Instant::now() < until {
        seq += 1;
        rng = splitmix64(rng);
        let result = if rng.is_multiple_of(DELETE_EVERY) {
            written.deletes += 1;
            client.delete(key.clone()).await.map(|_| ())
        } else {
            written.puts += 1;
            client.put(key.clone(), encode(&key, seq)).await.map(|_| ())
        };
        if let Err(e) = result {
            written.errors += 1;
            eprintln!("writer {key}: {e}");
        }
    }
    written
}

/// Every hot key written concurrently for [`STRESS`].
async fn write_for_a_while(writer: &Client, keys: &[String]) -> Result<Written> {
    let started = Instant::now();
    let until = started + STRESS;
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| tokio::spawn(write_key(writer.clone(), key.clone(), until)))
        .collect();
    let mut written = Written::default();
    for task in tasks {
        let w = task.await?;
        written.puts += w.puts;
        written.deletes += w.deletes;
        written.errors += w.errors;
    }
    let elapsed = started.elapsed();
    println!(
        "writer: {} puts, {} deletes, {} errors in {elapsed:.1?} ({:.0} writes/s)",
        written.puts,
        written.deletes,
        written.errors,
        (written.puts + written.deletes) as f64 / elapsed.as_secs_f64()
    );
    Ok(written)
}

/// Stops every reader and sums their summaries; a reader that served too
/// little one-sided or exited with a failure is added to `failures`.
fn collect_summaries(
    readers: &mut [Reader],
    failures: &mut Vec<String>,
) -> Result<BTreeMap<&'static str, u64>> {
    // Closing stdin tells a reader to stop and report.
    for reader in readers.iter_mut() {
        drop(reader.stdin.take());
    }
    let report_by = Instant::now() + Duration::from_secs(15);
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for (r, reader) in readers.iter_mut().enumerate() {
        let line = reader.line(report_by)?;
        println!("{line}");
        if !line.starts_with("summary ") {
            bail!("reader r{r} printed {line:?} instead of its summary");
        }
        let f = fields(&line);
        for name in SUMMARY_FIELDS {
            *totals.entry(name).or_default() += count(&f, name)?;
        }
        let (reads, served) = (count(&f, "reads")?, count(&f, "served")?);
        if served * 10 <= reads * 9 {
            failures.push(format!(
                "reader r{r}: only {served} of {reads} reads one-sided"
            ));
        }
        let status = reader
            .exit_status(report_by)
            .with_context(|| format!("reader r{r}"))?;
        if !status.success() {
            failures.push(format!("reader r{r} exited with {status}"));
        }
    }
    Ok(totals)
}

fn print_totals(over: Over, totals: &BTreeMap<&str, u64>) {
    let retries = totals["retries_slot"]
        + totals["retries_block"]
        + totals["retries_invalidated"]
        + totals["retries_moved"]
        + totals["retries_slow"];
    println!(
        "all readers over {}: {} reads, {} one-sided ({:.1}%), {} absent (deleted), {} saw a newer \
         version, {} rpc fallbacks after exhausted retries, {} lease refusals; {retries} retries \
         caught by validation (slot {}, block/torn {}, invalidated {}, moved {}, slow {}); wrong {}, \
         backwards {}",
        over.name(),
        totals["reads"],
        totals["served"],
        100.0 * totals["served"] as f64 / totals["reads"].max(1) as f64,
        totals["absent"],
        totals["advances"],
        totals["fallbacks"],
        totals["lease_refusals"],
        totals["retries_slot"],
        totals["retries_block"],
        totals["retries_invalidated"],
        totals["retries_moved"],
        totals["retries_slow"],
        totals["wrong"],
        totals["backwards"],
    );
}

/// The race itself, on a cluster with a leader: readers started and
/// ready, the writer for [`STRESS`], then every summary judged.
async fn race(cluster: &Cluster, over: Over) -> Result<()> {
    let writer = cluster.client(Intent::Any)?;
    let keys: Vec<String> = (0..HOT_KEYS).map(|i| format!("hot-{i}")).collect();
    for key in &keys {
        writer.put(key.clone(), encode(key, 0)).await?;
    }
    let endpoints = cluster.endpoints(Intent::Any)?;
    let mut readers = (0..READERS)
        .map(|r| Reader::spawn(&format!("r{r}"), &endpoints, &keys))
        .collect::<Result<Vec<_>>>()?;
    let ready_by = Instant::now() + Duration::from_secs(20);
    for reader in &readers {
        let line = reader.line(ready_by)?;
        if line != "ready" {
            bail!("reader said {line:?} instead of ready");
        }
    }
    let written = write_for_a_while(&writer, &keys).await?;
    let mut failures = Vec::new();
    let totals = collect_summaries(&mut readers, &mut failures)?;
    print_totals(over, &totals);
    if totals["wrong"] != 0 || totals["backwards"] != 0 {
        failures.push(format!(
            "{} wrong and {} backwards values",
            totals["wrong"], totals["backwards"]
        ));
    }
    if totals["advances"] < 100 {
        failures.push(format!(
            "the readers saw only {} new versions: they did not race the writer",
            totals["advances"]
        ));
    }
    if written.puts + written.deletes < 100 {
        failures.push(format!("the writer managed only {written:?}"));
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// Readers in other processes, reading one-sided `over` a transport while
/// the hot keys are overwritten and deleted, never see a wrong, torn or
/// backwards value.
pub async fn readers_never_see_a_wrong_value(over: Over) -> Result<()> {
    // The shortest grace period the server allows: freed blocks are reused
    // after 10 ms instead of 250 ms, so a reader that is descheduled between
    // its slot read and its block read (common with 3 readers, 3 servers and
    // the writer on 2 cores) can find its block reused, and must catch it.
    let mut cluster = Cluster::start_with(3, &over.with_node_args(&["--grace-period-ms", "10"]))?;
    let result = async {
        cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        if !over.served_by(&cluster).await? {
            return Ok(());
        }
        race(&cluster, over).await
    }
    .await;
    if result.is_err() {
        eprintln!("{}", cluster.logs());
    }
    result
}
