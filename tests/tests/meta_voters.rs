//! The metadata group's voters follow the cluster (issue 20;
//! docs/sharding.md, section 2, "Voters"): 3 `rdkv-server` processes with
//! `--shards 3 --replicas 2` start with voters 1-3; node 4 joins and stays
//! a learner (four live nodes keep three voters), node 5 joins and both
//! become voters. Two of the five voters, nodes 1 and 2, are SIGKILLed:
//! the group keeps its quorum, so the map is still edited (node 6 joins,
//! which a group of the three bootstrap voters could not take with two of
//! them dead), and once node 1 has been silent past the grace period the
//! leader makes the caught-up learner 6 a voter in its place. A node
//! leaves with `rdkvctl node remove` (section 8, "Removing a node"):
//! refused while it hosts replicas, then gone from the map and the group.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_tests::prometheus::http_get;
use rdkv_tests::shard_view::agreed_map;
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually};

const FLAGS: [&str; 6] = ["--shards", "3", "--replicas", "2", "--region-mib", "8"];

/// The metadata group's voters and learners in a node's `meta` status.
fn meta_members(meta: &serde_json::Value) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let ids = |field: &str| -> BTreeSet<u64> {
        meta[field]
            .as_array()
            .map(|ids| ids.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default()
    };
    (ids("voters"), ids("learners"))
}

/// The `meta` part of node `id`'s `/status`.
async fn meta_status(cluster: &Cluster, id: u64) -> Result<serde_json::Value> {
    let addr = cluster.node(id)?.http_addr;
    let (code, body) = tokio::task::spawn_blocking(move || http_get(addr, "/status")).await??;
    ensure!(code == 200, "/status of node {id}: {code}");
    let mut status: serde_json::Value = serde_json::from_str(&body)?;
    Ok(status["meta"].take())
}

/// Whether a node's `meta` status shows the group mid-change (joint).
fn meta_joint(meta: &serde_json::Value) -> Result<bool> {
    meta["joint"].as_bool().context("no meta.joint")
}

/// The metadata group's last log index and commit index at node `id`.
async fn meta_indexes(cluster: &Cluster, id: u64) -> Result<(u64, u64)> {
    let meta = meta_status(cluster, id).await?;
    let index = |field: &str| meta[field].as_u64().context(field.to_owned());
    Ok((index("last_log_index")?, index("commit_index")?))
}

/// Waits until each of `survivors` has committed every metadata entry any
/// of `all` had logged when called (the membership change among them).
async fn survivors_committed(cluster: &Cluster, all: &[u64], survivors: &[u64]) -> Result<()> {
    let mut logged = 0;
    for &id in all {
        logged = logged.max(meta_indexes(cluster, id).await?.0);
    }
    eventually(
        LEADER_TIMEOUT,
        &format!("nodes {survivors:?} committed index {logged}"),
        async || {
            for &id in survivors {
                let (_, committed) = meta_indexes(cluster, id).await?;
                ensure!(committed >= logged, "node {id} committed {committed}");
            }
            Ok(())
        },
    )
    .await
}

/// Waits until every one of `asked` shows `voters` (and `learners`) as the
/// metadata group's.
async fn members_are(
    cluster: &Cluster,
    asked: &[u64],
    voters: &[u64],
    learners: &[u64],
    within: Duration,
) -> Result<()> {
    let want = (
        voters.iter().copied().collect(),
        learners.iter().copied().collect(),
    );
    eventually(
        within,
        &format!("voters {voters:?}, learners {learners:?} on nodes {asked:?}"),
        async || {
            for &id in asked {
                // Members and joint from one reading, so both hold at once.
                let meta = meta_status(cluster, id).await?;
                let seen = meta_members(&meta);
                ensure!(seen == want, "node {id} shows {seen:?}");
                ensure!(!meta_joint(&meta)?, "node {id} is mid-change");
            }
            Ok(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_group_grows_to_five_voters_and_replaces_dead_ones() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(150), async |cluster| {
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &[1, 2, 3]).await,
        )
        .await?;
        members_are(cluster, &[1, 2, 3], &[1, 2, 3], &[], LEADER_TIMEOUT).await?;
        cluster.join(4, 1)?;
        eventually(Duration::from_secs(40), "node 4 in every map", async || {
            agreed_map(cluster, &[1, 2, 3, 4]).await
        })
        .await?;
        // Four live nodes: three voters still, node 4 a learner (after a
        // few of the leader's checks).
        tokio::time::sleep(Duration::from_secs(3)).await;
        members_are(cluster, &[1, 2, 3, 4], &[1, 2, 3], &[4], LEADER_TIMEOUT).await?;
        cluster.join(5, 1)?;
        let five = [1, 2, 3, 4, 5];
        members_are(cluster, &five, &five, &[], Duration::from_secs(40)).await?;

        // The five voters are seen before their configuration is committed:
        // killing two of the first three before the survivors know it is
        // committed would leave them in the joint configuration, whose old
        // half (1, 2, 3) has no quorum without 1 and 2.
        survivors_committed(cluster, &five, &[3, 4, 5]).await?;
        // Two voters of five die: the other three still commit.
        cluster.node_mut(1)?.kill();
        cluster.node_mut(2)?.kill();
        cluster.join(6, 3)?;
        let map = eventually(Duration::from_secs(40), "node 6 in every map", async || {
            agreed_map(cluster, &[3, 4, 5, 6]).await
        })
        .await?;
        ensure!(map.node(6).is_some(), "node 6 is not in the map: {map:?}");
        // Node 1, silent past the grace period, is replaced by node 6 (the
        // lowest dead id first; one learner replaces one voter).
        members_are(
            cluster,
            &[3, 4, 5, 6],
            &[2, 3, 4, 5, 6],
            &[1],
            Duration::from_secs(40),
        )
        .await
    })
    .await
}

/// Runs `rdkvctl` against every node's client address; its output.
async fn ctl(cluster: &Cluster, args: &[&str]) -> Result<std::process::Output> {
    let endpoints = cluster.endpoints(Intent::Any)?.join(",");
    let mut full = vec!["--endpoints", &endpoints, "--timeout", "30s"];
    full.extend_from_slice(args);
    rdkv_tests::rdkvctl(&full, &[]).await
}

/// `rdkvctl node remove ID -w json`, which must succeed; the map version
/// it reports.
async fn remove(cluster: &Cluster, id: u64) -> Result<u64> {
    let out = ctl(cluster, &["node", "remove", &id.to_string(), "-w", "json"]).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "node remove {id}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_str(&stdout)?;
    answer["version"].as_u64().context("no version")
}

/// Node 3 of `--shards 3 --replicas 2` (placed on shards 1 and 2) leaves
/// the cluster: refused while it hosts replicas (the refusal names them);
/// once they are moved to the joined node 4, removed from every node's map
/// and from the metadata group (node 4 voting in its place); a second
/// removal changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_hosting_nothing_is_removed_from_the_map_and_the_group() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(150), async |cluster| {
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &[1, 2, 3]).await,
        )
        .await?;
        cluster.join(4, 1)?;
        eventually(Duration::from_secs(40), "node 4 in every map", async || {
            agreed_map(cluster, &[1, 2, 3, 4]).await
        })
        .await?;

        let refused = ctl(cluster, &["node", "remove", "3"]).await?;
        let stderr = String::from_utf8_lossy(&refused.stderr);
        ensure!(
            !refused.status.success() && stderr.contains("shard(s) 1, 2"),
            "node remove 3 while it hosts shards 1 and 2: {stderr}"
        );
        for shard in ["1", "2"] {
            let moved = ctl(cluster, &["shard", "move-replica", shard, "3", "4"]).await?;
            ensure!(
                moved.status.success(),
                "move-replica {shard} 3 4: {}",
                String::from_utf8_lossy(&moved.stderr)
            );
        }
        // The map a move publishes reaches the leader a moment later.
        let version = eventually(LEADER_TIMEOUT, "node 3 removed", async || {
            remove(cluster, 3).await
        })
        .await?;
        let map = eventually(LEADER_TIMEOUT, "node 3 gone from every map", async || {
            let map = agreed_map(cluster, &[1, 2, 4]).await?;
            ensure!(map.node(3).is_none(), "version {}", map.version());
            Ok(map)
        })
        .await?;
        ensure!(map.version() == version, "{version} then {map:?}");
        // Node 3 voted: node 4, caught up, took its place in one change.
        members_are(cluster, &[1, 2, 4], &[1, 2, 4], &[], LEADER_TIMEOUT).await?;
        let again = remove(cluster, 3).await?;
        ensure!(again == version, "a second removal made version {again}");
        Ok(())
    })
    .await
}
