//! The read fence (`--read-fence`): a leader confirms a linearizable read by
//! asking each follower for its persisted Raft vote on its peer connection
//! instead of a ReadIndex heartbeat round. A leader that a newer term has
//! replaced must learn it from those votes, and never serve the value it
//! holds from before the new term.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use rdkv_client::{Client, Consistency, Role};
use rdkv_tests::{Cluster, LEADER_TIMEOUT, check_with_leader};

/// How long the readers at the bridged leader run.
const READING: Duration = Duration::from_secs(3);
/// Readers at once: enough that a fence round is in flight as the bridge
/// reconnects, few enough for a 2-core machine.
const READERS: usize = 8;
/// Bound of one read (the client retries reads on its own).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Node `id`'s `rdkv_read_fence_total` of shard 0 for `outcome`; a series
/// not there counts as 0 (the node has not counted one).
async fn fence_count(cluster: &Cluster, id: u64, outcome: &str) -> Result<f64> {
    Ok(cluster
        .metrics_of(id)
        .await?
        .get(
            "rdkv_read_fence_total",
            &[("shard", "0"), ("outcome", outcome)],
        )
        .unwrap_or(0.0))
}

/// Linearizable GETs of "moved" at `client` until `until`; returns the
/// values read (`None`: absent). Errors and redirects are not failures:
/// a deposed leader may refuse or redirect, it must not answer stale.
async fn read_until(client: Client, until: Instant) -> Vec<Option<String>> {
    let mut seen = Vec::new();
    while Instant::now() < until {
        let read = tokio::time::timeout(
            READ_TIMEOUT,
            client.get_with("moved", Consistency::Linearizable),
        )
        .await;
        match read {
            Ok(Ok(got)) => {
                seen.push(got.map(|v| String::from_utf8_lossy(&v.value).into_owned()));
            }
            // A refused read comes back at once: pause so that eight readers
            // do not spin the two cores the nodes need.
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    seen
}

/// Leader `old` is cut off from both followers; they elect a new leader and
/// commit "new" in term T+1. Then `old` reaches one of them again, the
/// bridge (it has voted in T+1), but still not the new leader. `old`'s Raft
/// still thinks it leads in T, and its region holds "old": a fence round
/// that took any answer as agreement would confirm a quorum {old, bridge}
/// and serve "old". The bridge's vote (T+1) must make the round fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_bridged_to_the_new_term_serves_no_stale_linearizable_read() -> Result<()> {
    // Loopback and the fault hook on purpose: the cut is asymmetric (old
    // reaches the bridge, not the new leader), which the netns partitions
    // into disjoint groups cannot make. 300 ms heartbeats leave a window of
    // up to one interval before openraft on `old` hears the newer term by
    // itself (a fence that took any answer serves "old" meanwhile), and an
    // election within 1.5-3 s of the cut.
    let mut cluster = Cluster::start_with(
        3,
        &["--fault-injection", "--read-fence", "--heartbeat-ms", "300"],
    )?;
    check_with_leader(&mut cluster, 180, async |cluster, old| {
        let all = cluster.tcp_client_via(&[1, 2, 3])?;
        all.put("moved", "old").await?;
        cluster
            .wait_applied(old, all.put("fence", "1").await?, LEADER_TIMEOUT)
            .await?;

        // Warm-up: shows that the flag is on, and opens the fence's
        // connections (kept, and used again once the bridge is back).
        let at_old = cluster.tcp_client_via(&[old])?;
        for _ in 0..20 {
            at_old.get_with("moved", Consistency::Linearizable).await?;
        }
        let confirmed = fence_count(cluster, old, "confirmed").await?;
        ensure!(
            confirmed > 0.0,
            "20 linearizable reads at leader {old} confirmed no fence round: is --read-fence on?"
        );

        let others: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
        // No reads at `old` from here until the bridge is back: a fallback
        // ReadIndex round would not reach a quorum anyway.
        cluster.isolate(old, &others).await?;
        let new = cluster
            .wait_for_leader_among(&others, old, LEADER_TIMEOUT)
            .await?;
        let bridge = others
            .iter()
            .copied()
            .find(|&id| id != new)
            .context("no follower beside the new leader")?;
        // Acknowledged in term T+1, by the new leader and the bridge.
        cluster.tcp_client_via(&others)?.put("moved", "new").await?;

        // The premises. `old` still leads in its own view (alpha.37 steps
        // down only a leader removed from the membership), and holds "old";
        // the bridge is in the newer term.
        let old_status = cluster.status_of(old).await?;
        ensure!(
            old_status.role == Role::Leader,
            "the cut-off leader {old} no longer leads ({:?}): nothing to fence",
            old_status.role
        );
        let held = cluster.map_region(old).await?.get(b"moved")?;
        ensure!(
            held.as_ref().is_some_and(|v| v.value == "old"),
            "the cut-off leader {old} should hold the stale version, not {held:?}"
        );
        let bridge_term = cluster.status_of(bridge).await?.term;
        ensure!(
            bridge_term > old_status.term,
            "the bridge {bridge} is in term {bridge_term}, not after {old}'s {}",
            old_status.term
        );

        // old <-> bridge open again; old <-> new still cut.
        let confirmed_before = fence_count(cluster, old, "confirmed").await?;
        cluster.isolate(old, &[new]).await?;
        let until = Instant::now() + READING;
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                Ok(tokio::spawn(read_until(
                    cluster.tcp_client_via(&[old])?,
                    until,
                )))
            })
            .collect::<Result<_>>()?;
        let mut seen = Vec::new();
        for reader in readers {
            seen.extend(reader.await?);
        }
        let stale = seen.iter().filter(|v| v.as_deref() != Some("new"));
        let stale_values: std::collections::BTreeSet<_> = stale.clone().collect();
        ensure!(
            stale_values.is_empty(),
            "{} of {} linearizable reads at {old} (bridged to {bridge}, cut from {new}) \
             did not return \"new\" but one of {stale_values:?}",
            stale.count(),
            seen.len()
        );
        println!(
            "{} linearizable reads at {old} after the bridge, all \"new\"",
            seen.len()
        );
        // No quorum holds T any more: the bridge answers T+1, the new
        // leader nothing. Whatever the reads returned, no round confirms.
        let confirmed_after = fence_count(cluster, old, "confirmed").await?;
        ensure!(
            confirmed_after == confirmed_before,
            "{old} confirmed {} fence rounds with only the bridge {bridge} (in a later term) \
             reachable",
            confirmed_after - confirmed_before
        );
        let higher = fence_count(cluster, old, "higher_vote").await?;
        ensure!(
            higher >= 1.0,
            "no fence round saw the bridge's newer vote while {old} led: only the fallback ran"
        );
        cluster.heal().await
    })
    .await
}
