//! The metadata group's voters follow the cluster (issue 20;
//! docs/sharding.md, section 2, "Voters"): 3 `rdkv-server` processes with
//! `--shards 3 --replicas 2` start with voters 1-3; node 4 joins and stays
//! a learner (four live nodes keep three voters), node 5 joins and both
//! become voters. Two of the five voters, nodes 1 and 2, are SIGKILLed:
//! the group keeps its quorum, so the map is still edited (node 6 joins,
//! which a group of the three bootstrap voters could not take with two of
//! them dead), and once node 1 has been silent past the grace period the
//! leader makes the caught-up learner 6 a voter in its place.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Result, ensure};
use rdkv_tests::prometheus::http_get;
use rdkv_tests::shard_view::agreed_map;
use rdkv_tests::{Cluster, LEADER_TIMEOUT, check, eventually};

const FLAGS: [&str; 6] = ["--shards", "3", "--replicas", "2", "--region-mib", "8"];

/// The metadata group's voters and learners in node `id`'s `/status`.
async fn meta_members(cluster: &Cluster, id: u64) -> Result<(BTreeSet<u64>, BTreeSet<u64>)> {
    let addr = cluster.node(id)?.http_addr;
    let (code, body) = tokio::task::spawn_blocking(move || http_get(addr, "/status")).await??;
    ensure!(code == 200, "/status of node {id}: {code}");
    let status: serde_json::Value = serde_json::from_str(&body)?;
    let ids = |field: &str| -> BTreeSet<u64> {
        status["meta"][field]
            .as_array()
            .map(|ids| ids.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default()
    };
    Ok((ids("voters"), ids("learners")))
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
                let seen = meta_members(cluster, id).await?;
                ensure!(seen == want, "node {id} shows {seen:?}");
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
