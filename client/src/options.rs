//! Client configuration: [`ClientOptions`] and the [`Transport`] GETs take.

use std::fmt;
use std::time::Duration;

use rdkv_proto::wire::Consistency;
pub use rdkv_tls::ClientTlsFiles;

/// How a [`Client`](crate::Client) connects, authenticates and retries.
///
/// ```
/// use std::time::Duration;
/// use rdkv_client::ClientOptions;
///
/// let options = ClientOptions {
///     token: Some("s3cret".into()),
///     request_timeout: Duration::from_secs(2),
///     ..ClientOptions::default()
/// };
/// assert_eq!(options.connect_timeout, Duration::from_secs(2));
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    /// Cluster token sent in the handshake; required when the server has one.
    pub token: Option<String>,
    /// Budget of one call, including connecting, waiting for credits, redirects
    /// and back-off. Default 5 s.
    pub request_timeout: Duration,
    /// Budget of one TCP connect plus handshake (also bounded by the remaining
    /// request budget). Default 2 s.
    pub connect_timeout: Duration,
    /// Most attempts (sends, redirects, connects) one call may make. Default 16.
    pub max_attempts: u32,
    /// Sent in the handshake, for the server's logs. Default `rdkv-client/<version>`.
    pub client_name: String,
    /// Consistency of [`Client::get`](crate::Client::get) and
    /// [`Client::mget`](crate::Client::mget). Default [`Consistency::Lease`].
    pub default_consistency: Consistency,
    /// Which transport serves GETs. Default [`Transport::Auto`]: one-sided
    /// through `rdma` when both sides have a device, else through `shm`
    /// when the server is on this host, else TCP.
    pub transport: Transport,
    /// Bound on the difference between this host's clock and the leader's:
    /// a one-sided lease read is served only while the leader's published
    /// lease runs at least this long beyond now. Default 50 ms.
    pub max_clock_drift: Duration,
    /// Keys whose block location is remembered, so that a repeated GET is one
    /// read instead of two. Default 0 (off): over `shm` a read is a local
    /// memory copy and the cache's lookup costs more than the slot read it
    /// saves (docs/benchmarks.md); it pays where a read is a network round
    /// trip (RDMA).
    pub index_cache_entries: usize,
    /// RDMA device for [`Transport::Auto`] and [`Transport::Rdma`]: `None`
    /// is the first device with an active port. Default: `RDKV_RDMA_DEVICE`
    /// from the environment. Used only when built with the `rdma` feature.
    pub rdma_device: Option<String>,
    /// TLS for TCP connections: the CA the servers' certificates must chain
    /// to, and this client's certificate for servers that verify clients.
    /// Default `None`: plain TCP. Local transports (`shm`, the Unix socket)
    /// and RDMA reads are unchanged; an RDMA session is set up over the TLS
    /// connection.
    pub tls: Option<ClientTlsFiles>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_attempts: 16,
            client_name: concat!("rdkv-client/", env!("CARGO_PKG_VERSION")).to_owned(),
            default_consistency: Consistency::Lease,
            transport: Transport::Auto,
            max_clock_drift: Duration::from_millis(rdkv_proto::region::DEFAULT_MAX_CLOCK_DRIFT_MS),
            index_cache_entries: 0,
            rdma_device: std::env::var("RDKV_RDMA_DEVICE")
                .ok()
                .filter(|d| !d.is_empty()),
            tls: None,
        }
    }
}

// Hand-written so that logging the options never leaks the token.
impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_attempts", &self.max_attempts)
            .field("client_name", &self.client_name)
            .field("default_consistency", &self.default_consistency)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Which transport serves GETs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// One-sided through `rdma` where both sides have a device, else through
    /// libfabric (`ofi`) where the node grants it, else through `shm` where
    /// the server is on this host, when the consistency level allows it;
    /// RPC over TCP otherwise. (libfabric's software `tcp;ofi_rxm` provider
    /// is passed over for a node whose region this host can map: `shm`
    /// is a memory copy, that provider a network round trip.)
    #[default]
    Auto,
    /// Always RPC over TCP.
    Tcp,
    /// Only one-sided through `shm`: a GET that cannot be served from a
    /// mapped region fails with `Error::OneSidedUnavailable` instead of
    /// going to the server (for benchmarks and for tests that must not touch
    /// the server's CPU).
    Shm,
    /// Only one-sided through `rdma`, like `Shm` otherwise. Needs the
    /// client built with the `rdma` feature.
    Rdma,
    /// Only one-sided through libfabric (`fi_read` over the provider the
    /// node granted), like `Shm` otherwise. Needs the client built with the
    /// `ofi` feature.
    Ofi,
}

impl Transport {
    /// GETs that cannot be served one-sided fail instead of using RPC.
    pub fn is_one_sided_only(self) -> bool {
        matches!(self, Transport::Shm | Transport::Rdma | Transport::Ofi)
    }

    #[cfg(feature = "ofi")]
    pub(crate) fn allows_ofi(self) -> bool {
        matches!(self, Transport::Auto | Transport::Ofi)
    }

    #[cfg(feature = "rdma")]
    pub(crate) fn allows_rdma(self) -> bool {
        matches!(self, Transport::Auto | Transport::Rdma)
    }

    pub(crate) fn allows_shm(self) -> bool {
        matches!(self, Transport::Auto | Transport::Shm)
    }
}
