//! Lease reads across a leader change, over any one-sided transport
//! ([`Over`]). The old leader is deposed without being told ([`Over::depose`]:
//! frozen over shm, cut from its peers over ofi), so its region keeps
//! saying it leads; a new leader commits a newer value. A one-sided `Lease`
//! read must never return the old leader's value once the new one is
//! committed: the lease deadline in the header (which the old leader can no
//! longer renew) is what stops it, and the test shows the stale value is
//! still there, read over the same transport.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Consistency, Transport};
use rdkv_fabric::clock::unix_now_us;

use crate::over::Over;
use crate::{Intent, LEADER_TIMEOUT, check_with_leader, client_options, eventually};

/// Deposes the leader, commits a newer value through a new one, steps this
/// process's wall clock by `clock_step_us`, then reads with `Lease` until
/// 200 reads returned the new value; none may return the old one.
///
/// The clock step is for a client on the servers' host (shm), which judges
/// leases on a clock that does not step; a remote region's lease (ofi) is
/// judged on the wall clocks, whose steps the documented drift bound
/// excludes.
pub async fn lease_reads_never_return_a_deposed_leaders_value(
    over: Over,
    clock_step_us: i64,
) -> Result<()> {
    let mut cluster = over.start_deposable(3)?;
    let mut deposed = None;
    let result = check_with_leader(&mut cluster, 120, async |cluster, old_leader| {
        if !over.served_by(cluster).await? {
            return Ok(());
        }
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

        // The old leader's region, read by the test itself, to look at later.
        let raw = over.region_reader(cluster, old_leader).await?;
        over.depose(cluster, old_leader).await?;
        deposed = Some(old_leader);
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

        // The old region still holds the old value and still claims the
        // lease flag, but its deadline has passed: only that check stands
        // between a reader and the stale value.
        let stale = raw.get(b"k")?.context("k missing from the old region")?;
        ensure!(stale.value == "old" && stale.version < new_version);
        let header = raw.dynamic_header()?;
        let lease = header
            .lease_deadline_unix_us
            .context("the old leader's lease flag is clear")?;
        ensure!(lease < unix_now_us(), "the old lease has not expired yet");
        rdkv_fabric::clock::step_wall_clock_for_tests(clock_step_us);

        new_value_only(&reader_client, served_before).await
    })
    .await;
    rdkv_fabric::clock::step_wall_clock_for_tests(0);
    if let Some(id) = deposed {
        let _ = over.reinstate(&mut cluster, id).await;
    }
    result
}

/// Every lease read from now on returns the new value (or fails while the
/// client finds the new leader); never the old one. Some were refused by
/// the lapsed lease, and reads went one-sided again (to the new leader).
async fn new_value_only(reader_client: &Client, served_before: u64) -> Result<()> {
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
}
