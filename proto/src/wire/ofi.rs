//! What the `ofi` (libfabric) transport hands an authenticated client: the
//! server's region grant ([`OfiRegionGrant`]: provider, endpoint address,
//! key, address, length, epoch), carried by `Response::OfiRegion` in reply
//! to `Request::OfiRegion` over the (already authenticated) control
//! connection. The client opens an endpoint of the same provider, inserts
//! the server's address and reads with `fi_read`.
//!
//! Decoding validates every field (a provider name or endpoint address of
//! a bounded length, a non-empty region that does not wrap the address
//! space): no code past the decoder sees a malformed grant. Positional
//! (postcard): fields are never reordered.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest provider name accepted (`verbs;ofi_rxm` is 13 bytes).
pub const MAX_OFI_PROVIDER_BYTES: usize = 64;
/// Longest endpoint address accepted (a sockaddr_in6 is 28 bytes, EFA's
/// address 32).
pub const MAX_OFI_ENDPOINT_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawOfiGrant", into = "RawOfiGrant")]
pub struct OfiRegionGrant {
    pub node_id: u64,
    pub region_epoch: u64,
    /// libfabric provider, e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// The server endpoint's address (`fi_getname`).
    pub endpoint: Vec<u8>,
    /// The remote address of the region's first byte as `fi_read` names it:
    /// its virtual address, or 0 where the provider addresses offsets.
    pub addr: u64,
    /// The registration's key; unguessable (64 random bits where the
    /// provider lets rdkv choose it).
    pub key: u64,
    pub len_bytes: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum OfiWireError {
    #[error("provider name of {0} bytes (at most {MAX_OFI_PROVIDER_BYTES})")]
    Provider(usize),
    #[error("endpoint address of {0} bytes (1 to {MAX_OFI_ENDPOINT_BYTES})")]
    Endpoint(usize),
    #[error("region at {addr:#x} of {len_bytes} bytes is empty or wraps")]
    Region { addr: u64, len_bytes: u64 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RawOfiGrant {
    node_id: u64,
    region_epoch: u64,
    provider: String,
    endpoint: Vec<u8>,
    addr: u64,
    key: u64,
    len_bytes: u64,
}

impl TryFrom<RawOfiGrant> for OfiRegionGrant {
    type Error = OfiWireError;

    fn try_from(raw: RawOfiGrant) -> Result<OfiRegionGrant, OfiWireError> {
        if raw.provider.is_empty() || raw.provider.len() > MAX_OFI_PROVIDER_BYTES {
            return Err(OfiWireError::Provider(raw.provider.len()));
        }
        if raw.endpoint.is_empty() || raw.endpoint.len() > MAX_OFI_ENDPOINT_BYTES {
            return Err(OfiWireError::Endpoint(raw.endpoint.len()));
        }
        if !super::rdma::spans_a_region(raw.addr, raw.len_bytes) {
            return Err(OfiWireError::Region {
                addr: raw.addr,
                len_bytes: raw.len_bytes,
            });
        }
        Ok(OfiRegionGrant {
            node_id: raw.node_id,
            region_epoch: raw.region_epoch,
            provider: raw.provider,
            endpoint: raw.endpoint,
            addr: raw.addr,
            key: raw.key,
            len_bytes: raw.len_bytes,
        })
    }
}

impl From<OfiRegionGrant> for RawOfiGrant {
    fn from(g: OfiRegionGrant) -> RawOfiGrant {
        RawOfiGrant {
            node_id: g.node_id,
            region_epoch: g.region_epoch,
            provider: g.provider,
            endpoint: g.endpoint,
            addr: g.addr,
            key: g.key,
            len_bytes: g.len_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> OfiRegionGrant {
        OfiRegionGrant {
            node_id: 2,
            region_epoch: 5,
            provider: "tcp;ofi_rxm".into(),
            endpoint: vec![2, 0, 0x9c, 0x40, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            addr: 0x7f00_0000_0000,
            key: 0xdead_beef_1234_5678,
            len_bytes: 1 << 20,
        }
    }

    #[test]
    fn a_grant_round_trips_and_malformed_ones_do_not_decode() {
        let bytes = postcard::to_stdvec(&grant()).unwrap();
        assert_eq!(
            postcard::from_bytes::<OfiRegionGrant>(&bytes).unwrap(),
            grant()
        );
        let bad = [
            OfiRegionGrant {
                provider: String::new(),
                ..grant()
            },
            OfiRegionGrant {
                provider: "p".repeat(MAX_OFI_PROVIDER_BYTES + 1),
                ..grant()
            },
            OfiRegionGrant {
                endpoint: Vec::new(),
                ..grant()
            },
            OfiRegionGrant {
                endpoint: vec![0; MAX_OFI_ENDPOINT_BYTES + 1],
                ..grant()
            },
            OfiRegionGrant {
                len_bytes: 0,
                ..grant()
            },
            OfiRegionGrant {
                addr: u64::MAX,
                ..grant()
            },
        ];
        for g in bad {
            let bytes = postcard::to_stdvec(&RawOfiGrant::from(g.clone())).unwrap();
            assert!(
                postcard::from_bytes::<OfiRegionGrant>(&bytes).is_err(),
                "{g:?}"
            );
        }
        for cut in 0..bytes.len() {
            assert!(postcard::from_bytes::<OfiRegionGrant>(&bytes[..cut]).is_err());
        }
    }
}
