//! The fault suite (`rdkv_tests::nemesis`: the same clients, operations and
//! checks as `nemesis.rs`) against sharded clusters, the clients' lease and
//! follower reads served one-sided from every shard's mapped regions where
//! they can be (the client's `ReadView` per shard).
//!
//! Node faults: 3 nodes, 6 Raft groups of 3 replicas each, leaders spread
//! over the nodes. The nemesis strikes a whole node, the one leading the
//! most shards: it partitions, pauses or kills it, slows its disk, or
//! restarts every node. A fault takes effect when every shard the node led
//! has a new leader among the others; before the next one, every shard has
//! a leader again.
//!
//! Replica moves: 4 nodes, 6 shards of 3 replicas, so that every shard has
//! a node to move to. The nemesis moves a shard's replica to that node with
//! `rdkvctl shard move-replica` and, after a while, back: the leader's
//! replica (the leader hands its leadership on first), also with the disks
//! of the members not taking over slowed, or a follower's with the shard's
//! third member killed during the move and the new member killed right
//! after it (its replica, opened for the move, comes back from its own
//! disk).
//!
//! Either way the history of keys spread over all six shards must stay
//! linearizable per key, with no acknowledged write lost.
//!
//! And without load, the leader's replica of three shards moves out and
//! back while the members not taking over have slow disks: the new leader
//! must wait for a quorum's acknowledgement before it changes the
//! membership (the move failed `Internal` there before it did).
//!
//! The tests of this file run one at a time (each has its own cluster).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_proto::shard::ShardId;
use rdkv_tests::nemesis::{Expect, load_secs, report, run_scenario, slow_disk};
use rdkv_tests::shard_view::{agreed_map, every_shard_led, map_of, node_ids};
use rdkv_tests::{Cluster, Intent, check, eventually, rdkvctl_ok};

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
const SHARDS: usize = 6;
/// One test of this file at a time: each runs a cluster of fault-injected
/// nodes and its clients, and two on a 2-core machine would starve each
/// other's heartbeats. (No other suite shares this process: this file is a
/// test binary of its own, not a module of `it`.)
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
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
    every_shard_led(cluster, ids, SHARDS, LEADER_TIMEOUT).await
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
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
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
                one_sided_reads: true,
                shard_map: Some(shard_map.clone()),
            };
            let nemesis = async |cluster: &mut Cluster, hold| inject(cluster, scenario, hold).await;
            rows.push(run_scenario(cluster, scenario.name(), round, expect, nemesis).await?);
        }
        report(&rows)
    })
    .await
}

#[derive(Debug, Clone, Copy)]
enum Move {
    /// The shard leader's replica moves out and back.
    LeadersReplica,
    /// The same with slow disks (+60 ms a log fsync) on the members that
    /// do not take over the leadership: the new leader is acknowledged by
    /// a quorum only some time after it was elected.
    LeadersReplicaSlowDisks,
    /// A follower's replica moves out, the shard's third member killed
    /// during the move and the new member killed right after it; then back.
    FollowersReplicaWithKills,
}

impl Move {
    const ALL: [Move; 3] = [
        Move::LeadersReplica,
        Move::LeadersReplicaSlowDisks,
        Move::FollowersReplicaWithKills,
    ];

    fn name(self) -> &'static str {
        match self {
            Move::LeadersReplica => "6 shards on 4 nodes: move the leader's replica out and back",
            Move::LeadersReplicaSlowDisks => {
                "6 shards on 4 nodes: move the leader's replica out (the other members' fsyncs \
                 +60 ms) and back"
            }
            Move::FollowersReplicaWithKills => {
                "6 shards on 4 nodes: move a follower's replica out (a member killed during \
                 the move, the new one after it) and back"
            }
        }
    }
}

/// One replica move out of a shard and back: the shard's members and
/// leader before it, the node whose replica moves and the one it moves to.
struct Planned {
    shard: ShardId,
    members: Vec<u64>,
    leader: u64,
    from: u64,
    to: u64,
}

impl Planned {
    /// The members after the move out, sorted.
    fn moved(&self) -> Vec<u64> {
        let mut moved: Vec<u64> = self
            .members
            .iter()
            .map(|&id| if id == self.from { self.to } else { id })
            .collect();
        moved.sort_unstable();
        moved
    }

    /// The member that is neither the leader nor `self.from` (the first).
    fn third(&self) -> Result<u64> {
        self.members
            .iter()
            .copied()
            .find(|&id| id != self.leader && id != self.from)
            .context("no third member")
    }
}

/// `shard`'s members as every node of `ids` serves them in the same map
/// (with every node's addresses: the moves find the target by them).
async fn members_of(cluster: &Cluster, ids: &[u64], shard: ShardId) -> Result<Vec<u64>> {
    let map = eventually(LEADER_TIMEOUT, "one map on every node", async || {
        agreed_map(cluster, ids).await
    })
    .await?;
    let mut members = map
        .shard(shard)
        .with_context(|| format!("shard {shard} is not in the map"))?
        .members
        .clone();
    members.sort_unstable();
    Ok(members)
}

/// `rdkvctl shard move-replica SHARD FROM TO` through `endpoints`; fails
/// unless it answers the members `expected` (sorted).
async fn move_replica(
    endpoints: String,
    shard: ShardId,
    (from, to): (u64, u64),
    expected: Vec<u64>,
) -> Result<()> {
    let (shard, from_arg, to_arg) = (shard.0.to_string(), from.to_string(), to.to_string());
    let args = [
        "--endpoints",
        &endpoints,
        "--timeout",
        "15s",
        "shard",
        "move-replica",
        &shard,
        &from_arg,
        &to_arg,
        "-w",
        "json",
    ];
    let started = std::time::Instant::now();
    let out = rdkvctl_ok(&args, &[]).await?;
    let took = started.elapsed();
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut members: Vec<u64> = answer["members"]
        .as_array()
        .with_context(|| format!("no members in {answer}"))?
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    members.sort_unstable();
    ensure!(
        members == expected,
        "shard {shard} moved {from} -> {to}: members {members:?}, expected {expected:?}"
    );
    println!("moved shard {shard}'s replica {from} -> {to} in {took:?}: members {members:?}");
    Ok(())
}

/// Waits until node `id` hosts a replica of `shard` (a move's target has
/// opened it).
async fn hosts(cluster: &Cluster, id: u64, shard: ShardId) -> Result<()> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let endpoint = cluster.node(id)?.endpoint();
    eventually(LEADER_TIMEOUT, "the target hosting the shard", async || {
        let statuses = client.shard_statuses_of(&endpoint).await?;
        ensure!(statuses.iter().any(|s| s.shard == shard), "{statuses:?}");
        Ok(())
    })
    .await
}

/// Moves a replica of `shard` to the node outside it, holds `hold`, moves
/// it back; every shard has a leader before each move and at the end.
async fn move_out_and_back(
    cluster: &mut Cluster,
    scenario: Move,
    shard: ShardId,
    hold: Duration,
) -> Result<()> {
    let all = node_ids(cluster);
    let endpoints = cluster.endpoints(Intent::Any)?.join(",");
    let leader = leaders_among(cluster, &all).await?[&shard];
    let members = members_of(cluster, &all, shard).await?;
    let to = *all
        .iter()
        .find(|id| !members.contains(id))
        .context("no node outside the shard")?;
    let from = match scenario {
        Move::LeadersReplica | Move::LeadersReplicaSlowDisks => leader,
        Move::FollowersReplicaWithKills => *members
            .iter()
            .find(|&&id| id != leader)
            .context("no follower")?,
    };
    let planned = Planned {
        shard,
        members,
        leader,
        from,
        to,
    };
    move_out(cluster, scenario, &planned, endpoints.clone()).await?;
    leaders_among(cluster, &all).await?;
    tokio::time::sleep(hold).await;
    move_replica(endpoints, shard, (to, from), planned.members).await?;
    leaders_among(cluster, &all).await?;
    Ok(())
}

/// The move out of `scenario`, with its faults (undone when it returns).
async fn move_out(
    cluster: &mut Cluster,
    scenario: Move,
    planned: &Planned,
    endpoints: String,
) -> Result<()> {
    let Planned {
        shard, from, to, ..
    } = *planned;
    let out = move_replica(endpoints, shard, (from, to), planned.moved());
    match scenario {
        Move::LeadersReplica => out.await,
        Move::LeadersReplicaSlowDisks => {
            // The leader hands its leadership to the lowest other voter
            // (`replica_move::Move::lead_elsewhere`) before the move.
            let next = planned
                .members
                .iter()
                .copied()
                .filter(|&id| id != from)
                .min()
                .context("no other voter")?;
            for &id in planned.members.iter().filter(|&&id| id != next) {
                cluster.slow_fsync(id, 60).await?;
            }
            let out = out.await;
            cluster.heal().await?;
            out
        }
        Move::FollowersReplicaWithKills => {
            // Neither the leader nor the source: the move goes on with the
            // other two members and the target.
            let bystander = planned.third()?;
            let done = AtomicBool::new(false);
            let out = async {
                let out = out.await;
                done.store(true, Ordering::Relaxed);
                out
            };
            let kill = async {
                hosts(cluster, to, shard).await?;
                cluster.node_mut(bystander)?.kill();
                anyhow::Ok(done.load(Ordering::Relaxed))
            };
            let (out, killed) = tokio::join!(out, kill);
            let after = killed.context("killing a member during the move")?;
            out?;
            let when = if after { "after" } else { "during" };
            println!("node {bystander} killed {when} the move, node {to} right after it");
            cluster.restart(bystander)?;
            cluster.node_mut(to)?.kill();
            cluster.restart(to)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_histories_stay_linearizable_while_replicas_move() -> Result<()> {
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start_faulty(4, &FLAGS)?;
    let limit = Duration::from_secs(90 + 30 * load_secs());
    check(&mut cluster, limit, async |cluster| {
        let all = node_ids(cluster);
        let leaders = leaders_among(cluster, &all).await?;
        println!("leaders at the start: {leaders:?}");
        let shard_map = eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &all).await,
        )
        .await?;
        let mut rows = Vec::new();
        let mut moves = 0;
        for (round, scenario) in Move::ALL.into_iter().enumerate() {
            let expect = Expect {
                one_sided_reads: true,
                shard_map: Some(shard_map.clone()),
            };
            let nemesis = async |cluster: &mut Cluster, hold| {
                // Shards in turn, each scenario from a shard three on.
                let shard = ShardId(u32::try_from((3 * round + moves) % SHARDS)?);
                moves += 1;
                move_out_and_back(cluster, scenario, shard, hold).await
            };
            rows.push(run_scenario(cluster, scenario.name(), round, expect, nemesis).await?);
        }
        report(&rows)
    })
    .await
}

/// Without load, where nothing else keeps the followers' acknowledgements
/// coming: the leader's replica of three shards moves out while the
/// members that do not take over the leadership have slow disks (the new
/// leader is acknowledged by a quorum only after their fsyncs), and back.
/// The move once failed here with `Internal` ("adding the learner failed:
/// has to forward request to: None"): the new leader was asked to change
/// the membership before a quorum had acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_replica_moves_while_the_other_members_disks_are_slow() -> Result<()> {
    let _alone = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut cluster = Cluster::start_faulty(4, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(120), async |cluster| {
        for shard in [0, 2, 4] {
            let hold = Duration::from_millis(100);
            move_out_and_back(cluster, Move::LeadersReplicaSlowDisks, ShardId(shard), hold).await?;
        }
        Ok(())
    })
    .await
}
