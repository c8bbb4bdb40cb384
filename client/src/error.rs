//! The client's error type.

use std::io;
use std::time::Duration;

pub use rdkv_fabric::ConnectError;
use rdkv_proto::wire::{ErrorCode, ErrorReply, WireError};

/// Everything a client call can fail with.
///
/// Branch on the variant (and on [`ErrorReply::code`] for [`Error::Server`]), never
/// on the message text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The client was given no endpoint to talk to.
    #[error("no endpoints given")]
    NoEndpoints,
    /// A connection could not be opened: TCP failed (or broke during the
    /// handshake), or the server refused the handshake
    /// ([`ConnectError::Handshake`], e.g. with [`ErrorCode::Unauthenticated`]
    /// for a missing or wrong token, or [`ErrorCode::UnsupportedVersion`]).
    #[error(transparent)]
    Connect(ConnectError),
    /// The server answered with an error that retrying cannot fix (or the retry
    /// budget ran out on a retryable one, such as `Unavailable`).
    #[error("server error {:?}: {}", .0.code, .0.message)]
    Server(ErrorReply),
    /// The request did not complete within `ClientOptions::request_timeout`, and it
    /// was either a read or a write that was never sent: nothing was changed.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// No node knows a leader (an election is in progress or there is no quorum) and
    /// the retry budget or the request timeout ran out.
    #[error("no leader available (election in progress or no quorum)")]
    NoLeader,

    /// `Transport::Shm` was forced but no mapped region could serve the read
    /// at its consistency level right now (no local server, lease lapsed,
    /// replicas beyond the lag bound).
    #[error("no one-sided read possible: no mapped region can serve it at this consistency now")]
    OneSidedUnavailable,
    /// A write (or membership change) was sent but its reply never came: the
    /// connection broke, the request timed out, or the server answered `Timeout`.
    /// It may or may not have been applied. The client never retries such a request
    /// on its own; read the key (or use [`Client::cas`](crate::Client::cas)) to find out.
    #[error("outcome unknown: the write was sent to {addr} but {reason}")]
    OutcomeUnknown { addr: String, reason: String },
    /// A read's connection broke and the retry budget ran out.
    #[error("connection to {addr} lost: {reason}")]
    ConnectionLost { addr: String, reason: String },
    /// A frame could not be encoded or decoded (e.g. a request larger than the
    /// server's `max_frame_bytes`, or a malformed reply).
    #[error("protocol error: {0}")]
    Protocol(WireError),
    /// The server answered with a response of the wrong kind for the request.
    #[error("unexpected response to {request}: {response}")]
    UnexpectedResponse {
        request: &'static str,
        response: String,
    },
    /// The snapshot changed (a newer one was built) while it was being streamed into
    /// a writer that cannot be rewound; start again.
    #[error("snapshot changed during transfer (index {from} -> {to}); retry")]
    SnapshotChanged { from: u64, to: u64 },
    /// A node serves a newer shard map (version `needed`) than the one the
    /// client could fetch in the call's budget (`held`; 0: none): the
    /// request was never served, nothing was changed.
    #[error("stale shard map: a node has version {needed}, the client {held}")]
    StaleShardMap { needed: u64, held: u64 },
    /// An `mput` whose pairs span several shards (each shard's part one
    /// atomic write) was written in some shards and not, or not knowingly,
    /// in others: which keys are which is in the [`PartialMPut`].
    #[error("{0}")]
    PartialMPut(Box<PartialMPut>),
    /// The TLS settings could not be used (a missing or bad CA,
    /// certificate or key file).
    #[error("TLS settings: {0}")]
    Tls(rdkv_tls::TlsError),
    /// Local I/O (writing a snapshot).
    #[error("I/O error: {0}")]
    Io(io::Error),
}

impl Error {
    /// The server's error code, for [`Error::Server`] and a refused handshake.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Server(reply) => Some(reply.code),
            Self::Connect(ConnectError::Handshake { code, .. }) => Some(*code),
            _ => None,
        }
    }

    /// Whether the same call may succeed if repeated later. `OutcomeUnknown` is not:
    /// repeating a write whose first attempt may have applied is the caller's call.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect(ConnectError::Handshake { code, .. }) => *code == ErrorCode::Unavailable,
            // Certificates and CAs do not change between attempts.
            Self::Connect(ConnectError::Tls { .. } | ConnectError::ServerWantsTls { .. }) => false,
            Self::Connect(_) | Self::Timeout(_) | Self::NoLeader => true,
            Self::OneSidedUnavailable => true,
            Self::ConnectionLost { .. } | Self::StaleShardMap { .. } => true,
            Self::Server(reply) => reply.code.is_retryable(),
            _ => false,
        }
    }
}

/// A malformed handshake frame is a protocol error like any other.
impl From<ConnectError> for Error {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Protocol(e) => Self::Protocol(e),
            other => Self::Connect(other),
        }
    }
}

impl Error {
    /// Whether the server refused the handshake, rdkv's or TLS's (as
    /// opposed to TCP failing).
    pub fn is_handshake_refusal(&self) -> bool {
        matches!(
            self,
            Self::Connect(
                ConnectError::Handshake { .. }
                    | ConnectError::Tls { .. }
                    | ConnectError::ServerWantsTls { .. }
            )
        )
    }
}

// Not `#[from]`: the message already shows the cause, and a `source()` as well
// would print it twice in error chains (anyhow's `{:#}`).
impl From<WireError> for Error {
    fn from(e: WireError) -> Self {
        Self::Protocol(e)
    }
}

impl From<rdkv_tls::TlsError> for Error {
    fn from(e: rdkv_tls::TlsError) -> Self {
        Self::Tls(e)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Shorthand for results of client calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What became of an `mput` split over several shards when a part failed.
#[derive(Debug)]
pub struct PartialMPut {
    /// Keys written, per shard part, with that part's version (versions of
    /// different shards are positions in different logs: not comparable).
    pub written: Vec<(Vec<bytes::Bytes>, u64)>,
    /// Keys of the parts that failed, with why. A part whose error is
    /// [`Error::OutcomeUnknown`] may have been written.
    pub failed: Vec<(Vec<bytes::Bytes>, Error)>,
}

impl std::fmt::Display for PartialMPut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "mput across shards partly failed: {} keys written in {} shards, {} keys in {} shards not written or unknown",
            keys_in(&self.written),
            self.written.len(),
            keys_in(&self.failed),
            self.failed.len()
        )?;
        if let Some((_, first)) = self.failed.first() {
            write!(f, " (first error: {first})")?;
        }
        Ok(())
    }
}

fn keys_in<T>(parts: &[(Vec<bytes::Bytes>, T)]) -> usize {
    parts.iter().map(|(keys, _)| keys.len()).sum()
}
