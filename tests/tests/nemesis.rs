//! The fault suite against one Raft group (the load and the checks are
//! `rdkv_tests::nemesis`): a nemesis partitions, pauses, kills and restarts
//! nodes, slows disks and changes the membership. Each fault must be seen
//! to take effect, each scenario must have served reads one-sided (all
//! recorded and checked), and partitions must be real (network namespaces):
//! under CI a host that cannot make them fails the suite
//! (`rdkv_tests::skip`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rdkv_tests::nemesis::{Expect, load_secs, report, run_scenario, slow_disk};
use rdkv_tests::{Cluster, Intent, check, eventually};

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    PartitionLeader,
    PartitionMinority,
    PauseLeader,
    KillLeaderLoop,
    SlowFsync,
    RestartAll,
    MembershipChange,
}

impl Scenario {
    const ALL: [Scenario; 7] = [
        Scenario::PartitionLeader,
        Scenario::PartitionMinority,
        Scenario::PauseLeader,
        Scenario::KillLeaderLoop,
        Scenario::SlowFsync,
        Scenario::RestartAll,
        Scenario::MembershipChange,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::PartitionLeader => "partition leader",
            Scenario::PartitionMinority => "partition minority",
            Scenario::PauseLeader => "pause leader (SIGSTOP)",
            Scenario::KillLeaderLoop => "kill -9 leader loop",
            Scenario::SlowFsync => "slow fsync (+25 ms)",
            Scenario::RestartAll => "restart all (kill -9)",
            Scenario::MembershipChange => "membership change (join, promote, remove)",
        }
    }
}

async fn current_leader(cluster: &mut Cluster) -> Result<u64> {
    cluster.wait_for_leader(LEADER_TIMEOUT).await
}

/// One fault, held for `hold`, then undone. Each fault is seen to take
/// effect before it is undone (a new leader, a replica that lost its
/// leader, slower fsyncs, a later term, a member added and removed), or the
/// scenario fails: a fault that silently did nothing would leave the
/// history trivially linearizable.
async fn inject(cluster: &mut Cluster, scenario: Scenario, hold: Duration) -> Result<()> {
    let leader = current_leader(cluster).await?;
    // Partitions last well past the follower-read freshness bound (1 s), so
    // a replica that kept serving on a stale view would be caught.
    let partition_hold = hold.max(Duration::from_millis(2500));
    let others: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    match scenario {
        Scenario::PartitionLeader => {
            cluster.partition(&[&[leader], &others]).await?;
            cluster
                .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
                .await?;
            tokio::time::sleep(partition_hold).await;
            cluster.heal().await?;
        }
        Scenario::PartitionMinority => {
            let minority = others[0];
            let rest: Vec<u64> = (1..=3).filter(|&id| id != minority).collect();
            let term = cluster.status_of(leader).await?.term;
            cluster.partition(&[&[minority], &rest]).await?;
            lost_its_leader(cluster, minority, leader, term).await?;
            tokio::time::sleep(partition_hold).await;
            cluster.heal().await?;
        }
        Scenario::PauseLeader => {
            cluster.node_mut(leader)?.pause()?;
            let replaced = cluster
                .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
                .await;
            tokio::time::sleep(hold).await;
            cluster.node_mut(leader)?.resume()?;
            replaced?;
        }
        Scenario::KillLeaderLoop => {
            cluster.node_mut(leader)?.kill();
            cluster
                .wait_for_leader_among(&others, leader, LEADER_TIMEOUT)
                .await?;
            cluster.restart(leader)?;
        }
        Scenario::SlowFsync => slow_disk(cluster, leader, hold).await?,
        Scenario::MembershipChange => change_membership(cluster, leader, hold).await?,
        Scenario::RestartAll => restart_all(cluster, leader, hold).await?,
    }
    Ok(())
}

/// Waits until the cut-off `minority` no longer follows `leader` (it timed
/// out and campaigned, in a term past `term`).
async fn lost_its_leader(cluster: &Cluster, minority: u64, leader: u64, term: u64) -> Result<()> {
    eventually(
        LEADER_TIMEOUT,
        "the minority losing its leader",
        async || {
            let status = cluster.status_of(minority).await?;
            ensure!(
                status.leader_id != Some(leader) || status.term > term,
                "node {minority} still follows {leader} in term {}",
                status.term
            );
            Ok(())
        },
    )
    .await
}

/// Kills every node, restarts them all, and waits for a leader elected
/// after the restart (a term past the one before).
async fn restart_all(cluster: &mut Cluster, leader: u64, hold: Duration) -> Result<()> {
    let term = cluster.status_of(leader).await?.term;
    for id in 1..=3 {
        cluster.node_mut(id)?.kill();
    }
    tokio::time::sleep(hold / 4).await;
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    let cluster = &*cluster;
    eventually(LEADER_TIMEOUT, "a leader after the restart", async || {
        for id in 1..=3 {
            if let Ok(status) = cluster.status_of(id).await
                && status.leader_id.is_some()
                && status.term > term
            {
                return Ok(());
            }
        }
        bail!("no node reports a leader in a term past {term}")
    })
    .await
}

/// A new member joins, becomes a voter, serves for `hold` and is removed.
async fn change_membership(cluster: &mut Cluster, leader: u64, hold: Duration) -> Result<()> {
    // A new member each time (a removed one does not come back).
    static NEXT_ID: AtomicU64 = AtomicU64::new(4);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let admin = cluster.client(Intent::Any)?;
    cluster.join(id, leader)?;
    eventually(
        Duration::from_secs(30),
        &format!("node {id} a voter"),
        async || {
            let members = admin.members().await?;
            ensure!(
                members.iter().any(|m| m.id == id && m.voter),
                "members: {members:?}"
            );
            Ok(())
        },
    )
    .await?;
    tokio::time::sleep(hold).await;
    admin
        .remove_member(id)
        .await
        .with_context(|| format!("removing node {id}"))?;
    eventually(LEADER_TIMEOUT, "the member's removal", async || {
        let members = admin.members().await?;
        ensure!(
            members.iter().all(|m| m.id != id),
            "node {id} is still a member"
        );
        Ok(())
    })
    .await?;
    cluster.node_mut(id)?.kill();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_stay_linearizable_under_faults() -> Result<()> {
    // Frequent snapshots and log purges, so that kills also land during
    // snapshot builds, installs (a restarted or new node behind the purged
    // log) and purges.
    let mut cluster = Cluster::start_faulty(
        3,
        &["--snapshot-entries", "100", "--snapshot-keep-entries", "20"],
    )?;
    rdkv_tests::skip::require_real_partitions(&cluster, "histories_stay_linearizable_under_faults");
    let limit = Duration::from_secs(60 + 30 * load_secs());
    check(&mut cluster, limit, async |cluster| {
        current_leader(cluster).await?;
        let mut rows = Vec::new();
        for (round, scenario) in Scenario::ALL.into_iter().enumerate() {
            let expect = Expect {
                one_sided_reads: true,
                shard_map: None,
            };
            let nemesis = async |cluster: &mut Cluster, hold| inject(cluster, scenario, hold).await;
            rows.push(run_scenario(cluster, scenario.name(), round, expect, nemesis).await?);
        }
        report(&rows)
    })
    .await
}
