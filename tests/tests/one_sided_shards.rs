//! One-sided reads of a multi-shard cluster (docs/sharding.md, section 5,
//! "One-sided reads"; issue 20): 3 `rdkv-server` processes, `--shards 6
//! --replicas 3`, shm on one host. Keys written through the native client
//! are read back by a client per node with one-sided reads required
//! (`Transport::Shm`: a GET not served from a mapped region fails with
//! `OneSidedUnavailable` instead of going to the server), at lease and at
//! follower consistency, and every node's region of every shard, attached
//! by a grant naming the shard, holds every key of that shard.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use rdkv_client::{Client, Consistency, Error, Transport};
use rdkv_fabric::{MonotonicClock, ReaderOptions, RegionReader, attach_shm_shard};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_tests::shard_view::{agreed_leaders, map_of, node_ids};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually};

/// Keys written and read back (issue 20's count).
const KEYS: usize = 100_000;
/// Keys per `mput` (split by shard by the client) and `mput`s in flight.
const BATCH: usize = 1_000;
const IN_FLIGHT: usize = 4;
const FLAGS: [&str; 6] = ["--shards", "6", "--replicas", "3", "--region-mib", "16"];

fn key(i: usize) -> String {
    format!("os-key-{i}")
}

fn value(i: usize) -> String {
    format!("value-{i}")
}

/// Writes every key through one client, `BATCH` keys per `mput`.
async fn write_all(client: &Client) -> Result<()> {
    futures::stream::iter((0..KEYS).step_by(BATCH))
        .map(|start| async move {
            let pairs: Vec<(String, String)> = (start..(start + BATCH).min(KEYS))
                .map(|i| (key(i), value(i)))
                .collect();
            client
                .mput(pairs)
                .await
                .with_context(|| format!("mput from key {start}"))
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<u64>>()
        .await?;
    Ok(())
}

/// A client of node `id` alone whose GETs are one-sided or fail.
fn one_sided_client(cluster: &Cluster, id: u64, consistency: Consistency) -> Result<Client> {
    let options = rdkv_client::ClientOptions {
        transport: Transport::Shm,
        default_consistency: consistency,
        ..cluster.options(None)
    };
    cluster.client_with(Intent::Via(&[id]), options)
}

/// Reads every key through `client`, one-sided: a read refused for now (a
/// lease renewing, the view being built) is tried again a few times; any
/// other error, a wrong value or a read still refused fails.
async fn read_all(client: &Client, what: &str) -> Result<()> {
    for i in 0..KEYS {
        let mut tries = 0;
        let got = loop {
            match client.get(key(i)).await {
                Err(Error::OneSidedUnavailable) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other.with_context(|| format!("{what}: {}", key(i)))?,
            }
        };
        let expected = value(i);
        ensure!(
            got.as_ref().map(|v| &v.value[..]) == Some(expected.as_bytes()),
            "{what}: {} reads {got:?}",
            key(i)
        );
    }
    let served = client.one_sided_stats().await.served;
    ensure!(
        served >= KEYS as u64,
        "{what}: {served} GETs served one-sided"
    );
    Ok(())
}

/// Node `id`'s region of every shard, attached through its shm socket by
/// a grant naming the shard, holds every key of that shard.
async fn every_region_holds_its_keys(cluster: &Cluster, id: u64, map: &ShardMap) -> Result<()> {
    let socket = cluster
        .status_of(id)
        .await?
        .shm_socket
        .with_context(|| format!("node {id} has no shm socket"))?;
    for shard in map.shards() {
        let attached = attach_shm_shard(Path::new(&socket), None, "test", Some(shard.id)).await?;
        let reader = RegionReader::attach(
            attached.memory,
            Arc::new(MonotonicClock::new()),
            ReaderOptions {
                max_attempts: 8,
                abandon_after_us: None,
                expiry_margin_ms: 0,
            },
        )?;
        let keys = (0..KEYS).filter(|&i| map.shard_of_key(key(i).as_bytes()) == shard.id);
        for i in keys {
            let got = reader.get(key(i).as_bytes())?;
            if got.as_ref().map(|v| &v.value[..]) != Some(value(i).as_bytes()) {
                bail!(
                    "node {id}, shard {}: {} reads {got:?} one-sided",
                    shard.id,
                    key(i)
                );
            }
        }
    }
    // A shard the map does not have is not granted.
    let unknown = attach_shm_shard(Path::new(&socket), None, "test", Some(ShardId(99))).await;
    ensure!(
        matches!(unknown, Err(rdkv_fabric::ShmError::WrongShard(_))),
        "{unknown:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_six_shards_is_read_one_sided_through_every_node() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(240), async |cluster| {
        let ids = node_ids(cluster);
        eventually(LEADER_TIMEOUT, "a leader in every shard", async || {
            let led = agreed_leaders(cluster, &ids).await?;
            ensure!(led.len() == 6, "{led:?}");
            Ok(led)
        })
        .await?;
        let map = map_of(cluster, 1).await?;
        let started = Instant::now();
        write_all(&cluster.client(Intent::Any)?).await?;
        eprintln!("{KEYS} keys written in {:?}", started.elapsed());

        for &id in &ids {
            let started = Instant::now();
            every_region_holds_its_keys(cluster, id, &map).await?;
            eprintln!("node {id}: 6 regions checked in {:?}", started.elapsed());
        }
        let follower = Consistency::Follower {
            max_lag_entries: 1_000,
        };
        for &id in &ids {
            for (consistency, what) in [(Consistency::Lease, "lease"), (follower, "follower")] {
                let started = Instant::now();
                let client = one_sided_client(cluster, id, consistency)?;
                read_all(&client, &format!("node {id}, {what}")).await?;
                eprintln!("node {id}, {what}: {KEYS} GETs in {:?}", started.elapsed());
            }
        }
        Ok(())
    })
    .await
}
