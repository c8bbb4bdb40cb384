//! TLS on every TCP listener (issue 21), with a CA and certificates made
//! at test time: a 3-node cluster with mutual TLS between peers forms,
//! replicates and fails over; clients with the CA (and a certificate it
//! signed) are served, others are refused with a TLS error; a peer with a
//! certificate from another CA never joins; redis-cli and `/metrics` work
//! over TLS; certificates rotate without a restart; a plain client on a TLS
//! port gets a TLS alert, never an rdkv, Redis or HTTP answer.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rdkv_client::{Client, ClientOptions, ClientTlsFiles, ConnectError, Error, Transport};
use rdkv_tests::numbered::{check_replica, put_all};
use rdkv_tests::pki::{CertFiles, TestCa, replace};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, NodeProc, check, check_with_leader, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "s3cret";

/// The test's certificate authorities: `ca` is the cluster's, `other` a
/// stranger's.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    other: TestCa,
    /// A client certificate `ca` signed.
    client: CertFiles,
}

impl Pki {
    fn new() -> Result<Pki> {
        let dir = tempfile::tempdir()?;
        let ca = TestCa::new(dir.path(), "ca")?;
        let other = TestCa::new(dir.path(), "other")?;
        let client = ca.issue("client", &["client.test".to_owned()])?;
        Ok(Pki {
            dir,
            ca,
            other,
            client,
        })
    }

    /// Client TLS trusting the cluster's CA, showing its client certificate.
    fn client_tls(&self) -> ClientTlsFiles {
        self.ca.client_tls(Some(&self.client))
    }
}

/// Flags giving `node` a certificate for its address from `ca` on every
/// port, requiring client certificates from `ca` and peers' from `peer_ca`.
fn tls_flags(node: &NodeProc, ca: &TestCa, peer_ca: &TestCa) -> Result<Vec<String>> {
    let names = vec![node.client_addr.ip().to_string(), "localhost".to_owned()];
    let front = ca.issue(&format!("node-{}", node.id), &names)?;
    let peer = peer_ca.issue(&format!("peer-{}", node.id), &names)?;
    let path = |p: &std::path::Path| p.display().to_string();
    Ok(vec![
        "--tls-cert".into(),
        path(&front.cert),
        "--tls-key".into(),
        path(&front.key),
        "--tls-ca".into(),
        path(&ca.cert),
        "--peer-tls-cert".into(),
        path(&peer.cert),
        "--peer-tls-key".into(),
        path(&peer.key),
        "--peer-tls-ca".into(),
        path(&peer_ca.cert),
    ])
}

/// `n` nodes with TLS everywhere; node ids in `strangers` get their peer
/// certificate (and peer CA) from the other CA.
fn tls_cluster(pki: &Pki, n: u64, strangers: &[u64]) -> Result<Cluster> {
    let mut cluster = Cluster::start_each(n, &["--token", TOKEN], |node| {
        let peer_ca = if strangers.contains(&node.id) {
            &pki.other
        } else {
            &pki.ca
        };
        node.extra_args = tls_flags(node, &pki.ca, peer_ca)?;
        Ok(())
    })?;
    cluster.set_client_auth(Some(TOKEN), Some(pki.client_tls()));
    Ok(cluster)
}

/// A TCP-only client of `cluster` with `tls` (the shm and Unix socket
/// paths are local and unchanged by TLS: they are not what is tested).
fn tcp_client(cluster: &Cluster, tls: Option<ClientTlsFiles>) -> Result<Client> {
    cluster.client_with(
        Intent::Any,
        ClientOptions {
            transport: Transport::Tcp,
            tls,
            ..cluster.options(Some(TOKEN))
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_peer_mutual_tls_forms_replicates_and_fails_over() -> Result<()> {
    let pki = Pki::new()?;
    let mut cluster = tls_cluster(&pki, 3, &[])?;
    check_with_leader(&mut cluster, 180, async |cluster, leader| {
        let client = tcp_client(cluster, Some(pki.client_tls()))?;
        put_all(&client, 20).await?;
        for id in 1..=3 {
            eventually(LEADER_TIMEOUT, "the keys on every node", async || {
                check_replica(cluster, id, 20).await
            })
            .await?;
        }
        cluster.node_mut(leader)?.kill();
        let next = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        ensure!(next != leader, "node {leader} was killed but still leads");
        client.put("after-failover", "yes").await?;
        let got = client.get("after-failover").await?;
        ensure!(
            got.is_some_and(|v| v.value == "yes".as_bytes()),
            "lost the write"
        );
        for id in (1..=3).filter(|id| *id != leader) {
            check_replica(cluster, id, 20).await?;
        }
        Ok(())
    })
    .await
}

/// The failure must be the TLS layer's, with `words` in its chain.
fn tls_refused<T: std::fmt::Debug>(
    what: &str,
    result: rdkv_client::Result<T>,
    words: &str,
) -> Result<()> {
    match result {
        Err(e @ Error::Connect(ConnectError::Tls { .. })) => {
            let chain = format!("{:#}", anyhow::Error::from(e));
            ensure!(
                chain.contains(words),
                "{what}: {chain:?} does not say {words:?}"
            );
            Ok(())
        }
        other => bail!("{what}: expected a TLS refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_the_ca_and_its_certificate_are_served() -> Result<()> {
    let pki = Pki::new()?;
    let mut cluster = tls_cluster(&pki, 1, &[])?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        let good = tcp_client(cluster, Some(pki.client_tls()))?;
        good.put("k", "v").await?;
        ensure!(good.get("k").await?.is_some(), "k was not read back");

        match tcp_client(cluster, None)?.get("k").await {
            Err(Error::Connect(ConnectError::ServerWantsTls { .. })) => {}
            other => bail!("a plain client: expected ServerWantsTls, got {other:?}"),
        }
        let message = tcp_client(cluster, None)?
            .get("k")
            .await
            .unwrap_err()
            .to_string();
        ensure!(message.contains("speaks TLS"), "unclear error: {message}");

        let stranger_ca = pki.other.client_tls(Some(&pki.client));
        tls_refused(
            "trusting another CA",
            tcp_client(cluster, Some(stranger_ca))?.get("k").await,
            "UnknownIssuer",
        )?;
        let foreign = pki
            .other
            .issue("foreign-client", &["client.test".to_owned()])?;
        let foreign_cert = pki.ca.client_tls(Some(&foreign));
        tls_refused(
            "a client certificate from another CA",
            tcp_client(cluster, Some(foreign_cert))?.get("k").await,
            "alert",
        )?;
        tls_refused(
            "no client certificate",
            tcp_client(cluster, Some(pki.ca.client_tls(None)))?
                .get("k")
                .await,
            "alert",
        )?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_certificate_from_another_ca_cannot_join() -> Result<()> {
    let pki = Pki::new()?;
    let mut cluster = tls_cluster(&pki, 3, &[3])?;
    check(&mut cluster, Duration::from_secs(180), async |cluster| {
        let leader = cluster
            .wait_for_leader_among(&[1, 2], 3, LEADER_TIMEOUT)
            .await?;
        let client = cluster.client_with(
            Intent::Via(&[leader]),
            ClientOptions {
                transport: Transport::Tcp,
                ..cluster.options(Some(TOKEN))
            },
        )?;
        put_all(&client, 10).await?;
        // Both sides refuse the stranger's handshakes, and say so.
        eventually(
            LEADER_TIMEOUT,
            "refused peer handshakes logged",
            async || {
                let logs = cluster.logs();
                ensure!(
                    logs.contains("peer connection from") && logs.contains("TLS handshake failed"),
                    "no refused peer handshake in the logs yet"
                );
                Ok(())
            },
        )
        .await?;
        let stranger = cluster.status_of(3).await?;
        let leader_status = cluster.status_of(leader).await?;
        ensure!(
            stranger.leader_id.is_none()
                && stranger.applied_index + 10 <= leader_status.applied_index,
            "node 3 took part: {stranger:?}, the leader: {leader_status:?}"
        );
        Ok(())
    })
    .await
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn redis_cli(addr: SocketAddr, pki: &Pki, command: &[&str]) -> Result<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut args = vec![
        "-h".to_owned(),
        addr.ip().to_string(),
        "-p".to_owned(),
        addr.port().to_string(),
        "--tls".to_owned(),
        "--cacert".to_owned(),
        path(&pki.ca.cert),
        "--cert".to_owned(),
        path(&pki.client.cert),
        "--key".to_owned(),
        path(&pki.client.key),
        "--user".to_owned(),
        "default".to_owned(),
        "--pass".to_owned(),
        TOKEN.to_owned(),
        "--no-auth-warning".to_owned(),
    ];
    args.extend(command.iter().map(|a| (*a).to_owned()));
    let output = Command::new("redis-cli")
        .args(&args)
        .output()
        .context("running redis-cli")?;
    ensure!(output.status.success(), "redis-cli {command:?}: {output:?}");
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// One HTTP GET over TLS with the harness's client TLS.
async fn https_get(addr: SocketAddr, tls: ClientTlsFiles, path: &str) -> Result<String> {
    let tls = rdkv_tls::ClientTls::load(tls)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut stream = tls.connect(tcp, &addr.to_string()).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    // The server closes after its answer (close_notify or a plain close).
    let _ = stream.read_to_end(&mut response).await;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_metrics_work_over_tls_through_a_follower() -> Result<()> {
    if !have("redis-cli") {
        rdkv_tests::skip::skip(
            "redis_cli_and_metrics_work_over_tls_through_a_follower",
            "redis-cli not installed (apt-get install redis-tools; .ci/run does)",
        );
        return Ok(());
    }
    let pki = Pki::new()?;
    let mut cluster = tls_cluster(&pki, 3, &[])?;
    check_with_leader(&mut cluster, 180, async |cluster, leader| {
        let follower = (1..=3).find(|id| *id != leader).context("no follower")?;
        let addr = cluster.node(follower)?.resp_addr;
        // The follower forwards the write to the leader's TLS client port.
        let set = tokio::task::block_in_place(|| redis_cli(addr, &pki, &["SET", "tls-key", "v1"]))?;
        ensure!(set == "OK", "SET answered {set:?}");
        let leader_addr = cluster.node(leader)?.resp_addr;
        let got =
            tokio::task::block_in_place(|| redis_cli(leader_addr, &pki, &["GET", "tls-key"]))?;
        ensure!(got == "v1", "GET answered {got:?}");
        let http = cluster.node(leader)?.http_addr;
        let metrics = https_get(http, pki.client_tls(), "/metrics").await?;
        ensure!(
            metrics.starts_with("HTTP/1.1 200") && metrics.contains("rdkv_"),
            "/metrics over TLS: {metrics:.200}"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_without_a_restart() -> Result<()> {
    let pki = Pki::new()?;
    let mut cluster = tls_cluster(&pki, 1, &[])?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        let old = tcp_client(cluster, Some(pki.client_tls()))?;
        old.put("k", "before").await?;
        // The node's certificate files, rewritten in place with one the
        // other CA signed; clients keep their certificate from `ca`.
        let node = cluster.node(1)?;
        let live = CertFiles {
            cert: pki.dir.path().join("ca-node-1.pem"),
            key: pki.dir.path().join("ca-node-1.key"),
        };
        let names = vec![node.client_addr.ip().to_string()];
        let rotated = pki.other.issue("node-1-rotated", &names)?;
        replace(&live, &rotated)?;
        let pid = node.pid().context("node 1 is not running")?;
        let hup = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()?;
        ensure!(hup.success(), "kill -HUP {pid}");
        let new_ca = pki.other.client_tls(Some(&pki.client));
        eventually(
            Duration::from_secs(20),
            "the rotated certificate served",
            async || Ok(tcp_client(cluster, Some(new_ca.clone()))?.get("k").await?),
        )
        .await?;
        // New connections of a client trusting only the old CA fail; the
        // one it had open goes on.
        tls_refused(
            "a new client of the old CA",
            tcp_client(cluster, Some(pki.client_tls()))?.get("k").await,
            "UnknownIssuer",
        )?;
        ensure!(old.get("k").await?.is_some(), "the open connection broke");
        ensure!(
            cluster.logs().contains("reloaded the TLS files"),
            "no reload logged"
        );
        Ok(())
    })
    .await
}

/// Everything a plain TCP client gets back from `addr` after `hello`.
async fn plain_answer(addr: SocketAddr, hello: &[u8]) -> Result<Vec<u8>> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(hello).await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .context("the TLS port kept a plain client open")??;
    Ok(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_on_a_tls_port_gets_a_tls_alert() -> Result<()> {
    let pki = Pki::new()?;
    let mut cluster = tls_cluster(&pki, 1, &[])?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        let node = cluster.node(1)?;
        let hello = rdkv_proto::wire::ClientHello::new("plain".to_owned(), Some(TOKEN.to_owned()));
        let native_hello = rdkv_proto::wire::encoded_frame(
            rdkv_proto::wire::FrameKind::ClientHello,
            0,
            &hello,
            rdkv_proto::wire::DEFAULT_MAX_FRAME_BYTES,
        )?;
        let ports: [(&str, SocketAddr, &[u8]); 4] = [
            ("native", node.client_addr, &native_hello),
            ("resp", node.resp_addr, b"AUTH s3cret\r\nPING\r\n"),
            ("http", node.http_addr, b"GET /metrics HTTP/1.1\r\n\r\n"),
            ("peer", node.peer_addr, b"RDKP plain peer hello\r\n"),
        ];
        for (what, addr, hello) in ports {
            let answer = plain_answer(addr, hello).await?;
            // A TLS alert record: content type 21, version 3.x, length 2.
            ensure!(
                matches!(answer.as_slice(), [0x15, 0x03, _, 0x00, 0x02, _, _]),
                "{what}: a plain client got {answer:?}, not one TLS alert"
            );
        }
        Ok(())
    })
    .await
}
