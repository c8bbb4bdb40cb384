//! Real partitions (network namespaces where the host allows, else the
//! peer network's fault hook): an isolated leader loses its leadership and
//! its health, the majority elects another and keeps taking writes, and
//! after healing every replica converges; a slow disk slows writes but
//! loses nothing; a node that is down is dialed at a paced rate.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_client::Consistency;
use rdkv_tests::prometheus::http_get;
use rdkv_tests::{Cluster, LEADER_TIMEOUT, check, check_with_leader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_is_replaced_and_the_cluster_converges() -> Result<()> {
    let mut cluster = Cluster::start_faulty(3, &[])?;
    rdkv_tests::skip::require_real_partitions(
        &cluster,
        "an_isolated_leader_is_replaced_and_the_cluster_converges",
    );
    check_with_leader(&mut cluster, 120, async |cluster, old| {
        let majority: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
        let all = cluster.tcp_client_via(&[1, 2, 3])?;
        all.put("before", "1").await?;
        // A key the old leader holds, then overwritten behind the cut: a
        // stale local read on the old leader returns "old", not nothing.
        all.put("moved", "old").await?;
        cluster
            .wait_applied(old, all.put("fence", "1").await?, LEADER_TIMEOUT)
            .await?;

        cluster.partition(&[&[old], &majority]).await?;
        let new = cluster
            .wait_for_leader_among(&majority, old, LEADER_TIMEOUT)
            .await?;
        let writer = cluster.tcp_client_via(&majority)?;
        writer.put("moved", "new").await?;
        for i in 0..20 {
            writer.put(format!("during{i}"), "x").await?;
        }
        // The old leader cannot serve linearizable or lease reads: it fails
        // them, or (having learned of the new leader) sends the client there.
        let cut_off = cluster.tcp_client_via(&[old])?;
        // The premise, read from its region directly: it holds the stale
        // version, which a read served locally would return.
        let held = cluster.map_region(old).await?.get(b"moved")?;
        ensure!(
            held.as_ref().is_some_and(|v| v.value == "old"),
            "the old leader should hold the stale version, not {held:?}"
        );
        for level in [Consistency::Linearizable, Consistency::Lease] {
            let read =
                tokio::time::timeout(Duration::from_secs(15), cut_off.get_with("moved", level))
                    .await;
            if let Ok(Ok(got)) = &read {
                ensure!(
                    got.as_ref().is_some_and(|v| v.value == "new"),
                    "the isolated old leader served a stale {level:?} read: {got:?}"
                );
            }
        }
        let health = tokio::task::spawn_blocking({
            let addr = cluster.node(old)?.http_addr;
            move || http_get(addr, "/health")
        })
        .await??;
        ensure!(
            health.0 == 503,
            "the isolated node reports healthy: {health:?}"
        );

        cluster.heal().await?;
        let last = writer.put("after", "1").await?;
        for id in 1..=3 {
            let node = cluster.replica(id)?;
            cluster
                .wait_applied(id, last, Duration::from_secs(20))
                .await?;
            for i in 0..20 {
                let got = node.get(format!("during{i}")).await?;
                ensure!(got.is_some(), "node {id} lacks during{i}");
            }
        }
        println!("leader {old} isolated, {new} elected, converged at {last}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disk_slows_writes_but_loses_none() -> Result<()> {
    let mut cluster = Cluster::start_faulty(3, &[])?;
    check_with_leader(&mut cluster, 90, async |cluster, leader| {
        let client = cluster.tcp_client_via(&[1, 2, 3])?;
        for id in 1..=3 {
            cluster.slow_fsync(id, 30).await?;
        }
        let mut acknowledged = Vec::new();
        for i in 0..30 {
            let key = format!("slow{i}");
            client.put(key.clone(), "v").await?;
            acknowledged.push(key);
        }
        let parsed = cluster.metrics_of(leader).await?;
        let slow = parsed.sum(
            "rdkv_raft_log_fsync_duration_seconds_bucket",
            &[("le", "0.025")],
        );
        let count = parsed.sum("rdkv_raft_log_fsync_duration_seconds_count", &[]);
        ensure!(
            count > slow,
            "no fsync took longer than 25 ms under a 30 ms delay"
        );
        cluster.heal().await?;
        cluster.node_mut(leader)?.kill();
        cluster.restart(leader)?;
        cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        for key in &acknowledged {
            let got = client
                .get_with(key.clone(), Consistency::Linearizable)
                .await
                .with_context(|| format!("reading {key}"))?;
            ensure!(got.is_some(), "acknowledged {key} lost");
        }
        Ok(())
    })
    .await
}

/// A leader whose follower is down dials it at a paced rate: a failed dial
/// waits at least 10 ms before the next (`peer::redial`). openraft opens
/// a new replication stream as soon as one fails to open, and without the
/// pacing the leader dialed the dead node tens of thousands of times a
/// second, logging a warning each time (21,877 in 2 s, seen before the
/// fix). The waits double from 10 ms to the heartbeat (the harness runs
/// 50 ms), and sleeps never end early, so over a window of `w` ms one
/// dialer fails at most `w / 50 + 4` times (three failures 10, 20 and 40
/// ms apart, then one per 50 ms): a bound, not a timing. A single group's
/// leader has two dialers per peer (openraft's replication stream and its
/// heartbeats, each with a connection of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paces_its_dials_to_a_follower_that_is_down() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 60, async |cluster, leader| {
        let down = (1..=3).find(|&id| id != leader).context("no follower")?;
        let client = cluster.tcp_client_via(&[leader])?;
        client.put("before", "1").await?;
        cluster.node_mut(down)?.kill();
        client.put("after", "1").await?;
        let dials = paced_dials(cluster, &[leader], down, 2).await?;
        ensure!(dials > 0.0, "no failed dial to node {down} counted");
        Ok(())
    })
    .await
}

/// The same on a node of a multi-shard cluster, whose shards share one
/// Raft link per peer (`peer::link`) and so one dialer: every shard's
/// replication, heartbeats and votes wait for the link's turn. (Before the
/// pacing this path did not storm: a link dials inside the append stream,
/// where openraft's own backoff applies; 7 warnings in 2 s. The test
/// guards the shared pacing and its count.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shards_of_a_node_pace_their_dials_to_a_node_that_is_down() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &["--shards", "3", "--replicas", "3"])?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let down = 3;
        let ids = rdkv_tests::shard_view::node_ids(cluster);
        let map = rdkv_tests::eventually(LEADER_TIMEOUT, "the shards' leaders", async || {
            rdkv_tests::shard_view::agreed_leaders(cluster, &ids).await
        })
        .await?;
        println!("shard leaders: {map:?}");
        cluster.node_mut(down)?.kill();
        let dials = paced_dials(cluster, &[1, 2], down, 1).await?;
        ensure!(dials > 0.0, "no failed dial to node {down} counted");
        Ok(())
    })
    .await
}

/// Over a window of about 2 s, each of `survivors` may fail at most
/// `dialers * (w / 50 + 4)` dials to `down`, and log at most as many
/// openraft replication warnings; returns the failed dials of them all.
async fn paced_dials(
    cluster: &Cluster,
    survivors: &[u64],
    down: u64,
    dialers: u128,
) -> Result<f64> {
    const WARNING: &str = "ReplicationCore recv RPCError";
    const DIALS: &str = "rdkv_peer_dial_failures_total";
    let peer = down.to_string();
    let labels = [("peer", peer.as_str())];
    let window_start = std::time::Instant::now();
    let mut before = Vec::new();
    for &id in survivors {
        let warnings = cluster.node(id)?.log().matches(WARNING).count();
        before.push((warnings, cluster.metrics_of(id).await?.sum(DIALS, &labels)));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut after = Vec::new();
    for &id in survivors {
        let warnings = cluster.node(id)?.log().matches(WARNING).count();
        after.push((warnings, cluster.metrics_of(id).await?.sum(DIALS, &labels)));
    }
    let window_ms = window_start.elapsed().as_millis();
    let allowed = dialers * (window_ms / 50 + 4);
    let mut total = 0.0;
    for ((id, (w0, d0)), (w1, d1)) in survivors.iter().zip(before).zip(after) {
        let (warnings, dials) = (w1 - w0, d1 - d0);
        println!(
            "node {id}, {window_ms} ms: {dials} failed dials to node {down}, {warnings} warnings"
        );
        ensure!(
            warnings as u128 <= allowed,
            "node {id}: {warnings} replication warnings in {window_ms} ms (at most {allowed})"
        );
        ensure!(
            dials as u128 <= allowed,
            "node {id}: {dials} failed dials in {window_ms} ms (at most {allowed})"
        );
        total += dials;
    }
    Ok(total)
}
