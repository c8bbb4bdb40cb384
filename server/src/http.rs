//! A small HTTP/1.1 endpoint for probes and scrapers: `/health` (200 when
//! healthy, 503 otherwise), `/status` (JSON), `/metrics` (Prometheus text).
//! Requests are read with a size and time bound; anything else gets 404.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use rdkv_proto::wire::{NodeStatus, ShardStatus};
use serde::Serialize;

use crate::accept::{TcpFront, accept_until};
use crate::service::Handler;

const MAX_REQUEST_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn serve_http(
    listener: TcpFront,
    handler: Arc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    accept_until(listener, "http", shutdown, move |stream, _| {
        let handler = Arc::clone(&handler);
        async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &handler)).await;
            Ok(())
        }
    })
    .await;
}

async fn respond(mut stream: rdkv_tls::Stream, handler: &Handler) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || request.len() + n > MAX_REQUEST_BYTES {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let (status, content_type, body) = match (method, path) {
        (b"GET", b"/health") => {
            let health = handler.health();
            let body = format!(
                "{{\"healthy\":{},\"reason\":\"{}\"}}\n",
                health.healthy,
                json_escape(&health.reason)
            );
            let status = if health.healthy {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            (status, "application/json", body)
        }
        (b"GET", b"/status") => ("200 OK", "application/json", status_json(handler)),
        (b"GET", b"/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            handler.metrics().await,
        ),
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

fn json_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `/status`: the node's `endpoint status` plus its health, where it
/// listens and what it is serving now.
#[derive(Debug, Serialize)]
struct StatusView {
    #[serde(flatten)]
    node: NodeStatus,
    healthy: bool,
    health_reason: String,
    listeners: Listeners,
    in_flight_requests: u64,
    /// Every shard replica this node hosts (a single group: shard 0).
    shards: Vec<ShardView>,
    /// The metadata group's replica here (a multi-shard node only).
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<MetaView>,
}

/// The metadata group in `/status`: its replica's state, the version of
/// the map it applied and of the map this node serves.
#[derive(Debug, Serialize)]
struct MetaView {
    #[serde(flatten)]
    status: ShardStatus,
    /// The group's voters and learners as this replica knows them (its
    /// leader keeps the voters, `meta::voters`).
    voters: Vec<u64>,
    learners: Vec<u64>,
    /// A membership change is under way: the voters are two configurations
    /// (joint consensus), each of which must keep its quorum.
    joint: bool,
    applied_map_version: u64,
    served_map_version: u64,
}

/// One hosted shard in `/status`: its replica's state and its slots.
#[derive(Debug, Serialize)]
struct ShardView {
    #[serde(flatten)]
    status: ShardStatus,
    /// Inclusive `[first, last]` slot ranges.
    slots: Vec<(u16, u16)>,
}

#[derive(Debug, Serialize)]
struct Listeners {
    client_tcp: String,
    client_unix: Option<String>,
    shm: Option<String>,
    resp: Option<String>,
    http: Option<String>,
}

fn status_json(handler: &Handler) -> String {
    let health = handler.health();
    let endpoints = handler.endpoints();
    let view = StatusView {
        node: handler.status(),
        healthy: health.healthy,
        health_reason: health.reason,
        listeners: Listeners {
            client_tcp: endpoints.client.clone(),
            client_unix: endpoints.rpc_socket.clone(),
            shm: endpoints.shm_socket.clone(),
            resp: endpoints.resp.clone(),
            http: endpoints.http.clone(),
        },
        in_flight_requests: handler.stats().in_flight(),
        shards: handler
            .shard_statuses()
            .into_iter()
            .map(|status| ShardView {
                slots: handler.shards().slot_ranges(status.shard),
                status,
            })
            .collect(),
        meta: handler.shards().meta().map(meta_view),
    };
    match serde_json::to_string(&view) {
        Ok(mut json) => {
            json.push('\n');
            json
        }
        Err(e) => format!("{{\"error\":\"{}\"}}\n", json_escape(&e.to_string())),
    }
}

fn meta_view(meta: &crate::meta::Meta) -> MetaView {
    let metrics = meta.replica().metrics();
    let membership = metrics.membership_config.membership();
    MetaView {
        status: crate::service::shard_status(rdkv_proto::shard::ShardId::META, meta.replica()),
        voters: membership.voter_ids().collect(),
        learners: membership.learner_ids().collect(),
        joint: membership.get_joint_config().len() > 1,
        applied_map_version: meta.applied_version(),
        served_map_version: meta.map().version(),
    }
}

#[cfg(test)]
mod tests {
    use super::json_escape;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
    }
}
