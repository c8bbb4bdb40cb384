//! `snapshot status`: a backup file checked end to end, every record's CRC
//! and the end record's pair count, and what it holds.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use crate::cluster_id::ClusterId;
use crate::state_machine::digest::StateDigest;
use crate::state_machine::snapshot::{SnapshotError, SnapshotReader};

use super::{BackupError, READ_BUFFER_BYTES, max_record_bytes};

/// What a whole, undamaged snapshot file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotStatus {
    pub format_version: u32,
    /// The log position the snapshot covers (0, 0 for an empty cluster's).
    pub last_log_index: u64,
    pub last_log_term: u64,
    /// Live pairs.
    pub keys: u64,
    /// Pairs with a deadline.
    pub expiring_keys: u64,
    /// Key and value bytes of the pairs.
    pub payload_bytes: u64,
    /// The file's size.
    pub total_bytes: u64,
    /// The state digest of the pairs: what `rdkvctl check` shows of a
    /// member at the snapshot's index.
    pub digest: u64,
    /// `None`: written before clusters had an identity (format <= 4), or
    /// before the identity was applied.
    pub cluster_id: Option<ClusterId>,
    /// The voters and learners of the membership it records, by id.
    pub members: Vec<u64>,
}

/// Reads the snapshot at `path` record by record, checking each; the first
/// damage found (its record index and byte offset) is the error.
pub fn status(path: &Path) -> Result<SnapshotStatus, BackupError> {
    let io_error = |source| BackupError::Io {
        path: path.to_owned(),
        source,
    };
    let damaged = |source| BackupError::Damaged {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io_error)?;
    let input = BufReader::with_capacity(READ_BUFFER_BYTES, file);
    let mut reader = SnapshotReader::from_stream(input, max_record_bytes()).map_err(damaged)?;
    let (mut keys, mut expiring_keys, mut payload_bytes) = (0u64, 0u64, 0u64);
    let mut digest = StateDigest::default();
    let meta = reader
        .pairs(|pair| {
            keys += 1;
            expiring_keys += u64::from(pair.deadline != rdkv_proto::region::NO_DEADLINE);
            payload_bytes += (pair.key.len() + pair.value.len()) as u64;
            digest.add(pair.key, pair.version);
            Ok::<_, SnapshotError>(())
        })
        .map_err(damaged)?;
    Ok(SnapshotStatus {
        format_version: reader.format_version,
        last_log_index: meta.last_log_id.map_or(0, |l| l.index),
        last_log_term: meta.last_log_id.map_or(0, |l| l.leader_id.term),
        keys,
        expiring_keys,
        payload_bytes,
        total_bytes: reader.bytes_read(),
        digest: digest.value(),
        cluster_id: reader.region.cluster_id,
        members: meta
            .last_membership
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect(),
    })
}
