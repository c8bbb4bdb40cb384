//! The fault suite (`rdkv_tests::nemesis`: the same clients, operations and
//! checks as `nemesis.rs`) against a sharded cluster: 3 nodes, 6 Raft
//! groups of 3 replicas each, leaders spread over the nodes. The nemesis
//! strikes a whole node, the one leading the most shards: it partitions,
//! pauses or kills it, slows its disk, or restarts every node. A fault
//! takes effect when every shard the node led has a new leader among the
//! others; before the next one, every shard has a leader again. The history
//! of keys spread over all six shards must stay linearizable per key.
//!
//! Not here yet: a replica move (`shard move-replica` is not built) and
//! one-sided reads (the client does not map a sharded cluster's regions).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use rdkv_proto::shard::ShardId;
use rdkv_tests::nemesis::{Expect, load_secs, report, run_scenario, slow_disk};
use rdkv_tests::shard_view::{agreed_leaders, map_of, node_ids};
use rdkv_tests::{Cluster, check, eventually};

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
const SHARDS: usize = 6;
const FLAGS: [&str; 10] = [
    "--shards",
    "6",
    "--replicas",
    "3",
    "--region-mib",
    "16",
    // Frequent snapshots and log purges in every shard, so that kills also
    // land during snapshot builds, installs and purges.
    "--snapshot-entries",
    "100",
    "--snapshot-keep-entries",
    "20",
];

#[derive(Debug, Clone, Copy)]
enum Scenario {
    PartitionNode,
    PauseNode,
    KillNodeLoop,
    SlowFsync,
    RestartAll,
}

impl Scenario {
    const ALL: [Scenario; 5] = [
        Scenario::PartitionNode,
        Scenario::PauseNode,
        Scenario::KillNodeLoop,
        Scenario::SlowFsync,
        Scenario::RestartAll,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::PartitionNode => "6 shards: partition the busiest leader node",
            Scenario::PauseNode => "6 shards: pause the busiest leader node (SIGSTOP)",
            Scenario::KillNodeLoop => "6 shards: kill -9 the busiest leader node, loop",
            Scenario::SlowFsync => "6 shards: slow fsync on the busiest leader node (+25 ms)",
            Scenario::RestartAll => "6 shards: restart all (kill -9)",
        }
    }
}

/// Waits until every shard has a leader among `ids` that its members there
/// agree on; returns the leaders.
async fn leaders_among(cluster: &Cluster, ids: &[u64]) -> Result<BTreeMap<ShardId, u64>> {
    eventually(
        LEADER_TIMEOUT,
        &format!("a leader of every shard among {ids:?}"),
        async || {
            let leaders = agreed_leaders(cluster, ids).await?;
            ensure!(leaders.len() == SHARDS, "leaders {leaders:?}");
            Ok(leaders)
        },
    )
    .await
}

/// The node leading the most shards (the lowest id among equals).
fn busiest(leaders: &BTreeMap<ShardId, u64>) -> u64 {
    let mut led: BTreeMap<u64, usize> = BTreeMap::new();
    for &node in leaders.values() {
        *led.entry(node).or_default() += 1;
    }
    let most = led.values().copied().max().unwrap_or(0);
    led.into_iter()
        .find(|&(_, count)| count == most)
        .map_or(1, |(node, _)| node)
}

/// One fault against the busiest leader node, held for `hold`, then
/// undone; each fault is seen to take effect (every shard led by a node
/// other than the victim, or slower fsyncs) before it is undone, and every
/// shard has a leader again before this returns.
async fn inject(cluster: &mut Cluster, scenario: Scenario, hold: Duration) -> Result<()> {
    let all = node_ids(cluster);
    let victim = busiest(&leaders_among(cluster, &all).await?);
    let others: Vec<u64> = all.iter().copied().filter(|&id| id != victim).collect();
    // Partitions last well past the follower-read freshness bound (1 s).
    let partition_hold = hold.max(Duration::from_millis(2500));
    match scenario {
        Scenario::PartitionNode => {
            cluster.partition(&[&[victim], &others]).await?;
            leaders_among(cluster, &others).await?;
            tokio::time::sleep(partition_hold).await;
            cluster.heal().await?;
        }
        Scenario::PauseNode => {
            cluster.node_mut(victim)?.pause()?;
            let replaced = leaders_among(cluster, &others).await;
            tokio::time::sleep(hold).await;
            cluster.node_mut(victim)?.resume()?;
            replaced?;
        }
        Scenario::KillNodeLoop => {
            cluster.node_mut(victim)?.kill();
            leaders_among(cluster, &others).await?;
            cluster.restart(victim)?;
        }
        Scenario::SlowFsync => slow_disk(cluster, victim, hold).await?,
        Scenario::RestartAll => {
            for &id in &all {
                cluster.node_mut(id)?.kill();
            }
            tokio::time::sleep(hold / 4).await;
            for &id in &all {
                cluster.restart(id)?;
            }
        }
    }
    leaders_among(cluster, &all).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_histories_stay_linearizable_under_node_faults() -> Result<()> {
    let mut cluster = Cluster::start_faulty(3, &FLAGS)?;
    rdkv_tests::skip::require_real_partitions(
        &cluster,
        "sharded_histories_stay_linearizable_under_node_faults",
    );
    let limit = Duration::from_secs(60 + 30 * load_secs());
    check(&mut cluster, limit, async |cluster| {
        let all = node_ids(cluster);
        let leaders = leaders_among(cluster, &all).await?;
        println!("leaders at the start: {leaders:?}");
        let shard_map = map_of(cluster, all[0]).await?;
        let mut rows = Vec::new();
        for (round, scenario) in Scenario::ALL.into_iter().enumerate() {
            let expect = Expect {
                one_sided_reads: false,
                shard_map: Some(shard_map.clone()),
            };
            let nemesis = async |cluster: &mut Cluster, hold| inject(cluster, scenario, hold).await;
            rows.push(run_scenario(cluster, scenario.name(), round, expect, nemesis).await?);
        }
        report(&rows)
    })
    .await
}
