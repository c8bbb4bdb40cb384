//! Security against a real node with a token: without the right token no
//! path serves anything (data, admin, snapshots, fault injection, the shm
//! region fd); with it, admin works; fault injection needs the node to have
//! been started for it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_client::{Client, ClientOptions, ConnectError, Error, ErrorCode, Fault, Transport};
use rdkv_tests::{Cluster, Intent, check, client_options, eventually};

const TOKEN: &str = "s3cret";

fn client(cluster: &Cluster, token: Option<&str>) -> Result<Client> {
    cluster.client_with(
        Intent::Any,
        ClientOptions {
            transport: Transport::Tcp,
            request_timeout: Duration::from_secs(5),
            max_attempts: 2,
            ..client_options(token)
        },
    )
}

/// A client with the right token, once the node has taken `key` = `value`
/// through it (the node leads).
async fn writing_client(cluster: &Cluster, key: &str, value: &str) -> Result<Client> {
    let good = client(cluster, Some(TOKEN))?;
    eventually(Duration::from_secs(20), "a leader", async || {
        Ok(good.put(key.to_owned(), value.to_owned()).await?)
    })
    .await?;
    Ok(good)
}

/// The failure must be the handshake refusing the token, nothing else.
fn refused<T: std::fmt::Debug>(what: &str, result: rdkv_client::Result<T>) -> Result<()> {
    match result {
        Err(Error::Connect(ConnectError::Handshake {
            code: ErrorCode::Unauthenticated,
            ..
        })) => Ok(()),
        other => anyhow::bail!("{what}: expected an Unauthenticated handshake, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_served_without_the_token() -> Result<()> {
    let mut cluster = Cluster::start_with(1, &["--token", TOKEN, "--fault-injection"])?;
    check(&mut cluster, Duration::from_secs(60), async |cluster| {
        let good = writing_client(cluster, "secret", "value").await?;
        let endpoint = cluster.node(1)?.client_addr.to_string();
        let snapshot_path = cluster.root().join("stolen.snap");
        for token in [None, Some("wrong")] {
            let bad = client(cluster, token)?;
            refused("get", bad.get("secret").await)?;
            refused("put", bad.put("secret", "x").await)?;
            refused("scan", bad.scan("", 10).await)?;
            refused("status", bad.status().await)?;
            refused("members", bad.members().await)?;
            refused(
                "add member",
                bad.add_member(9, "127.0.0.9:1", "127.0.0.9:2", true).await,
            )?;
            refused("remove member", bad.remove_member(1).await)?;
            refused("move leader", bad.move_leader(1).await)?;
            refused("clear", bad.clear().await)?;
            refused("snapshot", bad.snapshot_to_file(&snapshot_path).await)?;
            refused(
                "inject fault",
                bad.inject_fault(&endpoint, Fault::SlowFsync { delay_ms: 1000 })
                    .await,
            )?;
            ensure!(!snapshot_path.exists(), "a snapshot was written");

            // The region's fd is not handed out either.
            let shm_socket = PathBuf::from(
                good.status()
                    .await?
                    .shm_socket
                    .context("the node serves shm")?,
            );
            let attached = rdkv_fabric::attach_shm(&shm_socket, token, "intruder").await;
            ensure!(attached.is_err(), "shm attach without the token succeeded");
        }
        // Nothing changed, and the right token still works for admin.
        ensure!(
            good.get("secret")
                .await?
                .is_some_and(|v| v.value == "value")
        );
        ensure!(good.members().await?.len() == 1);
        good.inject_fault(&endpoint, Fault::Heal).await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_is_refused_unless_enabled() -> Result<()> {
    let mut cluster = Cluster::start_with(1, &["--token", TOKEN])?;
    check(&mut cluster, Duration::from_secs(60), async |cluster| {
        let good = writing_client(cluster, "k", "v").await?;
        let endpoint = cluster.node(1)?.client_addr.to_string();
        match good
            .inject_fault(&endpoint, Fault::Isolate { peers: vec![2, 3] })
            .await
        {
            Err(Error::Server(reply)) if reply.code == ErrorCode::InvalidRequest => Ok(()),
            other => anyhow::bail!("fault injection on a normal node: {other:?}"),
        }
    })
    .await
}
