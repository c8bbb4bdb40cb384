//! A small HTTP/1.1 endpoint for probes and scrapers: `/health` (200 when
//! healthy, 503 otherwise), `/status` (JSON), `/metrics` (Prometheus text).
//! Requests are read with a size and time bound; anything else gets 404.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::accept::accept_until;
use crate::service::Handler;

const MAX_REQUEST_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn serve_http(
    listener: TcpListener,
    handler: Arc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    accept_until(listener, "http", shutdown, |stream, _| {
        let handler = Arc::clone(&handler);
        async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &handler)).await;
            Ok(())
        }
    })
    .await;
}

async fn respond(mut stream: TcpStream, handler: &Handler) -> std::io::Result<()> {
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
        (b"GET", b"/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics_text(handler)),
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

fn status_json(handler: &Handler) -> String {
    let s = handler.status();
    let opt = |v: Option<u64>| v.map_or_else(|| "null".to_owned(), |v| v.to_string());
    format!(
        "{{\"id\":{},\"client_addr\":\"{}\",\"role\":\"{:?}\",\"term\":{},\"leader_id\":{},\
         \"last_log_index\":{},\"commit_index\":{},\"applied_index\":{},\"snapshot_index\":{},\
         \"region\":{{\"capacity_bytes\":{},\"used_bytes\":{},\"live_keys\":{}}},\"members\":{},\
         \"rdma\":\"{}\"}}\n",
        s.id,
        json_escape(&s.client_addr),
        s.role,
        s.term,
        opt(s.leader_id),
        s.last_log_index,
        s.commit_index,
        s.applied_index,
        s.snapshot_index,
        s.region.capacity_bytes,
        s.region.used_bytes,
        s.region.live_keys,
        s.members.len(),
        json_escape(&s.rdma)
    )
}

fn metrics_text(handler: &Handler) -> String {
    let s = handler.status();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    };
    gauge("rdkv_raft_term", "Current Raft term.", s.term);
    gauge(
        "rdkv_raft_is_leader",
        "1 if this node is the leader.",
        u64::from(s.role == rdkv_proto::wire::Role::Leader),
    );
    gauge(
        "rdkv_raft_last_log_index",
        "Last log index.",
        s.last_log_index,
    );
    gauge(
        "rdkv_raft_commit_index",
        "Cluster commit index known here.",
        s.commit_index,
    );
    gauge(
        "rdkv_raft_applied_index",
        "Last index applied to the region.",
        s.applied_index,
    );
    gauge(
        "rdkv_region_capacity_bytes",
        "Data area size.",
        s.region.capacity_bytes,
    );
    gauge(
        "rdkv_region_used_bytes",
        "Bytes in live blocks.",
        s.region.used_bytes,
    );
    gauge("rdkv_region_live_keys", "Live keys.", s.region.live_keys);
    let _ = writeln!(
        out,
        "# HELP rdkv_requests_total Requests answered over the native protocol.\n# TYPE rdkv_requests_total counter"
    );
    let served = s.served;
    for (op, count) in [
        ("get", served.get),
        ("mget", served.mget),
        ("put", served.put),
        ("delete", served.delete),
        ("cas", served.cas),
        ("mput", served.mput),
        ("admin", served.admin),
    ] {
        let _ = writeln!(out, "rdkv_requests_total{{op=\"{op}\"}} {count}");
    }
    let _ = writeln!(
        out,
        "# HELP rdkv_client_connections_total Client connections accepted.\n# TYPE rdkv_client_connections_total counter"
    );
    for (transport, count) in [
        ("tcp", served.tcp_connections),
        ("unix", served.unix_connections),
    ] {
        let _ = writeln!(
            out,
            "rdkv_client_connections_total{{transport=\"{transport}\"}} {count}"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::json_escape;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
    }
}
