//! Write cost on a 1-node cluster (every put fsynced before it is
//! acknowledged): sequential puts from one client, then 32 concurrent
//! writers sharing fsyncs through group commit.
//!
//! `cargo run --release -p rdkv-tests --example writes`

use std::time::{Duration, Instant};

use anyhow::Result;
use rdkv_tests::{Cluster, Intent};

const SEQUENTIAL_PUTS: usize = 1_000;
const WRITERS: usize = 32;
const PUTS_PER_WRITER: usize = 200;

#[tokio::main]
async fn main() -> Result<()> {
    let mut cluster = Cluster::start(1)?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let client = cluster.client(Intent::Any)?;
    client.put("warm", "up").await?;

    let started = Instant::now();
    for i in 0..SEQUENTIAL_PUTS {
        client.put(format!("k{i}"), "v").await?;
    }
    let per_op = started.elapsed().as_secs_f64() * 1000.0 / SEQUENTIAL_PUTS as f64;
    println!("sequential put, 1 client: {per_op:.3} ms/op");

    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..PUTS_PER_WRITER {
                client.put(format!("w{w}-{i}"), "v").await?;
            }
            Ok::<_, rdkv_client::Error>(())
        }));
    }
    for writer in writers {
        writer.await??;
    }
    let rate = (WRITERS * PUTS_PER_WRITER) as f64 / started.elapsed().as_secs_f64();
    println!("{WRITERS} concurrent writers: {rate:.0} puts/s");
    Ok(())
}
