//! Key expiry on a real cluster (issue 16): keys written with a TTL through
//! every node expire on every replica and for every read path (RPC and
//! one-sided), never earlier than the clock-drift margin allows; the
//! leader's replicated expire cycle gives their room back; killing the
//! leader in the middle of it loses and resurrects nothing; deadlines
//! survive a snapshot install and a restart.
//!
//! Every node runs on this host, so the test, the leader that stamps a
//! deadline and every reader share one wall clock: a key written with TTL
//! `t` whose write was issued at `i` and acknowledged at `a` has its
//! deadline in `[i + t, a + t]`, and a reader counts it expired from
//! `MARGIN_MS` before that. These are correctness bounds, not timings.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use futures::future::try_join_all;
use rdkv_client::Client;
use rdkv_fabric::clock::{DEFAULT_MAX_CLOCK_DRIFT_MS, unix_now_ms};
use rdkv_proto::wire::{Consistency, Request, Response};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, SNAPSHOT_OFTEN, check_with_leader, eventually};

const TEST_LIMIT_SECS: u64 = 120;
/// How early a reader may count a key expired (the servers' and the
/// client's default clock-drift bound).
const MARGIN_MS: u64 = DEFAULT_MAX_CLOCK_DRIFT_MS;
const SHORT_TTL: Duration = Duration::from_secs(1);
/// Writes in flight per client while loading keys.
const IN_FLIGHT: usize = 32;
/// How long the expire cycle gets to give the room back.
const RECLAIM_TIMEOUT: Duration = Duration::from_secs(15);

/// A key written with a TTL: when its write was issued and acknowledged
/// (unix ms), which bound its deadline.
#[derive(Debug, Clone)]
struct Timed {
    key: Bytes,
    issued_ms: u64,
    acked_ms: u64,
}

/// Writes `keys` with `ttl` through `client`, `IN_FLIGHT` at a time.
async fn put_expiring(client: &Client, keys: Vec<Bytes>, ttl: Duration) -> Result<Vec<Timed>> {
    let mut written = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(IN_FLIGHT) {
        let puts = chunk.iter().map(async |key| {
            let issued_ms = unix_now_ms();
            client
                .put_with_ttl(key.clone(), key.clone(), ttl)
                .await
                .with_context(|| format!("put {key:?} with a ttl"))?;
            anyhow::Ok(Timed {
                key: key.clone(),
                issued_ms,
                acked_ms: unix_now_ms(),
            })
        });
        written.extend(try_join_all(puts).await?);
    }
    Ok(written)
}

fn keys(prefix: &str, n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| Bytes::from(format!("{prefix}-{i:05}")))
        .collect()
}

/// Reads every key once through `client` (one-sided where it can) and
/// checks each answer against the deadline bounds: a key read absent must
/// have had its deadline within the margin of the read's end; a key read
/// present must have been read (started) before its latest deadline.
/// Returns how many were present.
async fn read_within_bounds(client: &Client, written: &[Timed], ttl_ms: u64) -> Result<usize> {
    let mut present = 0;
    for timed in written {
        let started_ms = unix_now_ms();
        let found = client.get(timed.key.clone()).await?;
        let ended_ms = unix_now_ms();
        match found {
            Some(_) => {
                ensure!(
                    started_ms < timed.acked_ms + ttl_ms,
                    "{:?} served at {started_ms}, past its latest deadline {}",
                    timed.key,
                    timed.acked_ms + ttl_ms
                );
                present += 1;
            }
            None => ensure!(
                ended_ms + MARGIN_MS >= timed.issued_ms + ttl_ms,
                "{:?} absent at {ended_ms}, more than {MARGIN_MS} ms before its earliest deadline {}",
                timed.key,
                timed.issued_ms + ttl_ms
            ),
        }
    }
    Ok(present)
}

/// Every node's (live keys, quota charge).
async fn room(cluster: &Cluster) -> Result<Vec<(u64, u64)>> {
    let mut rooms = Vec::new();
    for id in 1..=3 {
        let status = cluster.status_of(id).await?;
        rooms.push((status.region.live_keys, status.quota.charged_bytes));
    }
    Ok(rooms)
}

/// 1,000 keys with a 1 s TTL, written through each node in turn, are read
/// within their bounds while they expire, then are absent on every node by
/// RPC and by a direct one-sided read of each region, while every pair is
/// still in every region: the expire cycle is set to run once an hour, so
/// only the deadline check can hide them. (The room coming back is the
/// next test's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_keys_are_absent_to_every_read_before_they_are_removed() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &["--expire-cycle-ms", "3600000"])?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, _leader| {
        let client = cluster.client(Intent::Any)?;
        for key in keys("kept", 20) {
            client.put(key.clone(), key).await?;
        }
        let all = keys("short", 1_000);
        let mut written = Vec::new();
        for (id, chunk) in (1..=3u64).cycle().zip(all.chunks(334)) {
            let via = cluster.client(Intent::Via(&[id]))?;
            written.extend(put_expiring(&via, chunk.to_vec(), SHORT_TTL).await?);
        }
        let ttl_ms = SHORT_TTL.as_millis() as u64;
        eventually(RECLAIM_TIMEOUT, "every key read absent", async || {
            let present = read_within_bounds(&client, &written, ttl_ms).await?;
            ensure!(present == 0, "{present} keys still served");
            Ok(())
        })
        .await?;

        for id in 1..=3 {
            let replica = cluster.replica(id)?;
            let live = replica.status().await?.region.live_keys;
            ensure!(live == 1_020, "node {id} holds {live} pairs, not all 1,020");
            let values = replica.mget(all.iter().take(500).cloned()).await?;
            let values_rest = replica.mget(all.iter().skip(500).cloned()).await?;
            let served = values.iter().chain(&values_rest).flatten().count();
            ensure!(served == 0, "node {id} serves {served} expired keys by RPC");
            let region = cluster.map_region(id).await?;
            for key in &all {
                ensure!(
                    region.get(key)?.is_none(),
                    "node {id}'s region serves {key:?} one-sided"
                );
            }
            ensure!(replica.get("kept-00000").await?.is_some(), "node {id}");
        }
        Ok(())
    })
    .await
}

/// The leader is killed while its expire cycle is removing keys (a load of
/// 1 s keys still being written, the first ones expiring): the keys without
/// a TTL and with a long one are all there on every node, the expired ones
/// on none, also on the killed node once it restarts, and every node's
/// live keys and quota charge are back to what they were before the 1 s
/// keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_cycle_loses_and_resurrects_nothing() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        let kept = keys("kept", 200);
        for key in &kept {
            client.put(key.clone(), key.clone()).await?;
        }
        let long = keys("long", 200);
        put_expiring(&client, long.clone(), Duration::from_secs(3_600)).await?;
        let baseline = eventually(LEADER_TIMEOUT, "400 keys on every node", async || {
            let rooms = room(cluster).await?;
            ensure!(rooms.iter().all(|r| r.0 == 400), "{rooms:?}");
            Ok(rooms[0])
        })
        .await?;
        let short = keys("short", 4_000);
        let loader = {
            let client = client.clone();
            let short = short.clone();
            // Errors after the kill are expected: the keys expire anyway.
            tokio::spawn(async move { put_expiring(&client, short, SHORT_TTL).await })
        };
        let leader_replica = cluster.replica(leader)?;
        let mut peak = 0;
        eventually(
            Duration::from_secs(30),
            "the expire cycle at work",
            async || {
                let live = leader_replica.status().await?.region.live_keys;
                peak = peak.max(live);
                ensure!(peak > 1_000 && live < peak, "live keys {live}, peak {peak}");
                Ok(())
            },
        )
        .await?;
        cluster.node_mut(leader)?.kill();
        println!("killed leader {leader} at {peak} live keys at most");
        let _ = loader.await;
        let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        cluster
            .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
            .await?;
        let lasting = Lasting {
            kept: &kept,
            long: &long,
            room: baseline,
        };
        for id in others {
            expect_only_lasting_keys(cluster, id, &lasting, &short).await?;
        }
        cluster.restart(leader)?;
        expect_only_lasting_keys(cluster, leader, &lasting, &short).await
    })
    .await
}

/// The keys that must outlive the test's 1 s keys, and the (live keys,
/// quota charge) they make.
struct Lasting<'a> {
    kept: &'a [Bytes],
    long: &'a [Bytes],
    room: (u64, u64),
}

/// Node `id` ends up with exactly the lasting keys, each with its value,
/// charged as before, and serves none of `short`.
async fn expect_only_lasting_keys(
    cluster: &Cluster,
    id: u64,
    lasting: &Lasting<'_>,
    short: &[Bytes],
) -> Result<()> {
    let replica = cluster.replica(id)?;
    eventually(RECLAIM_TIMEOUT * 2, "only the lasting keys", async || {
        let status = replica.status().await?;
        let room = (status.region.live_keys, status.quota.charged_bytes);
        ensure!(
            room == lasting.room,
            "node {id} has (live keys, charge) {room:?}, not {:?}",
            lasting.room
        );
        Ok(())
    })
    .await?;
    for key in lasting.kept.iter().chain(lasting.long) {
        let found = replica.get(key.clone()).await?;
        ensure!(
            found.is_some_and(|v| v.value == *key),
            "node {id} lost {key:?}"
        );
    }
    for chunk in short.chunks(500) {
        let served = replica.mget(chunk.iter().cloned()).await?;
        ensure!(
            served.iter().all(Option::is_none),
            "node {id} resurrected an expired key"
        );
    }
    Ok(())
}

/// The deadline node `id` has for `key` (`None`: absent; `Some(None)`: no
/// deadline), asked of that node alone.
async fn deadline_on(cluster: &Cluster, id: u64, key: &str) -> Result<Option<Option<u64>>> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let request = Request::Ttl {
        key: Bytes::copy_from_slice(key.as_bytes()),
        consistency: Consistency::Follower {
            max_lag_entries: u64::MAX,
        },
    };
    match client
        .send_to(&cluster.node(id)?.endpoint(), request)
        .await?
    {
        Response::Expiry(expiry) => Ok(expiry.map(|e| e.deadline_unix_ms)),
        other => anyhow::bail!("node {id} answered TTL with {other:?}"),
    }
}

/// A node that catches up by snapshot and a node restarted from its
/// snapshot and log have the deadlines the leader has; a short TTL expires
/// on them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_survive_a_snapshot_install_and_a_restart() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &SNAPSHOT_OFTEN)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        client
            .put_with_ttl("long", "v", Duration::from_secs(3_600))
            .await?;
        client
            .put_with_ttl("short", "v", Duration::from_secs(4))
            .await?;
        // Enough entries past them for a snapshot and a purged log.
        for key in keys("filler", 400) {
            client.put(key.clone(), key).await?;
        }
        let deadline = deadline_on(cluster, leader, "long").await?;
        ensure!(
            matches!(deadline, Some(Some(_))),
            "the leader has {deadline:?}"
        );
        eventually(LEADER_TIMEOUT, "a snapshot on the leader", async || {
            let status = cluster.status_of(leader).await?;
            ensure!(status.snapshot_index >= 300, "{status:?}");
            Ok(())
        })
        .await?;
        let seed = (1..=3).find(|id| *id != leader).unwrap_or(1);
        cluster.join(4, seed)?;
        let restarted = seed;
        cluster.node_mut(restarted)?.kill();
        cluster.restart(restarted)?;
        for id in [4, restarted] {
            eventually(Duration::from_secs(40), "the deadline there", async || {
                let there = deadline_on(cluster, id, "long").await?;
                ensure!(there == deadline, "node {id} has {there:?}");
                Ok(())
            })
            .await?;
        }
        for id in [4, restarted] {
            let replica = cluster.replica(id)?;
            eventually(RECLAIM_TIMEOUT, "the short key gone", async || {
                ensure!(replica.get("short").await?.is_none(), "node {id}");
                let live = replica.status().await?.region.live_keys;
                ensure!(live == 401, "node {id} has {live} live keys");
                Ok(())
            })
            .await?;
        }
        Ok(())
    })
    .await
}
