//! The data directory's layout (docs/sharding.md, section 3): a single
//! group's files at the top, as always, or one directory per shard under
//! `shards/` with a `SHARDS` marker naming the shard count, fixed at
//! bootstrap. A multi-shard directory also records which shards this node
//! hosts (`HOSTED`): the placed ones at first, then as replicas are moved
//! onto and off the node (docs/sharding.md, section 8); and, for a node
//! added with `--join`, that it joined (`JOINED`: the map the join was
//! answered with).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use rdkv_proto::shard::{MAX_SHARDS, ShardId, ShardMap};
use rdkv_storage::durability;
use rdkv_storage::state_machine::SNAPSHOTS_DIR_NAME;

/// The marker of a multi-shard data directory: the shard count, in decimal.
pub const SHARDS_MARKER: &str = "SHARDS";
/// The metadata group's directory in a multi-shard data directory.
pub const META_DIR_NAME: &str = "meta";
/// The Raft log's directory name, in a data directory or a shard's.
pub const RAFT_LOG_DIR_NAME: &str = "raft-log";
/// The shards this node hosts, one id a line: written (atomically) after a
/// replica's directories exist and before its directories are removed.
pub const HOSTED_FILE: &str = "HOSTED";
/// Written once a node started with `--join` joined a multi-shard cluster:
/// the map (JSON) that listed it. A restart neither joins again nor needs a
/// placement, and serves this map until its metadata replica applies one.
pub const JOINED_FILE: &str = "JOINED";
/// Where the shard directories are, in a multi-shard data directory.
const SHARDS_DIR_NAME: &str = "shards";
/// A shard directory being removed is renamed to this prefix first, so
/// that a crash never leaves half a shard under its own name.
const REMOVING_PREFIX: &str = "removing-";

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
    #[error("{path} does not hold a list of shard ids: {content:?}")]
    BadHosted { path: PathBuf, content: String },
    #[error("a single group's data directory hosts shard 0 only")]
    SingleGroup,
    #[error("{path} does not hold the shard map of a join: {reason}")]
    BadJoined { path: PathBuf, reason: String },
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

/// The content of the record at `path`; `None` when there is none.
fn read_if_present(path: &Path) -> Result<Option<String>, LayoutError> {
    match std::fs::read_to_string(path) {
        Ok(content) => Ok(Some(content)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LayoutError::Io {
            what: "reading",
            path: path.to_owned(),
            source,
        }),
    }
}

impl Layout {
    /// The shard count `dir` was made with, without changing anything:
    /// its marker's, 1 for a single group's data (a Raft log at the top),
    /// `None` for a new directory.
    pub fn recorded_count(dir: &Path) -> Result<Option<u32>, LayoutError> {
        let marker = dir.join(SHARDS_MARKER);
        match std::fs::read_to_string(&marker) {
            Ok(content) => parse_marker(&content)
                .map(Some)
                .ok_or(LayoutError::BadMarker {
                    path: marker,
                    content,
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(dir.join(RAFT_LOG_DIR_NAME).exists().then_some(1))
            }
            Err(source) => Err(LayoutError::Io {
                what: "reading",
                path: marker,
                source,
            }),
        }
    }

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
            Layout::Sharded { .. } => data_dir.join(SHARDS_DIR_NAME).join(shard.0.to_string()),
        }
    }

    pub fn log_dir(&self, data_dir: &Path, shard: ShardId) -> PathBuf {
        self.shard_dir(data_dir, shard).join(RAFT_LOG_DIR_NAME)
    }

    pub fn snapshot_dir(&self, data_dir: &Path, shard: ShardId) -> PathBuf {
        self.shard_dir(data_dir, shard).join(SNAPSHOTS_DIR_NAME)
    }
}

impl Layout {
    /// The shards this node hosts as recorded in `HOSTED`; `None`: nothing
    /// recorded yet (a new directory: the placed shards are hosted), or a
    /// single group.
    pub fn recorded_hosted(
        &self,
        data_dir: &Path,
    ) -> Result<Option<BTreeSet<ShardId>>, LayoutError> {
        if *self == Layout::Single {
            return Ok(None);
        }
        let path = data_dir.join(HOSTED_FILE);
        let Some(content) = read_if_present(&path)? else {
            return Ok(None);
        };
        let hosted = content
            .lines()
            .map(|line| line.trim().parse().ok().filter(|&id| id < self.count()))
            .collect::<Option<BTreeSet<u32>>>()
            .ok_or(LayoutError::BadHosted { path, content })?;
        Ok(Some(hosted.into_iter().map(ShardId).collect()))
    }

    /// Records `hosted` as the shards this node hosts, atomically.
    pub fn record_hosted(
        &self,
        data_dir: &Path,
        hosted: &BTreeSet<ShardId>,
    ) -> Result<(), LayoutError> {
        if *self == Layout::Single {
            return Err(LayoutError::SingleGroup);
        }
        let content: String = hosted
            .iter()
            .map(|shard| format!("{}\n", shard.0))
            .collect();
        let path = data_dir.join(HOSTED_FILE);
        write_atomically(data_dir, HOSTED_FILE, &content).map_err(|source| LayoutError::Io {
            what: "writing",
            path,
            source,
        })
    }

    /// Removes `shard`'s directory: renamed aside (one atomic step, synced)
    /// and then deleted, so that a crash leaves either the whole directory
    /// or a leftover [`remove_strays`](Self::remove_strays) deletes.
    pub fn remove_shard_dir(&self, data_dir: &Path, shard: ShardId) -> Result<(), LayoutError> {
        if *self == Layout::Single {
            return Err(LayoutError::SingleGroup);
        }
        let dir = self.shard_dir(data_dir, shard);
        let aside = data_dir
            .join(SHARDS_DIR_NAME)
            .join(format!("{REMOVING_PREFIX}{}", shard.0));
        let io = |what, path: &Path| {
            let path = path.to_owned();
            move |source| LayoutError::Io { what, path, source }
        };
        if dir.exists() {
            durability::rename(&dir, &aside).map_err(io("renaming", &dir))?;
            durability::sync_dir_at(&data_dir.join(SHARDS_DIR_NAME))
                .map_err(io("syncing", &dir))?;
        }
        match std::fs::remove_dir_all(&aside) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing", &aside)(e)),
        }
    }

    /// Deletes what is under `shards/` but not a directory of a shard in
    /// `hosted`: a replica opened but never recorded (a crash before its
    /// `HOSTED` entry), one recorded as removed, or a removal's leftover.
    /// Returns the shards whose directories were removed.
    pub fn remove_strays(
        &self,
        data_dir: &Path,
        hosted: &BTreeSet<ShardId>,
    ) -> Result<Vec<ShardId>, LayoutError> {
        let root = data_dir.join(SHARDS_DIR_NAME);
        let entries = match std::fs::read_dir(&root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(LayoutError::Io {
                    what: "listing",
                    path: root,
                    source,
                });
            }
        };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stray = match name.parse::<u32>() {
                Ok(id) if hosted.contains(&ShardId(id)) => continue,
                Ok(id) => ShardId(id),
                Err(_) => match name.strip_prefix(REMOVING_PREFIX).map(str::parse::<u32>) {
                    Some(Ok(id)) => ShardId(id),
                    _ => continue,
                },
            };
            self.remove_shard_dir(data_dir, stray)?;
            removed.push(stray);
        }
        Ok(removed)
    }

    /// The map a join was answered with, if this node joined
    /// (`JOINED_FILE`).
    pub fn recorded_joined(data_dir: &Path) -> Result<Option<ShardMap>, LayoutError> {
        let path = data_dir.join(JOINED_FILE);
        let Some(content) = read_if_present(&path)? else {
            return Ok(None);
        };
        serde_json::from_str(&content)
            .map(Some)
            .map_err(|e| LayoutError::BadJoined {
                path,
                reason: e.to_string(),
            })
    }

    /// Records that this node joined, answered with `map`, atomically.
    pub fn record_joined(&self, data_dir: &Path, map: &ShardMap) -> Result<(), LayoutError> {
        if *self == Layout::Single {
            return Err(LayoutError::SingleGroup);
        }
        let path = data_dir.join(JOINED_FILE);
        let content = serde_json::to_string_pretty(map).map_err(|e| LayoutError::BadJoined {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_atomically(data_dir, JOINED_FILE, &(content + "\n")).map_err(|source| {
            LayoutError::Io {
                what: "writing",
                path,
                source,
            }
        })
    }

    fn count(&self) -> u32 {
        match self {
            Layout::Single => 1,
            Layout::Sharded { count } => *count,
        }
    }
}

fn parse_marker(content: &str) -> Option<u32> {
    let count: u32 = content.trim().parse().ok()?;
    (2..=MAX_SHARDS as u32).contains(&count).then_some(count)
}

fn write_marker(dir: &Path, count: u32) -> std::io::Result<()> {
    write_atomically(dir, SHARDS_MARKER, &format!("{count}\n"))
}

/// Writes `dir/name` as a temporary file, synced, renamed into place and
/// the directory synced: a crash leaves either the old file or the whole
/// new one.
fn write_atomically(dir: &Path, name: &str, content: &str) -> std::io::Result<()> {
    durability::create_dir_all(dir)?;
    let temp = dir.join(format!("{name}.tmp"));
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(content.as_bytes())?;
    durability::sync_all(&file)?;
    durability::rename(&temp, &dir.join(name))?;
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
    fn the_hosted_shards_are_recorded_and_strays_removed() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open(dir.path(), 4).unwrap();
        assert_eq!(layout.recorded_hosted(dir.path()).unwrap(), None);
        for shard in [0, 1, 3] {
            std::fs::create_dir_all(layout.log_dir(dir.path(), ShardId(shard))).unwrap();
        }
        // A removal cut short by a crash: renamed aside, not yet deleted.
        std::fs::create_dir_all(dir.path().join("shards/removing-2/raft-log")).unwrap();
        let hosted = BTreeSet::from([ShardId(0), ShardId(3)]);
        layout.record_hosted(dir.path(), &hosted).unwrap();
        assert_eq!(
            layout.recorded_hosted(dir.path()).unwrap(),
            Some(hosted.clone())
        );
        let mut removed = layout.remove_strays(dir.path(), &hosted).unwrap();
        removed.sort();
        assert_eq!(removed, [ShardId(1), ShardId(2)]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path().join("shards"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["0", "3"]);
        layout.remove_shard_dir(dir.path(), ShardId(3)).unwrap();
        assert!(!layout.shard_dir(dir.path(), ShardId(3)).exists());
        // Ids beyond the count are a damaged file.
        std::fs::write(dir.path().join(HOSTED_FILE), "0\n9\n").unwrap();
        assert!(matches!(
            layout.recorded_hosted(dir.path()),
            Err(LayoutError::BadHosted { .. })
        ));
    }

    #[test]
    fn a_join_is_recorded_with_its_map_and_the_count_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Layout::recorded_count(dir.path()).unwrap(), None);
        assert_eq!(Layout::recorded_joined(dir.path()).unwrap(), None);
        let layout = Layout::open(dir.path(), 3).unwrap();
        assert_eq!(Layout::recorded_count(dir.path()).unwrap(), Some(3));
        let nodes = [1, 2, 3]
            .map(|id| rdkv_proto::shard::NodeInfo {
                id,
                client_addr: Some(format!("127.0.0.{id}:7379")),
                resp_addr: None,
            })
            .to_vec();
        let map = crate::placement::initial(nodes, 3, 2).unwrap();
        layout.record_joined(dir.path(), &map).unwrap();
        assert_eq!(Layout::recorded_joined(dir.path()).unwrap(), Some(map));
        std::fs::write(dir.path().join(JOINED_FILE), "{}").unwrap();
        assert!(matches!(
            Layout::recorded_joined(dir.path()),
            Err(LayoutError::BadJoined { .. })
        ));
        let single = tempfile::tempdir().unwrap();
        std::fs::create_dir(single.path().join(RAFT_LOG_DIR_NAME)).unwrap();
        assert_eq!(Layout::recorded_count(single.path()).unwrap(), Some(1));
        assert!(
            Layout::Single
                .record_joined(single.path(), &placed_map())
                .is_err()
        );
    }

    fn placed_map() -> ShardMap {
        let nodes = vec![rdkv_proto::shard::NodeInfo {
            id: 1,
            client_addr: None,
            resp_addr: None,
        }];
        crate::placement::initial(nodes, 2, 1).unwrap()
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
