//! TLS for rdkv's TCP connections, over rustls with the `ring` provider.
//!
//! - [`files`]: certificates, keys and CA bundles read from PEM files, with
//!   errors that name the file.
//! - [`server`]: [`ServerTls`], what every TCP listener of a node accepts
//!   with: its certificate, and client certificates verified against a CA
//!   when one is given; [`ServerTls::reload`] swaps in the files' new
//!   contents for the connections accepted after it.
//! - [`client`]: [`ClientTls`], what every outgoing connection (clients,
//!   peers, a node's own forwarding client) connects with: the CA the
//!   server's certificate must chain to, and an optional client certificate.
//! - [`reload`]: [`Reloadable`], the swap both sides share.
//! - [`stream`]: [`Stream`], a TCP connection with or without TLS, split
//!   into halves that own their side (plain TCP keeps its lock-free halves).

#![forbid(unsafe_code)]

pub mod client;
pub mod files;
pub mod reload;
pub mod server;
pub mod stream;

use std::path::PathBuf;
use std::sync::Arc;

pub use client::{ClientTls, ClientTlsFiles};
pub use reload::{Reloadable, TlsFiles};
/// For callers that inspect a TLS failure (an `io::Error` wrapping one).
pub use rustls;
pub use server::{ServerTls, ServerTlsFiles};
pub use stream::{ReadHalf, Stream, WriteHalf};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or held no usable PEM.
    #[error("{what} {path}: {reason}")]
    File {
        what: String,
        path: PathBuf,
        reason: String,
    },
    /// rustls refused the certificates or keys (e.g. a key that does not
    /// match its certificate, a CA file with no CA).
    #[error("{what}: {reason}")]
    Config { what: String, reason: rustls::Error },
    /// A client certificate, key or server name without a CA file.
    #[error("a TLS client certificate, key or server name needs a CA file as well")]
    NoCa,
    /// A client certificate without its key, or the other way round.
    #[error("a client certificate needs both a certificate file and a key file")]
    IncompleteIdentity,
    /// The name the server's certificate is checked against is not a DNS
    /// name or an IP address.
    #[error("{0:?} is not a server name (a DNS name or an IP address)")]
    ServerName(String),
}

/// The one crypto provider every config is built with: `ring` (a light
/// build; no process-wide default to install or to race on).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
