//! One-sided reads of a multi-shard cluster (docs/sharding.md, section 5,
//! "One-sided reads"; issue 20): 3 `rdkv-server` processes, `--shards 6
//! --replicas 3`, shm on one host. 100,000 keys are written through every
//! path, a third each: native single `put`s and native `mput`s (split per
//! shard by the client), and RESP SETs pipelined through every node's RESP
//! port (two thirds of them reach a node that does not lead the key's
//! shard, which forwards them). Then every node's region of every shard,
//! attached by a grant naming the shard, holds every key of that shard,
//! and a client per node with one-sided reads required (`Transport::Shm`:
//! a GET not served from a mapped region fails with `OneSidedUnavailable`
//! instead of going to the server) reads every key back, at lease and at
//! follower consistency.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use rdkv_client::{Client, Consistency, Error, Transport};
use rdkv_fabric::{MonotonicClock, ReaderOptions, RegionReader, attach_shm_shard};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_tests::shard_view::{agreed_leaders, agreed_map, map_of, node_ids};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually};

/// Keys written and read back (issue 20's count), a third through each
/// path: native single puts, native `mput`s, RESP SETs.
const KEYS: usize = 100_000;
const BY_PUT: std::ops::Range<usize> = 0..KEYS / 3;
const BY_MPUT: std::ops::Range<usize> = KEYS / 3..2 * KEYS / 3;
const BY_RESP: std::ops::Range<usize> = 2 * KEYS / 3..KEYS;
/// Keys per `mput` (split by shard by the client) and `mput`s in flight.
const BATCH: usize = 1_000;
const IN_FLIGHT: usize = 4;
/// Single puts in flight.
const PUTS_IN_FLIGHT: usize = 64;
/// SETs per RESP pipeline.
const PIPELINE: usize = 500;
const FLAGS: [&str; 6] = ["--shards", "6", "--replicas", "3", "--region-mib", "16"];

fn key(i: usize) -> String {
    format!("os-key-{i}")
}

fn value(i: usize) -> String {
    format!("value-{i}")
}

/// Writes the keys of [`BY_PUT`], one `put` each, routed by the client to
/// their shard's leader.
async fn put_each(client: &Client) -> Result<()> {
    futures::stream::iter(BY_PUT)
        .map(|i| async move {
            client
                .put(key(i), value(i))
                .await
                .with_context(|| format!("put {}", key(i)))
        })
        .buffer_unordered(PUTS_IN_FLIGHT)
        .try_collect::<Vec<u64>>()
        .await?;
    Ok(())
}

/// Writes the keys of [`BY_MPUT`], `BATCH` keys per `mput`.
async fn mput_all(client: &Client) -> Result<()> {
    futures::stream::iter(BY_MPUT.step_by(BATCH))
        .map(|start| async move {
            let pairs: Vec<(String, String)> = (start..(start + BATCH).min(BY_MPUT.end))
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

/// Writes the keys of [`BY_RESP`] with SETs pipelined through every
/// node's RESP port, key i through node `ids[i % ids.len()]`, all nodes at
/// once: a node that does not lead a key's shard forwards its SET. Returns
/// how many SETs went to a node not leading their key's shard (by
/// `leaders`).
async fn set_through_every_node(
    cluster: &Cluster,
    ids: &[u64],
    map: &ShardMap,
    leaders: &BTreeMap<ShardId, u64>,
) -> Result<usize> {
    let mut forwarded = 0;
    let mut writers = Vec::new();
    for (n, &id) in ids.iter().enumerate() {
        let keys: Vec<usize> = BY_RESP.filter(|i| i % ids.len() == n).collect();
        forwarded += keys
            .iter()
            .filter(|&&i| leaders.get(&map.shard_of_key(key(i).as_bytes())) != Some(&id))
            .count();
        let addr = cluster.node(id)?.resp_addr;
        writers.push(tokio::task::spawn_blocking(move || {
            set_pipelined(addr, &keys)
        }));
    }
    for writer in writers {
        writer.await??;
    }
    Ok(forwarded)
}

/// SETs of `keys` through the RESP port at `addr`, [`PIPELINE`] a round
/// trip; every reply must be OK.
fn set_pipelined(addr: std::net::SocketAddr, keys: &[usize]) -> Result<()> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(10))?;
    con.set_read_timeout(Some(Duration::from_secs(30)))?;
    for chunk in keys.chunks(PIPELINE) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.cmd("SET").arg(key(i)).arg(value(i));
        }
        let replies: Vec<String> = pipe
            .query(&mut con)
            .with_context(|| format!("SETs from {} through {addr}", key(chunk[0])))?;
        ensure!(
            replies.len() == chunk.len() && replies.iter().all(|r| r == "OK"),
            "SETs from {} through {addr}: {replies:?}",
            key(chunk[0])
        );
    }
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
        let leaders = eventually(LEADER_TIMEOUT, "a leader in every shard", async || {
            let led = agreed_leaders(cluster, &ids).await?;
            ensure!(led.len() == 6, "{led:?}");
            Ok(led)
        })
        .await?;
        let map = map_of(cluster, 1).await?;
        let client = cluster.client(Intent::Any)?;
        let started = Instant::now();
        put_each(&client).await?;
        eprintln!(
            "{} keys put one by one in {:?}",
            BY_PUT.len(),
            started.elapsed()
        );
        let started = Instant::now();
        mput_all(&client).await?;
        eprintln!("{} keys by mput in {:?}", BY_MPUT.len(), started.elapsed());
        // RESP forwarding needs every node's address in the map.
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &ids).await,
        )
        .await?;
        let started = Instant::now();
        let forwarded = set_through_every_node(cluster, &ids, &map, &leaders).await?;
        eprintln!(
            "{} keys by RESP SET in {:?}, {forwarded} through a node not leading their shard",
            BY_RESP.len(),
            started.elapsed()
        );
        ensure!(forwarded > 0, "no SET was forwarded");

        for &id in &ids {
            let started = Instant::now();
            // A write is acknowledged once two of its shard's three
            // replicas have it: the third may apply the last ones later.
            eventually(LEADER_TIMEOUT, "every key in every region", async || {
                every_region_holds_its_keys(cluster, id, &map).await
            })
            .await?;
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
