//! Save, check and restore of a large backup, with the time and peak memory
//! (`/usr/bin/time -v`: wall clock, maximum resident set) of each `rdkvctl`
//! run: a 1-node cluster (`--region-mib`, default 1536) is loaded with
//! `--keys` keys (default 1 000 000) of `--value-bytes` values (default
//! 1024) in `mput` batches of 1 000; then `snapshot save` (which makes the
//! node build its snapshot: none is due yet), `snapshot status` and
//! `snapshot restore` into an empty directory (for a node of the same
//! `--region-mib`). The node's own memory during
//! the save: its peak resident set (`VmHWM` of `/proc/PID/status`) is reset
//! (`5` written to `/proc/PID/clear_refs`) just before the save and read
//! after it, beside its resident set before.
//!
//! `cargo run --release -p rdkv-tests --example backup -- [--keys N]
//! [--value-bytes N] [--region-mib N]`

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use rdkv_tests::flags::numeric_flags;
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, binary};

const BATCH: usize = 1_000;

fn flags() -> Result<(usize, usize, u64)> {
    let flags = numeric_flags(&["--keys", "--value-bytes", "--region-mib"])?;
    let flag = |name: &str, default: u64| flags.get(name).copied().unwrap_or(default);
    let keys = usize::try_from(flag("--keys", 1_000_000))?;
    let value_bytes = usize::try_from(flag("--value-bytes", 1024))?;
    ensure!(
        keys % BATCH == 0 && keys > 0,
        "--keys: a multiple of {BATCH}"
    );
    Ok((keys, value_bytes, flag("--region-mib", 1536)))
}

/// Runs `rdkvctl args` under `/usr/bin/time -v`; prints and returns
/// (wall seconds, peak resident MiB).
fn measured(step: &str, args: &[&str]) -> Result<(f64, f64)> {
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(binary("rdkvctl"))
        .args(args)
        .output()
        .context("running /usr/bin/time -v rdkvctl")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{step}: {stderr}");
    let field = |name: &str| {
        stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::trim)
            .with_context(|| format!("{step}: no {name:?} in {stderr}"))
    };
    let wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss):")?;
    let seconds = wall.split(':').try_fold(0.0, |total, part| {
        part.parse::<f64>().map(|p| total * 60.0 + p)
    })?;
    let rss_mib = field("Maximum resident set size (kbytes):")?.parse::<f64>()? / 1024.0;
    println!(
        "{step}: {seconds:.2} s, peak RSS {rss_mib:.1} MiB; stdout: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok((seconds, rss_mib))
}

/// `VmRSS` and `VmHWM` of process `pid`, MiB.
fn node_memory(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64> {
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(kib.parse::<f64>()? / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn path(p: &Path) -> Result<&str> {
    p.to_str().context("a UTF-8 path")
}

#[tokio::main]
async fn main() -> Result<()> {
    let (keys, value_bytes, region_mib) = flags()?;
    let region = region_mib.to_string();
    let mut cluster = Cluster::start_with(1, &["--region-mib", &region])?;
    cluster.wait_for_leader(LEADER_TIMEOUT).await?;
    let client = cluster.client(Intent::Any)?;
    for batch in 0..keys / BATCH {
        let pairs = (batch * BATCH..(batch + 1) * BATCH)
            .map(|i| {
                let mut value = format!("{i:010}").into_bytes();
                value.resize(value_bytes, b'v');
                (Bytes::from(format!("key{i:08}")), Bytes::from(value))
            })
            .collect::<Vec<_>>();
        client.mput(pairs).await?;
    }
    println!("loaded {keys} keys of {value_bytes} bytes");
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("backup.snap");
    let endpoint = cluster.node(1)?.endpoint();
    let pid = cluster.node(1)?.pid().context("the node's pid")?;
    let (rss_before, _) = node_memory(pid)?;
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .context("resetting the node's peak resident set")?;
    measured(
        "save",
        &[
            "--endpoints",
            &endpoint,
            "--timeout",
            "600s",
            "snapshot",
            "save",
            path(&file)?,
        ],
    )?;
    let (rss_after, peak) = node_memory(pid)?;
    println!(
        "node during save: resident {rss_before:.1} MiB before, {rss_after:.1} MiB after, \
         peak {peak:.1} MiB ({:.1} MiB over the resident set before)",
        peak - rss_before
    );
    println!("file: {} bytes", std::fs::metadata(&file)?.len());
    measured("status", &["snapshot", "status", path(&file)?])?;
    let restored = dir.path().join("restored");
    measured(
        "restore",
        &[
            "snapshot",
            "restore",
            path(&file)?,
            "--data-dir",
            path(&restored)?,
            "--id",
            "1",
            "--initial-cluster",
            "1=127.0.0.1:1",
            "--region-mib",
            &region,
        ],
    )?;
    Ok(())
}
