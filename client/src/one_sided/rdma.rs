//! Attaching to a region over RDMA: a dedicated control connection to its
//! node, the queue-pair exchange (`Request::RdmaConnect`, inside
//! `Request::Sharded` under a map of several shards: a session per (node,
//! shard), its grant that shard's region on the device of its queue pair),
//! then a `RegionReader` over the session's RDMA fabric.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rdkv_fabric::rdma::reopen::{REOPEN_AFTER, Reopen};
use rdkv_fabric::rdma::verbs::read::descriptor_of;
use rdkv_fabric::rdma::verbs::{RdmaClient, RdmaSession};
use rdkv_fabric::rpc::{Connection, RpcChannel};
use rdkv_fabric::{Clock, RegionReader};
use rdkv_proto::wire::{Request, Response, ShardRequest};

use super::topology::{RegionAt, remote_reader};
use crate::routing::Router;

/// The client's device, opened on first use; a failure is remembered
/// (logged once per attempt) and retried after `REOPEN_AFTER`.
#[derive(Debug)]
pub(super) struct Device {
    opened: Mutex<Reopen<Arc<RdmaClient>>>,
}

impl Default for Device {
    fn default() -> Device {
        Device {
            opened: Mutex::new(Reopen::new(REOPEN_AFTER)),
        }
    }
}

#[derive(Debug)]
pub(super) struct Attached {
    pub(super) reader: RegionReader,
    session: Arc<RdmaSession>,
    _control: Connection,
}

impl Attached {
    pub(super) fn channel(&self) -> Arc<dyn RpcChannel> {
        Arc::clone(&self.session) as Arc<dyn RpcChannel>
    }
}

/// Retired (a refresh replaced it, or the node left): the server drops the
/// queue pair with the control connection, so ours is torn down now and
/// reads still holding the reader fail fast instead of retrying into it.
impl Drop for Attached {
    fn drop(&mut self) {
        self.session.close();
    }
}

impl Device {
    fn get(&self, router: &Router) -> Option<Arc<RdmaClient>> {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = router.options().rdma_device.clone();
        opened
            .get(Instant::now(), || {
                RdmaClient::open(wanted.as_deref()).map_err(|e| e.to_string())
            })
            .map_err(|(reason, new)| {
                if new {
                    tracing::info!("rdma transport off for this client: {reason}");
                }
            })
            .ok()
    }

    pub(super) async fn attach(
        &self,
        router: &Router,
        at: RegionAt<'_>,
        clock: &Arc<dyn Clock>,
    ) -> Option<Attached> {
        let addr = at.addr;
        let device = self.get(router)?;
        let control = router
            .pool()
            .dedicated_connection(addr)
            .await
            .map_err(|e| tracing::debug!(addr, "no rdma control connection: {e}"))
            .ok()?;
        let pending = device
            .prepare(control.local_ip())
            .map_err(|e| tracing::debug!(addr, "no rdma queue pair: {e}"))
            .ok()?;
        let deadline = tokio::time::Instant::now() + router.options().connect_timeout;
        let endpoint = pending.endpoint();
        let request = at.grant_request(
            Request::RdmaConnect { endpoint },
            ShardRequest::RdmaConnect { endpoint },
        );
        let (endpoint, region) = match control.call(&request, deadline).await {
            Ok(Response::RdmaConnected { endpoint, region }) => (endpoint, region),
            Ok(other) => {
                tracing::debug!(addr, "server refused rdma: {other:?}");
                return None;
            }
            Err(e) => {
                tracing::debug!(addr, "rdma connect failed: {e:?}");
                return None;
            }
        };
        let session = pending
            .complete(endpoint, region, control.info().max_frame_bytes)
            .map_err(|e| tracing::debug!(addr, "rdma connect failed: {e}"))
            .ok()?;
        let reader = remote_reader(router, session.fabric(), descriptor_of(&region), clock)
            .map_err(|e| tracing::debug!(addr, "rdma region unreadable: {e}"))
            .ok()?;
        tracing::debug!(addr, "reading over rdma");
        Some(Attached {
            reader,
            session,
            _control: control,
        })
    }
}
