//! A single node holding 100 000 keys restarts with every one of them: once
//! after SIGKILL (recovery by replaying the Raft log), once after a clean
//! stop, which saves a snapshot first (recovery from the snapshot). The time from
//! process start to the first successful read is printed, not asserted
//! (numbers come from benchmarks: `cargo run --release -p rdkv-tests
//! --example recovery`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use rdkv_client::{Client, ClientOptions};
use rdkv_proto::wire::Consistency;
use rdkv_tests::{Cluster, Intent, check, client_options, eventually};

const KEYS: usize = 100_000;
const BATCH: usize = 1_000;
const VALUE_BYTES: usize = 100;

fn key(i: usize) -> Bytes {
    Bytes::from(format!("key-{i:06}"))
}

fn value(i: usize) -> Bytes {
    let mut v = format!("{i:010}-").into_bytes();
    v.resize(VALUE_BYTES, b'0' + (i % 10) as u8);
    Bytes::from(v)
}

/// Every key, read back in batches, and the node's live key count.
async fn all_keys_present(client: &Client, cluster: &Cluster) -> Result<()> {
    for start in (0..KEYS).step_by(BATCH) {
        let values = client
            .mget_with((start..start + BATCH).map(key), Consistency::Linearizable)
            .await?;
        for (i, got) in (start..).zip(values) {
            let got = got.map(|v| v.value);
            ensure!(
                got.as_ref() == Some(&value(i)),
                "key {i} reads back as {got:?}"
            );
        }
    }
    let status = cluster.status_of(1).await?;
    ensure!(
        status.region.live_keys == KEYS as u64,
        "live_keys = {}",
        status.region.live_keys
    );
    Ok(())
}

/// Restarts node 1 and returns the time from its start to the first read
/// that succeeds.
async fn restart_and_time_first_read(cluster: &mut Cluster) -> Result<Duration> {
    let probe = cluster.client_with(
        Intent::Via(&[1]),
        ClientOptions {
            request_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(200),
            max_attempts: 2,
            ..client_options(None)
        },
    )?;
    let started = Instant::now();
    cluster.restart(1)?;
    let last = key(KEYS - 1);
    let first = eventually(
        Duration::from_secs(60),
        "a successful read after the restart",
        async || {
            probe
                .get_with(last.clone(), Consistency::Linearizable)
                .await?
                .context("the last key is absent")
        },
    )
    .await?;
    ensure!(first.value == value(KEYS - 1), "first read: {first:?}");
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_keys_survive_restarts() -> Result<()> {
    let mut cluster = Cluster::start(1)?;
    check(&mut cluster, Duration::from_secs(180), async |cluster| {
        let client = cluster.client(Intent::Any)?;
        let loading = Instant::now();
        for start in (0..KEYS).step_by(BATCH) {
            client
                .mput((start..start + BATCH).map(|i| (key(i), value(i))))
                .await?;
        }
        println!(
            "loaded {KEYS} keys in {:?}; status {:?}",
            loading.elapsed(),
            cluster.status_of(1).await?.region
        );
        all_keys_present(&client, cluster).await?;

        // 1. SIGKILL: everything comes back from the log.
        cluster.node_mut(1)?.kill();
        let took = restart_and_time_first_read(cluster).await?;
        println!("after SIGKILL (log replay): first read {took:?} after the process started");
        all_keys_present(&client, cluster).await?;
        ensure!(
            cluster.status_of(1).await?.snapshot_index == 0,
            "expected no snapshot yet"
        );

        // 2. A clean stop saves a snapshot of everything applied (no
        // snapshot was due: the log is far short of --snapshot-entries),
        // and the restart loads it.
        let last_write = client.put(key(0), value(0)).await?;
        cluster.node_mut(1)?.stop()?;
        let took = restart_and_time_first_read(cluster).await?;
        println!("after SIGTERM (snapshot at stop): first read {took:?} after the process started");
        all_keys_present(&client, cluster).await?;
        let status = cluster.status_of(1).await?;
        ensure!(
            status.snapshot_index >= last_write,
            "snapshot_index {} after a clean stop, the last write was at {last_write}",
            status.snapshot_index,
        );

        // It takes writes again.
        client.put("after-restarts", "yes").await?;
        Ok(())
    })
    .await
}
