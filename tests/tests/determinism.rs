//! Apply is a pure function of the log and the snapshot: every replica
//! places keys with the cluster's one hash seed (chosen once, carried by the
//! log and by snapshots), through a restart and a snapshot install, and
//! every replica holds the same state: `rdkvctl check` finds the members'
//! state digests equal at an applied index they all passed.

use std::time::Duration;

use anyhow::{Result, ensure};
use rdkv_proto::region::HashSeed;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, SNAPSHOT_OFTEN, binary, check_with_leader, eventually,
    numbered,
};

const KEYS: usize = 400;

/// The hash seed in node `id`'s region header.
async fn seed_of(cluster: &Cluster, id: u64) -> Result<HashSeed> {
    Ok(cluster.map_region(id).await?.layout().hash_seed)
}

/// Every node in `ids` uses one seed, and it is not the placeholder a
/// region starts with before the cluster's seed is applied.
async fn one_seed(cluster: &Cluster, ids: &[u64]) -> Result<HashSeed> {
    let first = seed_of(cluster, ids[0]).await?;
    ensure!(
        first != HashSeed::default(),
        "node {} has no cluster seed",
        ids[0]
    );
    for id in &ids[1..] {
        let seed = seed_of(cluster, *id).await?;
        ensure!(
            seed == first,
            "node {id} has {seed:?}, node {} {first:?}",
            ids[0]
        );
    }
    Ok(first)
}

/// `rdkvctl check -w json` through `endpoint`: its report when it exits 0
/// and says the members agree.
async fn rdkvctl_check(endpoint: &str) -> Result<String> {
    let endpoint = endpoint.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary("rdkvctl"))
            .args(["--endpoints", &endpoint, "-w", "json", "check"])
            .env_remove("RDKV_ENDPOINTS")
            .env_remove("RDKV_TOKEN")
            .output()
    })
    .await??;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success() && report.contains("\"agree\":true"),
        "rdkvctl check ({}): {report} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_uses_the_clusters_hash_seed() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &SNAPSHOT_OFTEN)?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        numbered::put_all(&client, KEYS).await?;
        let seed = eventually(LEADER_TIMEOUT, "one seed on every node", async || {
            one_seed(cluster, &[1, 2, 3]).await
        })
        .await?;

        // A restarted follower rebuilds its region from its snapshot (and
        // the log after it): the same seed.
        let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
        let status = cluster.status_of(follower).await?;
        ensure!(
            status.snapshot_index > 0,
            "no snapshot to restart from: {status:?}"
        );
        cluster.node_mut(follower)?.kill();
        cluster.restart(follower)?;
        eventually(
            LEADER_TIMEOUT,
            "the restarted follower's keys",
            async || numbered::check_replica(cluster, follower, KEYS).await,
        )
        .await?;
        // The replica read above may be answered before the restarted node
        // serves its shm socket (seen once in a full run): wait for it.
        eventually(
            LEADER_TIMEOUT,
            "the restarted follower's seed",
            async || {
                let restarted = seed_of(cluster, follower).await?;
                ensure!(
                    restarted == seed,
                    "the restart changed the seed: {restarted:?}"
                );
                Ok(())
            },
        )
        .await?;

        // A joiner gets the state by snapshot install: the same seed.
        cluster.join(4, leader)?;
        eventually(
            Duration::from_secs(40),
            "node 4 has every key",
            async || numbered::check_replica(cluster, 4, KEYS).await,
        )
        .await?;
        ensure!(
            seed_of(cluster, 4).await? == seed,
            "the joiner has another seed"
        );

        // The four members (one restarted, one joined by snapshot) agree.
        let endpoint = cluster.node(leader)?.endpoint();
        let report = eventually(Duration::from_secs(20), "rdkvctl check", async || {
            rdkvctl_check(&endpoint).await
        })
        .await?;
        ensure!(
            report.matches("\"endpoint\"").count() == 4,
            "not every member was checked: {report}"
        );
        Ok(())
    })
    .await
}
