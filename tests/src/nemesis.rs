//! The fault suite's load and its judgement, Jepsen style, shared by the
//! single-group suite (`tests/tests/nemesis.rs`) and the sharded one
//! (`tests/tests/nemesis_shards.rs`): clients do get/put/cas/delete, puts
//! with a TTL of a few hundred ms and read-then-write transactions
//! (MULTI/EXEC's native form) on a few hot keys and many quiet ones (where
//! the TTLs run out) at every consistency level while a scenario's nemesis
//! injects its fault again and again; then every key is read linearizably
//! and the recorded history must be linearizable (Linearizable and Lease
//! reads, all writes) and every Follower read within its lag bound.
//!
//! Short by default (a few seconds of load per scenario); set
//! `RDKV_SOAK_SECS` for a long soak. With `RDKV_RELIABILITY_REPORT=path` a
//! suite appends one markdown table row per scenario to that file (the
//! tables in `docs/reliability.md` come from such runs).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Consistency, Transport, Versioned};
use rdkv_proto::shard::ShardMap;
use tokio::task::JoinHandle;

use crate::history::{History, Operation, Outcome, Recorder, RecordingClient, Returned, Tick};
use crate::linearizability::{
    CheckOptions, FollowerReport, Verdict, check_follower_reads_per_log,
    check_follower_reads_within, check_history, wall_slack_ms,
};
use crate::prometheus::http_get;
use crate::shard_view::every_shard_led;
use crate::stress_value::splitmix64;
use crate::{Cluster, Intent, LEADER_TIMEOUT, client_options};

const CLIENTS: u64 = 4;
/// Keys every client hammers: contention for the checker.
const KEYS: u64 = 3;
/// Keys beyond those, taking half of the operations: each is written only
/// every few hundred ms, so that TTLs run out before the next write.
const QUIET_KEYS: u64 = 64;
const FOLLOWER_LAG: u64 = 50;
const FOLLOWER_FRESHNESS_NS: u64 = 1_000_000_000;
/// TTLs of puts that expire: well above the expiry margin (50 ms), short
/// enough that keys expire while the clients still use them.
const TTL_MS: std::ops::Range<u64> = 100..600;

/// Seconds of load per scenario: `RDKV_SOAK_SECS`, 4 by default.
pub fn load_secs() -> u64 {
    std::env::var("RDKV_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

/// Slows node `id`'s fsyncs (every shard's log) by 25 ms until some are
/// seen slow, holds for `hold`, heals.
pub async fn slow_disk(cluster: &mut Cluster, id: u64, hold: Duration) -> Result<()> {
    let before = slow_fsyncs(cluster, id).await?;
    cluster.slow_fsync(id, 25).await?;
    crate::eventually(LEADER_TIMEOUT, "fsyncs slower than 25 ms", async || {
        let now = slow_fsyncs(cluster, id).await?;
        ensure!(now > before, "{now} fsyncs over 25 ms, {before} before");
        Ok(())
    })
    .await?;
    tokio::time::sleep(hold).await;
    cluster.heal().await
}

/// How many of node `id`'s log fsyncs took longer than 25 ms.
async fn slow_fsyncs(cluster: &Cluster, id: u64) -> Result<f64> {
    let addr = cluster.node(id)?.http_addr;
    let (_, text) = tokio::task::spawn_blocking(move || http_get(addr, "/metrics")).await??;
    let metrics = crate::prometheus::parse(&text)?;
    let all = metrics.sum("rdkv_raft_log_fsync_duration_seconds_count", &[]);
    let fast = metrics.sum(
        "rdkv_raft_log_fsync_duration_seconds_bucket",
        &[("le", "0.025")],
    );
    Ok(all - fast)
}

/// What a scenario must have exercised besides faults and writes.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Reads served one-sided (from mapped regions) by the clients that
    /// may: false where none can be (no region mapped, e.g. a cluster
    /// whose nodes have no shm socket).
    pub one_sided_reads: bool,
    /// The cluster's shard map when it runs several Raft groups: versions
    /// are log indexes of a key's own shard, so the follower-read bound is
    /// checked per shard.
    pub shard_map: Option<ShardMap>,
}

/// One scenario's outcome: a row of the reliability table.
#[derive(Debug)]
pub struct Row {
    pub scenario: &'static str,
    pub network: &'static str,
    pub operations: usize,
    pub ok: usize,
    pub unknown: usize,
    pub verdict: String,
    pub follower_reads: usize,
    pub follower_violations: usize,
    pub acknowledged_writes: usize,
    pub lost: usize,
}

#[derive(Debug, Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// The clients of one scenario, running until `stop`.
struct Load {
    recorder: Recorder,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    workers: Vec<JoinHandle<()>>,
    one_sided_clients: Vec<Client>,
}

/// Runs scenario `name` (`round` names its keys): the clients' load for
/// [`load_secs`], `inject` called again and again with how long to hold
/// its fault (it must undo the fault before it returns), then the final
/// reads and the checks. Fails on a history that is not linearizable, a
/// follower read out of bound, or a scenario that exercised too little.
pub async fn run_scenario(
    cluster: &mut Cluster,
    name: &'static str,
    round: usize,
    expect: Expect,
    mut inject: impl AsyncFnMut(&mut Cluster, Duration) -> Result<()>,
) -> Result<Row> {
    let prefix = format!("s{round}");
    // The members at the start: nodes joined and removed during the run are gone.
    let members: Vec<u64> = cluster.nodes.keys().copied().collect();
    let load = start_load(cluster, &members, &prefix)?;
    let duration = Duration::from_secs(load_secs());
    let started = Instant::now();
    tokio::time::sleep(duration / 4).await;
    let mut faults = 0;
    while started.elapsed() < duration {
        inject(cluster, duration / 4).await?;
        faults += 1;
        tokio::time::sleep(duration / 8).await;
    }
    load.stop.store(true, Ordering::Relaxed);
    for worker in load.workers {
        worker.await.context("a client task panicked")?;
    }
    let mut one_sided = 0;
    for client in &load.one_sided_clients {
        one_sided += client.one_sided_stats().await.served;
    }
    cluster.heal().await?;
    match &expect.shard_map {
        None => {
            cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        }
        // Nodes need not host the same shards (several shards of fewer
        // replicas than nodes): each shard's members must agree.
        Some(map) => {
            every_shard_led(cluster, &members, map.shards().len(), LEADER_TIMEOUT).await?;
        }
    }
    final_reads(cluster, &load.recorder, &members, &prefix).await?;
    let history = load.recorder.history();
    let judged = Judged::of(history, expect.shard_map.as_ref()).await?;
    let row = judged.row(name, cluster.network_kind());
    println!(
        "{name}: {faults} faults, {} ops ({} ok, {} unknown), {}, follower reads {} ({} \
         violations), {one_sided} reads served one-sided, {} reads found a TTL'd key gone",
        row.operations,
        row.ok,
        row.unknown,
        row.verdict,
        row.follower_reads,
        row.follower_violations,
        judged.expired_reads,
    );
    judged.ensure_correct(name)?;
    let ok = load.counts.ok.load(Ordering::Relaxed);
    judged.ensure_exercised(name, ok, one_sided, &expect)?;
    Ok(row)
}

/// Starts the clients: half read one-sided where they can (lease and
/// follower reads from the mapped regions), half only by RPC.
fn start_load(cluster: &Cluster, members: &[u64], prefix: &str) -> Result<Load> {
    let recorder = Recorder::new();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let mut workers = Vec::new();
    let mut one_sided_clients = Vec::new();
    for process in 0..CLIENTS {
        let transport = if process % 2 == 0 {
            Transport::Auto
        } else {
            Transport::Tcp
        };
        let client = cluster.client_with(
            Intent::Via(members),
            ClientOptions {
                transport,
                request_timeout: Duration::from_secs(3),
                ..client_options(None)
            },
        )?;
        if matches!(transport, Transport::Auto) {
            one_sided_clients.push(client.clone());
        }
        workers.push(tokio::spawn(worker(
            recorder.client(client, process),
            process,
            prefix.to_owned(),
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
    }
    Ok(Load {
        recorder,
        stop,
        counts,
        workers,
        one_sided_clients,
    })
}

/// Reads every key linearizably, recorded: every acknowledged write must be
/// explained by them.
async fn final_reads(
    cluster: &Cluster,
    recorder: &Recorder,
    members: &[u64],
    prefix: &str,
) -> Result<()> {
    let reader = recorder.client(cluster.client(Intent::Via(members))?, CLIENTS);
    for k in 0..KEYS + QUIET_KEYS {
        reader
            .get(format!("{prefix}/k{k}"), Consistency::Linearizable)
            .await
            .with_context(|| format!("final read of key {k}"))?;
    }
    Ok(())
}

/// One client process: random operations until `stop`.
async fn worker(
    client: RecordingClient,
    process: u64,
    prefix: String,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let mut state = splitmix64(process + 1);
    let mut seen = [None; (KEYS + QUIET_KEYS) as usize];
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        state = splitmix64(state);
        let k = if (state >> 40).is_multiple_of(2) {
            state % KEYS
        } else {
            KEYS + state % QUIET_KEYS
        } as usize;
        let key = Bytes::from(format!("{prefix}/k{k}"));
        n += 1;
        let value = Bytes::from(format!("p{process}-{n}"));
        let ok = one_operation(&client, state, key, value, &mut seen[k])
            .await
            .is_ok();
        let counter = if ok { &counts.ok } else { &counts.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        if !ok {
            // Do not spin while the cluster is unavailable.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One random operation on `key`, chosen by `state`; `seen` is the key's
/// version as this client last saw it (the expected version of its CAS).
async fn one_operation(
    client: &RecordingClient,
    state: u64,
    key: Bytes,
    value: Bytes,
    seen: &mut Option<u64>,
) -> rdkv_client::Result<()> {
    match (state >> 8) % 100 {
        0..=24 => *seen = version_of(client.get(key, Consistency::Linearizable).await?),
        25..=44 => *seen = version_of(client.get(key, Consistency::Lease).await?),
        45..=54 => {
            let follower = Consistency::Follower {
                max_lag_entries: FOLLOWER_LAG,
            };
            client.get(key, follower).await?;
        }
        55..=69 => {
            client.put(key, value).await?;
        }
        70..=79 => {
            let ttl_ms = TTL_MS.start + (state >> 24) % (TTL_MS.end - TTL_MS.start);
            let ttl = Duration::from_millis(ttl_ms);
            *seen = Some(client.put_with_ttl(key, value, ttl).await?);
        }
        80..=89 => {
            let c = client.cas(key, *seen, Some(value)).await?;
            *seen = if c.succeeded {
                Some(c.version)
            } else {
                c.current.map(|v| v.version)
            };
        }
        // A transaction (MULTI/EXEC's native form): read, then write.
        90..=94 => *seen = Some(client.swap(key, value).await?.1),
        _ => {
            client.delete(key).await?;
        }
    }
    Ok(())
}

fn version_of(value: Option<Versioned>) -> Option<u64> {
    value.map(|v| v.version)
}

/// A scenario's history and what the checkers said of it.
struct Judged {
    history: History,
    verdict: Verdict,
    follower: FollowerReport,
    expired_reads: usize,
}

impl Judged {
    async fn of(history: History, shard_map: Option<&ShardMap>) -> Result<Judged> {
        let verdict = tokio::task::spawn_blocking({
            let history = history.clone();
            move || check_history(&history, CheckOptions::default())
        })
        .await??;
        // The harness runs 50 ms heartbeats: a replica's view of the commit
        // index is at most one election timeout (250-500 ms) old before it
        // stops serving follower reads; the lease margin adds 50 ms. 1 s
        // covers both.
        let follower = match shard_map {
            None => check_follower_reads_within(&history, FOLLOWER_FRESHNESS_NS),
            Some(map) => check_follower_reads_per_log(&history, FOLLOWER_FRESHNESS_NS, &|key| {
                u64::from(map.shard_of_key(key).0)
            }),
        };
        let expired_reads = reads_of_expired_keys(&history);
        if wall_slack_ms(&history) > 0 {
            // Shown with the rows: a large step makes the expiry checks weak.
            println!("{}", wall_clock_note(&history));
        }
        Ok(Judged {
            history,
            verdict,
            follower,
            expired_reads,
        })
    }

    fn row(&self, scenario: &'static str, network: &'static str) -> Row {
        let ops = &self.history.ops;
        let count = |keep: &dyn Fn(&crate::history::OpRecord) -> bool| {
            ops.iter().filter(|op| keep(op)).count()
        };
        Row {
            scenario,
            network,
            operations: ops.len(),
            ok: count(&|op| matches!(op.outcome, Outcome::Ok(_))),
            unknown: count(&|op| op.outcome == Outcome::Unknown),
            verdict: match &self.verdict {
                Verdict::Linearizable => "linearizable".to_owned(),
                Verdict::NotLinearizable(_) => "NOT linearizable".to_owned(),
                Verdict::Timeout { .. } => "unknown (budget)".to_owned(),
            },
            follower_reads: self.follower.reads_checked,
            follower_violations: self.follower.violations.len(),
            acknowledged_writes: count(&|op| {
                !op.operation.is_read() && matches!(op.outcome, Outcome::Ok(_))
            }),
            // A lost acknowledged write makes the history non-linearizable
            // (the final linearizable reads cannot be explained).
            lost: usize::from(!matches!(self.verdict, Verdict::Linearizable)),
        }
    }

    /// The history is linearizable and every follower read within bound.
    fn ensure_correct(&self, name: &str) -> Result<()> {
        let clock = wall_clock_note(&self.history);
        match &self.verdict {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable(violation) => bail!("{name}: {violation}\n{clock}"),
            Verdict::Timeout { keys } => bail!(
                "{name}: the checker ran out of steps on {} key(s)",
                keys.len()
            ),
        }
        if let Some(v) = self.follower.violations.first() {
            bail!(
                "{name}: follower read out of bound: {} ({})\n{clock}",
                crate::linearizability::describe(&v.read),
                v.reason
            );
        }
        Ok(())
    }

    /// The scenario checked something: operations succeeded, keys written
    /// with a TTL expired while the clients used them, lease and follower
    /// reads (and one-sided ones where `expect` says so) are in the history.
    fn ensure_exercised(&self, name: &str, ok: u64, one_sided: u64, expect: &Expect) -> Result<()> {
        ensure!(ok > 0, "{name}: no operation succeeded");
        ensure!(
            self.expired_reads > 0,
            "{name}: no read found a key written with a TTL gone"
        );
        let lease = Operation::Get {
            consistency: Consistency::Lease,
        };
        let lease_reads = self
            .history
            .ops
            .iter()
            .filter(|op| op.operation == lease && matches!(op.outcome, Outcome::Ok(_)))
            .count();
        ensure!(
            (one_sided > 0 || !expect.one_sided_reads)
                && lease_reads > 0
                && self.follower.reads_checked > 0,
            "{name}: {one_sided} reads served one-sided, {lease_reads} lease and {} follower \
             reads checked",
            self.follower.reads_checked
        );
        Ok(())
    }
}

/// How the wall clock behaved while `history` was recorded: a violation
/// at an expiry's edge is read against it.
fn wall_clock_note(history: &History) -> String {
    format!(
        "(the wall clock stepped {} µs against the monotonic clock while the history \
         was recorded; the checkers allowed {} ms for it)",
        history.wall_clock_step_us,
        wall_slack_ms(history)
    )
}

/// Reads that found their key absent although the newest write of it
/// acknowledged before they began was a put with a TTL: keys seen expiring
/// (a concurrent delete can explain a few; the count only shows that
/// expiry was exercised, the checkers judge it).
fn reads_of_expired_keys(history: &History) -> usize {
    // (completion, key, version, with a TTL) of every acknowledged write
    // that set or removed the key's value, in order of completion.
    let mut writes: Vec<(Tick, &Bytes, u64, bool)> = history
        .ops
        .iter()
        .filter_map(|op| match &op.outcome {
            Outcome::Ok(Returned::Cas {
                succeeded: false, ..
            })
            | Outcome::Ok(Returned::Value(_)) => None,
            Outcome::Ok(returned) => Some((
                op.completed_at,
                &op.key,
                returned.committed_index()?,
                matches!(op.operation, Operation::PutTtl { .. }),
            )),
            _ => None,
        })
        .collect();
    writes.sort_unstable_by_key(|w| w.0);
    let mut newest: HashMap<&Bytes, (u64, bool)> = HashMap::new();
    let mut next = writes.iter().peekable();
    let mut count = 0;
    // The history is in order of invocation.
    for read in &history.ops {
        while let Some(&(_, key, version, ttl)) = next.next_if(|w| w.0 < read.invoked_at) {
            let entry = newest.entry(key).or_insert((version, ttl));
            if version >= entry.0 {
                *entry = (version, ttl);
            }
        }
        let absent = read.outcome == Outcome::Ok(Returned::Value(None));
        if absent && newest.get(&read.key).is_some_and(|&(_, ttl)| ttl) {
            count += 1;
        }
    }
    count
}

/// Appends `rows` to the markdown table at `RDKV_RELIABILITY_REPORT`, if set.
pub fn report(rows: &[Row]) -> Result<()> {
    let Ok(path) = std::env::var("RDKV_RELIABILITY_REPORT") else {
        return Ok(());
    };
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {path}"))?;
    for r in rows {
        writeln!(
            file,
            "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
            r.scenario,
            r.network,
            r.operations,
            r.ok,
            r.unknown,
            r.verdict,
            r.follower_reads,
            r.follower_violations,
            r.acknowledged_writes,
            r.lost
        )?;
    }
    Ok(())
}
