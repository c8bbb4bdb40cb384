//! Sends requests this node cannot serve (it does not lead) to the leader
//! through a native client over the cluster's client addresses, and turns
//! native errors into Redis errors. On a multi-shard node the same client
//! scans and clears every shard (KEYS, SCAN, FLUSHDB).

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Transport};
use rdkv_proto::wire::{Consistency, ErrorCode, ErrorReply, Request, Response};

use super::reply::Reply;

#[derive(Debug)]
pub struct Forwarder {
    /// The node's own client options (token, TLS).
    base: ClientOptions,
    /// The client and the endpoints it was made with.
    client: Mutex<Option<(Vec<String>, Client)>>,
}

impl Forwarder {
    pub fn new(base: ClientOptions) -> Forwarder {
        Forwarder {
            base,
            client: Mutex::new(None),
        }
    }

    fn client(&self, endpoints: Vec<String>) -> Result<Client, Reply> {
        let mut slot = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((known, client)) = slot.as_ref()
            && *known == endpoints
        {
            return Ok(client.clone());
        }
        let options = ClientOptions {
            request_timeout: Duration::from_secs(10),
            transport: Transport::Tcp,
            client_name: "rdkv-resp-forwarder".into(),
            ..self.base.clone()
        };
        let client = Client::new(&endpoints, options)
            .map_err(|e| Reply::err(format!("cannot reach the leader: {e}")))?;
        *slot = Some((endpoints, client.clone()));
        Ok(client)
    }

    pub async fn forward(
        &self,
        endpoints: Vec<String>,
        request: Request,
    ) -> Result<Response, Reply> {
        let client = self.client(endpoints)?;
        client.send(request).await.map_err(client_error)
    }

    /// `request` to exactly the node at `addr` (one of `endpoints`).
    pub async fn send_to(
        &self,
        endpoints: Vec<String>,
        addr: &str,
        request: Request,
    ) -> Result<Response, Reply> {
        let client = self.client(endpoints)?;
        client.send_to(addr, request).await.map_err(client_error)
    }

    /// Up to `limit` keys of every shard from `start_key` on, in key order:
    /// the client's scan, which merges the shards' pages (docs/sharding.md,
    /// section 6).
    pub async fn scan_keys(
        &self,
        endpoints: Vec<String>,
        start_key: Bytes,
        limit: usize,
        consistency: Consistency,
    ) -> Result<Vec<Bytes>, Reply> {
        let client = self.client(endpoints)?;
        let pairs = client
            .scan_with(start_key, limit, consistency)
            .await
            .map_err(client_error)?;
        Ok(pairs.into_iter().map(|(key, _)| key).collect())
    }

    /// Clears every shard, each through its leader (the client's `clear`:
    /// one entry per shard, not atomic across shards).
    pub async fn clear(&self, endpoints: Vec<String>) -> Result<(), Reply> {
        let client = self.client(endpoints)?;
        client.clear().await.map_err(client_error)?;
        Ok(())
    }
}

/// A forwarding client's error as a Redis error.
fn client_error(error: rdkv_client::Error) -> Reply {
    match error {
        rdkv_client::Error::Server(reply) => error_reply(&reply),
        other => Reply::err(other.to_string()),
    }
}

/// What Redis answers a write refused at `maxmemory` (noeviction).
pub const REDIS_OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// A native error as a Redis error.
pub fn error_reply(error: &ErrorReply) -> Reply {
    match error.code {
        ErrorCode::NotLeader | ErrorCode::Unavailable => {
            Reply::Error(format!("TRYAGAIN {}", error.message))
        }
        // Redis's own words for a write refused at `maxmemory`: clients and
        // tools recognise them.
        ErrorCode::NoSpace => Reply::Error(REDIS_OOM.to_owned()),
        _ => Reply::err(&error.message),
    }
}
