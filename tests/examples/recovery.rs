//! Time to recover, and the memory it takes: a node holding `--keys` keys
//! (default 100 000) of `--value-bytes` values (default 100) is stopped and
//! restarted; we measure from the restart to the first successful
//! linearizable read and to all keys being present: after a crash (SIGKILL)
//! with no snapshot (log replay), after a clean stop (SIGTERM, which saves a
//! snapshot first), and after a crash with periodic snapshots (snapshot and
//! log tail), and the region bytes per stored byte
//! (`rdkv_region_used_bytes` / `rdkv_region_payload_bytes`). The same data
//! in a real redis-server with an fsync-always AOF is restarted the same
//! way, in the same run, as a peer (its `used_memory` per stored byte).
//!
//! `cargo run --release -p rdkv-tests --example recovery -- [--keys N]
//! [--value-bytes N] [--region-mib N] [--snapshot-entries N]`
//! (redis-server must be on PATH for the comparison; it is skipped otherwise).

use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use rdkv_proto::wire::Consistency;
use rdkv_tests::flags::numeric_flags;
use rdkv_tests::prometheus::{http_get, parse};
use rdkv_tests::{Cluster, Intent, free_port};

const BATCH: usize = 1_000;

/// The run's scale, from the command line.
#[derive(Debug, Clone, Copy)]
struct Scale {
    keys: usize,
    value_bytes: usize,
    region_mib: u64,
    /// Entries (batches) between snapshots in the snapshot run.
    snapshot_entries: u64,
}

impl Scale {
    fn from_args() -> Result<Scale> {
        let flags = numeric_flags(&[
            "--keys",
            "--value-bytes",
            "--region-mib",
            "--snapshot-entries",
        ])?;
        let flag = |name: &str, default: u64| flags.get(name).copied().unwrap_or(default);
        let scale = Scale {
            keys: usize::try_from(flag("--keys", 100_000))?,
            value_bytes: usize::try_from(flag("--value-bytes", 100))?,
            region_mib: flag("--region-mib", 256),
            snapshot_entries: flag("--snapshot-entries", 10),
        };
        if !scale.keys.is_multiple_of(BATCH) || scale.keys == 0 {
            bail!("--keys must be a positive multiple of {BATCH}");
        }
        Ok(scale)
    }

    fn key(&self, i: usize) -> String {
        format!("key{i:08}")
    }

    fn value(&self, i: usize) -> Bytes {
        let mut v = format!("{i:010}").into_bytes();
        v.resize(self.value_bytes, b'v');
        Bytes::from(v)
    }

    /// Keys and values, as both stores hold them.
    fn payload_bytes(&self) -> u64 {
        (self.keys * (self.key(0).len() + self.value_bytes)) as u64
    }
}

/// What one restart measured.
struct Recovery {
    first_read: Duration,
    all_keys: Duration,
    /// Memory the store holds per byte of keys and values.
    bytes_per_byte: f64,
}

/// `used / payload` from a node's `/metrics`.
fn region_bytes_per_byte(cluster: &Cluster) -> Result<f64> {
    let (status, body) = http_get(cluster.node(1)?.http_addr, "/metrics")?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    let metrics = parse(&body)?;
    let sample = |name: &str| {
        metrics
            .get(name, &[("shard", "0")])
            .with_context(|| format!("no {name}"))
    };
    Ok(sample("rdkv_region_used_bytes")? / sample("rdkv_region_payload_bytes")?)
}

async fn load(client: &rdkv_client::Client, scale: Scale) -> Result<()> {
    for batch in 0..scale.keys / BATCH {
        let pairs = (batch * BATCH..(batch + 1) * BATCH)
            .map(|i| (Bytes::from(scale.key(i)), scale.value(i)))
            .collect::<Vec<_>>();
        client.mput(pairs).await?;
    }
    Ok(())
}

/// Waits until the node's snapshot covers all but fewer than `entries`
/// entries of its log (the snapshot policy caught up with the load), so
/// that what a restart replays does not depend on when the stop came.
async fn settle_snapshot(client: &rdkv_client::Client, entries: u64) -> Result<()> {
    let started = Instant::now();
    loop {
        let status = client.status().await?;
        if status.snapshot_index + entries > status.last_log_index {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the snapshot did not catch up: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the node is stopped before its restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGKILL: a crash.
    Kill,
    /// SIGTERM: a clean stop, which saves a snapshot first.
    Term,
}

/// One load, stop and restart; `snapshot_entries` when the node snapshots.
async fn rdkv_recovery(
    label: &str,
    scale: Scale,
    extra: &[&str],
    snapshot_entries: Option<u64>,
    stop: Stop,
) -> Result<Recovery> {
    let region_mib = scale.region_mib.to_string();
    let mut args = vec!["--region-mib", &region_mib];
    args.extend_from_slice(extra);
    let mut cluster = Cluster::start_with(1, &args)?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let client = cluster.client(Intent::Any)?;
    load(&client, scale).await?;
    if let Some(entries) = snapshot_entries {
        settle_snapshot(&client, entries).await?;
    }
    let bytes_per_byte = region_bytes_per_byte(&cluster)?;
    match stop {
        Stop::Kill => cluster.node_mut(1)?.kill(),
        Stop::Term => cluster.node_mut(1)?.stop()?,
    }
    let started = Instant::now();
    cluster.restart(1)?;
    let client = cluster.client(Intent::Any)?;
    let probe = Bytes::from(scale.key(scale.keys - 1));
    let first_read = loop {
        if let Ok(Some(v)) = client
            .get_with(probe.clone(), Consistency::Linearizable)
            .await
            && v.value == scale.value(scale.keys - 1)
        {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("{label}: no read within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let all_keys = loop {
        if let Ok(status) = client.status().await
            && status.region.live_keys == scale.keys as u64
        {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    cluster.node_mut(1)?.stop()?;
    Ok(Recovery {
        first_read,
        all_keys,
        bytes_per_byte,
    })
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

/// The same data, MSET batches of the same size, through redis-cli --pipe.
fn redis_load(port: u16, scale: Scale) -> Result<()> {
    let mut pipe = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let mut stdin = pipe.stdin.take().context("redis-cli stdin")?;
    for batch in 0..scale.keys / BATCH {
        let mut input = Vec::new();
        write!(input, "*{}\r\n$4\r\nMSET\r\n", 1 + 2 * BATCH)?;
        for i in batch * BATCH..(batch + 1) * BATCH {
            let key = scale.key(i);
            let v = scale.value(i);
            write!(input, "${}\r\n{key}\r\n${}\r\n", key.len(), v.len())?;
            input.extend_from_slice(&v);
            input.extend_from_slice(b"\r\n");
        }
        stdin.write_all(&input)?;
    }
    drop(stdin);
    pipe.wait()?;
    if redis_cli(port, &["DBSIZE"]).as_deref() != Some(&scale.keys.to_string()) {
        bail!("redis did not load {} keys", scale.keys);
    }
    Ok(())
}

/// `used_memory` of `INFO memory` per byte of keys and values.
fn redis_bytes_per_byte(port: u16, scale: Scale) -> Result<f64> {
    let info = redis_cli(port, &["INFO", "memory"]).context("INFO memory")?;
    let used: f64 = info
        .lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .context("no used_memory")?
        .trim()
        .parse()?;
    Ok(used / scale.payload_bytes() as f64)
}

fn redis_recovery(scale: Scale) -> Result<Option<Recovery>> {
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
    redis_load(port, scale)?;
    let bytes_per_byte = redis_bytes_per_byte(port, scale)?;
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()?;
    server.wait()?;
    let started = Instant::now();
    let mut server = redis(port, dir.path())?;
    let probe = scale.key(scale.keys - 1);
    let first_read = loop {
        if let Some(v) = redis_cli(port, &["GET", &probe])
            && v.starts_with(&format!("{:010}", scale.keys - 1))
        {
            break started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let all_keys = loop {
        if redis_cli(port, &["DBSIZE"]).as_deref() == Some(&scale.keys.to_string()) {
            break started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = server.kill();
    let _ = server.wait();
    Ok(Some(Recovery {
        first_read,
        all_keys,
        bytes_per_byte,
    }))
}

fn row(system: &str, recovery: &Recovery) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{system:<44} {:>16.1} {:>16.1} {:>14.3}",
        ms(recovery.first_read),
        ms(recovery.all_keys),
        recovery.bytes_per_byte
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let scale = Scale::from_args()?;
    println!(
        "recovery of {} keys x {} B values (time from restart; memory per byte of keys and values)",
        scale.keys, scale.value_bytes
    );
    println!(
        "{:<44} {:>16} {:>16} {:>14}",
        "system", "first read (ms)", "all keys (ms)", "bytes/byte"
    );
    row(
        "rdkv, 1 node, crash, log replay",
        &rdkv_recovery("log replay", scale, &[], None, Stop::Kill).await?,
    );
    row(
        "rdkv, 1 node, clean stop (snapshot at stop)",
        &rdkv_recovery("snapshot at stop", scale, &[], None, Stop::Term).await?,
    );
    let entries = scale.snapshot_entries.to_string();
    let snapshot_args = [
        "--snapshot-entries",
        &entries,
        "--snapshot-keep-entries",
        "0",
    ];
    row(
        "rdkv, 1 node, crash, snapshot + log tail",
        &rdkv_recovery(
            "snapshot",
            scale,
            &snapshot_args,
            Some(scale.snapshot_entries),
            Stop::Kill,
        )
        .await?,
    );
    match redis_recovery(scale)? {
        Some(recovery) => row("redis-server 7, AOF fsync always", &recovery),
        None => println!("redis-server not found: comparison skipped"),
    }
    Ok(())
}
