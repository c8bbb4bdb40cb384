//! What the tests of the `ofi` (libfabric) transport share: nodes that
//! serve it over the `tcp;ofi_rxm` provider and nothing one-sided else, the
//! check that they do (a visible skip where libfabric is absent, a failure
//! under CI), client options, and a node's region read by `fi_read` with
//! the node's grant, for a test to look at directly.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use rdkv_client::{ClientOptions, Transport};
use rdkv_fabric::ofi::client::{OfiSession, descriptor_of};
use rdkv_fabric::{MonotonicClock, ReaderOptions, RegionReader};
use rdkv_proto::wire::{OfiRegionGrant, Request, Response};

use crate::skip::{skip, this_test};
use crate::{Cluster, Intent, client_options};

/// The provider every ofi test runs over: libfabric's RMA in software.
pub const PROVIDER: &str = "tcp;ofi_rxm";

/// Node flags: libfabric over [`PROVIDER`], and no shm socket, so that a
/// client on this host reads over libfabric only, as from another host.
pub const NODE_ARGS: [&str; 4] = ["--ofi-provider", PROVIDER, "--shm-socket", "off"];

/// Whether node 1 serves ofi with [`PROVIDER`]; else a visible skip (a
/// failure under CI, which installs libfabric).
pub async fn ofi_on(cluster: &Cluster) -> Result<bool> {
    let status = cluster.status_of(1).await?;
    if status.ofi.starts_with(&format!("on: {PROVIDER}")) {
        return Ok(true);
    }
    skip(
        &this_test(),
        &format!("the node's ofi transport: {}", status.ofi),
    );
    Ok(false)
}

/// The harness's client options with `transport`.
pub fn options(transport: Transport) -> ClientOptions {
    ClientOptions {
        transport,
        request_timeout: Duration::from_secs(10),
        ..client_options(None)
    }
}

/// The grant of `node`'s region, as the client gets it.
pub async fn grant_of(cluster: &Cluster, node: u64) -> Result<OfiRegionGrant> {
    let client = cluster.client(Intent::Any)?;
    let endpoint = cluster.node(node)?.endpoint();
    match client.send_to(&endpoint, Request::OfiRegion).await? {
        Response::OfiRegion(grant) => Ok(grant),
        other => bail!("no grant: {other:?}"),
    }
}

/// `node`'s region read by `fi_read` (a session of its own, as a client's),
/// validated as a client reads it but with no lease or abandon bound: what
/// the region holds, whatever a client would make of it.
pub async fn region_reader(cluster: &Cluster, node: u64) -> Result<RegionReader> {
    let grant = grant_of(cluster, node).await?;
    let source = rdkv_fabric::ofi::source_toward(&cluster.node(node)?.endpoint());
    // Opening an endpoint and reading are blocking calls into the provider.
    let reader = tokio::task::spawn_blocking(move || -> Result<RegionReader> {
        let descriptor = descriptor_of(&grant);
        let session = OfiSession::open(grant, source.map(|ip| ip.to_string()).as_deref())?;
        Ok(RegionReader::over(
            session.fabric(),
            descriptor,
            Arc::new(MonotonicClock::new()),
            ReaderOptions {
                max_attempts: 8,
                abandon_after_us: None,
                expiry_margin_ms: rdkv_fabric::clock::DEFAULT_MAX_CLOCK_DRIFT_MS,
            },
        )?)
    });
    reader.await?
}
