//! Operating a cluster of several shards (docs/sharding.md, section 8):
//! 3 `rdkv-server` processes with `--shards 6 --replicas 3`. Every node
//! lists its shards in `/status` and labels its gauges by shard;
//! `rdkvctl rebalance` keeps every node at or under the bound of
//! ceil(6 / 3) + 1 = 3 led shards, also after `rdkvctl shard move-leader`
//! moved every leader to node 1, and moves nothing when run again; a
//! SIGKILLed node leaves every shard writable and loses no acknowledged
//! write.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::Role;
use rdkv_tests::prometheus::{http_get, parse};
use rdkv_tests::shard_view::{agreed_map, keys_per_shard, node_ids};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually, rdkvctl_ok};

const SHARDS: usize = 6;
const NODES: u64 = 3;
/// The bound: ceil(shards / nodes) + 1.
const MAX_LED: usize = SHARDS.div_ceil(NODES as usize) + 1;
const FLAGS: [&str; 6] = ["--shards", "6", "--replicas", "3", "--region-mib", "8"];

/// Shards led by each node, from every node's `ShardStatus`; fails until
/// every shard has exactly one leader.
async fn led_per_node(cluster: &Cluster) -> Result<BTreeMap<u64, usize>> {
    let mut leader_of: BTreeMap<ShardId, Vec<u64>> = BTreeMap::new();
    let mut per_node: BTreeMap<u64, usize> = cluster.nodes.keys().map(|&id| (id, 0)).collect();
    for (&id, node) in &cluster.nodes {
        let client = cluster.client(Intent::Via(&[id]))?;
        let statuses = client.shard_statuses_of(&node.endpoint()).await?;
        ensure!(statuses.len() == SHARDS, "node {id} hosts {statuses:?}");
        for status in statuses.iter().filter(|s| s.role == Role::Leader) {
            leader_of.entry(status.shard).or_default().push(id);
            *per_node.entry(id).or_default() += 1;
        }
    }
    ensure!(
        leader_of.len() == SHARDS && leader_of.values().all(|l| l.len() == 1),
        "leaders by shard: {leader_of:?}"
    );
    Ok(per_node)
}

/// Runs `rdkvctl` against every node; its stdout.
async fn ctl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let endpoints = cluster.endpoints(Intent::Any)?.join(",");
    let mut full = vec!["--endpoints", &endpoints, "--timeout", "15s"];
    full.extend_from_slice(args);
    let out = rdkvctl_ok(&full, &[]).await?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Rebalances, then checks the bound; the spread it left.
async fn rebalance_within_bound(cluster: &Cluster, when: &str) -> Result<BTreeMap<u64, usize>> {
    let printed = ctl(cluster, &["rebalance"]).await?;
    println!("rebalance {when}:\n{printed}");
    let spread = eventually(LEADER_TIMEOUT, "a leader per shard", async || {
        led_per_node(cluster).await
    })
    .await?;
    println!("leaders per node {when}: {spread:?}");
    ensure!(
        spread.values().all(|&led| led <= MAX_LED),
        "{when}: a node leads more than {MAX_LED} shards: {spread:?}"
    );
    Ok(spread)
}

/// One key per shard of `map`, tagged with `round`.
fn key_per_shard(map: &ShardMap, round: &str) -> Vec<String> {
    keys_per_shard(map, 1, |i| format!("{round}-{i}"))
        .into_iter()
        .map(|(_, key)| key)
        .collect()
}

/// `/status` lists every hosted shard with its slots; `/metrics` labels
/// the Raft and region gauges with the shard.
async fn observed_per_shard(cluster: &Cluster) -> Result<()> {
    let mut leaders = 0.0;
    for &id in cluster.nodes.keys() {
        let addr = cluster.node(id)?.http_addr;
        let (status, body) =
            tokio::task::spawn_blocking(move || http_get(addr, "/status")).await??;
        ensure!(status == 200, "/status of node {id}: {status}");
        let json: serde_json::Value = serde_json::from_str(&body)?;
        let shards = json["shards"].as_array().context("no shards in /status")?;
        ensure!(
            shards.len() == SHARDS,
            "node {id} /status shards: {shards:?}"
        );
        let slots: u64 = shards
            .iter()
            .flat_map(|s| s["slots"].as_array().cloned().unwrap_or_default())
            .map(|r| r[1].as_u64().unwrap_or(0) + 1 - r[0].as_u64().unwrap_or(0))
            .sum();
        ensure!(slots == 16_384, "node {id}'s shards cover {slots} slots");
        let (status, body) =
            tokio::task::spawn_blocking(move || http_get(addr, "/metrics")).await??;
        ensure!(status == 200, "/metrics of node {id}: {status}");
        let metrics = parse(&body)?;
        for shard in 0..SHARDS {
            let label = shard.to_string();
            let labels = [("shard", label.as_str())];
            ensure!(
                metrics.get("rdkv_region_capacity_bytes", &labels).is_some(),
                "node {id} has no region gauge of shard {shard}"
            );
            leaders += metrics
                .get("rdkv_raft_is_leader", &labels)
                .with_context(|| format!("node {id}: no rdkv_raft_is_leader of shard {shard}"))?;
        }
    }
    ensure!(
        leaders == SHARDS as f64,
        "{leaders} leaders over the shards' gauges"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_spreads_leaders_and_a_killed_node_leaves_every_shard_writable() -> Result<()> {
    let mut cluster = Cluster::start_with(NODES, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        eventually(LEADER_TIMEOUT, "a leader per shard", async || {
            led_per_node(cluster).await
        })
        .await?;
        // The moves go to nodes by the map's node directory, which each
        // node fills in with its own addresses once the metadata group runs.
        let ids = node_ids(cluster);
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &ids).await,
        )
        .await?;
        observed_per_shard(cluster).await?;
        let listed = ctl(cluster, &["shard", "list", "-w", "table"]).await?;
        println!("{listed}");
        ensure!(listed.lines().count() >= SHARDS, "shard list: {listed}");
        let status = ctl(cluster, &["endpoint", "status", "-w", "json"]).await?;
        let status: serde_json::Value = serde_json::from_str(&status)?;
        let rows = status["shards"].as_array().map_or(0, Vec::len);
        ensure!(
            rows == SHARDS * NODES as usize,
            "endpoint status shows {rows} shard rows: {status}"
        );
        rebalance_within_bound(cluster, "at start").await?;

        // Forced skew: node 1 leads every shard.
        for shard in 0..SHARDS {
            ctl(cluster, &["shard", "move-leader", &shard.to_string(), "1"]).await?;
        }
        let skewed = led_per_node(cluster).await?;
        ensure!(
            skewed.get(&1) == Some(&SHARDS),
            "after the moves: {skewed:?}"
        );
        rebalance_within_bound(cluster, "after the skew").await?;
        let again = ctl(cluster, &["rebalance", "-w", "json"]).await?;
        let moves: serde_json::Value = serde_json::from_str(&again)?;
        ensure!(
            moves["moves"].as_array().is_some_and(Vec::is_empty),
            "a second rebalance moved: {again}"
        );

        // Writes acknowledged in every shard, then SIGKILL node 1: every
        // shard keeps a quorum and stays writable.
        // The map a node's hello announces is fetched before the first
        // request (what rdkv-bench relies on): keys go to their shard's
        // leader from the first write.
        let client = cluster.client(Intent::Any)?;
        client.ping().await?;
        let map = client
            .shard_map()
            .context("no map after the first request")?;
        ensure!(map.shards().len() == SHARDS, "fetched {map:?}");
        let mut acknowledged = Vec::new();
        for key in key_per_shard(&map, "before") {
            client.put(key.clone(), key.clone()).await?;
            acknowledged.push(key);
        }
        cluster.node_mut(1)?.kill();
        let survivors = cluster.client(Intent::Via(&[2, 3]))?;
        for key in key_per_shard(&map, "after") {
            eventually(LEADER_TIMEOUT, "a write in every shard", async || {
                Ok(survivors.put(key.clone(), key.clone()).await?)
            })
            .await?;
            acknowledged.push(key);
        }
        for key in &acknowledged {
            let got = survivors.get(key.clone()).await?;
            ensure!(
                got.as_ref().map(|v| &v.value[..]) == Some(key.as_bytes()),
                "{key} reads {got:?} after the kill"
            );
        }
        Ok(())
    })
    .await
}
