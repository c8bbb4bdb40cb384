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

/// The local address this host sends from to reach `addr` (`host:port`):
/// what a client's endpoint binds to, so that the provider's connections
/// leave by the route the kernel chose for the node (another interface, a
/// bridge into a network namespace), not from the first interface it
/// lists. A UDP socket's `connect` only consults the routing table: no
/// packet is sent. `None` when `addr` does not resolve or has no route.
pub fn source_toward(addr: &str) -> Option<std::net::IpAddr> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let target = addr.to_socket_addrs().ok()?.next()?;
    let any: std::net::SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_source_toward_a_loopback_address_is_a_loopback_address() {
        let source = super::source_toward("127.0.0.1:7000");
        assert!(source.is_some_and(|ip| ip.is_loopback()), "{source:?}");
        assert_eq!(super::source_toward("not an address"), None);
    }
}
