//! The read fence (on by default): a leader confirms a linearizable read by
//! asking each follower for its persisted Raft vote on its peer connection
//! instead of a ReadIndex heartbeat round. A leader that a newer term has
//! replaced must learn it from those votes, and never serve the value it
//! holds from before the new term: in a single group, and in a shard of a
//! multi-shard cluster, whose fences are answered by a shared connection's
//! reader (`peer::demux`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rdkv_client::{Client, Consistency, Role};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::ShardStatus;
use rdkv_tests::shard_view::{agreed_map, every_shard_led, map_of};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, check_with_leader, eventually};

/// How long the readers at the bridged leader run.
const READING: Duration = Duration::from_secs(3);
/// Readers at once: enough that a fence round is in flight as the bridge
/// reconnects, few enough for a 2-core machine.
const READERS: usize = 8;
/// Bound of one read (the client retries reads on its own).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Node `id`'s `rdkv_read_fence_total` of `shard` for `outcome`; a series
/// not there counts as 0 (the node has not counted one).
async fn fence_count(cluster: &Cluster, id: u64, shard: ShardId, outcome: &str) -> Result<f64> {
    let shard = shard.0.to_string();
    Ok(cluster
        .metrics_of(id)
        .await?
        .get(
            "rdkv_read_fence_total",
            &[("shard", shard.as_str()), ("outcome", outcome)],
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

/// Shard 0, the only one of a single group.
const SINGLE: ShardId = ShardId(0);

/// 20 linearizable reads of "moved" at `old`, which leads `shard`: shows that
/// the fence is on and opens its connections (kept, and used again once
/// the bridge is back).
async fn warm_up(cluster: &Cluster, old: u64, shard: ShardId) -> Result<()> {
    let at_old = cluster.tcp_client_via(&[old])?;
    for _ in 0..20 {
        at_old.get_with("moved", Consistency::Linearizable).await?;
    }
    let confirmed = fence_count(cluster, old, shard, "confirmed").await?;
    ensure!(
        confirmed > 0.0,
        "20 linearizable reads at {old}, leader of shard {}, confirmed no fence round: \
         is the read fence on?",
        shard.0
    );
    Ok(())
}

/// The nodes of a cut: `old` leads `shard` in its own view, in an earlier
/// term than `new`, which leads it on the other side beside `bridge`.
struct Cut {
    shard: ShardId,
    old: u64,
    new: u64,
    bridge: u64,
}

/// The other side of the cut writes "new" in the later term: acknowledged
/// by `new` and the follower beside it, which becomes the bridge.
async fn write_new(
    cluster: &Cluster,
    shard: ShardId,
    (old, new): (u64, u64),
    others: &[u64],
) -> Result<Cut> {
    let bridge = others
        .iter()
        .copied()
        .find(|&id| id != new)
        .context("no follower beside the new leader")?;
    cluster.tcp_client_via(others)?.put("moved", "new").await?;
    Ok(Cut {
        shard,
        old,
        new,
        bridge,
    })
}

/// Opens `old` <-> bridge again (old <-> new stays cut), then reads at
/// `old` for a while: every linearizable read must return "new" (or
/// fail), no fence round may confirm, and one must see the bridge's
/// later vote.
async fn bridge_and_read(cluster: &Cluster, cut: &Cut) -> Result<()> {
    let Cut {
        shard,
        old,
        new,
        bridge,
    } = *cut;
    let confirmed_before = fence_count(cluster, old, shard, "confirmed").await?;
    let no_quorum_before = fence_count(cluster, old, shard, "no_quorum").await?;
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
    let confirmed_after = fence_count(cluster, old, shard, "confirmed").await?;
    ensure!(
        confirmed_after == confirmed_before,
        "{old} confirmed {} fence rounds with only the bridge {bridge} (in a later term) \
         reachable",
        confirmed_after - confirmed_before
    );
    let higher = fence_count(cluster, old, shard, "higher_vote").await?;
    let no_quorum = fence_count(cluster, old, shard, "no_quorum").await? - no_quorum_before;
    ensure!(
        higher >= 1.0,
        "no fence round saw the bridge's newer vote while {old} led: only the fallback ran \
         ({no_quorum} rounds there reached no quorum)"
    );
    cluster.heal().await
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
    // election within 1.5-3 s of the cut. The fence is on by default.
    let mut cluster = Cluster::start_with(3, &["--fault-injection", "--heartbeat-ms", "300"])?;
    check_with_leader(&mut cluster, 180, async |cluster, old| {
        let all = cluster.tcp_client_via(&[1, 2, 3])?;
        all.put("moved", "old").await?;
        cluster
            .wait_applied(old, all.put("fence", "1").await?, LEADER_TIMEOUT)
            .await?;
        warm_up(cluster, old, SINGLE).await?;

        let others: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
        // No reads at `old` from here until the bridge is back: a fallback
        // ReadIndex round would not reach a quorum anyway.
        cluster.isolate(old, &others).await?;
        let new = cluster
            .wait_for_leader_among(&others, old, LEADER_TIMEOUT)
            .await?;
        // Acknowledged in term T+1, by the new leader and the bridge.
        let cut = write_new(cluster, SINGLE, (old, new), &others).await?;
        let bridge = cut.bridge;

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
        bridge_and_read(cluster, &cut).await
    })
    .await
}

/// Node `id`'s replica of `shard`, from its own `ShardStatus`.
async fn shard_status(cluster: &Cluster, id: u64, shard: ShardId) -> Result<ShardStatus> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let statuses = client
        .shard_statuses_of(&cluster.node(id)?.endpoint())
        .await?;
    statuses
        .into_iter()
        .find(|s| s.shard == shard)
        .with_context(|| format!("node {id} hosts no replica of shard {}", shard.0))
}

/// The same cut in one shard of a multi-shard cluster (every node hosts
/// every shard): there a follower's fence answers come from the reader of
/// the node's shared peer connection, ahead of the shard's queue, and the
/// leader's calls share its Raft link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shards_leader_bridged_to_the_new_term_serves_no_stale_linearizable_read() -> Result<()> {
    const SHARDS: usize = 2;
    let flags = ["--fault-injection", "--heartbeat-ms", "300"];
    let placement = ["--shards", "2", "--replicas", "3"];
    let mut cluster = Cluster::start_with(3, &[&flags[..], &placement[..]].concat())?;
    check(&mut cluster, Duration::from_secs(180), async |cluster| {
        let leaders = every_shard_led(cluster, &[1, 2, 3], SHARDS, LEADER_TIMEOUT).await?;
        // The readers' client routes by the map it fetches: with only some
        // nodes' addresses in it (each node publishes its own after start),
        // it may never reach `old`, and no fence round runs there (one
        // failed run: the reads went to the new leader).
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &[1, 2, 3]).await,
        )
        .await?;
        let shard = map_of(cluster, 1).await?.shard_of_key(b"moved");
        let old = *leaders
            .get(&shard)
            .context("the key's shard has no leader")?;
        let all = cluster.tcp_client_via(&[1, 2, 3])?;
        all.put("moved", "old").await?;
        warm_up(cluster, old, shard).await?;

        let others: Vec<u64> = (1..=3).filter(|&id| id != old).collect();
        cluster.isolate(old, &others).await?;
        let what = format!("a new leader of shard {} among {others:?}", shard.0);
        let new = eventually(LEADER_TIMEOUT, &what, async || {
            for &id in &others {
                let status = shard_status(cluster, id, shard).await?;
                if let Some(leader) = status.leader_id.filter(|l| others.contains(l)) {
                    return Ok(leader);
                }
            }
            bail!("no leader of shard {} among {others:?} yet", shard.0)
        })
        .await?;
        let cut = write_new(cluster, shard, (old, new), &others).await?;
        let bridge = cut.bridge;

        // The premises: `old` still leads the shard in its own view, in an
        // earlier term than the bridge's (it was cut before "new" was
        // written, so its replica holds "old").
        let old_status = shard_status(cluster, old, shard).await?;
        ensure!(
            old_status.role == Role::Leader,
            "the cut-off leader {old} no longer leads shard {} ({:?}): nothing to fence",
            shard.0,
            old_status.role
        );
        let bridge_term = shard_status(cluster, bridge, shard).await?.term;
        ensure!(
            bridge_term > old_status.term,
            "the bridge {bridge} is in term {bridge_term} of shard {}, not after {old}'s {}",
            shard.0,
            old_status.term
        );
        bridge_and_read(cluster, &cut).await
    })
    .await
}
