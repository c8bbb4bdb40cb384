//! Version handshake: the first frame each way on a connection.
//!
//! The client sends a [`ClientHello`] (kind `ClientHello`, request id 0); the server
//! answers with a [`ServerHello`] and, if it accepted, both sides speak the chosen
//! version from then on. Token verification is the server's job; this module only
//! offers the constant-time comparison it should use.

use core::fmt;

use serde::{Deserialize, Serialize};

use super::error::WireError;
use super::message::ErrorCode;

/// Version 2 added the shard answers ([`Response::ShardMap`],
/// [`Response::WrongShard`]): a connection that negotiated 1 is never sent
/// them ([`Response::min_version`]).
///
/// [`Response::ShardMap`]: super::Response::ShardMap
/// [`Response::WrongShard`]: super::Response::WrongShard
/// [`Response::min_version`]: super::Response::min_version
///
/// Version 3 added [`Request::Sharded`] (a scan or clear of one shard),
/// never sent on a connection of an older version
/// ([`Request::min_version`]).
///
/// [`Request::Sharded`]: super::Request::Sharded
/// [`Request::min_version`]: super::Request::min_version
pub const PROTOCOL_VERSION: u16 = 3;
pub const MIN_PROTOCOL_VERSION: u16 = 1;
/// The first version whose clients decode the shard answers.
pub const SHARDS_PROTOCOL_VERSION: u16 = 2;
/// The first version whose servers decode `Request::Sharded`.
pub const SHARDED_PROTOCOL_VERSION: u16 = 3;
/// Lets a server recognise a non-rdkv client (or an HTTP probe) on its first frame.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"RDKV";

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientHello {
    pub magic: [u8; 4],
    pub min_version: u16,
    pub max_version: u16,
    pub token: Option<String>,
    /// Free-form, for the server's logs and metrics.
    pub client_name: String,
}

impl ClientHello {
    /// A hello offering every version this build supports.
    pub fn new(client_name: impl Into<String>, token: Option<String>) -> Self {
        Self {
            magic: HANDSHAKE_MAGIC,
            min_version: MIN_PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            token,
            client_name: client_name.into(),
        }
    }
}

// Hand-written so that logging a hello never leaks the credential.
impl fmt::Debug for ClientHello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientHello")
            .field("magic", &self.magic)
            .field("min_version", &self.min_version)
            .field("max_version", &self.max_version)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("client_name", &self.client_name)
            .finish()
    }
}

/// What a server that accepted a client tells it: the version and the
/// limits of the connection. On the wire its fields follow the variant
/// number in this order (the encoding of a struct variant with the same
/// fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    pub version: u16,
    pub node_id: u64,
    pub cluster_id: u64,
    /// The largest frame body the server will accept; clients must not send more.
    pub max_frame_bytes: u32,
    /// Pipelining depth (credits). The server reads no further request
    /// while this many are in flight on the connection (backpressure);
    /// `TooManyInFlight` is for servers that shed load instead.
    pub max_in_flight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerHello {
    Accepted(ServerInfo),
    Rejected {
        code: ErrorCode,
        message: String,
    },
    /// `Accepted` by a node of a multi-shard cluster, on a connection of
    /// version [`SHARDED_PROTOCOL_VERSION`] or later: the version of the
    /// node's shard map rides on the hello, so a client learns that the
    /// cluster is sharded (and fetches the map before its first request)
    /// with no round trip of its own, and a single group's hello is as
    /// before (docs/sharding.md, section 5).
    AcceptedSharded {
        info: ServerInfo,
        shard_map_version: u64,
    },
}

/// Picks the highest version both sides support.
pub fn negotiate(hello: &ClientHello, server_min: u16, server_max: u16) -> Result<u16, WireError> {
    if hello.magic != HANDSHAKE_MAGIC {
        return Err(WireError::BadMagic { found: hello.magic });
    }
    let highest = hello.max_version.min(server_max);
    let lowest = hello.min_version.max(server_min);
    // An inverted range on either side also lands here, since then highest < lowest.
    if highest < lowest {
        return Err(WireError::UnsupportedVersion {
            client_min: hello.min_version,
            client_max: hello.max_version,
            server_min,
            server_max,
        });
    }
    Ok(highest)
}

/// Compares a presented token with the expected one without an early exit, so the
/// response time does not reveal how long a matching prefix an attacker has guessed.
/// Only the length can leak, which is acceptable for random tokens of a fixed size.
#[must_use]
pub fn tokens_match(expected: &[u8], presented: &[u8]) -> bool {
    if expected.len() != presented.len() {
        return false;
    }
    let diff = expected
        .iter()
        .zip(presented)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    // Keeps the optimiser from turning the fold back into a short-circuiting compare.
    core::hint::black_box(diff) == 0
}
