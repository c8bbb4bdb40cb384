//! Which of a node's memory asks for transparent huge pages: its region
//! only. The heap (mimalloc, built with `no_thp`: Cargo.toml) must not: on
//! a host whose setting is `madvise`, a fresh node's heap grew on 2 MiB
//! pages, each zeroed when first touched, and its followers spent a third
//! of their CPU doing so until the log's first snapshot
//! (docs/benchmarks.md, thirtieth round). Asking is a mapping's flag (`hg`
//! in `/proc/PID/smaps`), set whatever the host's setting (`never`
//! included), so this holds on every kernel built with transparent huge
//! pages.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use rdkv_fabric::pages::{SHMEM_SETTING_PATH, SmapsEntry, smaps_entries};
use rdkv_storage::region::REGION_MEMFD_PREFIX;
use rdkv_tests::skip::{skip, this_test};
use rdkv_tests::{Cluster, Intent, check_with_leader};

/// The write path's allocations, for good measure: mimalloc reserves (and,
/// without `no_thp`, advises) its first arena at the first allocation.
const WRITES: usize = 4_000;
const VALUE_BYTES: usize = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_region_asks_for_huge_pages() -> Result<()> {
    // The kernel's settings exist only where it has transparent huge pages.
    if !Path::new(SHMEM_SETTING_PATH).exists() {
        skip(
            &this_test(),
            "the kernel has no transparent huge pages: no mapping can ask for them",
        );
        return Ok(());
    }
    let mut cluster = Cluster::start(1)?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        let value = vec![b'v'; VALUE_BYTES];
        for i in 0..WRITES {
            client.put(format!("heap-{i}"), value.clone()).await?;
        }
        let pid = cluster.node(leader)?.pid().context("the node runs")?;
        let smaps = tokio::fs::read_to_string(format!("/proc/{pid}/smaps")).await?;
        let region_path = format!("/memfd:{REGION_MEMFD_PREFIX}");
        let asking: Vec<SmapsEntry<'_>> = smaps_entries(&smaps)
            .filter(|entry| entry.pages.asked_for_huge)
            .collect();
        let (regions, others): (Vec<_>, Vec<_>) = asking
            .iter()
            .partition(|entry| entry.path.starts_with(&region_path));
        // The flag is read at all: the region asks (fabric::memory).
        ensure!(
            !regions.is_empty(),
            "the region does not ask for huge pages, or smaps was misread ({} entries; \
             these ask: {asking:#?})",
            smaps_entries(&smaps).count()
        );
        ensure!(
            others.is_empty(),
            "mappings other than the region ask for huge pages (the heap's, if mimalloc \
             lost `no_thp`): {others:#?}"
        );
        Ok(())
    })
    .await
}
