//! Attaching to a node over libfabric (feature `ofi`): the region grant
//! asked over the authenticated connection (`Request::OfiRegion`), a
//! session of the granted provider, then a `RegionReader` over it. Writes
//! and control stay on the node's TCP (or Unix socket) channel.

use std::sync::Arc;

use rdkv_fabric::ofi::client::{OfiSession, descriptor_of};
use rdkv_fabric::{Clock, RegionReader};
use rdkv_proto::wire::{Request, Response, ShardRequest};

use super::topology::{RegionAt, remote_reader};
use crate::routing::Router;

#[derive(Debug)]
pub(super) struct Attached {
    pub(super) reader: RegionReader,
    /// Keeps the endpoint and the bounce buffer's registration open while
    /// the reader lives (the reader's fabric holds it too).
    _session: Arc<OfiSession>,
}

/// Asks the node of `at` for the grant of its region (naming the shard
/// under a map of several) and opens a session reading it; `None` (with a
/// debug line saying why) when the node or this host cannot.
pub(super) async fn attach(
    router: &Router,
    at: RegionAt<'_>,
    clock: &Arc<dyn Clock>,
) -> Option<Attached> {
    let addr = at.addr;
    let request = at.grant_request(Request::OfiRegion, ShardRequest::OfiRegion);
    let deadline = tokio::time::timeout(
        router.options().connect_timeout,
        router.send_to(addr, request),
    );
    let grant = match deadline.await {
        Ok(Ok(Response::OfiRegion(grant))) => grant,
        Ok(Ok(other)) => {
            tracing::debug!(addr, "server refused ofi: {other:?}");
            return None;
        }
        Ok(Err(e)) => {
            tracing::debug!(addr, "ofi region request failed: {e}");
            return None;
        }
        Err(_) => {
            tracing::debug!(addr, "ofi region request timed out");
            return None;
        }
    };
    let descriptor = descriptor_of(&grant);
    let provider = grant.provider.clone();
    // Opening an endpoint and registering the bounce buffer are system
    // calls into the provider (and the address may need a lookup): off the
    // runtime threads. The endpoint binds to the address the kernel routes
    // to the node by (another interface, a bridge), so that its
    // connections leave from there, not from the provider's first one.
    let node = addr.to_owned();
    let session = tokio::task::spawn_blocking(move || {
        let source = rdkv_fabric::ofi::source_toward(&node).map(|ip| ip.to_string());
        OfiSession::open(grant, source.as_deref())
    })
    .await
    .ok()?
    .map_err(|e| tracing::info!(addr, provider, "ofi transport off for this node: {e}"))
    .ok()?;
    let reader = remote_reader(router, session.fabric(), descriptor, clock)
        .map_err(|e| tracing::debug!(addr, "ofi region unreadable: {e}"))
        .ok()?;
    tracing::debug!(addr, provider = session.provider(), "reading over ofi");
    Some(Attached {
        reader,
        _session: session,
    })
}
