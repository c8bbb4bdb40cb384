//! Randomized fault suite, Jepsen style: clients do get/put/cas/delete,
//! puts with a TTL of a few hundred ms and read-then-write transactions
//! (MULTI/EXEC's native form) on a few hot keys and many quiet ones (where
//! the TTLs run out) at every consistency level while a nemesis partitions,
//! pauses, kills and restarts nodes and slows disks; the recorded history
//! must be linearizable (Linearizable and Lease reads, all writes) and every
//! Follower read within its lag bound. Each fault must be seen to take
//! effect, each scenario must have served reads one-sided (all recorded and
//! checked), and partitions must be real (network namespaces): under CI a
//! host that cannot make them fails the suite (`rdkv_tests::skip`).
//!
//! Short by default (a few seconds of load per scenario); set
//! `RDKV_SOAK_SECS` for a long soak. With `RDKV_RELIABILITY_REPORT=path` the
//! suite appends one markdown table row per scenario to that file (the table
//! in `docs/reliability.md` comes from such a run).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use rdkv_client::{ClientOptions, Consistency, Transport};
use rdkv_tests::history::{History, Operation, Outcome, Recorder, RecordingClient, Returned, Tick};
use rdkv_tests::linearizability::{
    CheckOptions, Verdict, check_follower_reads_within, check_history,
};
use rdkv_tests::prometheus::http_get;
use rdkv_tests::stress_value::splitmix64;
use rdkv_tests::{Cluster, Intent, check, client_options, eventually};

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    PartitionLeader,
    PartitionMinority,
    PauseLeader,
    KillLeaderLoop,
    SlowFsync,
    RestartAll,
    MembershipChange,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::PartitionLeader,
        Scenario::PartitionMinority,
        Scenario::PauseLeader,
        Scenario::KillLeaderLoop,
        Scenario::SlowFsync,
        Scenario::RestartAll,
        Scenario::MembershipChange,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::PartitionLeader => "partition leader",
            Scenario::PartitionMinority => "partition minority",
            Scenario::PauseLeader => "pause leader (SIGSTOP)",
            Scenario::KillLeaderLoop => "kill -9 leader loop",
            Scenario::SlowFsync => "slow fsync (+25 ms)",
            Scenario::RestartAll => "restart all (kill -9)",
            Scenario::MembershipChange => "membership change (join, promote, remove)",
        }
    }
}

fn load_secs() -> u64 {
    std::env::var("RDKV_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

async fn current_leader(cluster: &mut Cluster) -> Result<u64> {
    cluster.wait_for_leader(LEADER_TIMEOUT).await
}

/// One fault, held for `hold`, then undone. Each fault is seen to take
/// effect before it is undone (a new leader, a replica that lost its
/// leader, slower fsyncs, a later term, a member added and removed), or the
/// scenario fails: a fault that silently did nothing would leave the
/// history trivially linearizable.
async fn inject(cluster: &mut Cluster, scenario: Scenario, hold: Duration) -> Result<()> {
    let leader = current_leader(cluster).await?;
    // Partitions last well past the follower-read freshness bound (1 s), so
    // a replica that kept serving on a stale view would be caught.
    let partition_hold = hold.max(Duration::from_millis(2500));
    let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    match scenario {
        Scenario::PartitionLeader => {
            cluster.partition(&[&[leader], &others]).await?;
            cluster
                .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
                .await?;
            tokio::time::sleep(partition_hold).await;
            cluster.heal().await?;
        }
        Scenario::PartitionMinority => {
            let minority = others[0];
            let rest: Vec<u64> = (1..=3).filter(|&id| id != minority).collect();
            let term = cluster.status_of(leader).await?.term;
            cluster.partition(&[&[minority], &rest]).await?;
            lost_its_leader(cluster, minority, leader, term).await?;
            tokio::time::sleep(partition_hold).await;
            cluster.heal().await?;
        }
        Scenario::PauseLeader => {
            cluster.node_mut(leader)?.pause()?;
            let replaced = cluster
                .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
                .await;
            tokio::time::sleep(hold).await;
            cluster.node_mut(leader)?.resume()?;
            replaced?;
        }
        Scenario::KillLeaderLoop => {
            cluster.node_mut(leader)?.kill();
            cluster
                .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
                .await?;
            cluster.restart(leader)?;
        }
        Scenario::SlowFsync => {
            let before = slow_fsyncs(cluster, leader).await?;
            cluster.slow_fsync(leader, 25).await?;
            eventually(LEADER_TIMEOUT, "fsyncs slower than 25 ms", async || {
                let now = slow_fsyncs(cluster, leader).await?;
                ensure!(now > before, "{now} fsyncs over 25 ms, {before} before");
                Ok(())
            })
            .await?;
            tokio::time::sleep(hold).await;
            cluster.heal().await?;
        }
        Scenario::MembershipChange => change_membership(cluster, leader, hold).await?,
        Scenario::RestartAll => restart_all(cluster, leader, hold).await?,
    }
    Ok(())
}

/// Waits until the cut-off `minority` no longer follows `leader` (it timed
/// out and campaigned, in a term past `term`).
async fn lost_its_leader(cluster: &Cluster, minority: u64, leader: u64, term: u64) -> Result<()> {
    eventually(
        LEADER_TIMEOUT,
        "the minority losing its leader",
        async || {
            let status = cluster.status_of(minority).await?;
            ensure!(
                status.leader_id != Some(leader) || status.term > term,
                "node {minority} still follows {leader} in term {}",
                status.term
            );
            Ok(())
        },
    )
    .await
}

/// How many of node `id`'s log fsyncs took longer than 25 ms.
async fn slow_fsyncs(cluster: &Cluster, id: u64) -> Result<f64> {
    let addr = cluster.node(id)?.http_addr;
    let (_, text) = tokio::task::spawn_blocking(move || http_get(addr, "/metrics")).await??;
    let metrics = rdkv_tests::prometheus::parse(&text)?;
    let all = metrics.sum("rdkv_raft_log_fsync_duration_seconds_count", &[]);
    let fast = metrics.sum(
        "rdkv_raft_log_fsync_duration_seconds_bucket",
        &[("le", "0.025")],
    );
    Ok(all - fast)
}

/// Kills every node, restarts them all, and waits for a leader elected
/// after the restart (a term past the one before).
async fn restart_all(cluster: &mut Cluster, leader: u64, hold: Duration) -> Result<()> {
    let term = cluster.status_of(leader).await?.term;
    for id in 1..=3 {
        cluster.node_mut(id)?.kill();
    }
    tokio::time::sleep(hold / 4).await;
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    let cluster = &*cluster;
    eventually(LEADER_TIMEOUT, "a leader after the restart", async || {
        for id in 1..=3 {
            if let Ok(status) = cluster.status_of(id).await
                && status.leader_id.is_some()
                && status.term > term
            {
                return Ok(());
            }
        }
        bail!("no node reports a leader in a term past {term}")
    })
    .await
}

/// A new member joins, becomes a voter, serves for `hold` and is removed.
async fn change_membership(cluster: &mut Cluster, leader: u64, hold: Duration) -> Result<()> {
    // A new member each time (a removed one does not come back).
    static NEXT_ID: AtomicU64 = AtomicU64::new(4);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let admin = cluster.client(Intent::Any)?;
    cluster.join(id, leader)?;
    eventually(
        Duration::from_secs(30),
        &format!("node {id} a voter"),
        async || {
            let members = admin.members().await?;
            ensure!(
                members.iter().any(|m| m.id == id && m.voter),
                "members: {members:?}"
            );
            Ok(())
        },
    )
    .await?;
    tokio::time::sleep(hold).await;
    admin
        .remove_member(id)
        .await
        .with_context(|| format!("removing node {id}"))?;
    eventually(LEADER_TIMEOUT, "the member's removal", async || {
        let members = admin.members().await?;
        ensure!(
            members.iter().all(|m| m.id != id),
            "node {id} is still a member"
        );
        Ok(())
    })
    .await?;
    cluster.node_mut(id)?.kill();
    Ok(())
}

#[derive(Debug, Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
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
        let choice = (state >> 8) % 100;
        n += 1;
        let value = Bytes::from(format!("p{process}-{n}"));
        let ok = match choice {
            0..=24 => client
                .get(key, Consistency::Linearizable)
                .await
                .map(|v| seen[k] = v.map(|v| v.version))
                .is_ok(),
            25..=44 => client
                .get(key, Consistency::Lease)
                .await
                .map(|v| seen[k] = v.map(|v| v.version))
                .is_ok(),
            45..=54 => client
                .get(
                    key,
                    Consistency::Follower {
                        max_lag_entries: FOLLOWER_LAG,
                    },
                )
                .await
                .is_ok(),
            55..=69 => client.put(key, value).await.is_ok(),
            70..=79 => {
                let ttl_ms = TTL_MS.start + (state >> 24) % (TTL_MS.end - TTL_MS.start);
                client
                    .put_with_ttl(key, value, Duration::from_millis(ttl_ms))
                    .await
                    .map(|version| seen[k] = Some(version))
                    .is_ok()
            }
            // A transaction (MULTI/EXEC's native form): read, then write.
            90..=94 => client
                .swap(key, value)
                .await
                .map(|(_, version)| seen[k] = Some(version))
                .is_ok(),
            80..=89 => client
                .cas(key, seen[k], Some(value))
                .await
                .map(|c| {
                    seen[k] = if c.succeeded {
                        Some(c.version)
                    } else {
                        c.current.map(|v| v.version)
                    }
                })
                .is_ok(),
            _ => client.delete(key).await.is_ok(),
        };
        let counter = if ok { &counts.ok } else { &counts.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        if !ok {
            // Do not spin while the cluster is unavailable.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
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

struct Row {
    scenario: &'static str,
    network: &'static str,
    operations: usize,
    ok: usize,
    unknown: usize,
    verdict: String,
    follower_reads: usize,
    follower_violations: usize,
    acknowledged_writes: usize,
    lost: usize,
}

async fn run_scenario(cluster: &mut Cluster, scenario: Scenario, round: usize) -> Result<Row> {
    let prefix = format!("s{round}");
    let recorder = Recorder::new();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    // The members at the start: nodes joined and removed during the run are gone.
    let members: Vec<u64> = cluster.nodes.keys().copied().collect();
    let mut workers = Vec::new();
    let mut one_sided_clients = Vec::new();
    for process in 0..CLIENTS {
        // Half the clients read one-sided where they can (lease and
        // follower reads from the mapped regions), half only by RPC.
        let transport = if process % 2 == 0 {
            Transport::Auto
        } else {
            Transport::Tcp
        };
        let client = cluster.client_with(
            Intent::Via(&members),
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
            prefix.clone(),
            Arc::clone(&stop),
            Arc::clone(&counts),
        )));
    }
    let load = Duration::from_secs(load_secs());
    let started = Instant::now();
    tokio::time::sleep(load / 4).await;
    let mut faults = 0;
    while started.elapsed() < load {
        inject(cluster, scenario, load / 4).await?;
        faults += 1;
        tokio::time::sleep(load / 8).await;
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.context("a client task panicked")?;
    }
    let mut one_sided = 0;
    for client in &one_sided_clients {
        one_sided += client.one_sided_stats().await.served;
    }
    // Final reads, recorded: every acknowledged write must be explained.
    cluster.heal().await?;
    current_leader(cluster).await?;
    let reader = recorder.client(cluster.client(Intent::Via(&members))?, CLIENTS);
    for k in 0..KEYS + QUIET_KEYS {
        reader
            .get(format!("{prefix}/k{k}"), Consistency::Linearizable)
            .await
            .with_context(|| format!("final read of key {k}"))?;
    }

    let history = recorder.history();
    let verdict = tokio::task::spawn_blocking({
        let history = history.clone();
        move || check_history(&history, CheckOptions::default())
    })
    .await??;
    // The harness runs 50 ms heartbeats: a replica's view of the commit
    // index is at most one election timeout (250-500 ms) old before it stops
    // serving follower reads; the lease margin adds 50 ms. 1 s covers both.
    let follower = check_follower_reads_within(&history, FOLLOWER_FRESHNESS_NS);
    let unknown = history
        .ops
        .iter()
        .filter(|op| op.outcome == Outcome::Unknown)
        .count();
    let acknowledged_writes = history
        .ops
        .iter()
        .filter(|op| !op.operation.is_read() && matches!(op.outcome, Outcome::Ok(_)))
        .count();
    let row = Row {
        scenario: scenario.name(),
        network: cluster.network_kind(),
        operations: history.ops.len(),
        ok: history
            .ops
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Ok(_)))
            .count(),
        unknown,
        verdict: match &verdict {
            Verdict::Linearizable => "linearizable".to_owned(),
            Verdict::NotLinearizable(_) => "NOT linearizable".to_owned(),
            Verdict::Timeout { .. } => "unknown (budget)".to_owned(),
        },
        follower_reads: follower.reads_checked,
        follower_violations: follower.violations.len(),
        acknowledged_writes,
        // A lost acknowledged write makes the history non-linearizable
        // (the final linearizable reads cannot be explained).
        lost: usize::from(!matches!(verdict, Verdict::Linearizable)),
    };
    let expired_reads = reads_of_expired_keys(&history);
    println!(
        "{}: {faults} faults, {} ops ({} ok, {} unknown), {}, follower reads {} ({} violations), \
         {one_sided} reads served one-sided, {expired_reads} reads found a TTL'd key gone",
        row.scenario,
        row.operations,
        row.ok,
        row.unknown,
        row.verdict,
        row.follower_reads,
        row.follower_violations
    );
    match verdict {
        Verdict::Linearizable => {}
        Verdict::NotLinearizable(violation) => bail!("{}: {violation}", scenario.name()),
        Verdict::Timeout { keys } => bail!(
            "{}: the checker ran out of steps on {} key(s)",
            scenario.name(),
            keys.len()
        ),
    }
    if let Some(v) = follower.violations.first() {
        bail!(
            "{}: follower read out of bound: {} ({})",
            scenario.name(),
            rdkv_tests::linearizability::describe(&v.read),
            v.reason
        );
    }
    ensure!(
        counts.ok.load(Ordering::Relaxed) > 0,
        "{}: no operation succeeded",
        scenario.name()
    );
    // Keys written with a TTL expired while the clients used them, so the
    // expiry rules were checked, not just the writes.
    ensure!(
        expired_reads > 0,
        "{}: no read found a key written with a TTL gone",
        scenario.name()
    );
    // The one-sided path was exercised and what it returned was checked:
    // every read of the one-sided clients is in the history checked above.
    let lease_reads = history
        .ops
        .iter()
        .filter(|op| {
            op.operation
                == (Operation::Get {
                    consistency: Consistency::Lease,
                })
                && matches!(op.outcome, Outcome::Ok(_))
        })
        .count();
    ensure!(
        one_sided > 0 && lease_reads > 0 && row.follower_reads > 0,
        "{}: {one_sided} reads served one-sided, {lease_reads} lease and {} follower reads \
         checked",
        scenario.name(),
        row.follower_reads
    );
    Ok(row)
}

fn report(rows: &[Row]) -> Result<()> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_stay_linearizable_under_faults() -> Result<()> {
    // Frequent snapshots and log purges, so that kills also land during
    // snapshot builds, installs (a restarted or new node behind the purged
    // log) and purges.
    let mut cluster = Cluster::start_faulty(
        3,
        &["--snapshot-entries", "100", "--snapshot-keep-entries", "20"],
    )?;
    rdkv_tests::skip::require_real_partitions(&cluster, "histories_stay_linearizable_under_faults");
    let limit = Duration::from_secs(60 + 30 * load_secs());
    check(&mut cluster, limit, async |cluster| {
        current_leader(cluster).await?;
        let mut rows = Vec::new();
        for (round, scenario) in Scenario::ALL.into_iter().enumerate() {
            rows.push(run_scenario(cluster, scenario, round).await?);
        }
        report(&rows)
    })
    .await
}
