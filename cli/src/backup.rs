//! `snapshot status` and `snapshot restore`: backup files, handled locally
//! (no cluster is contacted) by `rdkv_storage::backup`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rdkv_storage::RegionConfig;
use rdkv_storage::backup::{self, RestoreTarget, Restored, SnapshotStatus};

use crate::args::NodeSizeArgs;

use crate::output::{Json, Table, View, lines};

/// `snapshot status FILE`: every record checked; the first damage is the error.
pub fn status(file: &Path) -> Result<StatusView> {
    let status = backup::status(file)
        .with_context(|| format!("the snapshot {} is damaged or unreadable", file.display()))?;
    Ok(StatusView { status })
}

/// Who and what a restored member will be (`snapshot restore`'s flags).
pub struct Member<'a> {
    pub data_dir: &'a Path,
    pub id: u64,
    pub initial_cluster: &'a str,
    pub cluster_name: &'a str,
    pub size: NodeSizeArgs,
}

/// `snapshot restore FILE --data-dir DIR --id N --initial-cluster ...`.
pub fn restore(file: &Path, member: &Member<'_>) -> Result<RestoreView> {
    let members =
        backup::parse_initial_cluster(member.initial_cluster).context("--initial-cluster")?;
    let defaults = RegionConfig::default();
    let size = member.size;
    let region = RegionConfig {
        region_bytes: size
            .region_mib
            .map_or(defaults.region_bytes, |mib| mib.saturating_mul(1024 * 1024)),
        bytes_per_slot: size.bytes_per_slot.unwrap_or(defaults.bytes_per_slot),
        max_value_bytes: size.max_value_bytes.unwrap_or(defaults.max_value_bytes),
        ..defaults
    };
    let target = RestoreTarget {
        data_dir: member.data_dir,
        node_id: member.id,
        members: &members,
        cluster_name: member.cluster_name,
        region: &region,
        quota_bytes: size.quota_bytes,
    };
    let restored = backup::restore(file, &target)
        .with_context(|| format!("restoring {} failed", file.display()))?;
    Ok(RestoreView {
        data_dir: member.data_dir.to_owned(),
        id: member.id,
        restored,
    })
}

pub struct StatusView {
    status: SnapshotStatus,
}

impl StatusView {
    fn fields(&self) -> Vec<(&'static str, String)> {
        let s = &self.status;
        vec![
            ("index", s.last_log_index.to_string()),
            ("term", s.last_log_term.to_string()),
            ("keys", s.keys.to_string()),
            ("expiring keys", s.expiring_keys.to_string()),
            ("payload bytes", s.payload_bytes.to_string()),
            ("total bytes", s.total_bytes.to_string()),
            ("digest", format!("{:016x}", s.digest)),
            ("cluster", cluster_text(s)),
            ("members", members_text(&s.members)),
            ("format version", s.format_version.to_string()),
        ]
    }
}

fn cluster_text(status: &SnapshotStatus) -> String {
    status
        .cluster_id
        .map_or_else(|| "none".to_owned(), |id| id.to_string())
}

fn members_text(members: &[u64]) -> String {
    members
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl View for StatusView {
    fn simple(&self) -> String {
        lines(self.fields().into_iter().map(|(k, v)| format!("{k}: {v}")))
    }

    fn table(&self) -> String {
        let rows = self.fields().into_iter().map(|(k, v)| [k.to_owned(), v]);
        Table::of(["FIELD", "VALUE"], rows)
    }

    fn json(&self) -> Json {
        let s = &self.status;
        Json::obj([
            ("last_log_index", Json::U64(s.last_log_index)),
            ("last_log_term", Json::U64(s.last_log_term)),
            ("keys", Json::U64(s.keys)),
            ("expiring_keys", Json::U64(s.expiring_keys)),
            ("payload_bytes", Json::U64(s.payload_bytes)),
            ("total_bytes", Json::U64(s.total_bytes)),
            ("digest", Json::U64(s.digest)),
            (
                "cluster_id",
                s.cluster_id
                    .map_or(Json::Null, |id| Json::str(id.to_string())),
            ),
            (
                "members",
                Json::Arr(s.members.iter().map(|id| Json::U64(*id)).collect()),
            ),
            ("format_version", Json::U64(u64::from(s.format_version))),
        ])
    }
}

pub struct RestoreView {
    data_dir: PathBuf,
    id: u64,
    restored: Restored,
}

impl View for RestoreView {
    fn simple(&self) -> String {
        let r = &self.restored;
        format!(
            "Restored member {} into {} ({} keys, index {}, new cluster {}); \
             start it with the same --id and --initial-cluster",
            self.id,
            self.data_dir.display(),
            r.keys,
            r.last_log_index,
            r.cluster_id
        )
    }

    fn json(&self) -> Json {
        let r = &self.restored;
        Json::obj([
            ("id", Json::U64(self.id)),
            ("data_dir", Json::str(self.data_dir.display().to_string())),
            ("keys", Json::U64(r.keys)),
            ("last_log_index", Json::U64(r.last_log_index)),
            ("cluster_id", Json::str(r.cluster_id.to_string())),
            ("snapshot", Json::str(r.snapshot.display().to_string())),
        ])
    }
}
