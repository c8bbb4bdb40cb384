//! Backup and restore (issue 22): a snapshot saved from a 3-node cluster
//! under continuous writes becomes a new 3-node cluster with every write
//! acknowledged up to the snapshot's index and none after it; the new
//! cluster takes writes; a surviving node of the old cluster refuses the new
//! cluster's nodes (their cluster identities differ). `snapshot status`
//! checks the file, and names the damage in a file with one flipped bit and
//! in a truncated one.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rdkv_client::{Client, ClientOptions};
use rdkv_proto::wire::Consistency;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, binary, check, check_with_leader, client_options, eventually,
    rdkvctl, rdkvctl_blocking, rdkvctl_ok,
};

/// Acknowledged writes before the snapshot is taken, and after it.
const BEFORE: usize = 300;
const AFTER: usize = 50;

fn key(i: usize) -> String {
    format!("w-{i:06}")
}

fn value(i: usize) -> String {
    format!("value-{i}")
}

/// Writes `key(i)` for i = 0, 1, ... until `stop`; records each write the
/// cluster acknowledged with its version (a write without an answer is not
/// recorded: it may or may not have been applied).
async fn write_until(client: Client, stop: Arc<AtomicBool>, acked: Arc<Mutex<Vec<(usize, u64)>>>) {
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        if let Ok(version) = client.put(key(i), value(i)).await {
            acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((i, version));
        }
        i += 1;
    }
}

fn acked_count(acked: &Mutex<Vec<(usize, u64)>>) -> usize {
    acked.lock().unwrap_or_else(|p| p.into_inner()).len()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `rdkvctl args` that must succeed: its stdout.
async fn ok(args: &[&str]) -> Result<String> {
    Ok(text(&rdkvctl_ok(args, &[]).await?.stdout))
}

/// `rdkvctl args` that must fail: its stderr.
async fn refused(args: &[&str]) -> Result<String> {
    let out = rdkvctl(args, &[]).await?;
    ensure!(
        !out.status.success(),
        "rdkvctl {args:?} exited 0: {}",
        text(&out.stdout)
    );
    Ok(text(&out.stderr))
}

fn json_u64(report: &serde_json::Value, field: &str) -> Result<u64> {
    report[field]
        .as_u64()
        .with_context(|| format!("{field} in {report}"))
}

/// Saves a snapshot through every endpoint of `cluster` to `file`; its index.
async fn save(cluster: &Cluster, file: &Path) -> Result<u64> {
    let endpoints = cluster.endpoints(Intent::Any)?.join(",");
    let file = file.to_str().context("a UTF-8 path")?;
    let saved = ok(&[
        "--endpoints",
        &endpoints,
        "-w",
        "json",
        "--timeout",
        "60s",
        "snapshot",
        "save",
        file,
    ])
    .await?;
    json_u64(&serde_json::from_str(&saved)?, "last_log_index")
}

/// `snapshot status -w json` of a whole file.
async fn status(file: &Path) -> Result<serde_json::Value> {
    let file = file.to_str().context("a UTF-8 path")?;
    Ok(serde_json::from_str(
        &ok(&["-w", "json", "snapshot", "status", file]).await?,
    )?)
}

/// Where a test's backup goes (in a directory removed on drop), with
/// `rdkvctl` built before the test's clock starts (cargo may be slow).
async fn backup_file() -> Result<(tempfile::TempDir, std::path::PathBuf)> {
    tokio::task::spawn_blocking(|| binary("rdkvctl")).await?;
    let backups = tempfile::tempdir()?;
    let file = backups.path().join("backup.snap");
    Ok((backups, file))
}

/// `rdkvctl snapshot restore` of `file` as `node`, for the harness.
fn restore(file: &Path, node: &rdkv_tests::NodeProc, initial_cluster: &str) -> Result<()> {
    let (file, dir) = (
        file.to_str().context("path")?,
        node.data_dir.to_str().context("path")?,
    );
    let id = node.id.to_string();
    let out = rdkvctl_blocking(
        &[
            "snapshot",
            "restore",
            file,
            "--data-dir",
            dir,
            "--id",
            &id,
            "--initial-cluster",
            initial_cluster,
        ],
        &[],
    )?;
    ensure!(
        out.status.success(),
        "restoring node {id}: {}",
        text(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_becomes_a_new_cluster_that_the_old_one_refuses() -> Result<()> {
    let (_backups, file) = backup_file().await?;
    let mut old = Cluster::start(3)?;
    let mut acked_before = Vec::new();
    let mut index = 0;
    check_with_leader(&mut old, 240, async |old, _| {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writer = tokio::spawn(write_until(
            old.client(Intent::Any)?,
            Arc::clone(&stop),
            Arc::clone(&acked),
        ));
        eventually(
            Duration::from_secs(60),
            "writes before the snapshot",
            async || {
                ensure!(
                    acked_count(&acked) >= BEFORE,
                    "{} acknowledged",
                    acked_count(&acked)
                );
                Ok(())
            },
        )
        .await?;
        // A backup holds every write acknowledged before it was asked for
        // (etcd's `snapshot save` takes a fresh snapshot too), whatever the
        // snapshot policy (the default: every 10,000 entries): here a
        // snapshot already exists, from an earlier backup, and writes came
        // after it.
        let earlier = save(old, &file).await?;
        let acked_then = acked_count(&acked);
        eventually(Duration::from_secs(60), "writes after the earlier backup", async || {
            ensure!(acked_count(&acked) >= acked_then + 20, "{} acknowledged", acked_count(&acked));
            Ok(())
        })
        .await?;
        let acked_at_save = acked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, version)| *version)
            .max()
            .unwrap_or(0);
        index = save(old, &file).await?;
        ensure!(index > earlier, "the backup's index {index} is the earlier one's");
        ensure!(
            index >= acked_at_save,
            "the backup's index {index} is behind a write acknowledged before the save ({acked_at_save})"
        );
        let saved_at = acked_count(&acked);
        eventually(
            Duration::from_secs(60),
            "writes after the snapshot",
            async || {
                ensure!(
                    acked_count(&acked) >= saved_at + AFTER,
                    "{} acknowledged",
                    acked_count(&acked)
                );
                Ok(())
            },
        )
        .await?;
        stop.store(true, Ordering::Relaxed);
        writer.await?;
        acked_before = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(())
    })
    .await?;
    // The old cluster is lost; node 3's data directory survives.
    for node in old.nodes.values_mut() {
        node.kill();
    }
    let report = status(&file).await?;
    ensure!(
        json_u64(&report, "last_log_index")? == index,
        "status {report}"
    );
    let (kept, lost): (Vec<_>, Vec<_>) = acked_before.iter().partition(|(_, v)| *v <= index);
    ensure!(
        !kept.is_empty() && !lost.is_empty(),
        "{} writes before, {} after",
        kept.len(),
        lost.len()
    );
    ensure!(
        json_u64(&report, "keys")? >= kept.len() as u64,
        "status {report}"
    );

    let mut restored_files = Vec::new();
    let mut new = Cluster::start_prepared(3, &[], |node, initial_cluster| {
        restore(&file, node, initial_cluster)?;
        let snapshots = node.data_dir.join("snapshots");
        for entry in std::fs::read_dir(&snapshots)? {
            restored_files.push(std::fs::read(entry?.path())?);
        }
        Ok(())
    })?;
    ensure!(
        restored_files.len() == 3,
        "{} restored snapshot files",
        restored_files.len()
    );
    ensure!(
        restored_files.iter().all(|f| *f == restored_files[0]),
        "members restored from one file differ"
    );
    check_with_leader(&mut new, 240, async |new, _| {
        let client = new.client(Intent::Any)?;
        every_acknowledged_write_up_to_the_snapshot(&client, &kept, &lost).await?;
        let version = client.put("after-restore", "yes").await?;
        ensure!(
            version > index,
            "a new write's version {version} <= {index}"
        );
        for id in 1..=3 {
            eventually(
                Duration::from_secs(30),
                "the new write on every member",
                async || {
                    let got = new.replica(id)?.get("after-restore").await?;
                    ensure!(
                        got.as_ref().is_some_and(|v| v.value == "yes"),
                        "node {id}: {got:?}"
                    );
                    Ok(())
                },
            )
            .await?;
        }
        let dir = new.node(1)?.data_dir.to_str().context("path")?.to_owned();
        let stderr = refused(&[
            "snapshot",
            "restore",
            file.to_str().context("path")?,
            "--data-dir",
            &dir,
            "--id",
            "1",
            "--initial-cluster",
            "1=127.0.0.1:1",
        ])
        .await?;
        ensure!(
            stderr.contains("not empty"),
            "restore into a used directory: {stderr}"
        );
        Ok(())
    })
    .await?;
    let result = the_survivor_refuses_the_new_cluster(&mut old, &new).await;
    if let Err(e) = &result {
        eprintln!("test failed: {e:#}\n{}\n{}", old.logs(), new.logs());
    }
    result?;
    check(&mut new, Duration::from_secs(5), async |_| Ok(())).await
}

/// Every write acknowledged at or before the snapshot's index reads back
/// with its value; none acknowledged after it is there.
async fn every_acknowledged_write_up_to_the_snapshot(
    client: &Client,
    kept: &[&(usize, u64)],
    lost: &[&(usize, u64)],
) -> Result<()> {
    for &&(i, version) in kept {
        let got = client.get_with(key(i), Consistency::Linearizable).await?;
        match got {
            Some(v) if v.value == value(i) && v.version == version => {}
            other => bail!("{} (version {version}) reads back as {other:?}", key(i)),
        }
    }
    for &&(i, version) in lost {
        let got = client.get_with(key(i), Consistency::Linearizable).await?;
        ensure!(
            got.is_none(),
            "{} written at {version}, after the snapshot: {got:?}",
            key(i)
        );
    }
    Ok(())
}

/// The old cluster's node 3 restarts from its data directory; the new
/// cluster's leader, asked to add it, is refused at the handshake for its
/// cluster identity, and node 3 takes none of the new cluster's state.
async fn the_survivor_refuses_the_new_cluster(old: &mut Cluster, new: &Cluster) -> Result<()> {
    old.restart(3)?;
    let survivor = old.node(3)?;
    let (peer, client_addr) = (
        survivor.peer_addr.to_string(),
        survivor.client_addr.to_string(),
    );
    let adder = new.client_with(
        Intent::Any,
        ClientOptions {
            request_timeout: Duration::from_secs(30),
            ..client_options(None)
        },
    )?;
    // Waits for the learner to catch up, which it never does.
    let adding = tokio::spawn(async move { adder.add_member(9, peer, client_addr, true).await });
    let refused = eventually(LEADER_TIMEOUT * 2, "the survivor's refusal", async || {
        let log = old.node(3)?.log();
        log.lines()
            .find(|l| l.contains("refused a peer connection") && l.contains("belongs to cluster"))
            .map(str::to_owned)
            .context("no refusal for the cluster identity in the survivor's log")
    })
    .await;
    adding.abort();
    refused?;
    // Its own region, read one-sided: it has no leader to serve reads with.
    let got = old.map_region(3).await?.get(b"after-restore")?;
    ensure!(
        got.is_none(),
        "the survivor holds the new cluster's write: {got:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_a_flipped_bit_and_a_truncation() -> Result<()> {
    let (backups, file) = backup_file().await?;
    let mut cluster = Cluster::start(1)?;
    check_with_leader(&mut cluster, 120, async |cluster, _| {
        let client = cluster.client(Intent::Any)?;
        for i in 0..200 {
            client.put(key(i), value(i)).await?;
        }
        save(cluster, &file).await?;
        let report = status(&file).await?;
        ensure!(json_u64(&report, "keys")? == 200, "status {report}");
        let bytes = std::fs::read(&file)?;
        let mut flipped = bytes.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0x10;
        let cut = &bytes[..bytes.len() - 7];
        for (what, damaged) in [("one flipped bit", &flipped[..]), ("a truncated file", cut)] {
            let path = backups.path().join("damaged.snap");
            std::fs::write(&path, damaged)?;
            let stderr = refused(&["snapshot", "status", path.to_str().context("path")?]).await?;
            ensure!(
                stderr.starts_with("Error: ") && stderr.contains("snapshot record"),
                "{what}: {stderr}"
            );
            if what == "a truncated file" {
                ensure!(stderr.contains("truncated"), "{what}: {stderr}");
            }
        }
        Ok(())
    })
    .await
}

/// `rdkv-server --restore FILE args`, which must refuse to start: its
/// stderr. Bounded: a server that started after all is killed.
fn server_refuses(file: &Path, args: &[&str]) -> Result<String> {
    let mut child = std::process::Command::new(binary("rdkv-server"))
        .arg("--restore")
        .arg(file)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let started = std::time::Instant::now();
    while child.try_wait()?.is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("rdkv-server --restore {args:?} did not refuse: it still ran after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output()?;
    ensure!(
        !out.status.success(),
        "rdkv-server --restore {args:?} exited 0"
    );
    Ok(text(&out.stderr))
}

/// `rdkv-server --restore FILE` (etcd's and Redis's way) builds each
/// member's data directory as `rdkvctl snapshot restore` does, and the new
/// cluster serves the backup and takes writes; a used data directory and a
/// backup over the node's quota are refused before the node starts, with
/// the reason, and leave the directory as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_with_restore_serves_the_backup() -> Result<()> {
    let (backups, file) = backup_file().await?;
    tokio::task::spawn_blocking(|| binary("rdkv-server")).await?;
    let mut old = Cluster::start(1)?;
    let mut index = 0;
    check_with_leader(&mut old, 120, async |old, _| {
        let client = old.client(Intent::Any)?;
        for i in 0..200 {
            client.put(key(i), value(i)).await?;
        }
        index = save(old, &file).await?;
        Ok(())
    })
    .await?;
    for node in old.nodes.values_mut() {
        node.kill();
    }
    let path = file.to_str().context("path")?;
    let mut new = Cluster::start_with(3, &["--restore", path, "--cluster-name", "restored"])?;
    check_with_leader(&mut new, 120, async |new, _| {
        let client = new.client(Intent::Any)?;
        for i in 0..200 {
            let got = client.get_with(key(i), Consistency::Linearizable).await?;
            ensure!(
                got.as_ref().is_some_and(|v| v.value == value(i)),
                "{}: {got:?}",
                key(i)
            );
        }
        let version = client.put("after-restore", "yes").await?;
        ensure!(
            version > index,
            "a new write's version {version} <= {index}"
        );
        let used = new.node(1)?.data_dir.to_str().context("path")?.to_owned();
        let stderr = server_refuses(&file, &["--data-dir", &used])?;
        ensure!(
            stderr.contains("is not empty"),
            "restore into a used directory: {stderr}"
        );
        Ok(())
    })
    .await?;
    let fresh = backups.path().join("fresh");
    let fresh_dir = fresh.to_str().context("path")?;
    let stderr = server_refuses(&file, &["--data-dir", fresh_dir, "--quota-bytes", "1000"])?;
    ensure!(
        stderr.contains("does not fit the node") && stderr.contains("quota of 1000 bytes"),
        "a backup over the node's quota: {stderr}"
    );
    ensure!(
        std::fs::read_dir(&fresh)?.next().is_none(),
        "a refused restore left files in {}",
        fresh.display()
    );
    Ok(())
}
