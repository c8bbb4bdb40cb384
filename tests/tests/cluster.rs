//! Real `rdkv-server` processes on loopback: a cluster forms, replicates,
//! survives the loss of its leader, takes in a restarted node and a joining
//! one, shrinks, and moves its leadership.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rdkv_client::ClientOptions;
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check_with_leader, client_options, eventually};

/// Waits until node `id` alone (a replica read) has `key` = `expected`.
async fn eventually_on(cluster: &Cluster, id: u64, key: &str, expected: &str) -> Result<()> {
    let replica = cluster.replica(id)?;
    eventually(
        Duration::from_secs(15),
        &format!("node {id} has {key}={expected}"),
        async || replica.expect(key, expected).await,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_survive_leader_loss() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        // Writes through any endpoint (followers redirect) are readable everywhere.
        for id in 1..=3 {
            let client = cluster.client(Intent::Via(&[id]))?;
            client.put(format!("k{id}"), format!("v{id}")).await?;
        }
        for id in 1..=3 {
            for k in 1..=3 {
                eventually_on(cluster, id, &format!("k{k}"), &format!("v{k}")).await?;
            }
        }

        // SIGKILL the leader: the others elect a new one and writes go on.
        cluster.node_mut(leader)?.kill();
        let survivors: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        let client = cluster.client(Intent::Via(&survivors[..1]))?;
        eventually(LEADER_TIMEOUT, "a write after the failover", async || {
            Ok(client.put("after-failover", "yes").await?)
        })
        .await?;
        let new_leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        assert_ne!(new_leader, leader);

        // The killed node restarts from its data directory and catches up.
        cluster.restart(leader)?;
        eventually_on(cluster, leader, "after-failover", "yes").await?;
        eventually_on(cluster, leader, "k1", "v1").await?;
        Ok(())
    })
    .await
}

/// A replica read asks that node and no other: a follower cut off from the
/// others before a write does not have it, and reading it there fails
/// (absent, or refused as stale) even though the other two have it; once
/// healed, it catches up and the same read passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_read_fails_where_that_replica_lacks_the_key() -> Result<()> {
    let mut cluster = Cluster::start_faulty(3, &[])?;
    check_with_leader(&mut cluster, 90, async |cluster, leader| {
        let [cut_off, other] = [1, 2, 3]
            .into_iter()
            .filter(|id| *id != leader)
            .collect::<Vec<_>>()[..]
        else {
            anyhow::bail!("three nodes, one leader");
        };
        cluster.partition(&[&[leader, other], &[cut_off]]).await?;
        let writer = cluster.client(Intent::Via(&[leader, other]))?;
        writer.put("written-apart", "yes").await?;
        eventually_on(cluster, other, "written-apart", "yes").await?;

        let lacking = cluster.replica_with(
            cut_off,
            ClientOptions {
                request_timeout: Duration::from_secs(2),
                ..client_options(None)
            },
        )?;
        let read = lacking.expect("written-apart", "yes").await;
        ensure!(
            read.is_err(),
            "node {cut_off} was cut off before the write, yet its read passed"
        );

        cluster.heal().await?;
        eventually_on(cluster, cut_off, "written-apart", "yes").await
    })
    .await
}

/// A member whose first start comes after the others formed the cluster
/// (an empty data directory, the same `--initial-cluster`) joins it as a
/// follower: the leader and the term stay. It used to initialize a group of
/// its own, and openraft campaigns right after that; in term 1 its vote
/// outranked the lower-id leader's, which stepped down, and the cluster had
/// no leader until an election timeout later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_started_late_joins_without_deposing_the_leader() -> Result<()> {
    // The fault needs a leader elected in term 1 (a later term's leader
    // outranks the late member's first vote): a cluster whose first
    // election took more rounds (a starved machine) is started again. And
    // it needs the late member to campaign before the leader's first
    // heartbeat reaches it (which makes it a follower, and its
    // initialization refused): heartbeats every 500 ms make that the
    // common case, where at the harness's 50 ms the heartbeat usually won.
    for attempt in 1..=3 {
        let mut cluster = Cluster::start_late(3, &["--heartbeat-ms", "500"], &[3])?;
        let elected = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        let client = cluster.client(Intent::Via(&[1, 2]))?;
        client.put("before-node-3", "v").await?;
        let before = cluster.status_of(elected).await?;
        if before.term != 1 {
            println!(
                "attempt {attempt}: the first leader was elected in term {}",
                before.term
            );
            continue;
        }
        let leader = before
            .leader_id
            .context("no leader before node 3 started")?;
        cluster.restart(3)?;
        cluster
            .wait_applied(3, before.commit_index, LEADER_TIMEOUT)
            .await?;
        client.put("after-node-3", "v").await?;
        for id in 1..=3 {
            let status = cluster.status_of(id).await?;
            ensure!(
                status.term == 1 && status.leader_id == Some(leader),
                "node {id} is in term {} under leader {:?}; before node 3 started: term 1 under {leader}\n{}",
                status.term,
                status.leader_id,
                cluster.logs()
            );
        }
        return Ok(());
    }
    bail!("no cluster of three attempts elected its first leader in term 1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_the_worker_threads_it_is_given() -> Result<()> {
    for threads in [1, 3] {
        let cluster = Cluster::start_with(1, &["--worker-threads", &threads.to_string()])?;
        let client = cluster.client(Intent::Any)?;
        client.put("k", "v").await?;
        // The runtime's own count, logged once it runs.
        let log = cluster.node(1)?.log();
        ensure!(
            log.contains(&format!("runtime started workers={threads}\n")),
            "no runtime with {threads} workers in the log:\n{log}"
        );
    }
    Ok(())
}
