//! The `ofi` transport: one-sided reads of a server's region with
//! libfabric's `fi_read`, over any provider with RMA on reliable datagram
//! endpoints (`tcp;ofi_rxm` in software on any host; `verbs;ofi_rxm`,
//! `efa`, `cxi` on RDMA fabrics). GETs go through the same
//! [`Fabric`](crate::Fabric)/[`RemoteRegion`](crate::RemoteRegion) traits and
//! the same validating [`RegionReader`](crate::RegionReader) as shm and
//! verbs; writes and control stay on the authenticated TCP connection,
//! which also carries the grant (`Request::OfiRegion`).
//!
//! Always built (pure, tested without a fabric):
//! - [`plan`]: how a batch of reads goes through the client's bounce buffer
//!   in rounds.
//! - [`error`]: typed errors and their mapping onto `FabricError`.
//!
//! With the cargo feature `ofi` (a C shim over libfabric's static inline
//! API, `shim.c`, built against the system headers; libfabric.so.1 is
//! opened at run time, so the binary still runs without it):
//! - `ffi`: the shim's functions.
//! - [`endpoint`]: the library, an RDM endpoint (fabric, domain, CQ, AV),
//!   memory registrations.
//! - [`server`]: a node's endpoint, its progress thread, its region
//!   registrations and their retirement after the grace period.
//! - [`client`]: a client's session with one server (endpoint, registered
//!   bounce buffer, the grant) and the `Fabric` over it.

pub mod error;
pub mod plan;

#[cfg(feature = "ofi")]
pub mod client;
#[cfg(feature = "ofi")]
pub mod endpoint;
#[cfg(feature = "ofi")]
mod ffi;
#[cfg(feature = "ofi")]
pub mod server;

pub use error::OfiError;

/// Whether this build carries the libfabric transport (the cargo feature).
pub const COMPILED_IN: bool = cfg!(feature = "ofi");

/// Providers tried, in order, when none is named: the hardware fabrics
/// first, then libfabric's software RMA over TCP, which works on any host.
pub const AUTO_PROVIDERS: [&str; 4] = ["cxi", "efa", "verbs;ofi_rxm", "tcp;ofi_rxm"];

/// The environment variable (and `--ofi-provider` value) naming the
/// provider; `off` disables the transport.
pub const PROVIDER_ENV: &str = "RDKV_OFI_PROVIDER";
