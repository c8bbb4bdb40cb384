//! The hello of a native connection: protocol version, token, and a slot
//! under the node's connection limit. Nothing large is read before it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkv_proto::wire::{
    ClientHello, ErrorCode, FrameKind, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
    SHARDED_PROTOCOL_VERSION, ServerHello, ServerInfo, decode_payload, negotiate, tokens_match,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::OwnedSemaphorePermit;

use super::{Handler, MAX_IN_FLIGHT};
use crate::framed::{FrameReader, FrameWriter};
use crate::telemetry::{RateLimitedLog, RequestStats, Via};

/// Refused handshakes are logged at most once per this period (with a count
/// of the ones not logged): a client retrying a bad token must not flood
/// the log.
static AUTH_FAILURE_LOG: RateLimitedLog = RateLimitedLog::new(10);

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The hello is read under this small limit: nothing large is buffered for
/// a client that has not authenticated.
pub const HANDSHAKE_MAX_FRAME_BYTES: u32 = 64 * 1024;

/// The hello accepting a client: on a multi-shard node it carries the
/// version of the node's map, when the connection's version can decode it
/// (docs/sharding.md, section 5); a single group's is as before.
fn accepted_hello(info: ServerInfo, handler: &Handler) -> ServerHello {
    match handler.shards().map() {
        Some(map) if info.version >= SHARDED_PROTOCOL_VERSION => ServerHello::AcceptedSharded {
            info,
            shard_map_version: map.version(),
        },
        _ => ServerHello::Accepted(info),
    }
}

fn rejected(code: ErrorCode, message: impl Into<String>) -> ServerHello {
    ServerHello::Rejected {
        code,
        message: message.into(),
    }
}

/// Checks the hello; `Err` is the rejection to send.
fn accept_hello(hello: &ClientHello, handler: &Handler) -> Result<u16, ServerHello> {
    let version = negotiate(hello, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
        .map_err(|e| rejected(ErrorCode::UnsupportedVersion, e.to_string()))?;
    if let Some(expected) = handler.replica().token() {
        let presented = hello.token.as_deref().unwrap_or("");
        if !tokens_match(expected.as_bytes(), presented.as_bytes()) {
            return Err(rejected(
                ErrorCode::Unauthenticated,
                "wrong or missing token",
            ));
        }
    }
    Ok(version)
}

/// The version to speak and the connection's slot, or the rejection. The
/// connection limit is checked after the token: an unauthenticated client
/// learns nothing, not even that the node is full.
fn admit(
    hello: &ClientHello,
    handler: &Handler,
    via: Via,
) -> Result<(u16, OwnedSemaphorePermit), ServerHello> {
    let version = accept_hello(hello, handler)?;
    let admission = handler.admission();
    match admission.connection_slot() {
        Some(slot) => Ok((version, slot)),
        None => {
            RequestStats::connection_refused(via);
            Err(rejected(
                ErrorCode::Unavailable,
                format!(
                    "too many client connections (limit {}); try again later",
                    admission.max_client_connections()
                ),
            ))
        }
    }
}

/// Reads the hello and answers it. On success the reader takes frames up to
/// the node's limit, and the returned slot is to be held for as long as the
/// connection is served; the version is the one negotiated.
pub async fn handshake<R, W>(
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    addr: &str,
    via: Via,
    handler: &Handler,
) -> Result<(OwnedSemaphorePermit, u16)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let frame = tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.next())
        .await
        .context("handshake timed out")??
        .context("closed before the handshake")?;
    let hello = match frame
        .expect_kind(FrameKind::ClientHello)
        .and_then(|()| decode_payload::<ClientHello>(&frame))
    {
        Ok(hello) => hello,
        Err(e) => {
            let reply = rejected(
                ErrorCode::Malformed,
                format!("expected a client hello: {e}"),
            );
            writer.send(FrameKind::ServerHello, 0, &reply).await?;
            bail!("bad handshake: {e}");
        }
    };
    let max_frame_bytes = handler.limits().max_frame_bytes;
    match admit(&hello, handler, via) {
        Ok((version, slot)) => {
            let info = ServerInfo {
                version,
                node_id: handler.replica().node_id(),
                cluster_id: 0,
                max_frame_bytes,
                max_in_flight: MAX_IN_FLIGHT,
            };
            let accepted = accepted_hello(info, handler);
            writer.send(FrameKind::ServerHello, 0, &accepted).await?;
            reader.set_max_frame_bytes(max_frame_bytes);
            Ok((slot, version))
        }
        Err(reply) => {
            if matches!(
                reply,
                ServerHello::Rejected {
                    code: ErrorCode::Unauthenticated,
                    ..
                }
            ) {
                RequestStats::auth_failure("client");
            }
            AUTH_FAILURE_LOG.warn(format_args!(
                "refused a client from {addr} ({}): {reply:?}",
                hello.client_name
            ));
            writer.send(FrameKind::ServerHello, 0, &reply).await?;
            bail!("handshake refused");
        }
    }
}
