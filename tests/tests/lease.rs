//! Lease reads across a leader change. The old leader is frozen with SIGSTOP,
//! so it cannot learn that it was deposed and its region keeps saying it
//! leads; a new leader commits a newer value. A one-sided `Lease` read must
//! never return the old leader's value once the new one is committed: the
//! lease deadline in the header (which the frozen node can no longer renew)
//! is what stops it, and the test shows the stale value is still there.
//! The same holds when the wall clock steps back an hour just then (this
//! test process's clock, through the fabric's test hook): a client on the
//! servers' host judges leases on a clock that does not step.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use rdkv_client::{ClientOptions, Consistency, Transport};
use rdkv_fabric::clock::unix_now_us;
use rdkv_fabric::{MonotonicClock, ReaderOptions, RegionReader, attach_shm};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check_with_leader, client_options, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_reads_never_return_a_deposed_leaders_value() -> Result<()> {
    after_a_leader_change(0).await.context("no clock step")?;
    // The step is process-wide: this runs after the first, not beside it.
    after_a_leader_change(-3_600_000_000)
        .await
        .context("the wall clock stepped back an hour")
}

/// Freezes the leader, commits a newer value through a new one, steps this
/// process's wall clock by `clock_step_us`, then reads with `Lease` until
/// 200 reads returned the new value; none may return the old one.
async fn after_a_leader_change(clock_step_us: i64) -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    let mut paused = None;
    let result = check_with_leader(&mut cluster, 90, async |cluster, old_leader| {
        let options = ClientOptions {
            request_timeout: Duration::from_secs(2),
            ..client_options(None)
        };
        let reader_client = cluster.client_with(Intent::Any, options.clone())?;
        reader_client.put("k", "old").await?;
        // The value is served one-sided from the leader's region.
        let got = reader_client.get("k").await?.context("k missing")?;
        ensure!(got.value == "old");
        let served_before = reader_client.one_sided_stats().await.served;
        ensure!(served_before > 0, "the lease read was not one-sided");

        // Map the old leader's region ourselves, to look at it later.
        let socket = cluster
            .status_of(old_leader)
            .await?
            .shm_socket
            .context("no shm socket")?;
        let attached = attach_shm(Path::new(&socket), None, "lease-test").await?;
        let raw = RegionReader::attach(
            attached.memory,
            Arc::new(MonotonicClock::new()),
            ReaderOptions {
                max_attempts: 8,
                abandon_after_us: None,
                expiry_margin_ms: rdkv_fabric::clock::DEFAULT_MAX_CLOCK_DRIFT_MS,
            },
        )?;

        cluster.node_mut(old_leader)?.pause()?;
        paused = Some(old_leader);
        let survivors: Vec<u64> = (1..=3).filter(|id| *id != old_leader).collect();

        // A new leader among the others commits a newer value.
        let writer = cluster.client_with(
            Intent::Via(&survivors),
            ClientOptions {
                transport: Transport::Tcp,
                ..options
            },
        )?;
        let new_version = eventually(
            LEADER_TIMEOUT,
            "a new leader committed the write",
            async || Ok(writer.put("k", "new").await?),
        )
        .await?;

        // The frozen region still holds the old value and still claims the
        // lease flag, but its deadline has passed: only that check stands
        // between a reader and the stale value.
        let stale = raw.get(b"k")?.context("k missing from the old region")?;
        ensure!(stale.value == "old" && stale.version < new_version);
        let header = raw.dynamic_header()?;
        let lease = header
            .lease_deadline_unix_us
            .context("the frozen leader's lease flag is clear")?;
        ensure!(lease < unix_now_us(), "the old lease has not expired yet");
        rdkv_fabric::clock::step_wall_clock_for_tests(clock_step_us);

        // Every lease read from now on returns the new value (or fails while
        // the client finds the new leader); never the old one.
        let mut new_reads = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while new_reads < 200 {
            match reader_client
                .get_with(Bytes::from_static(b"k"), Consistency::Lease)
                .await
            {
                Ok(Some(v)) if v.value == "new" => new_reads += 1,
                Ok(other) => bail!("a lease read returned {other:?} after the new write"),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => bail!("lease reads never recovered: {e}"),
            }
        }
        let stats = reader_client.one_sided_stats().await;
        println!("one-sided after the leader change: {stats:?}");
        ensure!(stats.lease_refusals > 0, "no lease read was refused");
        ensure!(
            stats.served > served_before,
            "reads never went one-sided to the new leader"
        );
        Ok(())
    })
    .await;
    rdkv_fabric::clock::step_wall_clock_for_tests(0);
    if let Some(id) = paused {
        let _ = cluster.node_mut(id)?.resume();
    }
    result
}
