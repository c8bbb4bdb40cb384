//! Sequential GET latency on a 3-node cluster: one-sided through `shm` (the
//! default client: `Lease` reads of the leader's region mapped read-only in
//! this process; also with its index cache off) against RPC over TCP
//! (`Transport::Tcp`, `Lease`: the leader looks the key up and answers), on
//! the same cluster in the same run, from one process (tokio current-thread
//! runtime).
//!
//! `cargo run --release -p rdkv-tests --example get_latency`
//!
//! 16-byte keys, 10 000 keys with 100 B values and 10 000 with 1 KiB values.
//! Per value size and transport: one warm-up pass over every key (it also
//! fills the shm client's index cache), then 20 000 GETs of keys drawn
//! uniformly, in 10 alternating blocks of 2 000 per client so that load
//! drift on the machine hits all alike. Each GET is timed on its own; the
//! samples are sorted for p50 / p99.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkv_client::{Client, ClientOptions, Consistency, OneSidedStats, Transport};
use rdkv_tests::{Cluster, Intent, client_options};

const KEYS: u64 = 10_000;
const GETS: usize = 20_000;
const BLOCKS: usize = 10;
const LOAD_BATCH: u64 = 500;

fn key(prefix: char, i: u64) -> String {
    // 16 bytes: one letter and 15 digits.
    format!("{prefix}{i:015}")
}

struct Summary {
    p50: f64,
    p99: f64,
    mean: f64,
}

fn summarize(samples: &mut [Duration]) -> Summary {
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let at = |q: f64| us(samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]);
    Summary {
        p50: at(0.50),
        p99: at(0.99),
        mean: samples.iter().copied().map(us).sum::<f64>() / samples.len() as f64,
    }
}

/// Times `count` GETs of keys drawn uniformly from `prefix`'s set.
async fn timed_gets(
    client: &Client,
    prefix: char,
    value_len: usize,
    count: usize,
    rng: &mut u64,
    samples: &mut Vec<Duration>,
) -> Result<()> {
    for _ in 0..count {
        // xorshift64
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let k = key(prefix, *rng % KEYS);
        let started = Instant::now();
        let got = client.get_with(k.clone(), Consistency::Lease).await?;
        samples.push(started.elapsed());
        match got {
            Some(v) if v.value.len() == value_len => {}
            other => bail!("{k}: {other:?}"),
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let options = client_options(None);
    // shm with the index cache: a repeated GET is one block read.
    let shm = cluster.client_with(
        Intent::Any,
        ClientOptions {
            index_cache_entries: 65_536,
            ..options.clone()
        },
    )?;
    // The default client: shm, Lease, no index cache (a slot read, then a
    // block read).
    let shm_uncached = cluster.client_with(Intent::Any, options.clone())?;
    let tcp = cluster.client_with(
        Intent::Any,
        ClientOptions {
            transport: Transport::Tcp,
            ..options
        },
    )?;
    let clients = [
        ("shm, one-sided, index cache", &shm),
        ("shm, one-sided, no index cache (default)", &shm_uncached),
        ("tcp, RPC", &tcp),
    ];

    println!("| value | transport | p50 (µs) | p99 (µs) | mean (µs) |");
    println!("|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for (prefix, value_len, label) in [('s', 100usize, "100 B"), ('l', 1024, "1 KiB")] {
        let value = vec![b'x'; value_len];
        for start in (0..KEYS).step_by(LOAD_BATCH as usize) {
            shm.mput((start..start + LOAD_BATCH).map(|i| (key(prefix, i), value.clone())))
                .await?;
        }
        // Warm-up: every key once through each client.
        for (_, client) in clients {
            for i in 0..KEYS {
                client
                    .get(key(prefix, i))
                    .await?
                    .with_context(|| format!("warm-up: {} absent", key(prefix, i)))?;
            }
        }
        let before = [
            shm.one_sided_stats().await,
            shm_uncached.one_sided_stats().await,
            tcp.one_sided_stats().await,
        ];
        let mut rng = 0x2545_F491_4F6C_DD1D_u64;
        let mut samples: [Vec<Duration>; 3] = Default::default();
        for _ in 0..BLOCKS {
            for ((_, client), samples) in clients.iter().zip(samples.iter_mut()) {
                timed_gets(client, prefix, value_len, GETS / BLOCKS, &mut rng, samples).await?;
            }
        }
        let after = [
            shm.one_sided_stats().await,
            shm_uncached.one_sided_stats().await,
            tcp.one_sided_stats().await,
        ];
        let served: Vec<u64> = (0..3).map(|c| after[c].served - before[c].served).collect();
        if served != [GETS as u64, GETS as u64, 0] {
            bail!(
                "one-sided GETs (shm, shm uncached, tcp): {served:?}, expected {GETS}, {GETS}, 0"
            );
        }
        let summaries: Vec<Summary> = samples.iter_mut().map(|s| summarize(s)).collect();
        for ((name, _), s) in clients.iter().zip(&summaries) {
            println!(
                "| {label} | {name} | {:.2} | {:.2} | {:.2} |",
                s.p50, s.p99, s.mean
            );
        }
        let (cached, uncached, t) = (&summaries[0], &summaries[1], &summaries[2]);
        let delta = |c: usize, f: fn(&OneSidedStats) -> u64| f(&after[c]) - f(&before[c]);
        ratios.push(format!(
            "{label}: tcp/shm p50 {:.1}x, p99 {:.1}x, mean {:.1}x; tcp/shm-uncached p50 {:.1}x; \
             shm index cache hits {} of {GETS}, retries {} (uncached: {})",
            t.p50 / cached.p50,
            t.p99 / cached.p99,
            t.mean / cached.mean,
            t.p50 / uncached.p50,
            delta(0, |s| s.reads.cache_hits),
            delta(0, |s| s.reads.retries()),
            delta(1, |s| s.reads.retries()),
        ));
    }
    for line in ratios {
        println!("{line}");
    }
    Ok(())
}
