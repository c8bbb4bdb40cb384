//! The `rdma` transport against real server processes.
//!
//! - Without a device (every CI run): a node says why RDMA is off, in its
//!   log and its status, and clients with `Transport::Auto` work over
//!   shm/tcp; a client forcing `Transport::Rdma` gets
//!   `OneSidedUnavailable`, never a hang.
//! - With a device (`RDKV_RDMA_DEVICE=<name>`, tests built with
//!   `--features rdma`): GETs over RDMA READs with zero server GET RPCs,
//!   writes over SEND/RECV (large values fragmented), torn-read stress, and
//!   connection loss. Without the variable each prints a
//!   `<test>: skipped: ...` line that `cargo test` shows even without
//!   `--nocapture`, and returns.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use rdkv_client::{ClientOptions, Transport};
use rdkv_tests::shard_view::{agreed_map, node_ids};
use rdkv_tests::skip::{skip, skip_without_hardware, this_test};
use rdkv_tests::stress_value::{check, encode};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, client_options, eventually, numbered};

/// The device named by `RDKV_RDMA_DEVICE`, or `None` after saying (visibly,
/// past the harness's capture) why the test is skipped. A device named for
/// tests built without the rdma feature is a mistake in the run, not a
/// missing device: that skip fails under CI.
fn rdma_device(test: &str) -> Option<String> {
    match std::env::var("RDKV_RDMA_DEVICE") {
        Ok(device) if !device.is_empty() => {
            if !cfg!(feature = "rdma") {
                skip(
                    test,
                    "RDKV_RDMA_DEVICE is set but the tests were built without --features rdma",
                );
                return None;
            }
            Some(device)
        }
        _ => {
            skip_without_hardware(
                test,
                "RDKV_RDMA_DEVICE not set (no RDMA device on this host)",
            );
            None
        }
    }
}

/// Runs `body` against a cluster of `nodes` serving RDMA on the test device
/// (`extra_args` added to each node's), within two minutes; without a
/// device, says why the test is skipped and passes.
async fn with_rdma_cluster(
    nodes: u64,
    extra_args: &[&str],
    body: impl AsyncFnOnce(&mut Cluster, &str) -> Result<()>,
) -> Result<()> {
    let Some(device) = rdma_device(&this_test()) else {
        return Ok(());
    };
    let mut args = vec!["--rdma-device", device.as_str()];
    args.extend_from_slice(extra_args);
    let mut cluster = Cluster::start_with(nodes, &args)?;
    rdkv_tests::check_with_leader(&mut cluster, 120, async |cluster, _| {
        body(cluster, &device).await
    })
    .await
}

fn rdma_options(device: &str) -> ClientOptions {
    ClientOptions {
        transport: Transport::Rdma,
        rdma_device: Some(device.to_owned()),
        request_timeout: Duration::from_secs(10),
        ..client_options(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_device_the_node_says_why_and_auto_clients_still_work() -> Result<()> {
    // A device named here but absent must turn RDMA off, not stop the node.
    let mut cluster = Cluster::start_with(1, &["--rdma-device", "rdkv-no-such-device"])?;
    rdkv_tests::check_with_leader(&mut cluster, 60, async |cluster, _| {
        let status = cluster.status_of(1).await?;
        ensure!(
            status.rdma.starts_with("off: "),
            "status says rdma is {:?}",
            status.rdma
        );
        if cfg!(feature = "rdma") {
            // Built with the verbs backend: the reason is the host's.
            ensure!(
                !status.rdma.contains("built without"),
                "a binary built with the rdma feature says {:?}",
                status.rdma
            );
        } else {
            ensure!(status.rdma.contains("built without the rdma feature"));
        }
        let log = cluster.node(1)?.log();
        ensure!(
            log.contains("rdma transport off:"),
            "the node did not log why rdma is off:\n{log}"
        );

        let auto = cluster.client_with(
            Intent::Any,
            ClientOptions {
                rdma_device: Some("rdkv-no-such-device".into()),
                ..client_options(None)
            },
        )?;
        for i in 0..20 {
            auto.put(format!("k{i}"), format!("v{i}")).await?;
        }
        let before = cluster.served_gets().await?;
        for i in 0..20 {
            let got = auto.get(format!("k{i}")).await?;
            ensure!(got.is_some_and(|v| v.value == format!("v{i}").as_bytes()));
        }
        // Same host: the reads were one-sided through shm.
        let stats = auto.one_sided_stats().await;
        ensure!(stats.served >= 20, "one-sided stats {stats:?}");
        ensure!(
            cluster.served_gets().await? == before,
            "GETs reached the server"
        );

        // Forcing rdma where there is none fails fast, it does not fall back.
        let forced = cluster.client_with(
            Intent::Any,
            ClientOptions {
                transport: Transport::Rdma,
                rdma_device: Some("rdkv-no-such-device".into()),
                ..client_options(None)
            },
        )?;
        let started = Instant::now();
        let got = forced.get("k1").await;
        ensure!(
            matches!(got, Err(rdkv_client::Error::OneSidedUnavailable)),
            "forced rdma without a device: {got:?}"
        );
        ensure!(started.elapsed() < Duration::from_secs(5));
        // Writes still go by RPC.
        forced.put("k1", "again").await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_gets_cost_the_servers_no_rpc() -> Result<()> {
    with_rdma_cluster(3, &[], async |cluster, device| {
        for id in 1..=3 {
            let status = cluster.status_of(id).await?;
            ensure!(
                status.rdma.starts_with("on: "),
                "node {id}: {}",
                status.rdma
            );
        }
        let client = cluster.client_with(
            Intent::Any,
            ClientOptions {
                index_cache_entries: 1024,
                ..rdma_options(device)
            },
        )?;
        numbered::put_all(&client, 100).await?;
        client.get("key-000").await?;
        let before = cluster.served_gets().await?;
        numbered::get_all(&client, 100, 10).await?;
        // An MGet without the index cache: two batches of chained READs.
        let batched = cluster.client_with(Intent::Any, rdma_options(device))?;
        let values = batched.mget((0..100).map(numbered::key)).await?;
        numbered::check_all(&values, "mget")?;
        ensure!(
            cluster.served_gets().await? == before,
            "GETs reached the servers"
        );
        let stats = client.one_sided_stats().await;
        ensure!(stats.served >= 1_000, "{stats:?}");
        ensure!(stats.reads.cache_hits > 0, "{stats:?}");
        // Linearizable reads are never one-sided.
        rdkv_tests::ensure_linearizable_refused(&client).await
    })
    .await
}

/// A cluster of six shards (`--shards 6 --replicas 3`): the client opens a
/// session per (node, shard), each granted that shard's region, and reads
/// every key of every shard by RDMA READs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_gets_of_every_shard_cost_the_servers_no_rpc() -> Result<()> {
    const KEYS: usize = 300;
    let flags = ["--shards", "6", "--replicas", "3"];
    with_rdma_cluster(3, &flags, async |cluster, device| {
        let ids = node_ids(cluster);
        eventually(
            LEADER_TIMEOUT,
            "every node's address in every map",
            async || agreed_map(cluster, &ids).await,
        )
        .await?;
        numbered::put_all(&cluster.client(Intent::Any)?, KEYS).await?;
        let client = cluster.client_with(Intent::Any, rdma_options(device))?;
        eventually(LEADER_TIMEOUT, "a first read over rdma", async || {
            ensure!(client.get(numbered::key(0)).await?.is_some());
            Ok(())
        })
        .await?;
        let before = cluster.served_gets().await?;
        numbered::get_all(&client, KEYS, 2).await?;
        let values = client.mget((0..KEYS).map(numbered::key)).await?;
        numbered::check_all(&values, "mget across shards")?;
        ensure!(
            cluster.served_gets().await? == before,
            "GETs reached the servers"
        );
        let stats = client.one_sided_stats().await;
        ensure!(stats.served >= 3 * KEYS as u64, "{stats:?}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_writes_go_over_send_recv() -> Result<()> {
    with_rdma_cluster(1, &[], async |cluster, device| {
        let client = cluster.client_with(Intent::Any, rdma_options(device))?;
        client.put("warm", "up").await?;
        // Attaching over rdma moves this client's requests to the session.
        ensure!(client.get("warm").await?.is_some());
        let tcp_before = cluster.status_of(1).await?.served.tcp_connections;
        // Values of every size, up to several receive buffers (fragments).
        for (i, len) in [0usize, 1, 1000, 64 * 1024, 300 * 1024, 1024 * 1024 - 64]
            .into_iter()
            .enumerate()
        {
            let value: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
            let version = client.put(format!("big-{i}"), value.clone()).await?;
            let got = client.get(format!("big-{i}")).await?;
            ensure!(
                got.as_ref()
                    .is_some_and(|v| v.value == value.as_slice() && v.version == version),
                "value of {len} bytes did not round trip"
            );
        }
        let pairs: Vec<(String, String)> = (0..200)
            .map(|i| (format!("m{i}"), format!("{i}")))
            .collect();
        client.mput(pairs).await?;
        ensure!(client.get("m199").await?.is_some_and(|v| v.value == "199"));
        let status = cluster.status_of(1).await?;
        ensure!(status.served.put >= 7 && status.served.mput >= 1);
        // The status call above is this test's own; the writes opened no
        // new TCP connection.
        ensure!(
            status.served.tcp_connections <= tcp_before + 1,
            "writes opened tcp connections: {} -> {}",
            tcp_before,
            status.served.tcp_connections
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_reads_under_a_writer_flat_out_are_never_torn() -> Result<()> {
    with_rdma_cluster(1, &["--grace-period-ms", "20"], async |cluster, device| {
        let keys: Vec<String> = (0..8).map(|i| format!("hot-{i}")).collect();
        let writer = cluster.client(Intent::Any)?;
        for key in &keys {
            writer.put(key.clone(), encode(key, 0)).await?;
        }
        let reader = cluster.client_with(Intent::Any, rdma_options(device))?;
        let stop = Instant::now() + Duration::from_secs(5);
        let write_keys = keys.clone();
        let writing = tokio::spawn(async move {
            let mut seq = 1u64;
            while Instant::now() < stop {
                for key in &write_keys {
                    writer.put(key.clone(), encode(key, seq)).await?;
                }
                seq += 1;
            }
            anyhow::Ok(seq)
        });
        let mut last = vec![0u64; keys.len()];
        let mut reads = 0u64;
        while Instant::now() < stop {
            for (i, key) in keys.iter().enumerate() {
                let Some(v) = reader.get(key.clone()).await? else {
                    bail!("{key} vanished");
                };
                let seq = check(key.as_bytes(), &v.value).map_err(anyhow::Error::msg)?;
                ensure!(seq >= last[i], "{key} went back from {} to {seq}", last[i]);
                last[i] = seq;
                reads += 1;
            }
        }
        let written = writing.await??;
        let stats = reader.one_sided_stats().await;
        println!("{reads} reads over rdma, {written} write rounds, {stats:?}");
        ensure!(stats.served > 0, "no read was served over rdma: {stats:?}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_rdma_connection_falls_back_and_reconnects() -> Result<()> {
    with_rdma_cluster(1, &[], async |cluster, device| {
        let client = cluster.client_with(
            Intent::Any,
            ClientOptions {
                rdma_device: Some(device.to_owned()),
                ..client_options(None)
            },
        )?;
        client.put("k", "v1").await?;
        ensure!(client.get("k").await?.is_some_and(|v| v.value == "v1"));
        let served_before = client.one_sided_stats().await.served;
        // The node dies: its queue pairs and its region registration go.
        cluster.node_mut(1)?.kill();
        cluster.restart(1)?;
        cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        // The client notices (failed completions or a new epoch), falls
        // back, then attaches again; values stay right throughout.
        rdkv_tests::eventually(
            Duration::from_secs(30),
            "reads after restart",
            async || match client.get("k").await? {
                Some(v) if v.value == "v1" => Ok(()),
                other => bail!("after restart: {other:?}"),
            },
        )
        .await?;
        client.put("k", "v2").await?;
        rdkv_tests::eventually(Duration::from_secs(30), "one-sided again", async || {
            ensure!(client.get("k").await?.is_some_and(|v| v.value == "v2"));
            ensure!(client.one_sided_stats().await.served > served_before + 1);
            Ok(())
        })
        .await?;
        Ok(())
    })
    .await
}
