//! Backups: a snapshot file saved off a node (`rdkvctl snapshot save`)
//! checked end to end (`status`) and turned into a new cluster's data
//! directories (`restore`). Both read the file as a stream, one record at a
//! time, so a backup larger than memory is checked and restored alike.

mod members;
mod restore;
mod status;

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::region::RegionConfig;
use crate::state_machine::max_snapshot_record_bytes;
use crate::state_machine::snapshot::SnapshotError;

pub use members::{MembersError, parse_initial_cluster};
pub use restore::{RestoreTarget, Restored, restore};
pub use status::{SnapshotStatus, status};

/// The largest value any node accepts (`--max-value-bytes` at most this):
/// a value is read, framed and copied whole, so a node holds several at
/// once per connection; and a backup's records are bounded by it.
pub const MAX_MAX_VALUE_BYTES: u32 = 64 * 1024 * 1024;

/// Bytes read from a backup file at a time.
const READ_BUFFER_BYTES: usize = 1024 * 1024;

/// The bound on one record of a backup: a largest pair any node accepts,
/// plus framing (the file's own limits are not known before it is read).
fn max_record_bytes() -> u64 {
    max_snapshot_record_bytes(&RegionConfig {
        max_value_bytes: MAX_MAX_VALUE_BYTES,
        ..RegionConfig::default()
    })
}

#[derive(Debug, Error)]
pub enum BackupError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The file is not a whole, undamaged snapshot.
    #[error("{path}: {source}")]
    Damaged {
        path: PathBuf,
        source: SnapshotError,
    },
    #[error(
        "data directory {0} is not empty: a restore builds a fresh node; \
         give it a new or empty directory"
    )]
    DataDirNotEmpty(PathBuf),
    #[error("--id {id} is not one of the members given ({members})")]
    NotAMember { id: u64, members: String },
    /// The node restored could not hold the backup (its region, quota or
    /// limits are smaller than the cluster's it comes from).
    #[error(
        "the backup does not fit the node: {0}; restore it for the --region-mib, \
         --quota-bytes and --max-value-bytes the node will run with, large enough for it"
    )]
    DoesNotFit(String),
    #[error("writing the restored snapshot: {0}")]
    Write(SnapshotError),
}
