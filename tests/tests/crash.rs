//! Crash safety with real processes: no acknowledged write is lost when the
//! leader is SIGKILLed again and again under load, and a node whose log ends
//! in a torn record (garbage, or a record cut short) recovers every
//! acknowledged write and keeps serving.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Error as ClientError, Versioned};
use rdkv_proto::wire::Consistency;
use rdkv_storage::raft_log::{DEFAULT_MAX_RECORD_SIZE, segment};
use rdkv_tests::node::log_segments;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, check, check_with_leader, client_options, eventually, garbage,
    lost_writes,
};

const WRITERS: u64 = 4;
const KILLS: usize = 3;
/// Acknowledged writes awaited before each kill and after the last.
const PROGRESS: usize = 200;

#[derive(Debug, Default)]
struct History {
    /// Write numbers acknowledged with Ok.
    acked: BTreeSet<u64>,
    /// Writes that failed with an unknown outcome (may or may not be applied).
    unknown: u64,
    /// Writes that failed without being applied (timeout before sending, no leader).
    failed: u64,
}

fn writer_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(5),
        ..client_options(None)
    }
}

/// Issues `put("w{i}", i)` with ever-increasing `i` until `stop`.
async fn writer(
    client: Client,
    next: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let result = client.put(format!("w{i}"), i.to_string()).await;
        let failed = {
            let mut h = history.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(_) => {
                    h.acked.insert(i);
                    false
                }
                Err(ClientError::OutcomeUnknown { .. }) => {
                    h.unknown += 1;
                    false
                }
                Err(_) => {
                    h.failed += 1;
                    true
                }
            }
        };
        if failed {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn acked_count(history: &Mutex<History>) -> usize {
    history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .acked
        .len()
}

/// Checks that every write in `acked` reads back as its number through
/// `mget` (a client's, or one replica's).
async fn all_present(
    mget: impl AsyncFn(Vec<Bytes>) -> Result<Vec<Option<Versioned>>>,
    acked: &BTreeSet<u64>,
) -> Result<()> {
    let acked: Vec<u64> = acked.iter().copied().collect();
    for chunk in acked.chunks(500) {
        let keys: Vec<Bytes> = chunk.iter().map(|i| Bytes::from(format!("w{i}"))).collect();
        let values = mget(keys).await?;
        for (i, got) in chunk.iter().zip(values) {
            let got = got.map(|v| v.value);
            ensure!(
                got.as_deref() == Some(i.to_string().as_bytes()),
                "acknowledged write w{i} reads back as {got:?}"
            );
        }
    }
    Ok(())
}

/// Four writers share a client while the leader is SIGKILLed three times
/// (each time restarted once the others have elected a new leader). Every
/// write acknowledged with Ok is then read back, linearizably from the
/// leader and locally from every replica: zero lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_write_lost_when_leader_is_killed_repeatedly() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        let client = cluster.client_with(Intent::Any, writer_options())?;
        let next = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(History::default()));
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                tokio::spawn(writer(
                    client.clone(),
                    Arc::clone(&next),
                    Arc::clone(&stop),
                    Arc::clone(&history),
                ))
            })
            .collect();

        // Each round waits for fresh acknowledged writes (so that writes
        // resume after every failover), then kills the leader mid-stream.
        let progress = async |what: &str| {
            let mark = acked_count(&history);
            eventually(Duration::from_secs(20), what, async || {
                let now = acked_count(&history);
                ensure!(now >= mark + PROGRESS, "{now} acks, {mark} before");
                Ok(())
            })
            .await
        };
        let killing = async {
            for round in 0..KILLS {
                progress("writes before a kill").await?;
                let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
                println!(
                    "round {round}: SIGKILL leader {leader} after {} acks",
                    acked_count(&history)
                );
                cluster.node_mut(leader)?.kill();
                let new_leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
                ensure!(new_leader != leader, "the killed node still leads");
                cluster.restart(leader)?;
            }
            progress("writes after the last kill").await
        }
        .await;
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await.context("writer task")?;
        }
        killing?;

        let history = std::mem::take(&mut *history.lock().unwrap_or_else(|p| p.into_inner()));
        println!(
            "{} writes issued: {} acknowledged, {} unknown outcome, {} failed",
            next.load(Ordering::Relaxed),
            history.acked.len(),
            history.unknown,
            history.failed
        );
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        let checker = cluster.client_with(Intent::Any, writer_options())?;
        let linearizable =
            async |keys| Ok(checker.mget_with(keys, Consistency::Linearizable).await?);
        all_present(linearizable, &history.acked).await?;

        // Every replica, restarted ones included, has them as well.
        let commit = cluster.status_of(leader).await?.commit_index;
        for id in 1..=3 {
            eventually(Duration::from_secs(20), "replica caught up", async || {
                let status = cluster.status_of(id).await?;
                ensure!(
                    status.applied_index >= commit,
                    "node {id} applied {} < {commit}",
                    status.applied_index
                );
                Ok(())
            })
            .await?;
            let local = cluster.replica(id)?;
            all_present(async |keys| local.mget(keys).await, &history.acked)
                .await
                .with_context(|| format!("replica {id}"))?;
        }
        Ok(())
    })
    .await
}

// ---- torn tail ---------------------------------------------------------------

/// The newest segment file of a node's Raft log.
fn last_segment(data_dir: &Path) -> Result<PathBuf> {
    let (_, path) = log_segments(data_dir)?.pop_last().context("no segment")?;
    Ok(path)
}

/// Offsets and sizes of the intact records of a segment file.
fn records(path: &Path) -> Result<Vec<(u64, u64)>> {
    let scan = segment::read_segment(path, DEFAULT_MAX_RECORD_SIZE)?;
    Ok(scan
        .records
        .iter()
        .map(|r| (r.offset, r.end() - r.offset))
        .collect())
}

/// The raft-log directory's files other than segments and the lock (vote,
/// meta, committed index...), by path.
fn append(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(())
}

async fn wait_serving(client: &Client) -> Result<()> {
    eventually(LEADER_TIMEOUT, "the node serves", async || {
        client.get_with("probe", Consistency::Linearizable).await?;
        Ok(())
    })
    .await
}

async fn put_range(client: &Client, prefix: &str, n: usize, acked: &mut Vec<String>) -> Result<()> {
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        client.put(key.clone(), key.clone()).await?;
        acked.push(key);
    }
    Ok(())
}

async fn check_keys(client: &Client, keys: &[String]) -> Result<()> {
    let lost = lost_writes(client, keys).await?;
    ensure!(
        lost.is_empty(),
        "acknowledged {lost:?} do not read back as written"
    );
    Ok(())
}

/// A single node is stopped and its last segment damaged, three ways, each
/// followed by a restart that must bring back every acknowledged write and
/// take new ones:
/// 1. random bytes appended after the last record (a write torn mid-header),
/// 2. the first half of a copy of the last record appended (a record torn
///    mid-payload: plausible length, payload cut short),
/// 3. the last record itself cut in half. That record is a write made for
///    the purpose and left out of the check: a crash cannot tear a record
///    that was fsynced (and so acknowledged), so this stands for a write
///    torn before its fsync. It must vanish whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_log_tail_is_truncated_on_restart() -> Result<()> {
    let mut cluster = Cluster::start(1)?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let client = cluster.client(Intent::Any)?;
        wait_serving(&client).await?;
        let mut acked = Vec::new();
        put_range(&client, "a", 100, &mut acked).await?;
        client
            .mput((0..50).map(|i| (format!("m-{i}"), format!("m-{i}"))))
            .await?;
        acked.extend((0..50).map(|i| format!("m-{i}")));
        let data_dir = cluster.node(1)?.data_dir.clone();

        // 1. Garbage after the last record.
        cluster.node_mut(1)?.stop()?;
        let segment = last_segment(&data_dir)?;
        let before = std::fs::metadata(&segment)?.len();
        append(&segment, &garbage(1000, 7))?;
        cluster.restart(1)?;
        wait_serving(&client).await?;
        check_keys(&client, &acked).await.context("after garbage")?;
        put_range(&client, "b", 20, &mut acked).await?;
        check_keys(&client, &acked).await?;
        let after = std::fs::metadata(last_segment(&data_dir)?)?.len();
        ensure!(after >= before, "the log shrank below its intact records");

        // 2. Half a record appended.
        cluster.node_mut(1)?.stop()?;
        let segment = last_segment(&data_dir)?;
        let bytes = std::fs::read(&segment)?;
        let &(offset, len) = records(&segment)?.last().context("no record")?;
        let record = &bytes[offset as usize..(offset + len) as usize];
        append(&segment, &record[..record.len() / 2])?;
        cluster.restart(1)?;
        wait_serving(&client).await?;
        check_keys(&client, &acked)
            .await
            .context("after half a record")?;
        put_range(&client, "c", 20, &mut acked).await?;

        // 3. The state a crash leaves while the last record is being
        // written: the log files as they were before the torn write, plus
        // the first half of its record.
        cluster.node_mut(1)?.stop()?;
        let segment = last_segment(&data_dir)?;
        let intact_len = std::fs::metadata(&segment)?.len();
        cluster.restart(1)?;
        wait_serving(&client).await?;
        client.put("torn", "x").await?;
        // Killed, not stopped: a clean stop would save a snapshot holding
        // the write, which a crash mid-write never does.
        cluster.node_mut(1)?.kill();
        ensure!(
            last_segment(&data_dir)? == segment,
            "a new segment was started"
        );
        let torn: Vec<(u64, u64)> = records(&segment)?
            .into_iter()
            .filter(|(offset, _)| *offset >= intact_len)
            .collect();
        // The restart's election appends a blank entry of the new term
        // before the put: the put is the last record.
        let &(offset, len) = torn
            .last()
            .context(format!("no record after the mark: {torn:?}"))?;
        let file = std::fs::OpenOptions::new().write(true).open(&segment)?;
        file.set_len(offset + len / 2)?;
        file.sync_all()?;
        // The vote, meta and committed files stay as the stop left them: the
        // committed index (saved without fsync) now names the torn entry, the
        // worst case a crash can leave; recovery must cap it.
        cluster.restart(1)?;
        wait_serving(&client).await?;
        check_keys(&client, &acked)
            .await
            .context("after a torn record")?;
        // The torn record is dropped whole, not half-applied.
        let torn = client.get_with("torn", Consistency::Linearizable).await?;
        ensure!(torn.is_none(), "the torn write survived: {torn:?}");
        put_range(&client, "d", 20, &mut acked).await?;
        check_keys(&client, &acked).await?;
        let status = cluster.status_of(1).await?;
        ensure!(
            status.region.live_keys == acked.len() as u64,
            "live_keys {} != {} acknowledged",
            status.region.live_keys,
            acked.len()
        );
        Ok(())
    })
    .await
}

/// A follower applies (and saves its committed index for) entries it has
/// written to its log but not yet fsynced: openraft applies up to the
/// *submitted* log (`Engine::next_progress_driven_command`), and
/// `run_save_committed_and_apply` calls `save_committed` first. A power cut
/// can then leave the follower's last record torn while its saved committed
/// index covers it. That node must still start (its committed index clamped
/// to the intact log) and catch up from the leader, which holds the entry.
///
/// This stages that state (last record of a follower cut in half, the
/// committed file left as it is) and restarts the follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_with_torn_tail_below_its_committed_index_rejoins() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 60, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        let mut acked = Vec::new();
        put_range(&client, "k", 50, &mut acked).await?;
        let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
        let commit = cluster.status_of(leader).await?.commit_index;
        eventually(
            LEADER_TIMEOUT,
            "the follower applied everything",
            async || {
                let status = cluster.status_of(follower).await?;
                ensure!(status.applied_index >= commit, "{status:?}");
                Ok(())
            },
        )
        .await?;
        // Killed, not stopped: a clean stop would save a snapshot covering
        // the record torn below, which a crash never does.
        cluster.node_mut(follower)?.kill();

        let segment = last_segment(&cluster.node(follower)?.data_dir)?;
        let &(offset, len) = records(&segment)?.last().context("no record")?;
        let file = std::fs::OpenOptions::new().write(true).open(&segment)?;
        file.set_len(offset + len / 2)?;
        file.sync_all()?;

        cluster.restart(follower)?;
        let local = cluster.replica(follower)?;
        eventually(
            LEADER_TIMEOUT,
            "the follower serves every key",
            async || {
                ensure!(
                    cluster.node_mut(follower)?.is_running(),
                    "node {follower} exited after its restart"
                );
                let values = local
                    .mget(acked.iter().map(|k| Bytes::from(k.clone())))
                    .await?;
                ensure!(values.iter().all(Option::is_some), "keys missing");
                Ok(())
            },
        )
        .await?;
        client.put("after", "yes").await?;
        Ok(())
    })
    .await
}
