//! `rdkv-bench fabric`: perftest-style (`ib_read_lat` / `ib_read_bw`)
//! latency and bandwidth by message size, per transport. What each row
//! measures, honestly:
//!
//! - `mem`: `RemoteRegion::read` of an in-process region (anonymous memory
//!   registered with a `MappedFabric`): a copy with atomic word loads, no
//!   validation. The floor under every one-sided read.
//! - `shm`: the same read of a memfd region mapped read-only a second time
//!   (what a `shm` client maps from a server), still in one process: a
//!   memory copy from a shared mapping. No server, no validation.
//! - `shm-get`: a full one-sided GET by `rdkv_client` with `Transport::Shm`
//!   against a running server's region: the lease check in the header, the
//!   slot read, the block read, CRC and key validation, the value copy.
//! - `ofi` (feature `ofi`): `RemoteRegion::read` by libfabric `fi_read` of
//!   a region registered by an `OfiServer` endpoint, through an
//!   `OfiSession` (the client's bounce buffer, then a copy out), both in
//!   this process but over the provider's real path (`tcp;ofi_rxm`: the
//!   loopback TCP stack and the server endpoint's progress thread). The
//!   provider is `RDKV_OFI_PROVIDER`, else `tcp;ofi_rxm`; its name is in
//!   the table's title. No validation.
//! - `tcp`: a GET by RPC (`Transport::Tcp`) over loopback TCP: framing,
//!   both processes' wake-ups, the server's region lookup: the RPC round
//!   trip of the native protocol.
//!
//! Latency: one operation at a time, each timed alone; t_typical is the
//! median, as in perftest. Bandwidth: back-to-back operations (for `tcp`,
//! `bw_inflight` GETs in flight on one connection), bytes of payload per
//! second, MB = 2^20 bytes as perftest prints it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use rdkv_client::{Client, ClientOptions, Consistency, Transport};
use rdkv_fabric::{Fabric, MappedFabric, RegionMemory, RemoteRegion};
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum FabricBenchError {
    #[error("setting up the {transport} region: {source}")]
    Region {
        transport: &'static str,
        source: std::io::Error,
    },
    #[error("{transport}: {message}")]
    Read {
        transport: &'static str,
        message: String,
    },
    #[error("{transport}: {source}")]
    Client {
        transport: &'static str,
        source: rdkv_client::Error,
    },
    #[error("unknown fabric transport {0:?}: expected mem, shm, shm-get, ofi or tcp")]
    UnknownTransport(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FabricTransport {
    Mem,
    Shm,
    ShmGet,
    Tcp,
    Ofi,
}

impl FabricTransport {
    pub fn parse(s: &str) -> Result<FabricTransport, FabricBenchError> {
        match s {
            "mem" => Ok(FabricTransport::Mem),
            "shm" => Ok(FabricTransport::Shm),
            "shm-get" => Ok(FabricTransport::ShmGet),
            "tcp" => Ok(FabricTransport::Tcp),
            "ofi" => Ok(FabricTransport::Ofi),
            other => Err(FabricBenchError::UnknownTransport(other.to_owned())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FabricTransport::Mem => "mem",
            FabricTransport::Shm => "shm",
            FabricTransport::ShmGet => "shm-get",
            FabricTransport::Tcp => "tcp",
            FabricTransport::Ofi => "ofi",
        }
    }

    /// Needs a running server.
    pub fn needs_server(self) -> bool {
        matches!(self, FabricTransport::ShmGet | FabricTransport::Tcp)
    }

    pub fn describe(self) -> &'static str {
        match self {
            FabricTransport::Mem => {
                "one-sided read of an in-process region (atomic word copy, no validation)"
            }
            FabricTransport::Shm => {
                "one-sided read of a memfd region mapped read-only (memory copy, no validation)"
            }
            FabricTransport::ShmGet => {
                "rdkv GET one-sided over shm (lease check + slot read + block read + CRC/key validation + copy)"
            }
            FabricTransport::Tcp => {
                "rdkv GET by RPC over loopback TCP (request/response round trip)"
            }
            FabricTransport::Ofi => {
                "one-sided fi_read of a region registered by a libfabric endpoint (bounce buffer + copy, no validation)"
            }
        }
    }
}

/// perftest's sizes from 8 B to 1 MiB: the powers of two.
pub fn default_sizes() -> Vec<usize> {
    (3..=20).map(|p| 1usize << p).collect()
}

#[derive(Debug, Clone)]
pub struct FabricOptions {
    pub sizes: Vec<usize>,
    pub iterations: usize,
    /// Untimed operations before each size's measurements.
    pub warmup_iterations: usize,
    /// GETs in flight for the `tcp` bandwidth test.
    pub bw_inflight: usize,
    /// Servers for `shm-get` and `tcp`.
    pub endpoints: Vec<String>,
    pub token: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FabricRow {
    pub bytes: usize,
    pub iterations: usize,
    pub t_min_us: f64,
    pub t_typical_us: f64,
    pub t_avg_us: f64,
    pub t_p99_us: f64,
    pub bw_average_mb_sec: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FabricTable {
    pub transport: FabricTransport,
    pub description: &'static str,
    pub rows: Vec<FabricRow>,
}

fn row(bytes: usize, mut samples_ns: Vec<u64>, bw_elapsed: Duration, bw_ops: usize) -> FabricRow {
    samples_ns.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    let at = |q: f64| {
        let i = ((samples_ns.len() as f64 * q) as usize).min(samples_ns.len().saturating_sub(1));
        samples_ns.get(i).copied().map_or(0.0, us)
    };
    let sum: u64 = samples_ns.iter().sum();
    let mb = (bytes * bw_ops) as f64 / f64::from(1u32 << 20);
    FabricRow {
        bytes,
        iterations: samples_ns.len(),
        t_min_us: samples_ns.first().copied().map_or(0.0, us),
        t_typical_us: at(0.5),
        t_avg_us: if samples_ns.is_empty() {
            0.0
        } else {
            us(sum) / samples_ns.len() as f64
        },
        t_p99_us: at(0.99),
        bw_average_mb_sec: if bw_elapsed.is_zero() {
            0.0
        } else {
            mb / bw_elapsed.as_secs_f64()
        },
    }
}

fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A region of `len` bytes for `mem` or `shm`, filled so every page is
/// present (perftest touches its buffers too), opened through a fabric.
fn open_region(
    transport: FabricTransport,
    len: usize,
) -> Result<Arc<dyn RemoteRegion>, FabricBenchError> {
    let name = transport.name();
    let err = |source| FabricBenchError::Region {
        transport: name,
        source,
    };
    let owner = match transport {
        FabricTransport::Shm => RegionMemory::shared(len, "rdkv-bench-fabric").map_err(err)?,
        _ => RegionMemory::anonymous(len).map_err(err)?,
    };
    if transport == FabricTransport::Ofi {
        return ofi_region(owner);
    }
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    owner
        .write_bytes(0, &pattern)
        .map_err(|e| FabricBenchError::Read {
            transport: name,
            message: e.to_string(),
        })?;
    let memory = match transport {
        FabricTransport::Shm => {
            let fd = owner.read_only_fd().map_err(err)?;
            RegionMemory::map_read_only(fd, len).map_err(err)?
        }
        _ => owner,
    };
    let fabric = MappedFabric::new();
    let descriptor = fabric.register(Arc::new(memory), 1, 1);
    fabric
        .open(&descriptor)
        .map_err(|e| FabricBenchError::Read {
            transport: name,
            message: e.to_string(),
        })
}

/// The provider of the `ofi` row.
pub fn ofi_provider() -> String {
    std::env::var(rdkv_fabric::ofi::PROVIDER_ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "tcp;ofi_rxm".to_owned())
}

/// A region read over libfabric, with the server endpoint that registered
/// it (closed after the reader).
#[cfg(feature = "ofi")]
#[derive(Debug)]
struct OfiBenchRegion {
    region: Arc<dyn RemoteRegion>,
    _server: rdkv_fabric::ofi::server::OfiServer,
}

#[cfg(feature = "ofi")]
impl RemoteRegion for OfiBenchRegion {
    fn descriptor(&self) -> rdkv_fabric::RegionDescriptor {
        self.region.descriptor()
    }

    fn on_this_host(&self) -> bool {
        false
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), rdkv_fabric::FabricError> {
        self.region.read(offset, buf)
    }
}

/// `owner` registered by an in-process libfabric server endpoint on
/// loopback and opened through a client session.
#[cfg(feature = "ofi")]
fn ofi_region(owner: RegionMemory) -> Result<Arc<dyn RemoteRegion>, FabricBenchError> {
    use rdkv_fabric::ofi::client::{OfiSession, descriptor_of};
    use rdkv_fabric::ofi::server::OfiServer;
    let fail = |message: String| FabricBenchError::Read {
        transport: "ofi",
        message,
    };
    let provider = ofi_provider();
    let server = OfiServer::open(Some(&provider), Some("127.0.0.1"), Duration::from_secs(1))
        .map_err(|e| fail(e.to_string()))?;
    let grant = server
        .grant(&Arc::new(owner), 1, rdkv_proto::shard::ShardId(0), 1)
        .map_err(|e| fail(e.to_string()))?;
    let session =
        OfiSession::open(grant.clone(), Some("127.0.0.1")).map_err(|e| fail(e.to_string()))?;
    let region = session
        .fabric()
        .open(&descriptor_of(&grant))
        .map_err(|e| fail(e.to_string()))?;
    Ok(Arc::new(OfiBenchRegion {
        region,
        _server: server,
    }))
}

#[cfg(not(feature = "ofi"))]
fn ofi_region(_owner: RegionMemory) -> Result<Arc<dyn RemoteRegion>, FabricBenchError> {
    Err(FabricBenchError::Read {
        transport: "ofi",
        message: "rdkv-bench was built without the ofi feature".into(),
    })
}

fn bench_region(
    transport: FabricTransport,
    options: &FabricOptions,
) -> Result<FabricTable, FabricBenchError> {
    let max = options.sizes.iter().copied().max().unwrap_or(8);
    // Whole pages, and room for the largest read.
    let len = max.div_ceil(4096).max(1) * 4096;
    let region = open_region(transport, len)?;
    let fail = |e: rdkv_fabric::FabricError| FabricBenchError::Read {
        transport: transport.name(),
        message: e.to_string(),
    };
    let mut rows = Vec::new();
    for &size in &options.sizes {
        let mut buf = vec![0u8; size];
        for _ in 0..options.warmup_iterations {
            region.read(0, &mut buf).map_err(fail)?;
        }
        let mut samples = Vec::with_capacity(options.iterations);
        for _ in 0..options.iterations {
            let start = Instant::now();
            region.read(0, &mut buf).map_err(fail)?;
            samples.push(elapsed_ns(start));
        }
        std::hint::black_box(&buf);
        let start = Instant::now();
        for _ in 0..options.iterations {
            region.read(0, &mut buf).map_err(fail)?;
        }
        let bw_elapsed = start.elapsed();
        std::hint::black_box(&buf);
        rows.push(row(size, samples, bw_elapsed, options.iterations));
    }
    Ok(FabricTable {
        transport,
        description: transport.describe(),
        rows,
    })
}

fn key_of(size: usize) -> Bytes {
    Bytes::from(format!("rdkv-bench/fabric/{size}"))
}

async fn bench_server(
    transport: FabricTransport,
    options: &FabricOptions,
) -> Result<FabricTable, FabricBenchError> {
    let name = transport.name();
    let client_err = |source| FabricBenchError::Client {
        transport: name,
        source,
    };
    let client_options = ClientOptions {
        token: options.token.clone(),
        request_timeout: Duration::from_secs(10),
        transport: if transport == FabricTransport::Tcp {
            Transport::Tcp
        } else {
            Transport::Shm
        },
        ..ClientOptions::default()
    };
    let client = Client::new(&options.endpoints, client_options).map_err(client_err)?;
    let mut rows = Vec::new();
    for &size in &options.sizes {
        let key = key_of(size);
        let value = Bytes::from(vec![b'v'; size]);
        client.put(key.clone(), value).await.map_err(client_err)?;
        let get = || async {
            match client.get_with(key.clone(), Consistency::Lease).await {
                Ok(Some(v)) if v.value.len() == size => Ok(()),
                Ok(other) => Err(FabricBenchError::Read {
                    transport: name,
                    message: format!(
                        "GET {size}-byte value returned {:?} bytes",
                        other.map(|v| v.value.len())
                    ),
                }),
                Err(e) => Err(client_err(e)),
            }
        };
        // A new leader publishes its lease only after applying an entry of
        // its term and hearing from a quorum again: until then a shm GET has
        // no lease to check and is refused. Wait for it (bounded) before timing.
        let lease_deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match get().await {
                Err(FabricBenchError::Client {
                    source: rdkv_client::Error::OneSidedUnavailable,
                    ..
                }) if Instant::now() < lease_deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other?,
            }
        }
        for _ in 0..options.warmup_iterations {
            get().await?;
        }
        let mut samples = Vec::with_capacity(options.iterations);
        for _ in 0..options.iterations {
            let start = Instant::now();
            get().await?;
            samples.push(elapsed_ns(start));
        }
        let inflight = if transport == FabricTransport::Tcp {
            options.bw_inflight.max(1)
        } else {
            1
        };
        let start = Instant::now();
        let results: Vec<Result<(), FabricBenchError>> =
            futures::stream::iter(0..options.iterations)
                .map(|_| get())
                .buffer_unordered(inflight)
                .collect()
                .await;
        let bw_elapsed = start.elapsed();
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        rows.push(row(size, samples, bw_elapsed, options.iterations));
    }
    if transport == FabricTransport::ShmGet {
        let stats = client.one_sided_stats().await;
        let expected =
            (options.iterations * 2 + options.warmup_iterations.max(1)) * options.sizes.len();
        if stats.served < expected as u64 {
            return Err(FabricBenchError::Read {
                transport: name,
                message: format!(
                    "only {} of {expected} GETs were served one-sided (the rest went by RPC): \
                     the server is not on this host or its lease is not held",
                    stats.served
                ),
            });
        }
    }
    Ok(FabricTable {
        transport,
        description: transport.describe(),
        rows,
    })
}

/// Runs the chosen transports in order.
pub async fn run_fabric(
    transports: &[FabricTransport],
    options: &FabricOptions,
) -> Result<Vec<FabricTable>, FabricBenchError> {
    let mut tables = Vec::new();
    for &transport in transports {
        let table = if transport.needs_server() {
            bench_server(transport, options).await?
        } else {
            bench_region(transport, options)?
        };
        tables.push(table);
    }
    Ok(tables)
}

/// perftest's table layout.
pub fn format_table(table: &FabricTable) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let rule = "-".repeat(103);
    let _ = writeln!(out, "{rule}");
    let _ = writeln!(
        out,
        " transport: {} ({})",
        match table.transport {
            FabricTransport::Ofi => format!("ofi {}", ofi_provider()),
            other => other.name().to_owned(),
        },
        table.description
    );
    let _ = writeln!(
        out,
        " {:<10} {:<13} {:<14} {:<18} {:<14} {:<14} {:<18}",
        "#bytes",
        "#iterations",
        "t_min[usec]",
        "t_typical[usec]",
        "t_avg[usec]",
        "t_p99[usec]",
        "BW average[MB/sec]"
    );
    for r in &table.rows {
        let _ = writeln!(
            out,
            " {:<10} {:<13} {:<14.2} {:<18.2} {:<14.2} {:<14.2} {:<18.2}",
            r.bytes,
            r.iterations,
            r.t_min_us,
            r.t_typical_us,
            r.t_avg_us,
            r.t_p99_us,
            r.bw_average_mb_sec
        );
    }
    let _ = writeln!(out, "{rule}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_reads_report_every_size() {
        let options = FabricOptions {
            sizes: vec![8, 4096, 65536],
            iterations: 50,
            warmup_iterations: 5,
            bw_inflight: 1,
            endpoints: vec![],
            token: None,
        };
        for transport in [FabricTransport::Mem, FabricTransport::Shm] {
            let table = bench_region(transport, &options).unwrap();
            assert_eq!(table.rows.len(), 3);
            for r in &table.rows {
                assert_eq!(r.iterations, 50);
                assert!(
                    r.t_min_us <= r.t_typical_us && r.t_typical_us <= r.t_p99_us,
                    "{r:?}"
                );
                assert!(r.bw_average_mb_sec > 0.0);
            }
            let text = format_table(&table);
            assert!(
                text.contains("#bytes") && text.contains("BW average[MB/sec]"),
                "{text}"
            );
            assert!(text.contains(" 65536 "), "{text}");
        }
    }

    #[test]
    fn sizes_and_transports() {
        let sizes = default_sizes();
        assert_eq!(sizes.first(), Some(&8));
        assert_eq!(sizes.last(), Some(&(1 << 20)));
        assert_eq!(
            FabricTransport::parse("shm-get").unwrap(),
            FabricTransport::ShmGet
        );
        assert!(FabricTransport::parse("rdma").is_err());
    }
}
