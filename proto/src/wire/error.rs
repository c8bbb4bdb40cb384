//! Error types of the wire layer and their mapping onto reply codes.

use super::message::{ErrorCode, ErrorReply};

/// A frame or payload could not be encoded or decoded.
///
/// Framing errors ([`WireError::closes_connection`]) leave the byte stream
/// desynchronised, so the only safe reaction is to close the connection.
/// Payload errors happen inside an intact frame and can be answered with an
/// [`ErrorReply`] carrying the frame's request id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The announced (or, when encoding, the actual) body length exceeds the limit.
    #[error("frame body of {len_bytes} bytes exceeds the maximum of {max_bytes} bytes")]
    FrameTooLarge { len_bytes: u64, max_bytes: u32 },
    /// The announced body length cannot even hold the kind byte and request id.
    #[error("frame body of {len_bytes} bytes is shorter than the 9-byte minimum")]
    FrameTooShort { len_bytes: u32 },
    /// The kind byte names no known frame kind.
    #[error("unknown frame kind {0:#04x}")]
    UnknownFrameKind(u8),
    /// A well-formed frame arrived where a different kind was required.
    #[error("expected a {expected:?} frame, got {found:?}")]
    UnexpectedFrameKind {
        expected: super::frame::FrameKind,
        found: super::frame::FrameKind,
    },
    /// The payload is not a valid postcard encoding of the expected message.
    #[error("malformed payload: {0}")]
    Decode(#[source] postcard::Error),
    /// The payload decoded but left bytes over, which a conforming peer never sends.
    #[error("payload has {n_bytes} trailing bytes after the message")]
    TrailingBytes { n_bytes: usize },
    /// The message could not be serialised.
    #[error("could not encode message: {0}")]
    Encode(#[source] postcard::Error),
    /// The client hello did not start with the rdkv magic.
    #[error("bad handshake magic {found:?}")]
    BadMagic { found: [u8; 4] },
    /// Client and server version ranges do not overlap (or one is empty).
    #[error(
        "no common protocol version: client supports {client_min}..={client_max}, \
         server supports {server_min}..={server_max}"
    )]
    UnsupportedVersion {
        client_min: u16,
        client_max: u16,
        server_min: u16,
        server_max: u16,
    },
}

impl WireError {
    /// Whether the byte stream can no longer be trusted, so the connection must close
    /// instead of replying.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            Self::FrameTooLarge { .. }
                | Self::FrameTooShort { .. }
                | Self::UnknownFrameKind(_)
                | Self::BadMagic { .. }
                | Self::UnsupportedVersion { .. }
        )
    }
}

/// A request breaks one of the configured [`Limits`](super::limits::Limits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    #[error("key of {len_bytes} bytes exceeds the maximum key size of {max_bytes} bytes")]
    KeyTooLarge { len_bytes: u64, max_bytes: u32 },
    #[error("value of {len_bytes} bytes exceeds the maximum value size of {max_bytes} bytes")]
    ValueTooLarge { len_bytes: u64, max_bytes: u32 },
    #[error("batch of {entries} entries exceeds the maximum batch size of {max_entries} entries")]
    BatchTooLarge { entries: u64, max_entries: u32 },
    /// An empty MGet/MPut is almost certainly a client bug, and rejecting it costs
    /// nothing, whereas accepting an empty MPut would cost a Raft round trip.
    #[error("batch has no entries")]
    EmptyBatch,
}

/// A [`Limits`](super::limits::Limits) value that cannot work as a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsConfigError {
    #[error("limit {field} must be greater than zero")]
    Zero { field: &'static str },
    #[error(
        "max_batch_keys = {max_batch_keys} exceeds the protocol's hard cap of {hard_max} entries"
    )]
    BatchOverHardCap { max_batch_keys: u32, hard_max: u32 },
    #[error(
        "a put of a {max_key_bytes}-byte key and a {max_value_bytes}-byte value needs \
         {needed_bytes} frame bytes, more than max_frame_bytes = {max_frame_bytes}"
    )]
    EntryDoesNotFitFrame {
        max_key_bytes: u32,
        max_value_bytes: u32,
        needed_bytes: u64,
        max_frame_bytes: u32,
    },
}

impl From<&LimitError> for ErrorCode {
    fn from(err: &LimitError) -> Self {
        match err {
            LimitError::KeyTooLarge { .. } => Self::KeyTooLarge,
            LimitError::ValueTooLarge { .. } => Self::ValueTooLarge,
            LimitError::BatchTooLarge { .. } => Self::BatchTooLarge,
            LimitError::EmptyBatch => Self::EmptyBatch,
        }
    }
}

impl From<&LimitError> for ErrorReply {
    fn from(err: &LimitError) -> Self {
        Self::new(ErrorCode::from(err), err.to_string())
    }
}

impl From<&WireError> for ErrorCode {
    fn from(err: &WireError) -> Self {
        match err {
            WireError::FrameTooLarge { .. } => Self::FrameTooLarge,
            WireError::UnsupportedVersion { .. } => Self::UnsupportedVersion,
            WireError::Encode(_) => Self::Internal,
            WireError::FrameTooShort { .. }
            | WireError::UnknownFrameKind(_)
            | WireError::UnexpectedFrameKind { .. }
            | WireError::Decode(_)
            | WireError::TrailingBytes { .. }
            | WireError::BadMagic { .. } => Self::Malformed,
        }
    }
}

impl From<&WireError> for ErrorReply {
    fn from(err: &WireError) -> Self {
        Self::new(ErrorCode::from(err), err.to_string())
    }
}
