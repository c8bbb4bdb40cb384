//! The data directory's layout (docs/sharding.md, section 3): a single
//! group's files at the top, as always, or one directory per shard under
//! `shards/` with a `SHARDS` marker naming the shard count, fixed at
//! bootstrap.

use std::io::Write;
use std::path::{Path, PathBuf};

use rdkv_proto::shard::{MAX_SHARDS, ShardId};
use rdkv_storage::durability;
use rdkv_storage::state_machine::SNAPSHOTS_DIR_NAME;

/// The marker of a multi-shard data directory: the shard count, in decimal.
pub const SHARDS_MARKER: &str = "SHARDS";
/// The metadata group's directory in a multi-shard data directory.
pub const META_DIR_NAME: &str = "meta";
/// The Raft log's directory name, in a data directory or a shard's.
pub const RAFT_LOG_DIR_NAME: &str = "raft-log";

/// Why a data directory cannot be opened with the shard count asked for.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "{dir} holds a single group's data: it cannot be opened with --shards {asked} \
         (back it up and restore it into a new cluster)"
    )]
    SingleGroupData { dir: PathBuf, asked: u32 },
    #[error("{dir} was bootstrapped with --shards {found}, not {asked}")]
    OtherCount {
        dir: PathBuf,
        found: u32,
        asked: u32,
    },
    #[error("{path} does not hold a shard count between 2 and {MAX_SHARDS}: {content:?}")]
    BadMarker { path: PathBuf, content: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// How a data directory holds its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Today's: one group, `raft-log/` and `snapshots/` at the top.
    Single,
    /// `shards/<k>/raft-log/` and `shards/<k>/snapshots/` for shards
    /// 0..count, and the `SHARDS` marker.
    Sharded { count: u32 },
}

impl Layout {
    /// The layout of `dir` opened with `--shards asked`: a directory with a
    /// marker must have been made with the same count; one without a
    /// marker is a single group's (opened as today, and refused for
    /// `asked` > 1 if it holds a log); a new directory asked for more than
    /// one shard gets its marker now, durably, before any group's file.
    pub fn open(dir: &Path, asked: u32) -> Result<Layout, LayoutError> {
        let marker = dir.join(SHARDS_MARKER);
        let io = |what, path: &Path| {
            let path = path.to_owned();
            move |source| LayoutError::Io { what, path, source }
        };
        match std::fs::read_to_string(&marker) {
            Ok(content) => {
                let found = parse_marker(&content).ok_or_else(|| LayoutError::BadMarker {
                    path: marker.clone(),
                    content: content.clone(),
                })?;
                if found != asked {
                    return Err(LayoutError::OtherCount {
                        dir: dir.to_owned(),
                        found,
                        asked,
                    });
                }
                Ok(Layout::Sharded { count: found })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if asked <= 1 {
                    return Ok(Layout::Single);
                }
                if dir.join(RAFT_LOG_DIR_NAME).exists() {
                    return Err(LayoutError::SingleGroupData {
                        dir: dir.to_owned(),
                        asked,
                    });
                }
                write_marker(dir, asked).map_err(io("writing", &marker))?;
                Ok(Layout::Sharded { count: asked })
            }
            Err(e) => Err(io("reading", &marker)(e)),
        }
    }

    /// The shards whose directories this layout has.
    pub fn shards(&self) -> impl Iterator<Item = ShardId> {
        let count = match self {
            Layout::Single => 1,
            Layout::Sharded { count } => *count,
        };
        (0..count).map(ShardId)
    }

    /// The directory holding `shard`'s log and snapshots; the metadata
    /// group's (`ShardId::META`, multi-shard only) is `meta/`.
    pub fn shard_dir(&self, data_dir: &Path, shard: ShardId) -> PathBuf {
        match self {
            Layout::Single => data_dir.to_owned(),
            Layout::Sharded { .. } if shard == ShardId::META => data_dir.join(META_DIR_NAME),
            Layout::Sharded { .. } => data_dir.join("shards").join(shard.0.to_string()),
        }
    }

    pub fn log_dir(&self, data_dir: &Path, shard: ShardId) -> PathBuf {
        self.shard_dir(data_dir, shard).join(RAFT_LOG_DIR_NAME)
    }

    pub fn snapshot_dir(&self, data_dir: &Path, shard: ShardId) -> PathBuf {
        self.shard_dir(data_dir, shard).join(SNAPSHOTS_DIR_NAME)
    }
}

fn parse_marker(content: &str) -> Option<u32> {
    let count: u32 = content.trim().parse().ok()?;
    (2..=MAX_SHARDS as u32).contains(&count).then_some(count)
}

/// Writes the marker as a temporary file, synced, renamed into place and
/// the directory synced: a crash leaves either no marker or the whole one.
fn write_marker(dir: &Path, count: u32) -> std::io::Result<()> {
    durability::create_dir_all(dir)?;
    let temp = dir.join(format!("{SHARDS_MARKER}.tmp"));
    let mut file = std::fs::File::create(&temp)?;
    writeln!(file, "{count}")?;
    durability::sync_all(&file)?;
    durability::rename(&temp, &dir.join(SHARDS_MARKER))?;
    durability::sync_dir_at(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_is_todays_layout_and_writes_no_marker() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open(dir.path(), 1).unwrap();
        assert_eq!(layout, Layout::Single);
        assert!(!dir.path().join(SHARDS_MARKER).exists());
        assert_eq!(
            layout.log_dir(dir.path(), ShardId(0)),
            dir.path().join("raft-log")
        );
        assert_eq!(
            layout.snapshot_dir(dir.path(), ShardId(0)),
            dir.path().join("snapshots")
        );
        assert_eq!(layout.shards().collect::<Vec<_>>(), [ShardId(0)]);
    }

    #[test]
    fn a_new_directory_asked_for_shards_is_marked_and_reopens_alike() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open(dir.path(), 3).unwrap();
        assert_eq!(layout, Layout::Sharded { count: 3 });
        assert_eq!(
            std::fs::read_to_string(dir.path().join(SHARDS_MARKER)).unwrap(),
            "3\n"
        );
        assert_eq!(
            layout.log_dir(dir.path(), ShardId(2)),
            dir.path().join("shards/2/raft-log")
        );
        assert_eq!(
            layout.snapshot_dir(dir.path(), ShardId(0)),
            dir.path().join("shards/0/snapshots")
        );
        assert_eq!(
            layout.log_dir(dir.path(), ShardId::META),
            dir.path().join("meta/raft-log")
        );
        assert_eq!(
            layout.snapshot_dir(dir.path(), ShardId::META),
            dir.path().join("meta/snapshots")
        );
        assert_eq!(layout.shards().count(), 3);
        assert_eq!(Layout::open(dir.path(), 3).unwrap(), layout);
    }

    #[test]
    fn a_directory_is_never_opened_with_another_count() {
        let dir = tempfile::tempdir().unwrap();
        Layout::open(dir.path(), 3).unwrap();
        let err = Layout::open(dir.path(), 2).unwrap_err();
        assert!(
            matches!(
                err,
                LayoutError::OtherCount {
                    found: 3,
                    asked: 2,
                    ..
                }
            ),
            "{err}"
        );
        // A sharded directory is not a single group's either.
        let err = Layout::open(dir.path(), 1).unwrap_err();
        assert!(
            matches!(err, LayoutError::OtherCount { asked: 1, .. }),
            "{err}"
        );

        let single = tempfile::tempdir().unwrap();
        std::fs::create_dir(single.path().join("raft-log")).unwrap();
        let err = Layout::open(single.path(), 4).unwrap_err();
        assert!(
            matches!(err, LayoutError::SingleGroupData { asked: 4, .. }),
            "{err}"
        );
        assert!(!single.path().join(SHARDS_MARKER).exists());
        assert_eq!(Layout::open(single.path(), 1).unwrap(), Layout::Single);
    }

    #[test]
    fn a_damaged_marker_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for content in ["", "x", "1", "0", "99999"] {
            std::fs::write(dir.path().join(SHARDS_MARKER), content).unwrap();
            let err = Layout::open(dir.path(), 2).unwrap_err();
            assert!(
                matches!(err, LayoutError::BadMarker { .. }),
                "{content:?}: {err}"
            );
        }
    }
}
