//! Membership changes with real processes: a node joins with `--join` and is
//! brought up to date by a snapshot (the log it would need is purged), a
//! member is removed, and the leadership moves on request.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use rdkv_proto::wire::{Consistency, ErrorCode};
use rdkv_tests::node::log_segments;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, SNAPSHOT_OFTEN, check_with_leader, eventually, numbered,
};

const TEST_LIMIT_SECS: u64 = 90;
/// Enough entries for the leader to purge its log behind a snapshot: the
/// server purges in batches of 256 entries (`purge_batch_size`), so with
/// ~200 writes nothing would be purged and a joiner would get the log.
const KEYS: usize = 400;

/// A 3-node cluster that snapshots every 20 entries and keeps no log behind
/// its snapshots takes ~200 writes; a 4th node then joins through a
/// follower's client address. It can only catch up by snapshot. It must
/// become a voter, serve every key locally, and report a snapshot; then
/// removing it leaves 3 members everywhere and writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiner_catches_up_by_snapshot_then_is_removed() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &SNAPSHOT_OFTEN)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        numbered::put_all(&client, KEYS).await?;
        // The leader has snapshotted and purged its log.
        let status = eventually(LEADER_TIMEOUT, "a snapshot on the leader", async || {
            let status = cluster.status_of(leader).await?;
            ensure!(
                status.snapshot_index >= 300,
                "no snapshot past 300 yet: {status:?}"
            );
            Ok(status)
        })
        .await?;
        let leader_snapshot = status.snapshot_index;
        println!(
            "leader {leader}: last log {} snapshot {leader_snapshot}",
            status.last_log_index
        );

        // Join through a follower: the join request is redirected to the leader.
        let seed = (1..=3).find(|id| *id != leader).unwrap_or(1);
        cluster.join(4, seed)?;
        let node4 = cluster.node(4)?.client_addr.to_string();
        eventually(Duration::from_secs(40), "node 4 a voter", async || {
            let members = client.members().await?;
            let me = members.iter().find(|m| m.id == 4);
            match me {
                Some(m) if m.voter => {
                    ensure!(members.len() == 4, "members: {members:?}");
                    ensure!(m.client_addr == node4, "node 4 listed as {m:?}");
                    Ok(())
                }
                _ => bail!("node 4 is not a voter yet: {members:?}"),
            }
        })
        .await?;

        // Node 4 serves every key on its own, and got there by a snapshot.
        eventually(
            Duration::from_secs(15),
            "node 4 has every key",
            async || numbered::check_replica(cluster, 4, KEYS).await,
        )
        .await?;
        // It holds at least the leader's snapshot from before the join, and
        // its log starts after a snapshot, not at index 0: it never received
        // the entries the snapshot covers (segments are named after their
        // first index).
        let status = eventually(Duration::from_secs(15), "node 4's snapshot", async || {
            let status = cluster.status_of(4).await?;
            ensure!(
                status.snapshot_index >= leader_snapshot,
                "node 4 has no snapshot covering {leader_snapshot}: {status:?}"
            );
            Ok(status)
        })
        .await?;
        let segments = log_segments(&cluster.node(4)?.data_dir)?;
        let first = *segments.keys().next().context("no segment")?;
        ensure!(
            first > 0,
            "node 4's log starts at index {first}: it was sent the log, not a snapshot"
        );
        ensure!(
            status.members.iter().filter(|m| m.voter).count() == 4,
            "node 4 sees {:?}",
            status.members
        );
        ensure!(status.region.live_keys >= KEYS as u64, "{status:?}");

        // A write after the join reaches node 4 too.
        client.put("after-join", "yes").await?;
        let node4 = cluster.replica(4)?;
        eventually(
            Duration::from_secs(15),
            "node 4 has after-join",
            async || node4.expect("after-join", "yes").await,
        )
        .await?;

        // Remove it: 3 members left, on every remaining node.
        let members = client.remove_member(4).await?;
        ensure!(
            members.len() == 3 && members.iter().all(|m| m.id != 4 && m.voter),
            "after removal: {members:?}"
        );
        cluster.node_mut(4)?.kill();
        for id in 1..=3 {
            eventually(
                Duration::from_secs(10),
                "3 members everywhere",
                async || {
                    let status = cluster.status_of(id).await?;
                    ensure!(
                        status.members.len() == 3,
                        "node {id} sees {:?}",
                        status.members
                    );
                    Ok(())
                },
            )
            .await?;
        }
        let version = client.put("after-remove", "yes").await?;
        let got = client
            .get_with("after-remove", Consistency::Linearizable)
            .await?;
        ensure!(got.as_ref().map(|v| v.version) == Some(version), "{got:?}");
        ensure!(
            client.members().await?.len() == 3,
            "member list changed again"
        );
        Ok(())
    })
    .await
}

/// `move_leader(id)` hands the leadership to each follower in turn; every
/// node agrees on the new leader and writes go on. Moving to the leader
/// itself is a no-op; moving to a non-member is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_to_each_follower() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, first| {
        let client = cluster.client(Intent::Any)?;
        client.put("before", "1").await?;

        let mut targets: Vec<u64> = (1..=3).filter(|id| *id != first).collect();
        targets.push(first);
        for target in targets {
            client.move_leader(target).await?;
            let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
            ensure!(leader == target, "asked for {target}, got {leader}");
            for id in 1..=3 {
                let status = cluster.status_of(id).await?;
                ensure!(
                    status.leader_id == Some(target),
                    "node {id} says the leader is {:?}",
                    status.leader_id
                );
            }
            let key = format!("led-by-{target}");
            let version = client.put(key.clone(), "yes").await?;
            let got = client.get_with(key, Consistency::Linearizable).await?;
            ensure!(got.map(|v| v.version) == Some(version));
        }

        // No-op on the current leader, NotFound for a stranger.
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        client.move_leader(leader).await?;
        ensure!(cluster.wait_for_leader(LEADER_TIMEOUT).await? == leader);
        match client.move_leader(9).await {
            Err(e) if e.code() == Some(ErrorCode::NotFound) => {}
            other => bail!("move_leader(9): {other:?}"),
        }
        let got = client.get_with("before", Consistency::Linearizable).await?;
        ensure!(got.map(|v| v.value) == Some(Bytes::from("1")));
        Ok(())
    })
    .await
}
