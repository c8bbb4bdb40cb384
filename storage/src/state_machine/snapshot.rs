//! Snapshot files: the live key-value pairs of a region, each pair its own
//! CRC-framed record, so a corrupt or truncated snapshot is detected before
//! it replaces anything.
//!
//! ```text
//! record: "RDKVSNAP" + u32 LE format version
//! record: postcard(SnapshotRecord::Meta(SnapshotMeta))
//! record: postcard(SnapshotRecord::Region(SnapshotRegion))   (version 4; 3: RegionV3; 2: RegionV2)
//! record: postcard(SnapshotRecord::Pair { key, value, version, deadline })   (any number; <= 3: PairV3)
//! record: postcard(SnapshotRecord::End { pairs })
//! ```
//!
//! Older files are still read: version 1 has no region record (no cluster
//! hash seed yet), version 2's region record has the seed but no quota,
//! version 3's has no apply clock and its pairs no deadline (none expire).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use rdkv_proto::region::{BlockRef, NO_DEADLINE};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::durability;
use crate::raft::SnapshotMeta;
use crate::record::{RecordError, decode_record, encode_record};

const MAGIC: &[u8; 8] = b"RDKVSNAP";
const FORMAT_VERSION: u32 = 4;
/// The oldest format version still read.
const OLDEST_READ_VERSION: u32 = 1;
const FILE_PREFIX: &str = "snap-";
const FILE_SUFFIX: &str = ".bin";

#[derive(Debug, Serialize, Deserialize)]
enum SnapshotRecord<'a> {
    Meta(SnapshotMeta),
    /// Versions 1 to 3's pair (read, never written).
    PairV3 {
        key: &'a [u8],
        value: &'a [u8],
        version: u64,
    },
    End {
        pairs: u64,
    },
    /// Version 2's region record (read, never written).
    RegionV2(RegionRecordV2),
    /// Version 3's region record (read, never written).
    RegionV3(RegionRecordV3),
    Region(SnapshotRegion),
    Pair {
        key: &'a [u8],
        value: &'a [u8],
        version: u64,
        /// Unix ms; 0: never expires.
        deadline: u64,
    },
}

/// What a snapshot says of its region beyond the pairs: the replicated
/// parts of its state that placing and admitting pairs depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRegion {
    /// The cluster's hash seed, once `Command::SetHashSeed` was applied.
    pub hash_seed: Option<(u64, u64)>,
    /// The cluster's quota, once `Command::SetQuota` was applied.
    pub quota_bytes: Option<u64>,
    /// The apply clock (unix ms): the latest leader stamp applied, which
    /// decides what has expired for the entries after the snapshot.
    pub clock_unix_ms: u64,
}

/// The region record of format version 3.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RegionRecordV3 {
    hash_seed: Option<(u64, u64)>,
    quota_bytes: Option<u64>,
}

/// The region record of format version 2.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RegionRecordV2 {
    hash_seed: Option<(u64, u64)>,
}

#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("snapshot record {index}: {source}")]
    Record { index: u64, source: RecordError },
    #[error("snapshot record {index}: {source}")]
    Decode { index: u64, source: postcard::Error },
    #[error("not an rdkv snapshot, or an unsupported format version")]
    BadHeader,
    #[error("snapshot structure: {0}")]
    Structure(&'static str),
    #[error("snapshot file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Builds a snapshot in memory.
#[derive(Debug)]
pub struct SnapshotWriter {
    bytes: Vec<u8>,
    pairs: u64,
    scratch: Vec<u8>,
}

impl SnapshotWriter {
    pub fn new(
        meta: &SnapshotMeta,
        region: SnapshotRegion,
    ) -> Result<SnapshotWriter, postcard::Error> {
        let mut writer = SnapshotWriter {
            bytes: Vec::new(),
            pairs: 0,
            scratch: Vec::new(),
        };
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        encode_record(&header, &mut writer.bytes);
        writer.push(&SnapshotRecord::Meta(meta.clone()))?;
        writer.push(&SnapshotRecord::Region(region))?;
        Ok(writer)
    }

    fn push(&mut self, record: &SnapshotRecord<'_>) -> Result<(), postcard::Error> {
        self.scratch.clear();
        let encoded = postcard::to_extend(record, std::mem::take(&mut self.scratch))?;
        encode_record(&encoded, &mut self.bytes);
        self.scratch = encoded;
        Ok(())
    }

    pub fn pair(&mut self, pair: BlockRef<'_>) -> Result<(), postcard::Error> {
        self.pairs += 1;
        self.push(&SnapshotRecord::Pair {
            key: pair.key,
            value: pair.value,
            version: pair.version,
            deadline: pair.deadline,
        })
    }

    pub fn finish(mut self) -> Result<Vec<u8>, postcard::Error> {
        let pairs = self.pairs;
        self.push(&SnapshotRecord::End { pairs })?;
        Ok(self.bytes)
    }
}

/// A snapshot being read: the meta and region records validated, the pairs
/// not yet. Nothing is trusted before its record's CRC has been checked, and
/// the pair count must match the end record (a truncated snapshot is
/// refused).
#[derive(Debug)]
pub struct SnapshotReader<'a> {
    pub meta: SnapshotMeta,
    pub region: SnapshotRegion,
    records: Records<'a>,
}

impl<'a> SnapshotReader<'a> {
    /// Validates the header, meta and region records.
    pub fn open(bytes: &'a [u8], max_record_bytes: u64) -> Result<Self, SnapshotError> {
        let mut records = Records {
            rest: bytes,
            index: 0,
            max_record_bytes,
        };
        let version = format_version(records.next_payload()?)?;
        let SnapshotRecord::Meta(meta) = records.next_record()? else {
            return Err(SnapshotError::Structure("second record is not the meta"));
        };
        let region = match version {
            1 => SnapshotRegion::default(),
            2 => match records.next_record()? {
                SnapshotRecord::RegionV2(old) => SnapshotRegion {
                    hash_seed: old.hash_seed,
                    ..SnapshotRegion::default()
                },
                _ => return Err(SnapshotError::Structure("third record is not the region")),
            },
            3 => match records.next_record()? {
                SnapshotRecord::RegionV3(old) => SnapshotRegion {
                    hash_seed: old.hash_seed,
                    quota_bytes: old.quota_bytes,
                    clock_unix_ms: 0,
                },
                _ => return Err(SnapshotError::Structure("third record is not the region")),
            },
            _ => match records.next_record()? {
                SnapshotRecord::Region(region) => region,
                _ => return Err(SnapshotError::Structure("third record is not the region")),
            },
        };
        Ok(SnapshotReader {
            meta,
            region,
            records,
        })
    }

    /// Hands every pair to `on_pair`, then checks the end record; returns
    /// the meta. The first error, of the snapshot or of `on_pair`, stops it.
    pub fn pairs<E: From<SnapshotError>>(
        mut self,
        mut on_pair: impl FnMut(BlockRef<'_>) -> Result<(), E>,
    ) -> Result<SnapshotMeta, E> {
        let mut pairs = 0u64;
        loop {
            let pair = match self.records.next_record()? {
                SnapshotRecord::Pair {
                    key,
                    value,
                    version,
                    deadline,
                } => BlockRef {
                    key,
                    value,
                    version,
                    deadline,
                },
                SnapshotRecord::PairV3 {
                    key,
                    value,
                    version,
                } => BlockRef {
                    key,
                    value,
                    version,
                    deadline: NO_DEADLINE,
                },
                SnapshotRecord::End { pairs: expected } => {
                    if expected != pairs {
                        return Err(SnapshotError::Structure("pair count does not match").into());
                    }
                    if !self.records.rest.is_empty() {
                        return Err(SnapshotError::Structure("bytes after the end record").into());
                    }
                    return Ok(self.meta);
                }
                SnapshotRecord::Meta(_)
                | SnapshotRecord::Region(_)
                | SnapshotRecord::RegionV2(_)
                | SnapshotRecord::RegionV3(_) => {
                    return Err(SnapshotError::Structure("a second meta or region record").into());
                }
            };
            on_pair(pair)?;
            pairs += 1;
        }
    }
}

/// Validates a whole snapshot and hands its pairs to `on_pair`; returns its
/// meta (see [`SnapshotReader`]).
pub fn read_snapshot(
    bytes: &[u8],
    max_record_bytes: u64,
    on_pair: impl FnMut(BlockRef<'_>) -> Result<(), SnapshotError>,
) -> Result<SnapshotMeta, SnapshotError> {
    SnapshotReader::open(bytes, max_record_bytes)?.pairs(on_pair)
}

/// The format version a header record names, if this build reads it.
fn format_version(header: &[u8]) -> Result<u32, SnapshotError> {
    let (Some(magic), Some(version)) = (header.get(..8), header.get(8..)) else {
        return Err(SnapshotError::BadHeader);
    };
    let version = <[u8; 4]>::try_from(version).map_err(|_| SnapshotError::BadHeader)?;
    let version = u32::from_le_bytes(version);
    if magic != MAGIC || !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(SnapshotError::BadHeader);
    }
    Ok(version)
}

#[derive(Debug)]
struct Records<'a> {
    rest: &'a [u8],
    index: u64,
    max_record_bytes: u64,
}

impl<'a> Records<'a> {
    fn next_payload(&mut self) -> Result<&'a [u8], SnapshotError> {
        let index = self.index;
        let (payload, used) = decode_record(self.rest, self.max_record_bytes)
            .map_err(|source| SnapshotError::Record { index, source })?;
        self.rest = &self.rest[used..];
        self.index += 1;
        Ok(payload)
    }

    fn next_record(&mut self) -> Result<SnapshotRecord<'a>, SnapshotError> {
        let index = self.index;
        let payload = self.next_payload()?;
        postcard::from_bytes(payload).map_err(|source| SnapshotError::Decode { index, source })
    }
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` as the snapshot covering `last_index` durably (temp file,
/// fsync, rename, directory fsync), then removes older snapshot files.
pub fn persist(dir: &Path, last_index: u64, bytes: &[u8]) -> Result<PathBuf, SnapshotError> {
    durability::create_dir_all(dir).map_err(io_error(dir))?;
    let path = dir.join(format!("{FILE_PREFIX}{last_index:020}{FILE_SUFFIX}"));
    // Unique per write: two writers of the same index never share a temp file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("{}-{n}.tmp", std::process::id()));
    {
        let mut file = fs::File::create(&tmp).map_err(io_error(&tmp))?;
        file.write_all(bytes).map_err(io_error(&tmp))?;
        durability::sync_all(&file).map_err(io_error(&tmp))?;
    }
    durability::rename(&tmp, &path).map_err(io_error(&path))?;
    durability::sync_dir_at(dir).map_err(io_error(dir))?;
    // Only older snapshots go: a newer one written meanwhile must stay (file
    // names sort by index).
    for old in snapshot_files(dir)? {
        if old < path {
            durability::remove_file(&old).map_err(io_error(&old))?;
        }
    }
    Ok(path)
}

fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let mut files = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(io_error(dir)(e)),
    };
    for entry in entries {
        let path = entry.map_err(io_error(dir))?.path();
        let is_snapshot = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(FILE_PREFIX) && n.ends_with(FILE_SUFFIX));
        if is_snapshot {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The newest persisted snapshot's bytes, if any: the file mapped, not
/// read into the heap (a snapshot is as large as the region's live data).
/// Snapshot files are never changed in place (`persist` renames finished
/// files), which the mapping relies on.
pub fn load_latest(dir: &Path) -> Result<Option<Bytes>, SnapshotError> {
    let Some(path) = snapshot_files(dir)?.pop() else {
        return Ok(None);
    };
    rdkv_fabric::mapped_file::map_file(&path)
        .map(Some)
        .map_err(io_error(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot as an older version wrote it: version 1 has no region
    /// record, version 2 the region record without the quota, version 3
    /// without the clock (and pairs without deadlines).
    fn old_snapshot(version: u32, pairs: &[(&[u8], &[u8], u64)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&version.to_le_bytes());
        encode_record(&header, &mut bytes);
        let mut push = |record: &SnapshotRecord<'_>| {
            encode_record(&postcard::to_allocvec(record).unwrap(), &mut bytes);
        };
        push(&SnapshotRecord::Meta(SnapshotMeta::default()));
        if version == 2 {
            push(&SnapshotRecord::RegionV2(RegionRecordV2 {
                hash_seed: Some((7, 8)),
            }));
        }
        if version == 3 {
            push(&SnapshotRecord::RegionV3(RegionRecordV3 {
                hash_seed: Some((7, 8)),
                quota_bytes: Some(99),
            }));
        }
        for &(key, value, version) in pairs {
            push(&SnapshotRecord::PairV3 {
                key,
                value,
                version,
            });
        }
        push(&SnapshotRecord::End {
            pairs: pairs.len() as u64,
        });
        bytes
    }

    fn pairs_of(reader: SnapshotReader<'_>) -> Vec<(Vec<u8>, Vec<u8>, u64, u64)> {
        let mut pairs = Vec::new();
        reader
            .pairs(|pair| {
                let BlockRef {
                    key,
                    value,
                    version,
                    deadline,
                } = pair;
                pairs.push((key.to_vec(), value.to_vec(), version, deadline));
                Ok::<_, SnapshotError>(())
            })
            .unwrap();
        pairs
    }

    #[test]
    fn older_versions_are_read_and_a_newer_one_is_refused() {
        let expected = vec![(b"k".to_vec(), b"v".to_vec(), 4, NO_DEADLINE)];
        let bytes = old_snapshot(1, &[(b"k", b"v", 4)]);
        let reader = SnapshotReader::open(&bytes, 1024).unwrap();
        assert_eq!(reader.region, SnapshotRegion::default());
        assert_eq!(pairs_of(reader), expected);

        let bytes = old_snapshot(2, &[(b"k", b"v", 4)]);
        let reader = SnapshotReader::open(&bytes, 1024).unwrap();
        let seed_only = SnapshotRegion {
            hash_seed: Some((7, 8)),
            ..SnapshotRegion::default()
        };
        assert_eq!(reader.region, seed_only);
        assert_eq!(pairs_of(reader), expected);

        let bytes = old_snapshot(3, &[(b"k", b"v", 4)]);
        let reader = SnapshotReader::open(&bytes, 1024).unwrap();
        let no_clock = SnapshotRegion {
            hash_seed: Some((7, 8)),
            quota_bytes: Some(99),
            clock_unix_ms: 0,
        };
        assert_eq!(reader.region, no_clock);
        assert_eq!(pairs_of(reader), expected);

        let region = SnapshotRegion {
            hash_seed: Some((5, 6)),
            quota_bytes: Some(1 << 20),
            clock_unix_ms: 1_700_000_000_000,
        };
        let mut writer = SnapshotWriter::new(&SnapshotMeta::default(), region).unwrap();
        let expiring = BlockRef {
            key: b"k",
            value: b"v",
            version: 4,
            deadline: 1_700_000_060_000,
        };
        writer.pair(expiring).unwrap();
        let mut bytes = writer.finish().unwrap();
        let reader = SnapshotReader::open(&bytes, 1024).unwrap();
        assert_eq!(reader.region, region);
        assert_eq!(
            pairs_of(reader),
            vec![(b"k".to_vec(), b"v".to_vec(), 4, 1_700_000_060_000)]
        );
        // The version word of the header record, under its CRC: rewrite both.
        let header_end = crate::record::RECORD_HEADER_BYTES + 12;
        bytes[header_end - 4..header_end].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc32fast::hash(&bytes[crate::record::RECORD_HEADER_BYTES..header_end]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            SnapshotReader::open(&bytes, 1024),
            Err(SnapshotError::BadHeader)
        ));
    }

    #[test]
    fn an_older_snapshot_never_replaces_a_newer_file() {
        let dir = tempfile::tempdir().unwrap();
        persist(dir.path(), 10, b"ten").unwrap();
        // A slow build of an older index finishing later:
        persist(dir.path(), 5, b"five").unwrap();
        assert_eq!(
            load_latest(dir.path()).unwrap().as_deref(),
            Some(&b"ten"[..])
        );
        persist(dir.path(), 12, b"twelve").unwrap();
        assert_eq!(
            load_latest(dir.path()).unwrap().as_deref(),
            Some(&b"twelve"[..])
        );
        // Older files are cleaned up, no temp files are left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["snap-00000000000000000012.bin".to_owned()]);
    }
}
