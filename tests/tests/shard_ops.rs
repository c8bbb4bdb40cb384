//! Operating a cluster of several shards (docs/sharding.md, section 8):
//! 3 `rdkv-server` processes with `--shards 6 --replicas 3`. Every node
//! lists its shards in `/status` and labels its gauges by shard;
//! `rdkvctl rebalance` keeps every node at or under the bound of
//! ceil(6 / 3) + 1 = 3 led shards, also after `rdkvctl shard move-leader`
//! moved every leader to node 1, and moves nothing when run again; a
//! SIGKILLed node leaves every shard writable and loses no acknowledged
//! write. With `--shards 3 --replicas 2`, `rdkvctl shard move-replica`
//! moves a replica while a client writes to its shard, loses no
//! acknowledged write, and the moved replica survives a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail, ensure};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{
    Consistency, ErrorCode, MemberInfo, Request, Response, Role, ShardRequest, ShardStatus,
};
use rdkv_tests::prometheus::{http_get, parse};
use rdkv_tests::shard_view::{agreed_leaders, agreed_map, keys_per_shard, node_ids};
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

/// `rdkvctl top` with node 1 killed: node 1 unreachable, a row per shard,
/// each led by a survivor and answered by two of its three replicas.
async fn top_shows_every_shard_without_node_1(cluster: &Cluster) -> Result<()> {
    let text = ctl(
        cluster,
        &["top", "--interval-ms", "300", "--iterations", "2"],
    )
    .await?;
    let last = text
        .rsplit("rdkv top - ")
        .next()
        .context("no refresh printed")?;
    println!("rdkvctl top, last refresh:\n{last}");
    ensure!(
        last.contains("3 nodes (role, term, applied: each node's first shard)"),
        "{last}"
    );
    ensure!(
        last.contains("unreachable"),
        "node 1 not unreachable: {last}"
    );
    ensure!(
        last.contains(&format!(
            "{SHARDS} shards - {SHARDS} with a leader answering"
        )),
        "{last}"
    );
    ensure!(
        last.matches("| 2/3 ").count() == SHARDS,
        "not every shard answered by 2 of 3: {last}"
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
        top_shows_every_shard_without_node_1(cluster).await?;
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

/// Keys of `shard` only, `count` of them, named `{prefix}-{i}`.
fn keys_of_shard(map: &ShardMap, shard: ShardId, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|key| map.shard_of_key(key.as_bytes()) == shard)
        .take(count)
        .collect()
}

/// Node `id`'s replica of `shard`, if it hosts one.
async fn status_of_shard(
    cluster: &Cluster,
    id: u64,
    shard: ShardId,
) -> Result<Option<ShardStatus>> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let statuses = client
        .shard_statuses_of(&cluster.node(id)?.endpoint())
        .await?;
    Ok(statuses.into_iter().find(|s| s.shard == shard))
}

/// Every one of `keys` read from node `id`'s own replica (follower reads
/// sent to it alone), with its own value.
async fn all_on(cluster: &Cluster, id: u64, keys: &[String]) -> Result<()> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let endpoint = cluster.node(id)?.endpoint();
    for key in keys {
        let request = Request::Get {
            key: key.clone().into(),
            consistency: Consistency::Follower {
                max_lag_entries: u64::MAX,
            },
        };
        match client.send_to(&endpoint, request).await? {
            Response::Value(Some(v)) if v.value[..] == *key.as_bytes() => {}
            other => bail!("{key} on node {id}: {other:?}"),
        }
    }
    Ok(())
}

/// A client writing keys of `shard` until told to stop; the keys
/// acknowledged.
fn spawn_writer(
    client: rdkv_client::Client,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut acknowledged = Vec::new();
        for key in keys {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match client.put(key.clone(), key.clone()).await {
                Ok(_) => acknowledged.push(key),
                Err(e) => println!("write {key}: {e}"),
            }
        }
        acknowledged
    })
}

/// The code of the error reply a failed move got.
fn refusal_code(result: rdkv_client::Result<Vec<MemberInfo>>) -> Result<ErrorCode> {
    match result {
        Err(rdkv_client::Error::Server(reply)) => Ok(reply.code),
        other => bail!("the move was answered {other:?}"),
    }
}

/// Shard 0's replica moves from node 1 (leading it) to node 3 while a
/// client writes keys of shard 0; the writes acknowledged.
async fn move_while_writing(cluster: &Cluster, shard: ShardId) -> Result<Vec<String>> {
    let client = cluster.client(Intent::Any)?;
    client.ping().await?;
    let map = client
        .shard_map()
        .context("no map after the first request")?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(
        client,
        keys_of_shard(&map, shard, "moving", 100_000),
        Arc::clone(&stop),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let moved = ctl(
        cluster,
        &["shard", "move-replica", "0", "1", "3", "-w", "json"],
    )
    .await;
    // The client keeps writing after the move.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let acknowledged = writer.await?;
    let moved = moved?;
    println!("move-replica: {moved}");
    let moved: serde_json::Value = serde_json::from_str(&moved)?;
    ensure!(moved["members"] == serde_json::json!([2, 3]), "{moved}");
    println!("{} writes acknowledged around the move", acknowledged.len());
    ensure!(acknowledged.len() > 10, "the writer got {acknowledged:?}");
    Ok(acknowledged)
}

/// After the move: node 3 hosts shard 0 with voters {2, 3}; node 1 no
/// longer (no status row, `WrongShard`, no directory).
async fn moved_off_node_1(cluster: &Cluster, shard: ShardId) -> Result<()> {
    let status = status_of_shard(cluster, 3, shard)
        .await?
        .context("node 3 hosts no shard 0")?;
    // Voters and learners: no learner is left over.
    ensure!(
        status.members == [2, 3],
        "shard 0's members: {:?}",
        status.members
    );
    ensure!(
        status_of_shard(cluster, 1, shard).await?.is_none(),
        "node 1 still hosts shard 0"
    );
    let clear = Request::Sharded {
        shard,
        request: ShardRequest::Clear,
    };
    let answer = cluster
        .client(Intent::Via(&[1]))?
        .send_to(&cluster.node(1)?.endpoint(), clear)
        .await?;
    ensure!(
        matches!(answer, Response::WrongShard(_)),
        "node 1 answered {answer:?}"
    );
    let dir = cluster.node(1)?.data_dir.join("shards/0");
    ensure!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

/// Refused moves (to a member, from a non-member, to a node that cannot
/// be reached) leave shard 0's voters {2, 3}.
async fn refused_moves_keep_the_members(cluster: &mut Cluster, shard: ShardId) -> Result<()> {
    let mover = cluster.client(Intent::Via(&[2, 3]))?;
    let code = refusal_code(mover.move_shard_replica(shard, 2, 3).await)?;
    ensure!(code == ErrorCode::InvalidRequest, "to a member: {code:?}");
    let code = refusal_code(mover.move_shard_replica(shard, 1, 4).await)?;
    ensure!(code == ErrorCode::NotFound, "from a non-member: {code:?}");
    cluster.node_mut(1)?.kill();
    let code = refusal_code(mover.move_shard_replica(shard, 2, 1).await)?;
    ensure!(code == ErrorCode::Internal, "to a dead node: {code:?}");
    let status = status_of_shard(cluster, 3, shard)
        .await?
        .context("node 3 hosts no shard 0")?;
    ensure!(
        status.members == [2, 3],
        "after the refusals: {:?}",
        status.members
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_moves_while_a_client_writes_and_stays_moved_over_a_restart() -> Result<()> {
    // Placement: shard 0 on nodes {1, 2} (1 its first leader), 1 on {2, 3},
    // 2 on {3, 1}.
    let flags = ["--shards", "3", "--replicas", "2", "--region-mib", "8"];
    let mut cluster = Cluster::start_with(NODES, &flags)?;
    let shard = ShardId(0);
    check(&mut cluster, Duration::from_secs(150), async |cluster| {
        eventually(LEADER_TIMEOUT, "a leader per shard", async || {
            agreed_leaders(cluster, &[1, 2, 3]).await
        })
        .await?;
        let acknowledged = move_while_writing(cluster, shard).await?;
        moved_off_node_1(cluster, shard).await?;
        let client = cluster.client(Intent::Any)?;
        for key in &acknowledged {
            let got = client.get(key.clone()).await?;
            ensure!(
                got.is_some_and(|v| v.value[..] == *key.as_bytes()),
                "{key} lost"
            );
        }
        eventually(LEADER_TIMEOUT, "every write on node 3", async || {
            all_on(cluster, 3, &acknowledged).await
        })
        .await?;
        refused_moves_keep_the_members(cluster, shard).await?;
        // Node 3 still hosts the moved replica after a restart.
        cluster.node_mut(3)?.kill();
        cluster.restart(3)?;
        eventually(
            LEADER_TIMEOUT,
            "every write on node 3 after its restart",
            async || all_on(cluster, 3, &acknowledged).await,
        )
        .await?;
        ensure!(
            status_of_shard(cluster, 3, shard).await?.is_some(),
            "node 3 lost shard 0 over its restart"
        );
        Ok(())
    })
    .await
}

/// Node -> (replicas it hosts, shards it leads), from every node's own
/// `ShardStatus`: a moved replica's source no longer lists it.
async fn hosted_and_led(cluster: &Cluster) -> Result<BTreeMap<u64, (usize, usize)>> {
    let mut per_node = BTreeMap::new();
    for (&id, node) in &cluster.nodes {
        let client = cluster.client(Intent::Via(&[id]))?;
        let statuses = client.shard_statuses_of(&node.endpoint()).await?;
        let led = statuses.iter().filter(|s| s.role == Role::Leader).count();
        per_node.insert(id, (statuses.len(), led));
    }
    Ok(per_node)
}

/// The replicas each node hosts, in node order.
async fn hosted(cluster: &Cluster) -> Result<Vec<usize>> {
    let per_node = hosted_and_led(cluster).await?;
    Ok(per_node.values().map(|&(hosted, _)| hosted).collect())
}

/// `rdkvctl rebalance` with `args`, as json.
async fn rebalance_json(cluster: &Cluster, args: &[&str]) -> Result<serde_json::Value> {
    let mut full = vec!["rebalance", "-w", "json"];
    full.extend_from_slice(args);
    let printed = ctl(cluster, &full).await?;
    println!("rebalance {args:?}: {printed}");
    Ok(serde_json::from_str(&printed)?)
}

/// The json's `replicas_per_node` with each of nodes 1 to 3 at `each`.
fn every_node_hosts(json: &serde_json::Value, each: u64) -> bool {
    json["replicas_per_node"] == serde_json::json!({ "1": each, "2": each, "3": each })
}

/// Shard 0's replica moved 1 -> 3: node 1 hosts 1 replica, node 3 hosts 3.
/// A dry run then plans one replica move to 2 per node and moves
/// nothing; its json.
async fn skewed_and_planned(cluster: &Cluster) -> Result<serde_json::Value> {
    ctl(cluster, &["shard", "move-replica", "0", "1", "3"]).await?;
    let skewed = hosted(cluster).await?;
    ensure!(skewed == [1, 2, 3], "replicas after the skew: {skewed:?}");
    let planned = rebalance_json(cluster, &["--dry-run"]).await?;
    ensure!(planned["dry_run"] == true, "{planned}");
    let planned_moves = planned["replica_moves"].as_array().map_or(0, Vec::len);
    ensure!(planned_moves == 1, "the dry run planned {planned}");
    ensure!(
        every_node_hosts(&planned, 2),
        "the dry run planned {planned}"
    );
    let still = hosted(cluster).await?;
    ensure!(still == [1, 2, 3], "the dry run moved: {still:?}");
    Ok(planned)
}

/// `rdkvctl rebalance` while a client writes keys of every shard; its
/// json and the writes acknowledged.
async fn rebalance_while_writing(cluster: &Cluster) -> Result<(serde_json::Value, Vec<String>)> {
    let client = cluster.client(Intent::Any)?;
    client.ping().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let keys = (0..100_000).map(|i| format!("rebalancing-{i}")).collect();
    let writer = spawn_writer(client, keys, Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rebalanced = rebalance_json(cluster, &[]).await;
    // The client keeps writing after the rebalance.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let acknowledged = writer.await?;
    let rebalanced = rebalanced?;
    println!(
        "{} writes acknowledged around the rebalance",
        acknowledged.len()
    );
    ensure!(acknowledged.len() > 10, "the writer got {acknowledged:?}");
    Ok((rebalanced, acknowledged))
}

/// What the rebalance reported: 2 replicas per node, every node leading
/// at most ceil(3 / 3) = 1 shard.
fn reported_balanced(rebalanced: &serde_json::Value) -> Result<()> {
    ensure!(every_node_hosts(rebalanced, 2), "{rebalanced}");
    let bound = rebalanced["bound"].as_u64().context("no bound")?;
    ensure!(bound == 1, "{rebalanced}");
    let reported = rebalanced["leaders_per_node"]
        .as_object()
        .context("no leaders_per_node")?;
    ensure!(
        reported.len() == 3
            && reported
                .values()
                .all(|led| led.as_u64().is_some_and(|l| l <= bound)),
        "{rebalanced}"
    );
    Ok(())
}

/// What the nodes say after the rebalance: each hosts 2 replicas and
/// leads within the bound of ceil(3 / 3) + 1 (a leadership may
/// change on its own meanwhile), and every node's map gives each node 2.
async fn observed_balanced(cluster: &Cluster) -> Result<()> {
    let per_node = eventually(LEADER_TIMEOUT, "a leader per shard", async || {
        let per_node = hosted_and_led(cluster).await?;
        let leaders: usize = per_node.values().map(|&(_, led)| led).sum();
        ensure!(leaders == 3, "{per_node:?}");
        Ok(per_node)
    })
    .await?;
    println!("hosted and led after the rebalance: {per_node:?}");
    ensure!(
        per_node
            .values()
            .all(|&(replicas, led)| replicas == 2 && led <= 2),
        "after the rebalance: {per_node:?}"
    );
    let ids = node_ids(cluster);
    let map = eventually(LEADER_TIMEOUT, "one map on every node", async || {
        agreed_map(cluster, &ids).await
    })
    .await?;
    for &id in &ids {
        let count = map
            .shards()
            .iter()
            .filter(|s| s.members.contains(&id))
            .count();
        ensure!(
            count == 2,
            "the map gives node {id} {count} replicas: {map:?}"
        );
    }
    Ok(())
}

/// 3 nodes, `--shards 3 --replicas 2`: 6 replicas, 2 per node. Skewed by
/// `shard move-replica` to 1 on node 1 and 3 on node 3; a dry run plans
/// one replica move and moves nothing; `rdkvctl rebalance`, while a
/// client writes keys of every shard, makes that move, brings every node
/// back to 2 replicas (each node's own replicas and every node's map say
/// so) and the leaders to the bound; every acknowledged write reads back;
/// a second rebalance moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_evens_replicas_while_a_client_writes() -> Result<()> {
    let flags = ["--shards", "3", "--replicas", "2", "--region-mib", "8"];
    let mut cluster = Cluster::start_with(NODES, &flags)?;
    check(&mut cluster, Duration::from_secs(180), async |cluster| {
        eventually(LEADER_TIMEOUT, "a leader per shard", async || {
            agreed_leaders(cluster, &[1, 2, 3]).await
        })
        .await?;
        let ids = node_ids(cluster);
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &ids).await,
        )
        .await?;
        let planned = skewed_and_planned(cluster).await?;
        let (rebalanced, acknowledged) = rebalance_while_writing(cluster).await?;
        ensure!(
            rebalanced["replica_moves"] == planned["replica_moves"],
            "moved other than planned: {rebalanced} (planned {planned})"
        );
        reported_balanced(&rebalanced)?;
        observed_balanced(cluster).await?;
        let reader = cluster.client(Intent::Any)?;
        for key in &acknowledged {
            let got = reader.get(key.clone()).await?;
            ensure!(
                got.is_some_and(|v| v.value[..] == *key.as_bytes()),
                "{key} lost"
            );
        }
        let again = rebalance_json(cluster, &[]).await?;
        let none = serde_json::json!([]);
        ensure!(
            again["replica_moves"] == none && again["moves"] == none,
            "a second rebalance moved: {again}"
        );
        Ok(())
    })
    .await
}
