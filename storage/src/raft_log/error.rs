//! Errors of the durable Raft log. openraft sees them as `std::io::Error`
//! (with the `LogError` inside, so callers can downcast), everything else in
//! rdkv sees the typed enum.

use std::fmt;
use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::record::RecordError;

/// What is wrong with a record found while scanning a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// Short header, short payload, length above the limit or CRC mismatch.
    Record(RecordError),
    /// A header of zeros announcing an empty payload: a zero-filled tail (no
    /// encoded entry is empty).
    EmptyRecord,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::Record(e) => e.fmt(f),
            Damage::EmptyRecord => f.write_str("zero-length record (zero-filled tail)"),
        }
    }
}

#[derive(Debug, Error)]
pub enum LogError {
    #[error("raft log I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Damage in a segment that is not the last one: acknowledged entries are
    /// affected, so this is never repaired silently.
    #[error(
        "raft log segment {} is corrupt at offset {offset}: {damage} (only the tail of the last segment may be torn)",
        path.display()
    )]
    CorruptSegment {
        path: PathBuf,
        offset: u64,
        damage: Damage,
    },
    /// A record whose CRC is valid but whose payload does not decode, or
    /// whose log id is not the one expected there.
    #[error("raft log segment {} has a bad record at offset {offset}: {reason}", path.display())]
    BadRecord {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("raft log segment {} has a bad header: {reason}", path.display())]
    BadSegmentHeader { path: PathBuf, reason: String },
    #[error("raft log segment {} holds no entries but is not the last segment", path.display())]
    EmptySegment { path: PathBuf },
    #[error(
        "raft log has a gap: {} starts at index {found}, index {expected} was expected",
        path.display()
    )]
    Gap {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    /// The vote or meta file fails its CRC or does not decode.
    #[error("raft log file {} is corrupt: {reason}", path.display())]
    CorruptFile { path: PathBuf, reason: String },
    #[error("raft log directory {} is in use by another LogStore", path.display())]
    Locked { path: PathBuf },
    #[error("invalid raft log options: {0}")]
    InvalidOptions(String),
    #[error("entry {index} encodes to {size} bytes, above the maximum record size {max}")]
    RecordTooLarge { index: u64, size: u64, max: u32 },
    #[error("append is not contiguous: index {expected} expected, got {got}")]
    NotContiguous { expected: u64, got: u64 },
    #[error("encoding a raft log record failed: {0}")]
    Encode(#[from] postcard::Error),
    /// An fsync failed earlier: what the kernel dropped is unknown, so the
    /// log refuses every later write until the process restarts and recovers.
    #[error("an earlier fsync of the raft log failed ({0}); the log refuses further writes")]
    SyncFailed(String),
    #[error("the raft log state lock is poisoned (a thread panicked while holding it)")]
    Poisoned,
}

impl LogError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> LogError {
        LogError::Io {
            path: path.into(),
            source,
        }
    }

    fn kind(&self) -> io::ErrorKind {
        match self {
            LogError::Io { source, .. } => source.kind(),
            LogError::CorruptSegment { .. }
            | LogError::BadRecord { .. }
            | LogError::BadSegmentHeader { .. }
            | LogError::EmptySegment { .. }
            | LogError::Gap { .. }
            | LogError::CorruptFile { .. } => io::ErrorKind::InvalidData,
            LogError::Locked { .. } => io::ErrorKind::WouldBlock,
            LogError::InvalidOptions(_)
            | LogError::RecordTooLarge { .. }
            | LogError::NotContiguous { .. } => io::ErrorKind::InvalidInput,
            LogError::Encode(_) | LogError::SyncFailed(_) | LogError::Poisoned => {
                io::ErrorKind::Other
            }
        }
    }
}

impl From<LogError> for io::Error {
    fn from(error: LogError) -> io::Error {
        io::Error::new(error.kind(), error)
    }
}
