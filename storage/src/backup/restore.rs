//! `snapshot restore`: a node's fresh data directory built from a backup,
//! for a new cluster. The snapshot is copied record by record (each one
//! checked) into the directory's snapshot store with three changes, the
//! same for every member restored from one file with one membership, so
//! that they all start with identical state:
//!
//! - the membership is the one given (`--initial-cluster`), not the old
//!   cluster's;
//! - the cluster identity is a new one, derived from the old one, the
//!   snapshot's position, the new membership and the cluster name
//!   (`ClusterId::derive`): the new cluster cannot be mistaken for the old;
//! - the log position keeps its index (versions of the pairs are log
//!   indexes) but its term is 0: the new cluster's log has no entry, and its
//!   first leader's term (1 or more) must be above the snapshot's.
//!
//! The node then starts from it as after a restart: the snapshot is loaded,
//! the log is empty, and the members elect a leader among themselves.
//!
//! A backup the node cannot hold is refused before the node ever starts:
//! every pair must be within the node's key and value limits, and the
//! pairs' charge (what the quota counts) within the node's quota (its
//! `--quota-bytes`, else 90% of its region's data area).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::BufReader;
use std::path::{Path, PathBuf};

use openraft::Membership;
use openraft::vote::RaftLeaderIdExt;

use rdkv_proto::region::{BlockRef, charged_bytes};

use crate::cluster_id::ClusterId;
use crate::durability;
use crate::raft::{LogId, NodeAddr, SnapshotMeta, StoredMembership, TypeConfig};
use crate::region::RegionConfig;
use crate::state_machine::SNAPSHOTS_DIR_NAME;
use crate::state_machine::snapshot::{
    SnapshotError, SnapshotReader, SnapshotRegion, SnapshotWriter, Streamed,
};
use crate::state_machine::snapshot_store::persist_with;

use super::{BackupError, READ_BUFFER_BYTES, max_record_bytes};

/// Where and as what a backup is restored.
#[derive(Debug, Clone, Copy)]
pub struct RestoreTarget<'a> {
    /// The node's data directory (`--data-dir`): absent or empty.
    pub data_dir: &'a Path,
    /// The node's id (`--id`): one of `members`.
    pub node_id: u64,
    /// The new cluster's members: id -> peer address (`--initial-cluster`).
    pub members: &'a BTreeMap<u64, String>,
    /// Tells apart clusters restored from one file with one membership
    /// (etcd's `--initial-cluster-token`); every member must be given the
    /// same.
    pub cluster_name: &'a str,
    /// The node's region as it will run (`--region-mib`,
    /// `--bytes-per-slot`, `--max-value-bytes`): the backup must fit it.
    pub region: &'a RegionConfig,
    /// The node's `--quota-bytes` (`None`: its default).
    pub quota_bytes: Option<u64>,
}

/// What a restore wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub cluster_id: ClusterId,
    pub last_log_index: u64,
    pub keys: u64,
    /// The snapshot file in the data directory.
    pub snapshot: PathBuf,
}

type BackupReader = SnapshotReader<Streamed<BufReader<File>>>;

/// Restores the backup at `file` as `target` (see the module comment).
/// Nothing is left in the data directory if the backup turns out damaged
/// or too large for the node.
pub fn restore(file: &Path, target: &RestoreTarget<'_>) -> Result<Restored, BackupError> {
    if !target.members.contains_key(&target.node_id) {
        let members = target
            .members
            .keys()
            .map(u64::to_string)
            .collect::<Vec<_>>();
        return Err(BackupError::NotAMember {
            id: target.node_id,
            members: members.join(","),
        });
    }
    let mut fits = Fit::of(target)?;
    prepare_data_dir(target.data_dir)?;
    let damaged = |source| BackupError::Damaged {
        path: file.to_owned(),
        source,
    };
    let input = File::open(file).map_err(|source| BackupError::Io {
        path: file.to_owned(),
        source,
    })?;
    let mut reader = SnapshotReader::from_stream(
        BufReader::with_capacity(READ_BUFFER_BYTES, input),
        max_record_bytes(),
    )
    .map_err(damaged)?;
    let last_log_index = reader.meta.last_log_id.map_or(0, |l| l.index);
    let cluster_id = new_cluster_id(&reader, target);
    let meta = restored_meta(last_log_index, target.members);
    let region = SnapshotRegion {
        cluster_id: Some(cluster_id),
        ..reader.region
    };
    let dir = target.data_dir.join(SNAPSHOTS_DIR_NAME);
    let mut keys = 0;
    let snapshot = persist_with(&dir, last_log_index, |out| {
        let mut writer = SnapshotWriter::new(out, &meta, region).map_err(BackupError::Write)?;
        let copied = reader.pairs(|pair| {
            keys += 1;
            fits.check(pair).map_err(Copying::DoesNotFit)?;
            writer.pair(pair).map_err(Copying::Write)
        });
        match copied {
            Ok(_) => {}
            Err(Copying::Source(e)) => return Err(damaged(e)),
            Err(Copying::Write(e)) => return Err(BackupError::Write(e)),
            Err(Copying::DoesNotFit(reason)) => return Err(BackupError::DoesNotFit(reason)),
        }
        writer.finish().map_err(BackupError::Write)?;
        Ok(())
    })
    .inspect_err(|_| {
        // A damaged or refused backup leaves the directory as it was
        // found: empty.
        let _ = fs::remove_dir(&dir);
    })?;
    Ok(Restored {
        cluster_id,
        last_log_index,
        keys,
        snapshot: snapshot.adopted_path().unwrap_or(dir),
    })
}

/// What the node being restored can hold, and what the pairs so far take.
struct Fit {
    max_key_bytes: usize,
    max_value_bytes: usize,
    quota_bytes: u64,
    charged_bytes: u64,
    region_mib: u64,
}

impl Fit {
    fn of(target: &RestoreTarget<'_>) -> Result<Fit, BackupError> {
        let quota_bytes = target
            .region
            .quota_bytes(target.quota_bytes)
            .map_err(|e| BackupError::DoesNotFit(e.to_string()))?;
        Ok(Fit {
            max_key_bytes: target.region.max_key_bytes as usize,
            max_value_bytes: target.region.max_value_bytes as usize,
            quota_bytes,
            charged_bytes: 0,
            region_mib: target.region.region_bytes / (1024 * 1024),
        })
    }

    /// Counts `pair`; why the node could not hold it, if it could not.
    fn check(&mut self, pair: BlockRef<'_>) -> Result<(), String> {
        if pair.key.len() > self.max_key_bytes {
            return Err(format!(
                "a {}-byte key is over the node's limit of {} bytes",
                pair.key.len(),
                self.max_key_bytes
            ));
        }
        if pair.value.len() > self.max_value_bytes {
            return Err(format!(
                "a {}-byte value is over the node's --max-value-bytes {}",
                pair.value.len(),
                self.max_value_bytes
            ));
        }
        let charge = charged_bytes(pair.key.len(), pair.value.len()).unwrap_or(u64::MAX);
        self.charged_bytes = self.charged_bytes.saturating_add(charge);
        if self.charged_bytes > self.quota_bytes {
            return Err(format!(
                "its pairs take more than the node's quota of {} bytes \
                 (--quota-bytes, by default 90% of the data area of its {} MiB region)",
                self.quota_bytes, self.region_mib
            ));
        }
        Ok(())
    }
}

/// Creates the data directory, or accepts it if it exists and is empty.
fn prepare_data_dir(dir: &Path) -> Result<(), BackupError> {
    let io_error = |source| BackupError::Io {
        path: dir.to_owned(),
        source,
    };
    match fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(BackupError::DataDirNotEmpty(dir.to_owned()));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            durability::create_dir_all(dir).map_err(io_error)
        }
        Err(e) => Err(io_error(e)),
    }
}

/// The new cluster's identity (see `ClusterId::derive`): from what every
/// member is given alike.
fn new_cluster_id(reader: &BackupReader, target: &RestoreTarget<'_>) -> ClusterId {
    let old = reader.region.cluster_id.map(|id| id.0).unwrap_or_default();
    let index = reader.meta.last_log_id.map_or(0, |l| l.index).to_le_bytes();
    let term = reader
        .meta
        .last_log_id
        .map_or(0, |l| l.leader_id.term)
        .to_le_bytes();
    let members: String = target
        .members
        .iter()
        .map(|(id, addr)| format!("{id}={addr};"))
        .collect();
    ClusterId::derive(&[
        &old,
        &index,
        &term,
        members.as_bytes(),
        target.cluster_name.as_bytes(),
    ])
}

/// The restored snapshot's meta: the index kept at term 0, the membership
/// given (client addresses are learned from the peer handshake, as for a
/// cluster started with `--initial-cluster`).
fn restored_meta(index: u64, members: &BTreeMap<u64, String>) -> SnapshotMeta {
    type LeaderId = <TypeConfig as openraft::RaftTypeConfig>::LeaderId;
    let log_id = LogId::new(LeaderId::new_committed(0, 0), index);
    let nodes: BTreeMap<u64, NodeAddr> = members
        .iter()
        .map(|(id, peer_addr)| {
            let node = NodeAddr {
                peer_addr: peer_addr.clone(),
                client_addr: String::new(),
            };
            (*id, node)
        })
        .collect();
    SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), Membership::from(nodes)),
    }
}

/// A failure while copying pairs: of the backup read, of the copy written,
/// or a pair the node could not hold.
enum Copying {
    Source(SnapshotError),
    Write(SnapshotError),
    DoesNotFit(String),
}

impl From<SnapshotError> for Copying {
    fn from(source: SnapshotError) -> Copying {
        Copying::Source(source)
    }
}

/// The snapshot store's own failures (its directory, the rename).
impl From<SnapshotError> for BackupError {
    fn from(source: SnapshotError) -> BackupError {
        BackupError::Write(source)
    }
}
