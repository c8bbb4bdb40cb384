//! The `shm` transport's attach reply.
//!
//! A same-host client connects to the server's Unix socket and sends one
//! [`ClientHello`](super::ClientHello) frame (the node's primary region: a
//! single group's), or one [`ShmAttach`] frame naming a shard (protocol
//! version 3, docs/sharding.md, section 5). The server answers with exactly one
//! message, `[u32 LE len][postcard(ShmGrant)]`, and closes. A
//! [`ShmGrant::Granted`] travels in the same `sendmsg` as a read-only fd of the
//! region's memfd (SCM_RIGHTS); a [`ShmGrant::Refused`] never carries an fd.
//!
//! The enum is append-only: variants are encoded by their index, so new ones
//! go at the end and existing ones never change shape.

use serde::{Deserialize, Serialize};

use super::error::WireError;
use super::frame::decode_exact;
use super::handshake::ClientHello;
use super::message::{ErrorCode, WrongShard};
use crate::shard::ShardId;

/// Largest grant body a client accepts (the length prefix not counted). A
/// grant is a few dozen bytes; the cap keeps a hostile server from making the
/// client allocate without bound.
pub const MAX_SHM_GRANT_BYTES: u32 = 4096;

/// Bytes of the grant's length prefix.
pub const SHM_GRANT_PREFIX_BYTES: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShmGrant {
    /// The attached fd maps `region_bytes` bytes of node `node_id`'s region,
    /// whose header carried `region_epoch` when the grant was made.
    Granted {
        node_id: u64,
        region_epoch: u64,
        region_bytes: u64,
    },
    /// No fd is attached. Branch on `code`; `message` is for humans.
    Refused { code: ErrorCode, message: String },
    /// No fd is attached: the node does not host the shard a [`ShmAttach`]
    /// named (only ever sent in answer to one).
    WrongShard(WrongShard),
}

/// The attach of one shard's region (frame kind
/// [`FrameKind::ShmAttach`](super::FrameKind::ShmAttach)): the hello, whose
/// versions must include 3, and the shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmAttach {
    pub hello: ClientHello,
    pub shard: ShardId,
}

impl ShmGrant {
    /// `[u32 LE len][postcard]`, or `None` if the encoding would exceed
    /// [`MAX_SHM_GRANT_BYTES`] (only possible with an oversized message).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let body = postcard::to_stdvec(self).ok()?;
        let len = u32::try_from(body.len())
            .ok()
            .filter(|&n| n <= MAX_SHM_GRANT_BYTES)?;
        let mut out = Vec::with_capacity(SHM_GRANT_PREFIX_BYTES + body.len());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&body);
        Some(out)
    }

    /// Decodes a grant body (without the length prefix), rejecting trailing bytes.
    pub fn decode(body: &[u8]) -> Result<ShmGrant, WireError> {
        decode_exact(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_round_trip_and_are_bounded() {
        for grant in [
            ShmGrant::Granted {
                node_id: 7,
                region_epoch: 3,
                region_bytes: 1 << 28,
            },
            ShmGrant::Refused {
                code: ErrorCode::Unauthenticated,
                message: "bad token".into(),
            },
            ShmGrant::WrongShard(WrongShard {
                map_version: 1,
                slot: crate::shard::Slot::new(5461).unwrap(),
                shard: ShardId(2),
            }),
        ] {
            let bytes = grant.encode().unwrap();
            let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            assert_eq!(len, bytes.len() - 4);
            assert_eq!(ShmGrant::decode(&bytes[4..]).unwrap(), grant);
            let mut trailing = bytes[4..].to_vec();
            trailing.push(0);
            assert!(ShmGrant::decode(&trailing).is_err());
        }
        let huge = ShmGrant::Refused {
            code: ErrorCode::Internal,
            message: "x".repeat(MAX_SHM_GRANT_BYTES as usize),
        };
        assert!(huge.encode().is_none());
        // Variant indices are the wire format: Granted is 0, Refused is 1.
        assert_eq!(
            ShmGrant::Granted {
                node_id: 1,
                region_epoch: 2,
                region_bytes: 3
            }
            .encode()
            .unwrap()[4..],
            [0, 1, 2, 3]
        );
    }
}
