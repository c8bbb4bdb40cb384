//! Lease reads across a leader change, over `shm`: the body is the
//! harness's (`rdkv_tests::lease_change`), which `tests/tests/ofi.rs` runs
//! over libfabric too. The old leader is frozen with SIGSTOP, so it cannot
//! learn that it was deposed and its region keeps saying it leads; a new
//! leader commits a newer value. A one-sided `Lease` read must never return
//! the old leader's value once the new one is committed. The same holds
//! when the wall clock steps back an hour just then (this test process's
//! clock, through the fabric's test hook): a client on the servers' host
//! judges leases on a clock that does not step.

use anyhow::{Context, Result};
use rdkv_tests::lease_change::lease_reads_never_return_a_deposed_leaders_value as after_a_leader_change;
use rdkv_tests::over::Over;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_reads_never_return_a_deposed_leaders_value() -> Result<()> {
    after_a_leader_change(Over::Shm, 0)
        .await
        .context("no clock step")?;
    // The step is process-wide: this runs after the first, not beside it.
    after_a_leader_change(Over::Shm, -3_600_000_000)
        .await
        .context("the wall clock stepped back an hour")
}
