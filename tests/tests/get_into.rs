//! The synchronous one-sided read path (`Client::read_handle`) against a
//! real cluster: values straight into the caller's buffers, the answers of
//! the async GET, and no heap allocation per `get_into` (this binary's
//! allocator counts each thread's allocations).

use std::time::Duration;

use anyhow::{Result, ensure};
use rdkv_client::{Consistency, GetIntoError, NotServed, ReadHandle};
use rdkv_fabric::alloc_count::CountingAllocator;
use rdkv_tests::{Cluster, Intent, check_with_leader, eventually, numbered};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const KEYS: usize = 100;

/// Waits until the handle serves (the client attached the leader's region
/// and the lease holds).
async fn until_served(handle: &mut ReadHandle) -> Result<()> {
    let mut buf = [0u8; 64];
    eventually(
        Duration::from_secs(20),
        "a one-sided get_into",
        async || {
            handle
                .get_into(numbered::key(0).as_bytes(), &mut buf)
                .map(drop)
                .map_err(anyhow::Error::from)
        },
    )
    .await
}

/// The numbered pairs, made before anything is counted.
fn pairs() -> Vec<(String, String)> {
    (0..KEYS)
        .map(|i| (numbered::key(i), numbered::value(i)))
        .collect()
}

/// Reads every numbered key into `buf` and checks it; returns how many
/// allocations this thread made meanwhile.
fn read_all(
    handle: &mut ReadHandle,
    pairs: &[(String, String)],
    buf: &mut [u8],
    rounds: u64,
) -> Result<u64> {
    let before = CountingAllocator::allocations_on_this_thread();
    for round in 0..rounds {
        for (key, value) in pairs {
            let got = handle.get_into(key.as_bytes(), buf)?;
            ensure!(
                got.is_some_and(|g| &buf[..g.len] == value.as_bytes() && g.version > 0),
                "round {round}: {key}"
            );
        }
        ensure!(handle.get_into(b"never-written", buf)?.is_none());
    }
    Ok(CountingAllocator::allocations_on_this_thread() - before)
}

/// Reads every numbered key and one never written as one batch (seven of
/// the reader's chunks), each value into its own buffer, `rounds` times,
/// and checks them; returns how many allocations this thread made in the
/// `get_many_into` calls.
fn read_batch(handle: &mut ReadHandle, rounds: u64) -> Result<u64> {
    let keys: Vec<String> = (0..KEYS + 1).map(numbered::key).collect();
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let mut storage = vec![[0u8; 64]; keys.len()];
    let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(|b| &mut b[..]).collect();
    let mut out = vec![None; keys.len()];
    let mut allocations = 0;
    for round in 0..rounds {
        out.fill(None);
        let before = CountingAllocator::allocations_on_this_thread();
        handle.get_many_into(&keys, &mut bufs, &mut out, Consistency::Lease)?;
        allocations += CountingAllocator::allocations_on_this_thread() - before;
        for i in 0..KEYS {
            let got = out[i].ok_or_else(|| anyhow::anyhow!("round {round}: key {i} absent"))?;
            ensure!(
                bufs[i][..got.len] == *numbered::value(i).as_bytes(),
                "round {round}: key {i}"
            );
        }
        ensure!(out[KEYS].is_none(), "a key never written");
    }
    Ok(allocations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_into_fills_the_callers_buffer_and_allocates_nothing() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 90, async |cluster, _| {
        let client = cluster.client(Intent::Any)?;
        numbered::put_all(&client, KEYS).await?;
        let mut handle = client.read_handle();
        until_served(&mut handle).await?;
        let before = cluster.served_gets().await?;
        let mut buf = vec![0u8; 4096];
        let pairs = pairs();
        // The first round warms what is made once per thread.
        read_all(&mut handle, &pairs, &mut buf, 1)?;
        let allocations = read_all(&mut handle, &pairs, &mut buf, 20)?;
        ensure!(
            allocations == 0,
            "{allocations} allocations in 2020 get_into calls"
        );
        // The counter does see this thread's allocations.
        let seen = CountingAllocator::allocations_on_this_thread();
        std::hint::black_box(vec![0u8; 16]);
        ensure!(CountingAllocator::allocations_on_this_thread() > seen);
        ensure!(
            cluster.served_gets().await? == before,
            "GETs reached the servers"
        );

        // A buffer too small for the value says how long it is.
        let mut tiny = [0u8; 3];
        let too_small = handle.get_into(numbered::key(7).as_bytes(), &mut tiny);
        let needed = numbered::value(7).len();
        ensure!(
            too_small == Err(GetIntoError::BufferTooSmall { needed, len: 3 }),
            "{too_small:?}"
        );
        // Linearizable reads are the server's.
        let linearizable = handle.get_into_with(
            numbered::key(7).as_bytes(),
            &mut buf,
            Consistency::Linearizable,
        );
        ensure!(linearizable == Err(GetIntoError::NotServed(NotServed::Consistency)));

        // A batch: every value into its own buffer; the first warms the
        // thread's scratch, the next ten allocate nothing.
        read_batch(&mut handle, 1)?;
        let allocations = read_batch(&mut handle, 10)?;
        ensure!(
            allocations == 0,
            "{allocations} allocations in 10 get_many_into calls of {} keys",
            KEYS + 1
        );
        let stats = client.one_sided_stats().await;
        // 21 rounds of every key and a missing one, and 11 batches.
        let asked = 32 * (KEYS as u64 + 1);
        ensure!(stats.served >= asked, "{stats:?}");
        Ok(())
    })
    .await
}

/// The same under a map of several shards (docs/sharding.md, section 5):
/// each key read from its own shard's region (the handle's view holds a
/// group of readers per shard and a slot table), still without a heap
/// allocation per `get_into`; a batch of keys of every shard is read shard
/// by shard into the caller's buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_into_reads_each_keys_shard_and_allocates_nothing() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &["--shards", "3", "--replicas", "3"])?;
    check_with_leader(&mut cluster, 90, async |cluster, _| {
        let client = cluster.client(Intent::Any)?;
        numbered::put_all(&client, KEYS).await?;
        ensure!(
            client.shard_map().is_some_and(|m| m.shards().len() == 3),
            "the client has no map of 3 shards"
        );
        let mut handle = client.read_handle();
        let mut buf = vec![0u8; 4096];
        let pairs = pairs();
        // Served once every shard's leader region is attached and leased;
        // this also warms what is made once per thread.
        eventually(Duration::from_secs(20), "every shard read", async || {
            handle.refresh().await;
            read_all(&mut handle, &pairs, &mut buf, 1)
        })
        .await?;
        let before = cluster.served_gets().await?;
        let allocations = read_all(&mut handle, &pairs, &mut buf, 20)?;
        ensure!(
            allocations == 0,
            "{allocations} allocations in 2020 get_into calls"
        );
        ensure!(
            cluster.served_gets().await? == before,
            "GETs reached the servers"
        );

        read_batch(&mut handle, 1)?;
        Ok(())
    })
    .await
}
