//! The `ofi` (libfabric) transport against real server processes, over the
//! `tcp;ofi_rxm` provider: clients in this process read the nodes' regions
//! with `fi_read` (a real TCP stack, other processes' memory).
//!
//! Built only with `--features ofi` (CI runs it so: `.ci/run`). Where
//! libfabric or its tcp provider is absent at run time the nodes say so in
//! their status and each test skips visibly (failing under CI, which
//! installs libfabric).

#![cfg(feature = "ofi")]

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use bytes::Bytes;
use rdkv_client::{ClientOptions, Consistency, Transport};
use rdkv_fabric::Fabric;
use rdkv_fabric::ofi::client::{OfiSession, descriptor_of};
use rdkv_proto::wire::{OfiRegionGrant, Request, Response};
use rdkv_tests::skip::{skip, this_test};
use rdkv_tests::{Cluster, Intent, check_with_leader, client_options, numbered};

const PROVIDER: &str = "tcp;ofi_rxm";
/// Nodes read over libfabric only: no shm socket, as on another host.
const NODE_ARGS: [&str; 4] = ["--ofi-provider", PROVIDER, "--shm-socket", "off"];

/// Whether node 1 serves ofi with the tcp provider; else a visible skip.
async fn ofi_on(cluster: &Cluster) -> Result<bool> {
    let status = cluster.status_of(1).await?;
    if status.ofi.starts_with(&format!("on: {PROVIDER}")) {
        return Ok(true);
    }
    skip(
        &this_test(),
        &format!("the node's ofi transport: {}", status.ofi),
    );
    Ok(false)
}

fn ofi_options(transport: Transport) -> ClientOptions {
    ClientOptions {
        transport,
        request_timeout: Duration::from_secs(10),
        ..client_options(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_and_follower_gets_by_fi_read_cost_the_servers_no_rpc() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &NODE_ARGS)?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        if !ofi_on(cluster).await? {
            return Ok(());
        }
        let writer = cluster.client(Intent::Any)?;
        numbered::put_all(&writer, 50).await?;
        let client = cluster.client_with(Intent::Any, ofi_options(Transport::Ofi))?;
        // Warm up: the client learns the topology and opens its sessions.
        ensure!(client.get("key-000").await?.is_some());
        let before = cluster.served_gets().await?;
        let stats_before = client.one_sided_stats().await;
        numbered::get_all(&client, 50, 2).await?;
        for i in 0..50 {
            let got = client
                .get_with(
                    Bytes::from(numbered::key(i)),
                    Consistency::Follower {
                        max_lag_entries: 1_000_000,
                    },
                )
                .await?;
            ensure!(
                got.is_some_and(|v| v.value == numbered::value(i)),
                "follower read of key {i}"
            );
        }
        let values = client.mget((0..50).map(numbered::key)).await?;
        numbered::check_all(&values, "mget over ofi")?;
        let stats = client.one_sided_stats().await;
        ensure!(
            cluster.served_gets().await? == before,
            "GETs reached the servers"
        );
        ensure!(
            stats.served - stats_before.served == 200,
            "one-sided GETs: {stats:?}"
        );
        // Forced ofi never goes to the server: a linearizable GET is refused.
        ensure!(matches!(
            client
                .get_with(Bytes::from_static(b"key-001"), Consistency::Linearizable)
                .await,
            Err(rdkv_client::Error::OneSidedUnavailable)
        ));
        Ok(())
    })
    .await
}

/// The grant of `node`'s region, as the client gets it.
async fn grant_of(cluster: &Cluster, node: u64) -> Result<OfiRegionGrant> {
    let client = cluster.client(Intent::Any)?;
    let endpoint = cluster.node(node)?.endpoint();
    match client.send_to(&endpoint, Request::OfiRegion).await? {
        Response::OfiRegion(grant) => Ok(grant),
        other => bail!("no grant: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_without_the_granted_key_cannot_read_the_region() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &NODE_ARGS)?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        if !ofi_on(cluster).await? {
            return Ok(());
        }
        let grant = grant_of(cluster, 2).await?;
        ensure!(grant.provider == PROVIDER && grant.node_id == 2);
        let read = |grant: OfiRegionGrant| {
            tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
                let session = OfiSession::open(grant.clone())?;
                let region = session.fabric().open(&descriptor_of(&grant))?;
                let mut header = vec![0u8; 64];
                region.read(0, &mut header)?;
                Ok(header)
            })
        };
        // The granted key reads the region's header (the other node's memory).
        let header = read(grant.clone()).await??;
        ensure!(header.iter().any(|&b| b != 0), "an empty header");
        // Keys not granted are refused by the node's provider.
        for forged in [grant.key ^ 1, grant.key.rotate_left(17), 1, 0] {
            let attempt = read(OfiRegionGrant {
                key: forged,
                ..grant.clone()
            })
            .await?;
            ensure!(attempt.is_err(), "key {forged:#x} read the region");
        }
        // And the node keeps serving the granted key.
        ensure!(read(grant).await?? == header);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_reads_fails_over_without_a_wrong_value() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &NODE_ARGS)?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        if !ofi_on(cluster).await? {
            return Ok(());
        }
        let writer = cluster.client(Intent::Any)?;
        numbered::put_all(&writer, 40).await?;
        // Auto: ofi first (no shm here), RPC when a one-sided read fails.
        let client = cluster.client_with(Intent::Any, ofi_options(Transport::Auto))?;
        let follower = |i: usize| {
            (
                Bytes::from(numbered::key(i)),
                Consistency::Follower {
                    max_lag_entries: 1_000_000,
                },
            )
        };
        for i in 0..40 {
            let (key, consistency) = follower(i);
            client.get_with(key, consistency).await?;
        }
        ensure!(
            client.one_sided_stats().await.served >= 40,
            "not reading over ofi"
        );
        let victim = cluster
            .nodes
            .keys()
            .copied()
            .find(|id| *id != leader)
            .unwrap_or(1);
        for round in 0..6 {
            if round == 2 {
                cluster.node_mut(victim)?.kill();
            }
            for i in 0..40 {
                let (key, consistency) = follower(i);
                if let Some(got) = client.get_with(key, consistency).await? {
                    ensure!(got.value == numbered::value(i), "wrong value for key {i}");
                } else {
                    bail!("key {i} missing in round {round}");
                }
            }
        }
        // Reads of the killed node's region failed over (to RPC or another
        // replica's region): every GET above answered, with its value.
        println!("after the kill: {:?}", client.one_sided_stats().await);
        Ok(())
    })
    .await
}
