//! A replica move whose leader dies in the middle is finished by running
//! the same move again (docs/sharding.md, section 8). 3 nodes with
//! `--shards 3 --replicas 2`: shard 0 on nodes {1, 2}, led by node 1,
//! which is restarted with a failpoint armed and aborts in the move of
//! shard 0's replica from node 2 to node 3, after the promotion of node 3
//! (the shard has one voter more than its map names) or after the removal
//! of node 2 (the map still names node 2). Node 1 restarted without it,
//! the same move is run again: voters and every node's map name {1, 3},
//! node 2 no longer hosts shard 0, and every key written before is read.
//! Run once more, the move (done) answers the same members.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{Request, Response, ShardRequest, ShardStatus};
use rdkv_storage::failpoint;
use rdkv_tests::shard_view::{agreed_leaders, agreed_map};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually, rdkvctl, rdkvctl_ok};

const FLAGS: [&str; 6] = ["--shards", "3", "--replicas", "2", "--region-mib", "8"];
const SHARD: ShardId = ShardId(0);
const NODES: [u64; 3] = [1, 2, 3];
const MOVE: [&str; 7] = ["shard", "move-replica", "0", "2", "3", "-w", "json"];

/// `rdkvctl` against every node with `args`.
async fn ctl(cluster: &Cluster, args: &[&str]) -> Result<std::process::Output> {
    let endpoints = cluster.endpoints(Intent::Any)?.join(",");
    let mut full = vec!["--endpoints", &endpoints, "--timeout", "60s"];
    full.extend_from_slice(args);
    rdkvctl(&full, &[]).await
}

/// Node `id`'s replica of shard 0, if it hosts one.
async fn status_of_shard(cluster: &Cluster, id: u64) -> Result<Option<ShardStatus>> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let statuses = client
        .shard_statuses_of(&cluster.node(id)?.endpoint())
        .await?;
    Ok(statuses.into_iter().find(|s| s.shard == SHARD))
}

/// Keys of shard 0 written (and acknowledged) before the move.
async fn write_keys(cluster: &Cluster) -> Result<Vec<String>> {
    let client = cluster.client(Intent::Any)?;
    client.ping().await?;
    let map: std::sync::Arc<ShardMap> = client.shard_map().context("no map")?;
    let keys: Vec<String> = (0..)
        .map(|i| format!("before-{i}"))
        .filter(|key| map.shard_of_key(key.as_bytes()) == SHARD)
        .take(50)
        .collect();
    for key in &keys {
        client.put(key.clone(), key.clone()).await?;
    }
    Ok(keys)
}

/// Restarts node 1 with `failpoint` armed and makes it shard 0's leader.
async fn lead_with_failpoint(cluster: &mut Cluster, failpoint: &str) -> Result<()> {
    cluster.node_mut(1)?.kill();
    cluster.node_mut(1)?.env = vec![("RDKV_FAILPOINTS".into(), failpoint.into())];
    cluster.restart(1)?;
    let leaders = eventually(LEADER_TIMEOUT, "a leader per shard", async || {
        agreed_leaders(cluster, &NODES).await
    })
    .await?;
    if leaders.get(&SHARD) != Some(&1) {
        let endpoints = cluster.endpoints(Intent::Any)?.join(",");
        let args = ["--endpoints", &endpoints, "shard", "move-leader", "0", "1"];
        rdkvctl_ok(&args, &[]).await?;
    }
    eventually(LEADER_TIMEOUT, "node 1 leads shard 0", async || {
        let leaders = agreed_leaders(cluster, &NODES).await?;
        ensure!(leaders.get(&SHARD) == Some(&1), "leaders {leaders:?}");
        Ok(())
    })
    .await
}

/// The move, sent while node 1 leads shard 0 with `failpoint` armed: node
/// 1 aborts there and the client gets an error.
async fn interrupted(cluster: &mut Cluster, failpoint: &str) -> Result<()> {
    let out = ctl(cluster, &MOVE).await?;
    ensure!(
        !out.status.success(),
        "the move succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    println!(
        "the interrupted move: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    eventually(Duration::from_secs(30), "node 1 stopped", async || {
        ensure!(!cluster.node_mut(1)?.is_running(), "node 1 still runs");
        Ok(())
    })
    .await?;
    ensure!(
        cluster
            .node(1)?
            .log()
            .contains(&format!("failpoint {failpoint}")),
        "node 1 stopped, but not at {failpoint}"
    );
    cluster.node_mut(1)?.env.clear();
    cluster.restart(1)
}

/// Shard 0's voters and every node's map are {1, 3}; node 2 hosts no
/// replica of it (no status row, `WrongShard`, no directory).
async fn moved_to_node_3(cluster: &Cluster) -> Result<()> {
    eventually(LEADER_TIMEOUT, "shard 0's members {1, 3}", async || {
        for id in [1, 3] {
            let status = status_of_shard(cluster, id)
                .await?
                .with_context(|| format!("node {id} hosts no shard 0"))?;
            ensure!(status.members == [1, 3], "node {id}: {status:?}");
        }
        let map = agreed_map(cluster, &NODES).await?;
        let named = map.shard(SHARD).context("no shard 0")?.members.clone();
        ensure!(named == [1, 3], "the map names {named:?}");
        Ok(())
    })
    .await?;
    ensure!(
        status_of_shard(cluster, 2).await?.is_none(),
        "node 2 still hosts shard 0"
    );
    let clear = Request::Sharded {
        shard: SHARD,
        request: ShardRequest::Clear,
    };
    let answer = cluster
        .client(Intent::Via(&[2]))?
        .send_to(&cluster.node(2)?.endpoint(), clear)
        .await?;
    ensure!(
        matches!(answer, Response::WrongShard(_)),
        "node 2 answered {answer:?}"
    );
    let dir = cluster.node(2)?.data_dir.join("shards/0");
    ensure!(!dir.exists(), "{} is still there", dir.display());
    Ok(())
}

/// The move sent again succeeds, answering shard 0's members {1, 3}.
async fn moved_again(cluster: &Cluster, what: &str) -> Result<()> {
    let out = ctl(cluster, &MOVE).await?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    ensure!(out.status.success(), "{what} failed: {}", text(&out.stderr));
    let moved: serde_json::Value = serde_json::from_str(&text(&out.stdout))?;
    ensure!(
        moved["members"] == serde_json::json!([1, 3]),
        "{what}: {moved}"
    );
    Ok(())
}

/// Interrupts the move at `failpoint`, runs it again, checks the result.
async fn finished_by_running_it_again(failpoint: &str) -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(300), async |cluster| {
        // Every node's address in the map: the leader resuming after the
        // removal reaches the source through it alone (they share no
        // other shard, so no peer hello of the source reaches the leader).
        eventually(
            LEADER_TIMEOUT,
            "a leader per shard and every address",
            async || {
                agreed_map(cluster, &NODES).await?;
                agreed_leaders(cluster, &NODES).await
            },
        )
        .await?;
        let keys = write_keys(cluster).await?;
        lead_with_failpoint(cluster, failpoint).await?;
        interrupted(cluster, failpoint).await?;
        moved_again(cluster, "the move run again").await?;
        moved_to_node_3(cluster).await?;
        // Done: sent once more, the move answers the same members.
        moved_again(cluster, "the move run once it was done").await?;
        moved_to_node_3(cluster).await?;
        let client = cluster.client(Intent::Any)?;
        for key in &keys {
            let got = client.get(key.clone()).await?;
            ensure!(
                got.is_some_and(|v| v.value[..] == *key.as_bytes()),
                "{key} lost"
            );
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_promotion_is_finished_by_running_it_again() -> Result<()> {
    finished_by_running_it_again(failpoint::MOVE_AFTER_PROMOTION).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_removal_is_finished_by_running_it_again() -> Result<()> {
    finished_by_running_it_again(failpoint::MOVE_AFTER_REMOVAL).await
}
