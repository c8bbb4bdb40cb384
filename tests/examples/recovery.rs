//! Time to recover: a node holding 100 000 keys (100-byte values) is stopped
//! and restarted; we measure from the restart to the first successful
//! linearizable read and to all keys being present, once recovering by log
//! replay and once from a snapshot. The same data in a real redis-server with
//! an fsync-always AOF is restarted the same way, in the same run, as a peer.
//!
//! `cargo run --release -p rdkv-tests --example recovery`
//! (redis-server must be on PATH for the comparison; it is skipped otherwise).

use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use rdkv_proto::wire::Consistency;
use rdkv_tests::{Cluster, Intent, free_port};

const KEYS: usize = 100_000;
const BATCH: usize = 1_000;
const VALUE_BYTES: usize = 100;

fn value(i: usize) -> Bytes {
    let mut v = format!("{i:010}").into_bytes();
    v.resize(VALUE_BYTES, b'v');
    Bytes::from(v)
}

async fn rdkv_recovery(label: &str, extra: &[&str]) -> Result<(Duration, Duration)> {
    let mut cluster = Cluster::start_with(1, extra)?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let client = cluster.client(Intent::Any)?;
    for batch in 0..KEYS / BATCH {
        let pairs = (batch * BATCH..(batch + 1) * BATCH)
            .map(|i| (Bytes::from(format!("key{i:08}")), value(i)))
            .collect::<Vec<_>>();
        client.mput(pairs).await?;
    }
    cluster.node_mut(1)?.stop()?;
    let started = Instant::now();
    cluster.restart(1)?;
    let client = cluster.client(Intent::Any)?;
    let probe = Bytes::from(format!("key{:08}", KEYS - 1));
    let first_read = loop {
        if let Ok(Some(v)) = client
            .get_with(probe.clone(), Consistency::Linearizable)
            .await
            && v.value == value(KEYS - 1)
        {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("{label}: no read within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let all = loop {
        if let Ok(status) = client.status().await
            && status.region.live_keys == KEYS as u64
        {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    cluster.node_mut(1)?.stop()?;
    Ok((first_read, all))
}

fn redis(port: u16, dir: &std::path::Path) -> Result<Child> {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server")
}

fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn redis_recovery() -> Result<Option<(Duration, Duration)>> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        return Ok(None);
    }
    let dir = tempfile::tempdir()?;
    let port = free_port("127.0.0.1");
    let mut server = redis(port, dir.path())?;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Same data, MSET batches of the same size, through redis-cli --pipe.
    let mut input = Vec::new();
    for batch in 0..KEYS / BATCH {
        write!(input, "*{}\r\n$4\r\nMSET\r\n", 1 + 2 * BATCH)?;
        for i in batch * BATCH..(batch + 1) * BATCH {
            let key = format!("key{i:08}");
            let v = value(i);
            write!(input, "${}\r\n{key}\r\n${}\r\n", key.len(), v.len())?;
            input.extend_from_slice(&v);
            input.extend_from_slice(b"\r\n");
        }
    }
    let mut pipe = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    pipe.stdin
        .take()
        .context("redis-cli stdin")?
        .write_all(&input)?;
    pipe.wait()?;
    if redis_cli(port, &["DBSIZE"]).as_deref() != Some(&KEYS.to_string()) {
        bail!("redis did not load {KEYS} keys");
    }
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()?;
    server.wait()?;
    let started = Instant::now();
    let mut server = redis(port, dir.path())?;
    let probe = format!("key{:08}", KEYS - 1);
    let first_read = loop {
        if let Some(v) = redis_cli(port, &["GET", &probe])
            && v.starts_with(&format!("{:010}", KEYS - 1))
        {
            break started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let all = loop {
        if redis_cli(port, &["DBSIZE"]).as_deref() == Some(&KEYS.to_string()) {
            break started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = server.kill();
    let _ = server.wait();
    Ok(Some((first_read, all)))
}

#[tokio::main]
async fn main() -> Result<()> {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("recovery of {KEYS} keys x {VALUE_BYTES} B values (time from restart)");
    println!(
        "{:<42} {:>16} {:>16}",
        "system", "first read (ms)", "all keys (ms)"
    );
    let (r, a) = rdkv_recovery("log replay", &[]).await?;
    println!(
        "{:<42} {:>16.1} {:>16.1}",
        "rdkv, 1 node, log replay",
        ms(r),
        ms(a)
    );
    let (r, a) = rdkv_recovery(
        "snapshot",
        &["--snapshot-entries", "10", "--snapshot-keep-entries", "0"],
    )
    .await?;
    println!(
        "{:<42} {:>16.1} {:>16.1}",
        "rdkv, 1 node, snapshot + log tail",
        ms(r),
        ms(a)
    );
    match redis_recovery()? {
        Some((r, a)) => println!(
            "{:<42} {:>16.1} {:>16.1}",
            "redis-server 7, AOF fsync always",
            ms(r),
            ms(a)
        ),
        None => println!("redis-server not found: comparison skipped"),
    }
    Ok(())
}
