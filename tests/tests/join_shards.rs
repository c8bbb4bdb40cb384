//! Growing a multi-shard cluster (issue 20; docs/sharding.md, section 8,
//! "How to grow a cluster"): 3 `rdkv-server` processes with `--shards 3
//! --replicas 2` while a client writes keys of every shard, recording every
//! acknowledged write. Node 4, started with `--join`, hosts no shard, is a
//! learner of the metadata group and is listed in every node's map with
//! its client and RESP addresses; `rdkvctl shard move-replica` moves two
//! replicas onto it while the writes go on. Every acknowledged write is
//! then read through the client (following the map), from node 4 alone for
//! the shards it hosts, and through RESP forwarding to and from node 4
//! (leading a shard); again after node 4's SIGKILL and restart, which does
//! not join again. The same growth by `rdkvctl rebalance`: a joined node
//! of a 6-shard cluster is given its share of the replicas while a client
//! writes. A node started with a `--shards` the cluster does not have, or
//! asking for an id the cluster has, is refused.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{Consistency, ErrorCode, Request, Response};
use rdkv_tests::prometheus::http_get;
use rdkv_tests::shard_view::{agreed_leaders, agreed_map, map_of};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually, rdkvctl_ok};

const FLAGS: [&str; 6] = ["--shards", "3", "--replicas", "2", "--region-mib", "8"];
/// The new node.
const NEW: u64 = 4;
/// Placement: shard 0 on {1, 2}, 1 on {2, 3}, 2 on {3, 1}. Shard 0's
/// replica moves from node 1 to node 4, shard 1's from node 3.
const MOVES: [(u32, u64); 2] = [(0, 1), (1, 3)];

/// Runs `rdkvctl` against every node; its stdout.
async fn ctl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let endpoints = cluster.endpoints(Intent::Any)?.join(",");
    let mut full = vec!["--endpoints", &endpoints, "--timeout", "30s"];
    full.extend_from_slice(args);
    let out = rdkvctl_ok(&full, &[]).await?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A client writing keys `grow-0`, `grow-1`, ... (every shard's) until
/// told to stop; each acknowledged key is recorded as soon as it is.
fn spawn_writer(
    client: rdkv_client::Client,
    acknowledged: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut failed = 0;
        for i in 0.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let key = format!("grow-{i}");
            match client.put(key.clone(), key.clone()).await {
                Ok(_) => acknowledged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(key),
                Err(e) => {
                    failed += 1;
                    println!("write {key}: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        failed
    })
}

fn acknowledged_now(acknowledged: &Mutex<Vec<String>>) -> usize {
    acknowledged.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// Waits until the writer has `more` acknowledged writes beyond now.
async fn writes_go_on(acknowledged: &Mutex<Vec<String>>, more: usize, when: &str) -> Result<()> {
    let target = acknowledged_now(acknowledged) + more;
    eventually(
        LEADER_TIMEOUT,
        &format!("{more} more writes {when}"),
        async || {
            let now = acknowledged_now(acknowledged);
            ensure!(now >= target, "{now} of {target}");
            Ok(())
        },
    )
    .await
}

/// Every one of `keys` read through `client` (which follows the map).
async fn all_through(client: &rdkv_client::Client, keys: &[String], when: &str) -> Result<()> {
    for chunk in keys.chunks(200) {
        let values = client.mget(chunk.iter().cloned()).await?;
        for (key, value) in chunk.iter().zip(values) {
            ensure!(
                value.is_some_and(|v| v.value[..] == *key.as_bytes()),
                "{key} lost {when}"
            );
        }
    }
    Ok(())
}

/// Every one of `keys` of `shards` (hosted by node `id`) read from node
/// `id`'s own replicas alone: follower reads sent to it, one shard's keys
/// per request.
async fn all_on(
    cluster: &Cluster,
    id: u64,
    map: &ShardMap,
    shards: &[u32],
    keys: &[String],
) -> Result<()> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let endpoint = cluster.node(id)?.endpoint();
    for &shard in shards {
        let of_shard: Vec<&String> = keys
            .iter()
            .filter(|key| map.shard_of_key(key.as_bytes()) == ShardId(shard))
            .collect();
        for chunk in of_shard.chunks(200) {
            let request = Request::MGet {
                keys: chunk.iter().map(|k| (*k).clone().into()).collect(),
                consistency: Consistency::Follower {
                    max_lag_entries: u64::MAX,
                },
            };
            let Response::Values(values) = client.send_to(&endpoint, request).await? else {
                bail!("node {id} did not answer an MGET of shard {shard} with values");
            };
            for (key, value) in chunk.iter().zip(values) {
                ensure!(
                    value.is_some_and(|v| v.value[..] == *key.as_bytes()),
                    "{key} (shard {shard}) not on node {id}"
                );
            }
        }
    }
    Ok(())
}

/// Node `id`'s hosted shards, from its own `ShardStatus`.
async fn hosted(cluster: &Cluster, id: u64) -> Result<Vec<u32>> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let statuses = client
        .shard_statuses_of(&cluster.node(id)?.endpoint())
        .await?;
    Ok(statuses.into_iter().map(|s| s.shard.0).collect())
}

/// Node `id`'s `/status`, as JSON.
async fn status_json(cluster: &Cluster, id: u64) -> Result<serde_json::Value> {
    let addr = cluster.node(id)?.http_addr;
    let (code, body) = tokio::task::spawn_blocking(move || http_get(addr, "/status")).await??;
    ensure!(code == 200, "/status of node {id}: {code}");
    Ok(serde_json::from_str(&body)?)
}

/// A client writing (see `spawn_writer`) once every node's addresses are
/// in the map, and node 4 joined while it writes (`joined_without_shards`
/// checked): the writer's record, its stop flag and its task.
async fn join_while_writing(
    cluster: &mut Cluster,
) -> Result<(
    Arc<Mutex<Vec<String>>>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<usize>,
)> {
    eventually(
        LEADER_TIMEOUT,
        "every node's addresses in the map",
        async || agreed_map(cluster, &[1, 2, 3]).await,
    )
    .await?;
    let writer_client = cluster.client(Intent::Any)?;
    writer_client.ping().await?;
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(writer_client, Arc::clone(&acknowledged), Arc::clone(&stop));
    writes_go_on(&acknowledged, 100, "before the join").await?;
    cluster.join(NEW, 2)?;
    joined_without_shards(cluster).await?;
    Ok((acknowledged, stop, writer))
}

/// Stops the writer of `join_while_writing`; the keys it had acknowledged.
async fn stop_writing(
    acknowledged: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    writer: tokio::task::JoinHandle<usize>,
) -> Result<Vec<String>> {
    stop.store(true, Ordering::Relaxed);
    let failed = writer.await?;
    let keys = acknowledged
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    println!("{} writes acknowledged, {failed} failed", keys.len());
    Ok(keys)
}

/// Node 4 right after its join: no shard hosted, a learner of the
/// metadata group, in every node's map with its addresses.
async fn joined_without_shards(cluster: &Cluster) -> Result<ShardMap> {
    let map = eventually(
        Duration::from_secs(40),
        "node 4 in every node's map with its addresses",
        async || agreed_map(cluster, &[1, 2, 3, NEW]).await,
    )
    .await?;
    ensure!(
        map.shards().iter().all(|s| !s.members.contains(&NEW)),
        "node 4 is a member of a shard: {map:?}"
    );
    ensure!(
        hosted(cluster, NEW).await?.is_empty(),
        "node 4 hosts shards"
    );
    let status = status_json(cluster, NEW).await?;
    let meta = &status["meta"];
    ensure!(
        meta["role"] == "Learner",
        "node 4's metadata replica: {meta}"
    );
    ensure!(
        meta["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|id| id == NEW)),
        "node 4's metadata replica: {meta}"
    );
    // What an operator checks: `endpoint status` answers for node 4 too.
    let status = ctl(cluster, &["endpoint", "status", "-w", "json"]).await?;
    let endpoint = cluster.node(NEW)?.endpoint();
    ensure!(status.contains(&endpoint), "endpoint status: {status}");
    Ok(map)
}

/// Moves shard `shard`'s replica from `from` onto node 4 with `rdkvctl`.
async fn move_onto_new(cluster: &Cluster, shard: u32, from: u64) -> Result<()> {
    let (shard_arg, from_arg, to_arg) = (shard.to_string(), from.to_string(), NEW.to_string());
    let moved = ctl(
        cluster,
        &[
            "shard",
            "move-replica",
            &shard_arg,
            &from_arg,
            &to_arg,
            "-w",
            "json",
        ],
    )
    .await?;
    println!("move-replica {shard} {from} {NEW}: {moved}");
    let moved: serde_json::Value = serde_json::from_str(&moved)?;
    let members = moved["members"].as_array().context("no members")?;
    ensure!(
        members.iter().any(|m| m == NEW) && !members.iter().any(|m| m == from),
        "shard {shard} after the move: {moved}"
    );
    Ok(())
}

/// GETs `keys` through the RESP port at `addr`; each must read its own
/// name.
async fn all_through_resp(addr: SocketAddr, keys: Vec<String>, what: &str) -> Result<()> {
    let what = what.to_owned();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        let mut con = client.get_connection_with_timeout(Duration::from_secs(10))?;
        con.set_read_timeout(Some(Duration::from_secs(15)))?;
        for key in &keys {
            let value: Option<String> = redis::cmd("GET").arg(key).query(&mut con)?;
            ensure!(
                value.as_deref() == Some(key.as_str()),
                "{what}: {key} read {value:?}"
            );
        }
        Ok(())
    })
    .await?
}

/// The first `count` of `keys` in shard `shard`.
fn of_shard(map: &ShardMap, keys: &[String], shard: u32, count: usize) -> Vec<String> {
    keys.iter()
        .filter(|key| map.shard_of_key(key.as_bytes()) == ShardId(shard))
        .take(count)
        .cloned()
        .collect()
}

/// RESP reaches node 4: it leads shard 0, so a GET of shard 0 through node
/// 1 (which no longer hosts it) is forwarded there; node 4 forwards a GET
/// of shard 2, which it does not host.
async fn resp_reaches_the_new_node(
    cluster: &Cluster,
    map: &ShardMap,
    keys: &[String],
) -> Result<()> {
    ctl(cluster, &["shard", "move-leader", "0", &NEW.to_string()]).await?;
    eventually(LEADER_TIMEOUT, "node 4 leading shard 0", async || {
        let leaders = agreed_leaders(cluster, &[1, 2, 3, NEW]).await?;
        ensure!(leaders.get(&ShardId(0)) == Some(&NEW), "{leaders:?}");
        Ok(())
    })
    .await?;
    let through_1 = cluster.node(1)?.resp_addr;
    all_through_resp(through_1, of_shard(map, keys, 0, 50), "shard 0 via node 1").await?;
    let through_4 = cluster.node(NEW)?.resp_addr;
    all_through_resp(through_4, of_shard(map, keys, 2, 50), "shard 2 via node 4").await?;
    all_through_resp(through_4, of_shard(map, keys, 0, 50), "shard 0 on node 4").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_node_takes_replicas_while_clients_write_and_loses_nothing() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(240), async |cluster| {
        eventually(LEADER_TIMEOUT, "a leader per shard", async || {
            agreed_leaders(cluster, &[1, 2, 3]).await
        })
        .await?;
        let (acknowledged, stop, writer) = join_while_writing(cluster).await?;
        writes_go_on(&acknowledged, 100, "after the join").await?;
        for (shard, from) in MOVES {
            move_onto_new(cluster, shard, from).await?;
            writes_go_on(&acknowledged, 100, &format!("after moving shard {shard}")).await?;
        }
        let keys = stop_writing(&acknowledged, &stop, writer).await?;

        let mut hosted_by_new = hosted(cluster, NEW).await?;
        hosted_by_new.sort_unstable();
        ensure!(hosted_by_new == [0, 1], "node 4 hosts {hosted_by_new:?}");
        let map = eventually(
            LEADER_TIMEOUT,
            "every node's map after the moves",
            async || {
                let map = agreed_map(cluster, &[1, 2, 3, NEW]).await?;
                for (shard, from) in MOVES {
                    let members = &map.shard(ShardId(shard)).context("no shard")?.members;
                    ensure!(
                        members.contains(&NEW) && !members.contains(&from),
                        "shard {shard}: {members:?}"
                    );
                }
                Ok(map)
            },
        )
        .await?;
        let reader = cluster.client(Intent::Any)?;
        all_through(&reader, &keys, "after the moves").await?;
        let moved = MOVES.map(|(shard, _)| shard);
        eventually(LEADER_TIMEOUT, "every write on node 4", async || {
            all_on(cluster, NEW, &map, &moved, &keys).await
        })
        .await?;
        resp_reaches_the_new_node(cluster, &map, &keys).await?;

        // SIGKILL and restart: node 4 keeps its replicas, and does not join
        // again (JOINED).
        cluster.node_mut(NEW)?.kill();
        cluster.restart(NEW)?;
        eventually(
            LEADER_TIMEOUT,
            "every write on node 4 after its restart",
            async || all_on(cluster, NEW, &map, &moved, &keys).await,
        )
        .await?;
        let mut hosted_by_new = hosted(cluster, NEW).await?;
        hosted_by_new.sort_unstable();
        ensure!(
            hosted_by_new == [0, 1],
            "after the restart node 4 hosts {hosted_by_new:?}"
        );
        let log = cluster.node(NEW)?.log();
        ensure!(
            log.matches("joining the multi-shard cluster").count() == 1,
            "node 4 joined more than once"
        );
        ensure!(
            cluster.node(NEW)?.data_dir.join("JOINED").exists(),
            "node 4 recorded no join"
        );
        let reader = cluster.client(Intent::Via(&[NEW]))?;
        all_through(&reader, &keys, "after node 4's restart").await
    })
    .await
}

/// `rdkvctl rebalance` as json.
async fn rebalance(cluster: &Cluster) -> Result<serde_json::Value> {
    let printed = ctl(cluster, &["rebalance", "-w", "json"]).await?;
    println!("rebalance: {printed}");
    Ok(serde_json::from_str(&printed)?)
}

/// Growing by the operator's two commands: node 4 joins a cluster of six
/// shards of three replicas (18 replicas, 6 per node) and `rdkvctl
/// rebalance`, while a client writes, moves replicas onto it until every
/// node hosts 4 or 5 and spreads the leaders; every acknowledged write is
/// then read through the client and from node 4's replicas alone, and a
/// second rebalance moves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_node_is_given_replicas_by_rebalance_while_clients_write() -> Result<()> {
    let flags = ["--shards", "6", "--replicas", "3", "--region-mib", "8"];
    let mut cluster = Cluster::start_with(3, &flags)?;
    check(&mut cluster, Duration::from_secs(300), async |cluster| {
        let (acknowledged, stop, writer) = join_while_writing(cluster).await?;

        let plan = rebalance(cluster).await?;
        writes_go_on(&acknowledged, 100, "after the rebalance").await?;
        let keys = stop_writing(&acknowledged, &stop, writer).await?;

        let per_node = &plan["replicas_per_node"];
        for id in 1..=NEW {
            let count = per_node[id.to_string()].as_u64().unwrap_or(0);
            ensure!((4..=5).contains(&count), "node {id} hosts {count}: {plan}");
        }
        let moved_in = plan["replica_moves"]
            .as_array()
            .context("no replica moves")?;
        ensure!(
            moved_in.len() >= 4 && moved_in.iter().all(|m| m["to"] == NEW),
            "replica moves: {plan}"
        );
        let mut on_new = hosted(cluster, NEW).await?;
        on_new.sort_unstable();
        ensure!(
            on_new.len() as u64 == per_node[NEW.to_string()].as_u64().unwrap_or(0),
            "node 4 hosts {on_new:?}: {plan}"
        );
        let map = eventually(
            LEADER_TIMEOUT,
            "every node's map naming node 4",
            async || {
                let map = agreed_map(cluster, &[1, 2, 3, NEW]).await?;
                for &shard in &on_new {
                    let members = &map.shard(ShardId(shard)).context("no shard")?.members;
                    ensure!(members.contains(&NEW), "shard {shard}: {members:?}");
                }
                Ok(map)
            },
        )
        .await?;
        all_through(&cluster.client(Intent::Any)?, &keys, "after the rebalance").await?;
        eventually(
            LEADER_TIMEOUT,
            "every write of its shards on node 4",
            async || all_on(cluster, NEW, &map, &on_new, &keys).await,
        )
        .await?;
        // The leaders within the bound, ceil(6 / 4) + 1.
        let leaders = eventually(LEADER_TIMEOUT, "a leader per shard", async || {
            let leaders = agreed_leaders(cluster, &[1, 2, 3, NEW]).await?;
            ensure!(leaders.len() == 6, "{leaders:?}");
            Ok(leaders)
        })
        .await?;
        for id in 1..=NEW {
            let led = leaders.values().filter(|&&l| l == id).count();
            ensure!(led <= 3, "node {id} leads {led}: {leaders:?}");
        }
        let again = rebalance(cluster).await?;
        ensure!(
            again["replica_moves"].as_array().is_some_and(Vec::is_empty),
            "a second rebalance moved replicas: {again}"
        );
        Ok(())
    })
    .await
}

/// `AddNode` for `id` with `peer_addr` at whichever node leads the
/// metadata group; its error code there.
async fn add_node_refusal(cluster: &Cluster, id: u64, peer_addr: &str) -> Result<ErrorCode> {
    let mut answers = Vec::new();
    for &node in cluster.nodes.keys() {
        let client = cluster.client(Intent::Via(&[node]))?;
        let request = Request::AddNode {
            id,
            peer_addr: peer_addr.to_owned(),
            client_addr: "127.0.0.1:1".to_owned(),
            resp_addr: None,
        };
        match client
            .send_to(&cluster.node(node)?.endpoint(), request)
            .await
        {
            Err(rdkv_client::Error::Server(reply)) if reply.code != ErrorCode::NotLeader => {
                return Ok(reply.code);
            }
            other => answers.push(format!("node {node}: {other:?}")),
        }
    }
    bail!("no node refused AddNode for {id}: {answers:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_with_another_shard_count_or_a_taken_id_is_refused() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let map = eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &[1, 2, 3]).await,
        )
        .await?;
        // `--shards 4` against a cluster of 3: the process exits with why.
        cluster.join_with_args(5, 1, &["--shards", "4", "--region-mib", "8"])?;
        eventually(Duration::from_secs(30), "node 5 refused", async || {
            ensure!(!cluster.node_mut(5)?.is_running(), "node 5 still runs");
            Ok(())
        })
        .await?;
        let log = cluster.node(5)?.log();
        ensure!(
            log.contains("has 3 shard(s), not --shards 4"),
            "node 5's log: {log}"
        );
        // An id the cluster has (node 2's, another peer address): refused
        // by the metadata group's leader, and nothing changed.
        let code = add_node_refusal(cluster, 2, "127.0.0.1:9").await?;
        ensure!(code == ErrorCode::InvalidRequest, "a taken id: {code:?}");
        let after = map_of(cluster, 1).await?;
        ensure!(
            after.version() == map.version(),
            "the map changed: {after:?}"
        );
        Ok(())
    })
    .await
}
