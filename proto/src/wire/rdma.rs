//! What the `rdma` transport exchanges over the (already authenticated) TCP
//! control connection, as perftest does: each side's queue-pair endpoint
//! ([`QpEndpoint`]) and the server's region grant ([`RdmaRegionGrant`]: the
//! address, rkey and length a client READs).
//!
//! Both are carried inside `Request::RdmaConnect` / `Response::RdmaConnected`
//! (append-only variants of the native protocol), and also encode standalone
//! ([`QpEndpoint::encode`] / [`QpEndpoint::decode`]). Decoding validates every
//! field (a QP number or PSN over 24 bits, an MTU that is not one of the five
//! InfiniBand sizes, a credit window of 0 or beyond the bound, a region that
//! wraps the address space): a malformed endpoint is a decode error, so no
//! code past the decoder ever sees one. Nothing here panics on any input.
//!
//! The structs are positional (postcard): fields are never reordered; a
//! change of shape bumps [`RDMA_ENDPOINT_VERSION`].

use serde::{Deserialize, Serialize};

use super::error::WireError;
use super::frame::decode_exact;

/// Shape of [`QpEndpoint`]; a peer sending another version is refused (and
/// reads over shm/tcp). 2 added the READ depths (`max_rd_atomic`,
/// `max_dest_rd_atomic`): a peer that does not announce them cannot agree
/// on them, so version 1 is refused rather than guessed at.
pub const RDMA_ENDPOINT_VERSION: u8 = 2;
/// Largest standalone encoding of a [`QpEndpoint`] accepted (the real one is
/// about 40 bytes).
pub const MAX_QP_ENDPOINT_BYTES: usize = 128;
/// Most receive buffers (= send credits granted to the peer) one side may
/// announce: bounds what a peer can make us size a send window for.
pub const MAX_RDMA_RECV_CREDITS: u32 = 4096;
/// Fewest receive buffers: the credit protocol keeps one credit in reserve
/// for credit updates and grants in steps of two, so a window below four
/// could stall.
pub const MIN_RDMA_RECV_CREDITS: u32 = 4;
/// Smallest receive buffer: a fragment header plus a useful payload.
pub const MIN_RDMA_RECV_BUFFER_BYTES: u32 = 256;
/// Largest receive buffer a peer may announce (fragments are at most this).
pub const MAX_RDMA_RECV_BUFFER_BYTES: u32 = 1024 * 1024;
/// The path MTUs InfiniBand and RoCE define, in bytes.
pub const RDMA_MTU_BYTES: [u16; 5] = [256, 512, 1024, 2048, 4096];

const QPN_MASK: u32 = 0x00FF_FFFF;

/// One side of an RC queue-pair connection: what the other side needs to
/// move its own QP to RTR (and size its send window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawQpEndpoint", into = "RawQpEndpoint")]
pub struct QpEndpoint {
    /// Queue pair number (24 bits).
    pub qp_num: u32,
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand); 0 on RoCE, which routes by GID.
    pub lid: u16,
    /// The GID of `gid_index` (RoCE v2: an IPv4-mapped or IPv6 address).
    pub gid: [u8; 16],
    pub gid_index: u8,
    /// Physical port number (>= 1), for diagnostics.
    pub port: u8,
    /// This side's active path MTU; the connection uses the smaller one.
    pub mtu_bytes: u16,
    /// Receive buffers this side has posted for the peer's SENDs: the peer's
    /// initial send credits.
    pub recv_credits: u32,
    /// Size of each of those buffers: the peer's largest fragment.
    pub recv_buffer_bytes: u32,
    /// READs this side will have outstanding as initiator (>= 1).
    pub max_rd_atomic: u8,
    /// READs this side accepts outstanding as responder (>= 1): the peer's
    /// initiator depth is at most this.
    pub max_dest_rd_atomic: u8,
}

/// The wire shape, checked by `TryFrom` before it becomes a [`QpEndpoint`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RawQpEndpoint {
    version: u8,
    qp_num: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    gid_index: u8,
    port: u8,
    mtu_bytes: u16,
    recv_credits: u32,
    recv_buffer_bytes: u32,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
}

/// Why an endpoint or grant was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaWireError {
    #[error("rdma endpoint version {found} (this build speaks {RDMA_ENDPOINT_VERSION})")]
    Version { found: u8 },
    #[error("{field} {value:#x} does not fit in 24 bits")]
    Over24Bits { field: &'static str, value: u32 },
    #[error("path MTU of {found} bytes is not 256, 512, 1024, 2048 or 4096")]
    Mtu { found: u16 },
    #[error("port number 0 (ports start at 1)")]
    Port,
    #[error("{found} receive credits ({MIN_RDMA_RECV_CREDITS}..={MAX_RDMA_RECV_CREDITS} allowed)")]
    Credits { found: u32 },
    #[error(
        "receive buffers of {found} bytes \
         ({MIN_RDMA_RECV_BUFFER_BYTES}..={MAX_RDMA_RECV_BUFFER_BYTES} allowed)"
    )]
    BufferBytes { found: u32 },
    #[error("{field} of 0 (at least one outstanding READ)")]
    ReadDepth { field: &'static str },
    #[error("region of {len_bytes} bytes at {addr:#x} is empty or wraps the address space")]
    Region { addr: u64, len_bytes: u64 },
}

impl TryFrom<RawQpEndpoint> for QpEndpoint {
    type Error = RdmaWireError;

    fn try_from(raw: RawQpEndpoint) -> Result<QpEndpoint, RdmaWireError> {
        if raw.version != RDMA_ENDPOINT_VERSION {
            return Err(RdmaWireError::Version { found: raw.version });
        }
        for (field, value) in [("qp number", raw.qp_num), ("psn", raw.psn)] {
            if value & !QPN_MASK != 0 {
                return Err(RdmaWireError::Over24Bits { field, value });
            }
        }
        if !RDMA_MTU_BYTES.contains(&raw.mtu_bytes) {
            return Err(RdmaWireError::Mtu {
                found: raw.mtu_bytes,
            });
        }
        if raw.port == 0 {
            return Err(RdmaWireError::Port);
        }
        if !(MIN_RDMA_RECV_CREDITS..=MAX_RDMA_RECV_CREDITS).contains(&raw.recv_credits) {
            return Err(RdmaWireError::Credits {
                found: raw.recv_credits,
            });
        }
        if !(MIN_RDMA_RECV_BUFFER_BYTES..=MAX_RDMA_RECV_BUFFER_BYTES)
            .contains(&raw.recv_buffer_bytes)
        {
            return Err(RdmaWireError::BufferBytes {
                found: raw.recv_buffer_bytes,
            });
        }
        for (field, value) in [
            ("max_rd_atomic", raw.max_rd_atomic),
            ("max_dest_rd_atomic", raw.max_dest_rd_atomic),
        ] {
            if value == 0 {
                return Err(RdmaWireError::ReadDepth { field });
            }
        }
        Ok(QpEndpoint {
            qp_num: raw.qp_num,
            psn: raw.psn,
            lid: raw.lid,
            gid: raw.gid,
            gid_index: raw.gid_index,
            port: raw.port,
            mtu_bytes: raw.mtu_bytes,
            recv_credits: raw.recv_credits,
            recv_buffer_bytes: raw.recv_buffer_bytes,
            max_rd_atomic: raw.max_rd_atomic,
            max_dest_rd_atomic: raw.max_dest_rd_atomic,
        })
    }
}

impl From<QpEndpoint> for RawQpEndpoint {
    fn from(e: QpEndpoint) -> RawQpEndpoint {
        RawQpEndpoint {
            version: RDMA_ENDPOINT_VERSION,
            qp_num: e.qp_num,
            psn: e.psn,
            lid: e.lid,
            gid: e.gid,
            gid_index: e.gid_index,
            port: e.port,
            mtu_bytes: e.mtu_bytes,
            recv_credits: e.recv_credits,
            recv_buffer_bytes: e.recv_buffer_bytes,
            max_rd_atomic: e.max_rd_atomic,
            max_dest_rd_atomic: e.max_dest_rd_atomic,
        }
    }
}

impl QpEndpoint {
    /// Checks the fields a decoder would check (for endpoints built locally).
    pub fn validate(&self) -> Result<(), RdmaWireError> {
        QpEndpoint::try_from(RawQpEndpoint::from(*self)).map(|_| ())
    }

    /// The standalone encoding (postcard), at most [`MAX_QP_ENDPOINT_BYTES`].
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        postcard::to_stdvec(self).map_err(WireError::Encode)
    }

    /// Decodes [`QpEndpoint::encode`]'s bytes, refusing oversized input,
    /// trailing bytes and any invalid field.
    pub fn decode(bytes: &[u8]) -> Result<QpEndpoint, WireError> {
        if bytes.len() > MAX_QP_ENDPOINT_BYTES {
            return Err(WireError::FrameTooLarge {
                len_bytes: bytes.len() as u64,
                max_bytes: MAX_QP_ENDPOINT_BYTES as u32,
            });
        }
        decode_exact(bytes)
    }
}

/// What a client needs to READ a server's region: handed out only in reply
/// to an authenticated connection's request (brief section 8). The NIC
/// enforces the bounds: the memory region is exactly the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawRegionGrant", into = "RawRegionGrant")]
pub struct RdmaRegionGrant {
    pub node_id: u64,
    pub region_epoch: u64,
    /// Virtual address of the region's first byte in the server.
    pub addr: u64,
    pub rkey: u32,
    pub len_bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RawRegionGrant {
    node_id: u64,
    region_epoch: u64,
    addr: u64,
    rkey: u32,
    len_bytes: u64,
}

/// Whether a granted region, `len_bytes` from `addr`, is one a reader can
/// address: not empty, and not wrapping the address space. Every
/// transport's grant (`RdmaRegionGrant`, `OfiRegionGrant`) is checked so.
pub(crate) fn spans_a_region(addr: u64, len_bytes: u64) -> bool {
    len_bytes > 0 && addr.checked_add(len_bytes).is_some()
}

impl TryFrom<RawRegionGrant> for RdmaRegionGrant {
    type Error = RdmaWireError;

    fn try_from(raw: RawRegionGrant) -> Result<RdmaRegionGrant, RdmaWireError> {
        if !spans_a_region(raw.addr, raw.len_bytes) {
            return Err(RdmaWireError::Region {
                addr: raw.addr,
                len_bytes: raw.len_bytes,
            });
        }
        Ok(RdmaRegionGrant {
            node_id: raw.node_id,
            region_epoch: raw.region_epoch,
            addr: raw.addr,
            rkey: raw.rkey,
            len_bytes: raw.len_bytes,
        })
    }
}

impl From<RdmaRegionGrant> for RawRegionGrant {
    fn from(g: RdmaRegionGrant) -> RawRegionGrant {
        RawRegionGrant {
            node_id: g.node_id,
            region_epoch: g.region_epoch,
            addr: g.addr,
            rkey: g.rkey,
            len_bytes: g.len_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> QpEndpoint {
        QpEndpoint {
            qp_num: 0x12_3456,
            psn: 0xAB_CDEF,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
            gid_index: 3,
            port: 1,
            mtu_bytes: 1024,
            recv_credits: 64,
            recv_buffer_bytes: 64 * 1024,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 8,
        }
    }

    /// Version 1 (no READ depths) is refused: a peer that cannot say how
    /// many READs it accepts cannot be connected to safely.
    #[test]
    fn an_endpoint_carries_its_read_depths_and_version_1_is_refused() {
        let e = endpoint();
        let decoded = QpEndpoint::decode(&e.encode().unwrap()).unwrap();
        assert_eq!((decoded.max_rd_atomic, decoded.max_dest_rd_atomic), (16, 8));
        let mut v1 = e.encode().unwrap();
        v1[0] = 1;
        v1.truncate(v1.len() - 2);
        assert!(QpEndpoint::decode(&v1).is_err());
    }

    #[test]
    fn an_endpoint_round_trips() {
        let e = endpoint();
        let bytes = e.encode().unwrap();
        assert!(bytes.len() <= MAX_QP_ENDPOINT_BYTES);
        assert_eq!(QpEndpoint::decode(&bytes).unwrap(), e);
        assert_eq!(bytes[0], RDMA_ENDPOINT_VERSION);
    }

    #[test]
    fn malformed_endpoints_are_refused() {
        let good = endpoint().encode().unwrap();
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(
            QpEndpoint::decode(&trailing),
            Err(WireError::TrailingBytes { n_bytes: 1 })
        ));
        for cut in 0..good.len() {
            assert!(QpEndpoint::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        // Over the limit is refused by its length before decoding; at the
        // limit it is decoded (and these zeros fail as a bad encoding).
        assert!(matches!(
            QpEndpoint::decode(&[0u8; MAX_QP_ENDPOINT_BYTES + 1]),
            Err(WireError::FrameTooLarge { .. })
        ));
        assert!(!matches!(
            QpEndpoint::decode(&[0u8; MAX_QP_ENDPOINT_BYTES]),
            Err(WireError::FrameTooLarge { .. }) | Ok(_)
        ));
        let mut wrong_version = good.clone();
        wrong_version[0] = 1;
        assert!(QpEndpoint::decode(&wrong_version).is_err());
        let bad = [
            QpEndpoint {
                qp_num: 1 << 24,
                ..endpoint()
            },
            QpEndpoint {
                psn: u32::MAX,
                ..endpoint()
            },
            QpEndpoint {
                mtu_bytes: 1500,
                ..endpoint()
            },
            QpEndpoint {
                port: 0,
                ..endpoint()
            },
            QpEndpoint {
                recv_credits: MIN_RDMA_RECV_CREDITS - 1,
                ..endpoint()
            },
            QpEndpoint {
                recv_credits: MAX_RDMA_RECV_CREDITS + 1,
                ..endpoint()
            },
            QpEndpoint {
                recv_buffer_bytes: 16,
                ..endpoint()
            },
            QpEndpoint {
                recv_buffer_bytes: MAX_RDMA_RECV_BUFFER_BYTES + 1,
                ..endpoint()
            },
            QpEndpoint {
                max_rd_atomic: 0,
                ..endpoint()
            },
            QpEndpoint {
                max_dest_rd_atomic: 0,
                ..endpoint()
            },
        ];
        for e in bad {
            assert!(e.validate().is_err(), "{e:?}");
            // Encoding does not validate; decoding does.
            let bytes = e.encode().unwrap();
            assert!(QpEndpoint::decode(&bytes).is_err(), "{e:?}");
        }
    }

    #[test]
    fn grants_that_wrap_or_are_empty_are_refused() {
        let grant = RdmaRegionGrant {
            node_id: 1,
            region_epoch: 9,
            addr: 0x7f00_0000_0000,
            rkey: 0x1234,
            len_bytes: 1 << 26,
        };
        let bytes = postcard::to_stdvec(&grant).unwrap();
        assert_eq!(
            postcard::from_bytes::<RdmaRegionGrant>(&bytes).unwrap(),
            grant
        );
        for bad in [
            RdmaRegionGrant {
                len_bytes: 0,
                ..grant
            },
            RdmaRegionGrant {
                addr: u64::MAX - 10,
                ..grant
            },
        ] {
            let bytes = postcard::to_stdvec(&bad).unwrap();
            assert!(postcard::from_bytes::<RdmaRegionGrant>(&bytes).is_err());
        }
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(e) = QpEndpoint::decode(&bytes) {
                proptest::prop_assert!(e.validate().is_ok());
            }
        }
    }
}
