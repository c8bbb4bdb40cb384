//! One-sided GETs through `shm` against a real cluster: no server RPC per
//! GET, correct values, and the consistency checks that make them safe.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use bytes::Bytes;
use rdkv_client::{ClientOptions, Consistency, Transport};
use rdkv_fabric::clock::unix_now_us;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, check_with_leader, client_options, eventually, numbered,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_gets_cost_the_servers_no_rpc() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 90, async |cluster, _| {
        let client = cluster.client_with(
            Intent::Any,
            ClientOptions {
                index_cache_entries: 1024,
                ..client_options(None)
            },
        )?;
        numbered::put_all(&client, 100).await?;
        // Warm up: the client learns the topology and maps the regions.
        client.get("key-000").await?;
        let before = cluster.served_gets().await?;
        let stats_before = client.one_sided_stats().await;
        numbered::get_all(&client, 100, 10).await?;
        let values = client.mget((0..100).map(numbered::key)).await?;
        assert!(values.iter().all(Option::is_some));
        // Without the index cache an MGet's reads go out in two batches.
        let batched = cluster.client(Intent::Any)?;
        let values = batched.mget((0..100).map(numbered::key)).await?;
        numbered::check_all(&values, "batched mget")?;
        ensure!(batched.one_sided_stats().await.served == 100);
        let after = cluster.served_gets().await?;
        let stats = client.one_sided_stats().await;
        println!("one-sided: {stats:?}");
        assert_eq!(after, before, "GETs reached the servers");
        assert_eq!(stats.served - stats_before.served, 1_100);
        assert!(stats.reads.cache_hits > 0, "the index cache was not used");

        // Forced shm: one-sided or an error, never the server.
        let shm_only = cluster.client_with(
            Intent::Any,
            ClientOptions {
                transport: Transport::Shm,
                ..client_options(None)
            },
        )?;
        ensure!(
            shm_only
                .get("key-002")
                .await?
                .is_some_and(|v| v.value == "value-2")
        );
        ensure!(matches!(
            shm_only
                .get_with(Bytes::from_static(b"key-002"), Consistency::Linearizable)
                .await,
            Err(rdkv_client::Error::OneSidedUnavailable)
        ));
        ensure!(cluster.served_gets().await? == after);

        // The client maps the regions of local servers and talks to them
        // over their Unix sockets too: its writes skip TCP.
        let mut unix = 0;
        for id in cluster.nodes.keys() {
            unix += cluster.status_of(*id).await?.served.unix_connections;
        }
        ensure!(unix >= 1, "no client connection used a unix socket");

        // Forced TCP reads do reach the servers (a follower that redirects
        // counts the request too).
        let tcp = cluster.client_with(
            Intent::Any,
            ClientOptions {
                transport: Transport::Tcp,
                ..client_options(None)
            },
        )?;
        tcp.get_with(Bytes::from_static(b"key-001"), Consistency::Lease)
            .await?;
        assert!(cluster.served_gets().await? > after);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_mapped_anew() -> Result<()> {
    // SIGKILL leaves the old region's memfd mapped in the client, still
    // saying "serving": the new incarnation's region has a new epoch, and
    // the client must move to it rather than read the dead one.
    let mut cluster = Cluster::start(1)?;
    check_with_leader(&mut cluster, 90, async |cluster, _| {
        let client = cluster.client_with(
            Intent::Any,
            ClientOptions {
                request_timeout: Duration::from_secs(3),
                ..client_options(None)
            },
        )?;
        client.put("a", "1").await?;
        ensure!(client.get("a").await?.is_some_and(|v| v.value == "1"));
        let epoch_before = cluster.status_of(1).await?.region_epoch;
        cluster.node_mut(1)?.kill();
        cluster.restart(1)?;
        cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        ensure!(cluster.status_of(1).await?.region_epoch != epoch_before);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        eventually(
            Duration::from_secs(20),
            "a write after the restart",
            async || Ok(client.put("a", "2").await?),
        )
        .await?;
        let served_before = client.one_sided_stats().await.served;
        let mut fresh = 0;
        while fresh < 50 {
            match client.get("a").await {
                Ok(Some(v)) if v.value == "2" => fresh += 1,
                Ok(other) => bail!("read {other:?} after the restart's write"),
                Err(_) => {
                    ensure!(
                        std::time::Instant::now() < deadline,
                        "reads never recovered"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        let stats = client.one_sided_stats().await;
        ensure!(
            stats.served > served_before,
            "reads did not go one-sided to the new region: {stats:?}"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_idle_node_keeps_serving_lease_reads_one_sided() -> Result<()> {
    // A sole voter is its own quorum: its lease must not lapse while it is
    // idle (no writes refresh its quorum acknowledgement).
    let mut cluster = Cluster::start(1)?;
    check_with_leader(&mut cluster, 60, async |cluster, _| {
        let writer = cluster.client(Intent::Any)?;
        writer.put("idle", "1").await?;
        let idle_since = unix_now_us();
        // With no request at all, the lease in the node's header is renewed
        // past several election timeouts (50 ms heartbeats: 250-500 ms)
        // of idling: nothing but the sole-voter rule can do that. (How
        // promptly it is renewed depends on the machine's load: a read may
        // find it lapsed for a moment and fall back to RPC.)
        rdkv_tests::eventually(
            Duration::from_secs(30),
            "an idle lease renewal",
            async || {
                // Mapped each time: the region is replaced once when the
                // cluster's hash seed is applied, which under load can come
                // after the write above; the replaced one is never renewed.
                let region = cluster.map_region(1).await?;
                let lease = region.dynamic_header()?.lease_deadline_unix_us;
                ensure!(
                    lease.is_some_and(|deadline| deadline > idle_since + 1_500_000),
                    "lease deadline {lease:?}, idle since {idle_since}"
                );
                Ok(())
            },
        )
        .await?;
        let shm = cluster.client_with(
            Intent::Any,
            ClientOptions {
                transport: Transport::Shm,
                request_timeout: Duration::from_secs(3),
                ..client_options(None)
            },
        )?;
        let mut reads = 0;
        while shm.one_sided_stats().await.served < 20 {
            let got = shm.get("idle").await?;
            ensure!(got.is_some_and(|v| v.value == "1"), "wrong value");
            reads += 1;
            ensure!(reads < 2_000, "{:?}", shm.one_sided_stats().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Follower reads by RPC are served too: the idle leader's view of
        // the commit index is current.
        let tcp = cluster.client_with(
            Intent::Any,
            ClientOptions {
                transport: Transport::Tcp,
                request_timeout: Duration::from_secs(3),
                max_attempts: 1,
                ..client_options(None)
            },
        )?;
        let got = tcp
            .get_with("idle", Consistency::Follower { max_lag_entries: 0 })
            .await?;
        ensure!(got.is_some_and(|v| v.value == "1"), "wrong value");
        Ok(())
    })
    .await
}
