//! Overload: a flood of deep pipelines of large writes behind a slow disk
//! keeps the node's heap within its in-flight budget while a well-behaved
//! client is still served; connections beyond the limit are refused with a
//! clear error; the node survives and recovers.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::{Bytes, BytesMut};
use rdkv_client::{ClientOptions, Consistency, Fault, Transport};
use rdkv_proto::wire::{DEFAULT_MAX_FRAME_BYTES, FrameKind, Request, encode_frame};
use rdkv_tests::prometheus::{http_get, parse};
use rdkv_tests::raw_native::RawConnection;
use rdkv_tests::wait::{CallsBeside, calls_beside};
use rdkv_tests::{Cluster, Intent, check, client_options};

const MAX_CONNECTIONS: usize = 24;
const IN_FLIGHT_MIB: u64 = 16;
const FLOODERS: usize = 12;
const VALUE_BYTES: usize = 256 * 1024;
const REQUESTS_PER_FLOODER: u64 = 100;

/// Anonymous resident memory of a process (the region's shared memfd is not
/// in it; an anonymous region, as the metadata group's, is, on 2 MiB pages
/// where the kernel gives them), in bytes.
fn rss_anon_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .context("no RssAnon in /proc/pid/status")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("RssAnon value")?
        .parse()?;
    Ok(kib * 1024)
}

/// A raw connection that has done the handshake, as a blocking stream for
/// a flooder thread; `Err` carries the refusal.
async fn handshake(addr: SocketAddr) -> Result<std::result::Result<TcpStream, String>> {
    match RawConnection::open(addr, "overload-test", None).await? {
        Ok(connection) => Ok(Ok(connection.into_std()?)),
        Err(refusal) => Ok(Err(refusal)),
    }
}

/// Writes large puts as fast as the server reads them, never reading the
/// answers; gives up when the server stops reading for a while.
fn flood(mut stream: TcpStream, flooder: usize) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(4)));
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let mut out = BytesMut::new();
    for i in 0..REQUESTS_PER_FLOODER {
        out.clear();
        let request = Request::Put {
            key: Bytes::from(format!("flood/{flooder}/{i}")),
            value: value.clone(),
        };
        if encode_frame(
            FrameKind::Request,
            i + 1,
            &request,
            DEFAULT_MAX_FRAME_BYTES,
            &mut out,
        )
        .is_err()
            || stream.write_all(&out).is_err()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_stays_within_the_budget_and_others_are_served() -> Result<()> {
    let connections = MAX_CONNECTIONS.to_string();
    let in_flight = IN_FLIGHT_MIB.to_string();
    let mut cluster = Cluster::start_with(
        1,
        &[
            "--fault-injection",
            "--max-client-connections",
            &connections,
            "--max-in-flight-mib",
            &in_flight,
        ],
    )?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let node = cluster.node(1)?;
        let addr = node.client_addr;
        let http = node.http_addr;
        let pid = node.pid().context("node pid")?;
        let endpoint = addr.to_string();
        let good = cluster.client_with(
            Intent::Via(&[1]),
            ClientOptions {
                transport: Transport::Tcp,
                // About liveness only: how fast reads are under the flood is
                // the machine's business, that they are served is the node's.
                request_timeout: Duration::from_secs(60),
                ..client_options(None)
            },
        )?;
        rdkv_tests::eventually(Duration::from_secs(20), "a leader", async || {
            Ok(good.put("good", "1").await?)
        })
        .await?;
        // Every write now waits 300 ms for its fsync: requests pile up.
        good.inject_fault(&endpoint, Fault::SlowFsync { delay_ms: 300 })
            .await?;
        let baseline = rss_anon_bytes(pid)?;

        let mut flooders = Vec::new();
        for f in 0..FLOODERS {
            let stream = handshake(addr)
                .await?
                .map_err(|refusal| anyhow::anyhow!("flooder {f} refused: {refusal}"))?;
            flooders.push(std::thread::spawn(move || flood(stream, f)));
        }

        // While the flood goes on (watched for 4 s): heap stays bounded,
        // reads are served. The outcome that matters is that reads complete
        // while flooders are still writing, not how fast: a node that made
        // reads wait behind the flood would serve them only once it ended.
        let mut peak = baseline;
        let until = Instant::now() + Duration::from_secs(4);
        let CallsBeside {
            calls: reads,
            while_busy: reads_during_flood,
        } = calls_beside(
            |_| Instant::now() < until,
            || flooders.iter().any(|f| !f.is_finished()),
            async |_| {
                peak = peak.max(rss_anon_bytes(pid)?);
                let got = good.get_with("good", Consistency::Lease).await?;
                ensure!(got.is_some_and(|v| v.value == "1"));
                Ok(())
            },
        )
        .await?;
        ensure!(
            reads_during_flood > 0,
            "no read completed while the flood went on ({reads} after it)"
        );
        let growth_mib = peak.saturating_sub(baseline) / (1024 * 1024);
        let offered_mib =
            FLOODERS as u64 * REQUESTS_PER_FLOODER * VALUE_BYTES as u64 / (1024 * 1024);
        println!(
            "flood: {offered_mib} MiB offered, heap grew {growth_mib} MiB (budget {IN_FLIGHT_MIB} MiB), \
             {reads} reads served, {reads_during_flood} during the flood"
        );
        // Budget + one partial frame per connection + the log's entry cache
        // (16 MiB) + allocator slack. Without the budget the node reads 128
        // requests per connection: 384 MiB here.
        ensure!(
            growth_mib < IN_FLIGHT_MIB + 112,
            "heap grew {growth_mib} MiB under a {IN_FLIGHT_MIB} MiB budget"
        );

        // The connection limit: the good client holds one slot (flooders may
        // have given up by now and freed theirs), so of limit + 6 attempts
        // at most limit - 1 are accepted and at least 7 refused.
        let mut accepted = Vec::new();
        let mut refusals = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 6 {
            match handshake(addr).await? {
                Ok(stream) => accepted.push(stream),
                Err(refusal) => refusals.push(refusal),
            }
        }
        ensure!(
            accepted.len() < MAX_CONNECTIONS && refusals.len() >= 7,
            "{} accepted, {} refused under a limit of {MAX_CONNECTIONS}",
            accepted.len(),
            refusals.len()
        );
        ensure!(
            refusals
                .iter()
                .all(|r| r.contains("Unavailable") && r.contains("too many client connections")),
            "refusals: {refusals:?}"
        );
        drop(accepted);

        // Recovery: stop the flood, heal the disk, write again.
        good.inject_fault(&endpoint, Fault::Heal).await?;
        for flooder in flooders {
            let _ = tokio::task::spawn_blocking(move || flooder.join()).await?;
        }
        ensure!(cluster.node_mut(1)?.is_running(), "the node died");
        // The flood filled the region: empty it, and writes work again.
        good.clear().await?;
        rdkv_tests::eventually(Duration::from_secs(10), "a write after the flood", async || {
            Ok(good.put("after", "1").await?)
        })
        .await?;
        let metrics = tokio::task::spawn_blocking(move || http_get(http, "/metrics"))
            .await??
            .1;
        let metrics = parse(&metrics)?;
        ensure!(
            metrics.sum("rdkv_connections_refused_total", &[]) >= refusals.len() as f64,
            "refusals not counted"
        );
        ensure!(
            metrics.sum("rdkv_backpressure_events_total", &[]) > 0.0,
            "no backpressure recorded"
        );
        Ok(())
    })
    .await
}
