//! Snapshot files: the live key-value pairs of a region, each pair its own
//! CRC-framed record, so a corrupt or truncated snapshot is detected before
//! it replaces anything.
//!
//! ```text
//! record: "RDKVSNAP" + u32 LE format version
//! record: postcard(SnapshotRecord::Meta(SnapshotMeta))
//! record: postcard(SnapshotRecord::Region(SnapshotRegion))   (version 5; 4: RegionV4; 3: RegionV3; 2: RegionV2)
//! record: postcard(SnapshotRecord::Pair { key, value, version, deadline })   (any number; <= 3: PairV3)
//! record: postcard(SnapshotRecord::End { pairs })
//! ```
//!
//! Older files are still read: version 1 has no region record (no cluster
//! hash seed yet), version 2's region record has the seed but no quota,
//! version 3's has no apply clock and its pairs no deadline (none expire),
//! version 4's has no cluster identity.
//!
//! A snapshot is read from bytes in memory (tests, fuzzing) or from a
//! stream ([`SnapshotReader::from_stream`]: a node's snapshot file loaded,
//! a backup checked or restored, record by record, never held whole), and
//! written to any `Write` (a buffer, or a file as it is built). Where the
//! files live and how they become durable is `snapshot_store`'s.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use rdkv_proto::region::{BlockRef, NO_DEADLINE};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cluster_id::ClusterId;
use crate::raft::SnapshotMeta;
use crate::record::{
    RECORD_HEADER_BYTES, ReadRecordError, RecordError, decode_record, encode_record, read_record,
};

const MAGIC: &[u8; 8] = b"RDKVSNAP";
pub const FORMAT_VERSION: u32 = 5;
/// The oldest format version still read.
const OLDEST_READ_VERSION: u32 = 1;

/// Postcard encodes the variant's index: variants are only ever appended.
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
    /// Version 4's region record (read, never written).
    RegionV4(RegionRecordV4),
    Pair {
        key: &'a [u8],
        value: &'a [u8],
        version: u64,
        /// Unix ms; 0: never expires.
        deadline: u64,
    },
    /// Version 5's region record.
    Region(SnapshotRegion),
}

/// What a snapshot says of its region beyond the pairs: the replicated
/// parts of its state that placing and admitting pairs depend on, and the
/// cluster it belongs to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRegion {
    /// The cluster's hash seed, once `Command::SetHashSeed` was applied.
    pub hash_seed: Option<(u64, u64)>,
    /// The cluster's quota, once `Command::SetQuota` was applied.
    pub quota_bytes: Option<u64>,
    /// The apply clock (unix ms): the latest leader stamp applied, which
    /// decides what has expired for the entries after the snapshot.
    pub clock_unix_ms: u64,
    /// The cluster's identity, once `Command::SetClusterId` was applied (or
    /// given by a restore).
    pub cluster_id: Option<ClusterId>,
}

/// The region record of format version 4.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RegionRecordV4 {
    hash_seed: Option<(u64, u64)>,
    quota_bytes: Option<u64>,
    clock_unix_ms: u64,
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

/// Record indexes count from 0 (the header record); offsets are the
/// record's first byte in the file.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("snapshot record {index} (at byte {offset}): {source}")]
    Record {
        index: u64,
        offset: u64,
        source: RecordError,
    },
    #[error("snapshot record {index} (at byte {offset}): undecodable: {source}")]
    Decode {
        index: u64,
        offset: u64,
        source: postcard::Error,
    },
    #[error(
        "the snapshot ends after record {} (at byte {offset}) without its end record: truncated",
        records.saturating_sub(1)
    )]
    Ended { records: u64, offset: u64 },
    #[error("not an rdkv snapshot, or an unsupported format version")]
    BadHeader,
    #[error("snapshot structure: {0}")]
    Structure(&'static str),
    #[error("snapshot encoding: {0}")]
    Encode(postcard::Error),
    #[error("reading the snapshot: {0}")]
    Read(io::Error),
    #[error("writing the snapshot: {0}")]
    Write(io::Error),
    #[error("snapshot file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Writes a snapshot record by record into `out` (a buffer, or a file).
#[derive(Debug)]
pub struct SnapshotWriter<W: Write> {
    out: W,
    pairs: u64,
    /// Reused encodings: one pair's postcard bytes, then its framed record.
    scratch: Vec<u8>,
    framed: Vec<u8>,
}

impl<W: Write> SnapshotWriter<W> {
    pub fn new(
        out: W,
        meta: &SnapshotMeta,
        region: SnapshotRegion,
    ) -> Result<SnapshotWriter<W>, SnapshotError> {
        let mut writer = SnapshotWriter {
            out,
            pairs: 0,
            scratch: Vec::new(),
            framed: Vec::new(),
        };
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        writer.write_framed(&header)?;
        writer.push(&SnapshotRecord::Meta(meta.clone()))?;
        writer.push(&SnapshotRecord::Region(region))?;
        Ok(writer)
    }

    fn push(&mut self, record: &SnapshotRecord<'_>) -> Result<(), SnapshotError> {
        self.scratch.clear();
        let encoded = postcard::to_extend(record, std::mem::take(&mut self.scratch))
            .map_err(SnapshotError::Encode)?;
        let written = self.write_framed(&encoded);
        self.scratch = encoded;
        written
    }

    fn write_framed(&mut self, payload: &[u8]) -> Result<(), SnapshotError> {
        self.framed.clear();
        encode_record(payload, &mut self.framed);
        self.out
            .write_all(&self.framed)
            .map_err(SnapshotError::Write)
    }

    pub fn pair(&mut self, pair: BlockRef<'_>) -> Result<(), SnapshotError> {
        self.pairs += 1;
        self.push(&SnapshotRecord::Pair {
            key: pair.key,
            value: pair.value,
            version: pair.version,
            deadline: pair.deadline,
        })
    }

    /// Writes the end record; returns the output (not flushed or synced).
    pub fn finish(mut self) -> Result<W, SnapshotError> {
        let pairs = self.pairs;
        self.push(&SnapshotRecord::End { pairs })?;
        Ok(self.out)
    }
}

/// Where a snapshot's records come from: bytes in memory, or a stream.
pub trait RecordSource {
    /// The next record's payload, checked; `None` at a clean end of input.
    fn next_payload(&mut self, max_bytes: u64) -> Result<Option<&[u8]>, ReadRecordError>;
}

/// A snapshot held in memory.
#[derive(Debug)]
pub struct InMemory<'a> {
    rest: &'a [u8],
}

impl<'a> RecordSource for InMemory<'a> {
    fn next_payload(&mut self, max_bytes: u64) -> Result<Option<&[u8]>, ReadRecordError> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let rest: &'a [u8] = self.rest;
        let (payload, used) = decode_record(rest, max_bytes)?;
        self.rest = &rest[used..];
        Ok(Some(payload))
    }
}

/// A snapshot read as a stream: one record in memory at a time.
#[derive(Debug)]
pub struct Streamed<R: Read> {
    input: R,
    payload: Vec<u8>,
}

impl<R: Read> RecordSource for Streamed<R> {
    fn next_payload(&mut self, max_bytes: u64) -> Result<Option<&[u8]>, ReadRecordError> {
        Ok(read_record(&mut self.input, max_bytes, &mut self.payload)?.map(|()| &self.payload[..]))
    }
}

/// A snapshot being read: the meta and region records validated, the pairs
/// not yet. Nothing is trusted before its record's CRC has been checked, and
/// the pair count must match the end record (a truncated snapshot is
/// refused).
#[derive(Debug)]
pub struct SnapshotReader<S: RecordSource> {
    pub meta: SnapshotMeta,
    pub region: SnapshotRegion,
    /// The format version the file was written in.
    pub format_version: u32,
    records: Records<S>,
}

impl<'a> SnapshotReader<InMemory<'a>> {
    /// Validates the header, meta and region records of `bytes`.
    pub fn open(bytes: &'a [u8], max_record_bytes: u64) -> Result<Self, SnapshotError> {
        Self::from_source(InMemory { rest: bytes }, max_record_bytes)
    }
}

impl<R: Read> SnapshotReader<Streamed<R>> {
    /// Validates the header, meta and region records read from `input`
    /// (buffer it: records are read a header and a payload at a time).
    pub fn from_stream(input: R, max_record_bytes: u64) -> Result<Self, SnapshotError> {
        let source = Streamed {
            input,
            payload: Vec::new(),
        };
        Self::from_source(source, max_record_bytes)
    }
}

impl<S: RecordSource> SnapshotReader<S> {
    fn from_source(source: S, max_record_bytes: u64) -> Result<Self, SnapshotError> {
        let mut records = Records {
            source,
            index: 0,
            offset: 0,
            max_record_bytes,
        };
        let format_version = format_version(records.next_payload()?)?;
        let SnapshotRecord::Meta(meta) = records.next_record()? else {
            return Err(SnapshotError::Structure("second record is not the meta"));
        };
        let region = read_region(&mut records, format_version)?;
        Ok(SnapshotReader {
            meta,
            region,
            format_version,
            records,
        })
    }

    /// Bytes read so far (all of them once [`SnapshotReader::pairs`] returned).
    pub fn bytes_read(&self) -> u64 {
        self.records.offset
    }

    /// Hands every pair to `on_pair`, then checks the end record; returns
    /// the meta. The first error, of the snapshot or of `on_pair`, stops it.
    pub fn pairs<E: From<SnapshotError>>(
        &mut self,
        mut on_pair: impl FnMut(BlockRef<'_>) -> Result<(), E>,
    ) -> Result<SnapshotMeta, E> {
        let mut pairs = 0u64;
        loop {
            let expected = match self.records.next_record()? {
                SnapshotRecord::Pair {
                    key,
                    value,
                    version,
                    deadline,
                } => {
                    on_pair(BlockRef {
                        key,
                        value,
                        version,
                        deadline,
                    })?;
                    pairs += 1;
                    continue;
                }
                SnapshotRecord::PairV3 {
                    key,
                    value,
                    version,
                } => {
                    on_pair(BlockRef {
                        key,
                        value,
                        version,
                        deadline: NO_DEADLINE,
                    })?;
                    pairs += 1;
                    continue;
                }
                SnapshotRecord::End { pairs: expected } => expected,
                SnapshotRecord::Meta(_)
                | SnapshotRecord::Region(_)
                | SnapshotRecord::RegionV2(_)
                | SnapshotRecord::RegionV3(_)
                | SnapshotRecord::RegionV4(_) => {
                    return Err(SnapshotError::Structure("a second meta or region record").into());
                }
            };
            if expected != pairs {
                return Err(SnapshotError::Structure("pair count does not match").into());
            }
            if !self.records.at_end()? {
                return Err(SnapshotError::Structure("bytes after the end record").into());
            }
            return Ok(self.meta.clone());
        }
    }
}

/// The region record, as the file's format version wrote it.
fn read_region<S: RecordSource>(
    records: &mut Records<S>,
    version: u32,
) -> Result<SnapshotRegion, SnapshotError> {
    if version == 1 {
        return Ok(SnapshotRegion::default());
    }
    Ok(match (version, records.next_record()?) {
        (2, SnapshotRecord::RegionV2(old)) => SnapshotRegion {
            hash_seed: old.hash_seed,
            ..SnapshotRegion::default()
        },
        (3, SnapshotRecord::RegionV3(old)) => SnapshotRegion {
            hash_seed: old.hash_seed,
            quota_bytes: old.quota_bytes,
            ..SnapshotRegion::default()
        },
        (4, SnapshotRecord::RegionV4(old)) => SnapshotRegion {
            hash_seed: old.hash_seed,
            quota_bytes: old.quota_bytes,
            clock_unix_ms: old.clock_unix_ms,
            cluster_id: None,
        },
        (5, SnapshotRecord::Region(region)) => region,
        _ => return Err(SnapshotError::Structure("third record is not the region")),
    })
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

/// Records in file order, with the index and offset of the next one.
#[derive(Debug)]
struct Records<S> {
    source: S,
    index: u64,
    offset: u64,
    max_record_bytes: u64,
}

impl<S: RecordSource> Records<S> {
    fn next_payload(&mut self) -> Result<&[u8], SnapshotError> {
        let (index, offset) = (self.index, self.offset);
        match self.source.next_payload(self.max_record_bytes) {
            Ok(Some(payload)) => {
                self.index += 1;
                self.offset += (RECORD_HEADER_BYTES + payload.len()) as u64;
                Ok(payload)
            }
            Ok(None) => Err(SnapshotError::Ended {
                records: index,
                offset,
            }),
            Err(ReadRecordError::Record(source)) => Err(SnapshotError::Record {
                index,
                offset,
                source,
            }),
            Err(ReadRecordError::Io(e)) => Err(SnapshotError::Read(e)),
        }
    }

    fn next_record(&mut self) -> Result<SnapshotRecord<'_>, SnapshotError> {
        let (index, offset) = (self.index, self.offset);
        let payload = self.next_payload()?;
        postcard::from_bytes(payload).map_err(|source| SnapshotError::Decode {
            index,
            offset,
            source,
        })
    }

    /// Whether the input ends here (anything after, even a damaged record,
    /// is `false`).
    fn at_end(&mut self) -> Result<bool, SnapshotError> {
        match self.source.next_payload(self.max_record_bytes) {
            Ok(None) => Ok(true),
            Ok(Some(_)) | Err(ReadRecordError::Record(_)) => Ok(false),
            Err(ReadRecordError::Io(e)) => Err(SnapshotError::Read(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot as an older version wrote it: version 1 has no region
    /// record, version 2 the region record without the quota, version 3
    /// without the clock (and pairs without deadlines), version 4 without
    /// the cluster identity.
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
        if version == 4 {
            push(&SnapshotRecord::RegionV4(RegionRecordV4 {
                hash_seed: Some((7, 8)),
                quota_bytes: Some(99),
                clock_unix_ms: 5,
            }));
        }
        for &(key, value, pair_version) in pairs {
            if version == 4 {
                push(&SnapshotRecord::Pair {
                    key,
                    value,
                    version: pair_version,
                    deadline: NO_DEADLINE,
                });
            } else {
                push(&SnapshotRecord::PairV3 {
                    key,
                    value,
                    version: pair_version,
                });
            }
        }
        push(&SnapshotRecord::End {
            pairs: pairs.len() as u64,
        });
        bytes
    }

    fn pairs_of<S: RecordSource>(
        mut reader: SnapshotReader<S>,
    ) -> Vec<(Vec<u8>, Vec<u8>, u64, u64)> {
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
            ..SnapshotRegion::default()
        };
        assert_eq!(reader.region, no_clock);
        assert_eq!(pairs_of(reader), expected);

        let bytes = old_snapshot(4, &[(b"k", b"v", 4)]);
        let reader = SnapshotReader::open(&bytes, 1024).unwrap();
        let no_identity = SnapshotRegion {
            clock_unix_ms: 5,
            ..no_clock
        };
        assert_eq!(reader.region, no_identity);
        assert_eq!(reader.format_version, 4);
        assert_eq!(pairs_of(reader), expected);

        let region = SnapshotRegion {
            hash_seed: Some((5, 6)),
            quota_bytes: Some(1 << 20),
            clock_unix_ms: 1_700_000_000_000,
            cluster_id: Some(ClusterId([9; 16])),
        };
        let mut writer = SnapshotWriter::new(Vec::new(), &SnapshotMeta::default(), region).unwrap();
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
}
