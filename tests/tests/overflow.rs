//! Three nodes whose region index is deliberately tiny (`--bytes-per-slot`:
//! eight buckets for thousands of keys), so most keys live in overflow
//! tables, and whose snapshots are frequent. Every key reads back on every
//! replica, one-sided through its mapped region (`get`, `get_cached`,
//! `get_many`) and by RPC from that node alone: after a follower restarted
//! (its region rebuilt from its snapshot and the log, laid out unlike the
//! others), after the whole cluster restarted, and on a fourth node that
//! joined by snapshot install. A client on `Transport::Shm` reads them
//! one-sided too; the replicas' state digests agree; and `/metrics` shows
//! overflow tables on every node, so the overflow path was really taken.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Consistency, Transport};
use rdkv_fabric::IndexCache;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, SNAPSHOT_OFTEN, check_with_leader, client_options, eventually,
    numbered,
};

/// One index slot per MiB of the harness's 64 MiB region: 64 slots, 8 buckets.
const TINY_INDEX: [&str; 2] = ["--bytes-per-slot", "1048576"];
/// Written in batches first.
const BATCHED_KEYS: usize = 2500;
/// Then one entry each: enough entries for snapshots on every node.
const SINGLE_KEYS: usize = 200;
/// Written one entry each while a follower is down.
const LATER_KEYS: usize = 100;
const KEYS: usize = BATCHED_KEYS + SINGLE_KEYS + LATER_KEYS;
/// Keys per MPut and per MGet (under the 1024-key batch limit).
const BATCH: usize = 250;

fn keys(range: std::ops::Range<usize>) -> Vec<Bytes> {
    range.map(|i| Bytes::from(numbered::key(i))).collect()
}

async fn put_batched(client: &Client, range: std::ops::Range<usize>) -> Result<()> {
    let indexes: Vec<usize> = range.collect();
    for batch in indexes.chunks(BATCH) {
        client
            .mput(
                batch
                    .iter()
                    .map(|&i| (numbered::key(i), numbered::value(i))),
            )
            .await?;
    }
    Ok(())
}

/// Node `id`'s region, mapped and read directly: every key with `get`, with
/// `get_cached` (twice: the second from the cache), with `get_many`, and a
/// few keys never written as absent.
async fn check_one_sided(cluster: &Cluster, id: u64) -> Result<()> {
    let reader = cluster.map_region(id).await?;
    let cache = IndexCache::new(KEYS);
    for i in 0..KEYS {
        let key = numbered::key(i);
        let want = numbered::value(i);
        for (how, got) in [
            ("get", reader.get(key.as_bytes())?),
            ("get_cached", reader.get_cached(key.as_bytes(), &cache)?),
            ("cached", reader.get_cached(key.as_bytes(), &cache)?),
        ] {
            ensure!(
                got.as_ref().is_some_and(|v| v.value == want.as_bytes()),
                "node {id} {how} {key} = {got:?}"
            );
        }
    }
    for batch in keys(0..KEYS).chunks(BATCH) {
        let got = reader.get_many(batch)?;
        let first = numbered::key(0);
        ensure!(
            got.len() == batch.len(),
            "get_many of {first}..: {}",
            got.len()
        );
        for (key, found) in batch.iter().zip(got) {
            ensure!(found.is_some(), "node {id} get_many {key:?} = None");
        }
    }
    for key in keys(KEYS..KEYS + 50) {
        ensure!(reader.get(&key)?.is_none(), "node {id} has {key:?}");
    }
    let stats = reader.stats();
    ensure!(stats.cache_hits >= KEYS as u64, "node {id}: {stats:?}");
    Ok(())
}

/// Every key by RPC from node `id` alone, in batches (`numbered::check_replica`
/// reads them in one MGet, over the batch limit for this many).
async fn check_by_rpc(cluster: &Cluster, id: u64) -> Result<()> {
    let replica = cluster.replica(id)?;
    for start in (0..KEYS).step_by(BATCH) {
        let range = start..(start + BATCH).min(KEYS);
        let got = replica.mget(keys(range.clone())).await?;
        for (i, found) in range.zip(got) {
            let want = numbered::value(i);
            ensure!(
                found.as_ref().is_some_and(|v| v.value == want.as_bytes()),
                "node {id} by RPC: {} = {found:?}",
                numbered::key(i)
            );
        }
    }
    Ok(())
}

/// Every key through a client that may only read one-sided (shm): lease
/// reads from the leader's region, follower reads spread over the others.
async fn check_shm_client(cluster: &Cluster) -> Result<()> {
    let client = cluster.client_with(
        Intent::Any,
        ClientOptions {
            transport: Transport::Shm,
            ..client_options(None)
        },
    )?;
    numbered::get_all(&client, KEYS, 1).await?;
    let any_lag = Consistency::Follower {
        max_lag_entries: u64::MAX,
    };
    for start in (0..KEYS).step_by(BATCH) {
        let range = start..(start + BATCH).min(KEYS);
        let got = client.mget_with(keys(range.clone()), any_lag).await?;
        for (i, found) in range.zip(got) {
            ensure!(
                found
                    .as_ref()
                    .is_some_and(|v| v.value == numbered::value(i).as_bytes()),
                "shm follower read of {} = {found:?}",
                numbered::key(i)
            );
        }
    }
    let stats = client.one_sided_stats().await;
    ensure!(stats.served >= 2 * KEYS as u64, "{stats:?}");
    Ok(())
}

/// Node `id`'s overflow tables, from its `/metrics`.
async fn overflow_tables(cluster: &Cluster, id: u64) -> Result<f64> {
    cluster
        .metrics_of(id)
        .await?
        .get("rdkv_region_overflow_tables", &[("shard", "0")])
        .with_context(|| format!("node {id} reports no rdkv_region_overflow_tables"))
}

/// Every node has applied everything, holds every key (one-sided and by
/// RPC), reports overflow tables, and all report one state digest at one
/// applied index.
async fn check_everywhere(cluster: &Cluster) -> Result<()> {
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    eventually(
        Duration::from_secs(30),
        "one state digest on every node",
        async || {
            let mut digests = Vec::new();
            for &id in &ids {
                digests.push(cluster.status_of(id).await?.state_digest);
            }
            ensure!(
                digests.windows(2).all(|pair| pair[0] == pair[1]),
                "digests {digests:?}"
            );
            Ok(())
        },
    )
    .await?;
    for &id in &ids {
        check_one_sided(cluster, id).await?;
        check_by_rpc(cluster, id).await?;
        let tables = overflow_tables(cluster, id).await?;
        println!("node {id}: {tables} overflow tables");
        ensure!(tables >= 8.0, "node {id} has {tables} overflow tables");
    }
    check_shm_client(cluster).await
}

async fn put_each(client: &Client, range: std::ops::Range<usize>) -> Result<()> {
    for i in range {
        client.put(numbered::key(i), numbered::value(i)).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_index_spills_into_overflow_tables_on_every_replica() -> Result<()> {
    let args: Vec<&str> = TINY_INDEX.iter().chain(&SNAPSHOT_OFTEN).copied().collect();
    let mut cluster = Cluster::start_with(3, &args)?;
    check_with_leader(&mut cluster, 300, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        put_batched(&client, 0..BATCHED_KEYS).await?;
        let before_kill = BATCHED_KEYS + SINGLE_KEYS;
        put_each(&client, BATCHED_KEYS..before_kill).await?;

        // A follower with a snapshot is killed, misses writes, and restarts:
        // its region is rebuilt from the snapshot, then the log.
        let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
        eventually(LEADER_TIMEOUT, "a snapshot on the follower", async || {
            let status = cluster.status_of(follower).await?;
            ensure!(status.snapshot_index > 0, "no snapshot: {status:?}");
            Ok(())
        })
        .await?;
        let epoch = cluster.status_of(follower).await?.region_epoch;
        cluster.node_mut(follower)?.kill();
        put_each(&client, before_kill..KEYS).await?;
        cluster.restart(follower)?;
        eventually(LEADER_TIMEOUT, "the follower catches up", async || {
            check_by_rpc(cluster, follower).await
        })
        .await?;
        let status = cluster.status_of(follower).await?;
        ensure!(status.region_epoch != epoch, "the follower kept its region");
        check_everywhere(cluster).await?;

        // The whole cluster restarts: every region is rebuilt from its
        // snapshot and the log.
        for id in 1..=3 {
            cluster.node_mut(id)?.kill();
        }
        for id in 1..=3 {
            cluster.restart(id)?;
        }
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        eventually(LEADER_TIMEOUT, "every node has every key", async || {
            for id in 1..=3 {
                check_by_rpc(cluster, id).await?;
            }
            Ok(())
        })
        .await?;
        check_everywhere(cluster).await?;

        // A joiner gets everything by snapshot install.
        cluster.join(4, leader)?;
        eventually(
            Duration::from_secs(40),
            "node 4 has every key",
            async || check_by_rpc(cluster, 4).await,
        )
        .await?;
        ensure!(
            cluster.node(4)?.log().contains("snapshot installed"),
            "node 4 caught up without a snapshot install"
        );
        check_everywhere(cluster).await
    })
    .await
}
