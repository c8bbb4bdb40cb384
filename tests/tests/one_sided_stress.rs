//! Cross-process stress of one-sided GETs through `shm`: the body is the
//! harness's (`rdkv_tests::stress`), which `tests/tests/ofi.rs` runs over
//! libfabric too. Three reader processes GET 8 hot keys continuously while
//! this process overwrites and deletes them; zero wrong, torn or backwards
//! values.

use anyhow::Result;
use rdkv_tests::over::Over;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_in_other_processes_never_see_a_wrong_value() -> Result<()> {
    rdkv_tests::stress::readers_never_see_a_wrong_value(Over::Shm).await
}
