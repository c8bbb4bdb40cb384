//! On-disk format of the Raft log directory.
//!
//! ```text
//! <dir>/LOCK                          flock'ed while a LogStore has the directory open
//! <dir>/seg-{first_index:020}.log     segments, in index order, no gaps
//! <dir>/vote                          one record: postcard(VoteFile)
//! <dir>/meta                          one record: postcard(MetaFile) (last purged, committed)
//!
//! segment = header record*
//! header  = "RDKVLOG\0" [u32 LE format version] [u32 LE 0]            (16 bytes)
//! record  = [u32 LE payload_len][u32 LE crc32(payload)][payload]    (crate::record)
//! payload = postcard(openraft Entry)
//! ```
//!
//! A segment is named after the index of its first entry; the entries in it
//! are consecutive. Only the last segment is ever written to, and it is
//! fsynced before the next one is created, so only the last segment can have
//! a torn tail. The last (active) segment is preallocated to the segment
//! size (`fallocate`): past its last record it reads as zeros, which
//! recovery cuts as the end of the log, not as damage. Its zero tail is cut
//! when the log rolls past it and at a clean stop, and every truncation
//! cuts before preallocating again, so no byte past the end ever holds an
//! old record. The vote and meta files are replaced atomically (write
//! `*.tmp`, fsync, rename, fsync the directory).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rdkv_proto::wire::serialize_bounded;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::LogError;
use crate::durability;
use crate::raft::{Entry, LogId, Vote};
use crate::record::{RECORD_HEADER_BYTES, decode_record, encode_record, seal_record};

pub const SEGMENT_MAGIC: [u8; 8] = *b"RDKVLOG\0";
pub const SEGMENT_FORMAT_VERSION: u32 = 1;
pub const SEGMENT_HEADER_BYTES: u64 = 16;
pub const VOTE_FILE: &str = "vote";
pub const META_FILE: &str = "meta";
pub const COMMITTED_FILE: &str = "committed";
pub const LOCK_FILE: &str = "LOCK";
/// Vote and meta records are tiny; anything larger is corruption.
const MAX_SMALL_FILE_BYTES: u64 = 64 * 1024;
const SMALL_FILE_FORMAT_VERSION: u32 = 1;

pub fn segment_file_name(first_index: u64) -> String {
    format!("seg-{first_index:020}.log")
}

/// The first index named by a segment file name, `None` for other files.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn segment_header() -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
    h
}

/// Checks a segment header; the reason when it is not ours.
pub fn check_segment_header(h: &[u8; SEGMENT_HEADER_BYTES as usize]) -> Result<(), String> {
    if h[..8] != SEGMENT_MAGIC {
        return Err(format!(
            "magic {:02x?} is not {:02x?}",
            &h[..8],
            SEGMENT_MAGIC
        ));
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&h[8..12]);
    let version = u32::from_le_bytes(v);
    if version != SEGMENT_FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {SEGMENT_FORMAT_VERSION}"
        ));
    }
    Ok(())
}

/// Appends the framed record of `entry` to `out`; returns the payload size.
/// The payload is encoded in place, after its reserved header; one over
/// `max_payload` is only counted, and on any error `out` is left as it was.
pub fn encode_entry(entry: &Entry, max_payload: u32, out: &mut Vec<u8>) -> Result<u32, LogError> {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
    let encoded = serialize_bounded(entry, u64::from(max_payload), out);
    let len = match encoded {
        Ok(size) => u32::try_from(size)
            .ok()
            .filter(|len| *len <= max_payload)
            .ok_or(LogError::RecordTooLarge {
                index: entry.log_id.index,
                size,
                max: max_payload,
            }),
        Err(e) => Err(LogError::Encode(e)),
    };
    match len {
        Ok(len) => {
            seal_record(&mut out[start..]);
            Ok(len)
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Reads and checks the record of `expected` at `offset` (a location taken
/// from the in-memory index, so `len` is already bounded).
pub fn read_entry_at(
    file: &File,
    path: &Path,
    offset: u64,
    len: u32,
    expected: &LogId,
) -> Result<Entry, LogError> {
    let mut buf = vec![0u8; RECORD_HEADER_BYTES + len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| LogError::io(path, e))?;
    let bad = |reason: String| LogError::BadRecord {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let (payload, used) =
        decode_record(&buf, u64::from(len)).map_err(|e| bad(format!("on read: {e}")))?;
    if used != buf.len() {
        return Err(bad(format!(
            "on read: record is {used} bytes, the index says {}",
            buf.len()
        )));
    }
    let entry: Entry = postcard::from_bytes(payload).map_err(|e| bad(format!("decode: {e}")))?;
    if entry.log_id != *expected {
        return Err(bad(format!(
            "holds log id {}, the index says {}",
            entry.log_id, expected
        )));
    }
    Ok(entry)
}

#[derive(Serialize, serde::Deserialize)]
struct VoteFile {
    version: u32,
    vote: Vote,
}

/// The meta file: what the segments alone cannot tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct Meta {
    pub last_purged: Option<LogId>,
    pub committed: Option<LogId>,
}

#[derive(Serialize, serde::Deserialize)]
struct MetaFile {
    version: u32,
    meta: Meta,
}

pub(crate) fn read_vote(dir: &Path) -> Result<Option<Vote>, LogError> {
    let path = dir.join(VOTE_FILE);
    let Some(file) = read_small_file::<VoteFile>(&path)? else {
        return Ok(None);
    };
    check_small_version(&path, file.version)?;
    Ok(Some(file.vote))
}

pub(crate) fn write_vote(dir: &Path, dir_file: &File, vote: &Vote) -> Result<(), LogError> {
    let file = VoteFile {
        version: SMALL_FILE_FORMAT_VERSION,
        vote: *vote,
    };
    write_small_file(dir, dir_file, VOTE_FILE, &file)
}

pub(crate) fn read_meta(dir: &Path) -> Result<Meta, LogError> {
    let path = dir.join(META_FILE);
    let Some(file) = read_small_file::<MetaFile>(&path)? else {
        return Ok(Meta::default());
    };
    check_small_version(&path, file.version)?;
    Ok(file.meta)
}

pub(crate) fn write_meta(dir: &Path, dir_file: &File, meta: &Meta) -> Result<(), LogError> {
    let file = MetaFile {
        version: SMALL_FILE_FORMAT_VERSION,
        meta: *meta,
    };
    write_small_file(dir, dir_file, META_FILE, &file)
}

/// The committed log id is advisory: openraft uses it to re-apply the log
/// after a restart without waiting for the cluster, and loses nothing if it
/// is older than the truth. So it is written on every commit advance without
/// any fsync, overwritten in place (one `pwrite`; a rename per commit cost a
/// directory update each), and a missing or damaged file (a torn overwrite
/// at a crash fails the record's CRC) reads as "unknown" instead of failing
/// the open. Two fsyncs per commit halved write throughput; see
/// docs/benchmarks.md.
#[derive(Debug)]
pub(crate) struct CommittedFile {
    file: File,
    len: u64,
}

impl CommittedFile {
    pub(crate) fn open(dir: &Path) -> Result<CommittedFile, LogError> {
        let path = dir.join(COMMITTED_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LogError::io(&path, e))?;
        let len = file.metadata().map_err(|e| LogError::io(&path, e))?.len();
        Ok(CommittedFile { file, len })
    }

    pub(crate) fn write(&mut self, dir: &Path, committed: Option<LogId>) -> Result<(), LogError> {
        let payload = postcard::to_allocvec(&(SMALL_FILE_FORMAT_VERSION, committed))?;
        let mut bytes = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
        encode_record(&payload, &mut bytes);
        let io_error = |e| LogError::io(dir.join(COMMITTED_FILE), e);
        self.file.write_all_at(&bytes, 0).map_err(io_error)?;
        let len = bytes.len() as u64;
        // A shorter record must not leave the old one's tail behind.
        if len < self.len {
            self.file.set_len(len).map_err(io_error)?;
        }
        self.len = len;
        Ok(())
    }
}

pub(crate) fn read_committed(dir: &Path) -> Option<LogId> {
    let path = dir.join(COMMITTED_FILE);
    let file = read_small_file::<(u32, Option<LogId>)>(&path);
    match file {
        Ok(Some((SMALL_FILE_FORMAT_VERSION, committed))) => committed,
        Ok(None) => None,
        other => {
            tracing::warn!(path = %path.display(), "ignoring an unreadable committed-index file: {other:?}");
            None
        }
    }
}

fn check_small_version(path: &Path, version: u32) -> Result<(), LogError> {
    if version == SMALL_FILE_FORMAT_VERSION {
        Ok(())
    } else {
        Err(LogError::CorruptFile {
            path: path.to_path_buf(),
            reason: format!(
                "format version {version}, this build reads {SMALL_FILE_FORMAT_VERSION}"
            ),
        })
    }
}

/// A file holding exactly one record. Missing: `None`. Anything else that is
/// not one valid record (torn, flipped bit, trailing bytes): an error.
fn read_small_file<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, LogError> {
    let corrupt = |reason: String| LogError::CorruptFile {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io(path, e)),
    };
    let size = file.metadata().map_err(|e| LogError::io(path, e))?.len();
    if size > MAX_SMALL_FILE_BYTES {
        return Err(corrupt(format!(
            "{size} bytes, more than {MAX_SMALL_FILE_BYTES}"
        )));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    io::Read::read_to_end(&mut file, &mut bytes).map_err(|e| LogError::io(path, e))?;
    let (payload, used) =
        decode_record(&bytes, MAX_SMALL_FILE_BYTES).map_err(|e| corrupt(e.to_string()))?;
    if used != bytes.len() {
        return Err(corrupt(format!(
            "{} trailing bytes after the record",
            bytes.len() - used
        )));
    }
    postcard::from_bytes(payload)
        .map(Some)
        .map_err(|e| corrupt(format!("decode: {e}")))
}

/// Replaces `dir/name` atomically and durably: write `name.tmp`, fsync,
/// rename over `name`, fsync the directory.
fn write_small_file<T: Serialize>(
    dir: &Path,
    dir_file: &File,
    name: &str,
    value: &T,
) -> Result<(), LogError> {
    let payload = postcard::to_allocvec(value)?;
    let mut bytes = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
    encode_record(&payload, &mut bytes);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| LogError::io(&tmp, e))?;
    file.write_all(&bytes).map_err(|e| LogError::io(&tmp, e))?;
    durability::sync_all(&file).map_err(|e| LogError::io(&tmp, e))?;
    drop(file);
    let path = dir.join(name);
    durability::rename(&tmp, &path).map_err(|e| LogError::io(&path, e))?;
    durability::sync_dir(dir_file, dir).map_err(|e| LogError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Command, TypeConfig};
    use bytes::Bytes;
    use openraft::entry::RaftEntry;
    use std::fs;

    fn put_entry(index: u64, value_len: usize) -> Entry {
        let command = Command::Put {
            key: Bytes::from_static(b"key"),
            value: Bytes::from(vec![7u8; value_len]),
        };
        Entry::new_normal(
            openraft::testing::log_id::<TypeConfig>(2, 1, index),
            command,
        )
    }

    #[test]
    fn an_entry_is_appended_as_the_record_of_its_postcard_encoding() {
        let entry = put_entry(5, 1000);
        let payload = postcard::to_allocvec(&entry).unwrap();
        let mut want = b"before".to_vec();
        encode_record(&payload, &mut want);
        let mut out = b"before".to_vec();
        let len = encode_entry(&entry, u32::MAX, &mut out).unwrap();
        assert_eq!(len as usize, payload.len());
        assert_eq!(out, want);
        let (decoded, used) = decode_record(&out[6..], u64::MAX).unwrap();
        assert_eq!((decoded, used), (&payload[..], out.len() - 6));
    }

    #[test]
    fn an_entry_over_the_limit_is_refused_and_leaves_the_buffer_as_it_was() {
        let entry = put_entry(9, 4096);
        let size = postcard::to_allocvec(&entry).unwrap().len() as u64;
        for max in [0, 100, size as u32 - 1] {
            let mut out = b"kept".to_vec();
            match encode_entry(&entry, max, &mut out) {
                Err(LogError::RecordTooLarge {
                    index: 9,
                    size: got,
                    max: got_max,
                }) => assert_eq!((got, got_max), (size, max)),
                other => panic!("limit {max}: {other:?}"),
            }
            assert_eq!(out, b"kept", "limit {max}");
        }
        let mut out = Vec::new();
        assert_eq!(
            encode_entry(&entry, size as u32, &mut out).unwrap() as u64,
            size
        );
    }

    #[test]
    fn segment_names_round_trip() {
        assert_eq!(segment_file_name(42), "seg-00000000000000000042.log");
        assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
        assert_eq!(
            parse_segment_file_name(&segment_file_name(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_file_name("seg-42.log"), None);
        assert_eq!(
            parse_segment_file_name("seg-0000000000000000004x.log"),
            None
        );
        assert_eq!(parse_segment_file_name("vote"), None);
    }

    #[test]
    fn small_files_are_read_up_to_their_bound_and_newer_versions_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir_file = File::open(dir.path()).expect("open dir");
        // A record well above a vote's size but under the 64 KiB bound.
        let large = vec![7u8; 2000];
        write_small_file(dir.path(), &dir_file, "large", &large).expect("write");
        let read = read_small_file::<Vec<u8>>(&dir.path().join("large")).expect("read");
        assert_eq!(read, Some(large));

        // Exactly at the bound is read; one byte over is refused by its size
        // before anything is read.
        let mut at_bound = vec![1u8; 60_000];
        write_small_file(dir.path(), &dir_file, "edge", &at_bound).expect("write");
        let path = dir.path().join("edge");
        let size = fs::metadata(&path).expect("stat").len();
        at_bound.resize(at_bound.len() + (MAX_SMALL_FILE_BYTES - size) as usize, 1);
        write_small_file(dir.path(), &dir_file, "edge", &at_bound).expect("write");
        assert_eq!(
            fs::metadata(&path).expect("stat").len(),
            MAX_SMALL_FILE_BYTES
        );
        let read = read_small_file::<Vec<u8>>(&path).expect("read at the bound");
        assert_eq!(read.map(|v| v.len()), Some(at_bound.len()));
        let mut over = fs::read(&path).expect("read");
        over.push(0);
        fs::write(&path, &over).expect("write");
        let refused = read_small_file::<Vec<u8>>(&path).expect_err("over the bound");
        assert!(refused.to_string().contains("more than"), "{refused}");

        let vote = Vote::new(3, 1);
        let newer = VoteFile { version: 2, vote };
        write_small_file(dir.path(), &dir_file, VOTE_FILE, &newer).expect("write");
        let refused = read_vote(dir.path()).expect_err("a newer vote file");
        assert!(
            refused.to_string().contains("format version 2"),
            "{refused}"
        );
        let newer = MetaFile {
            version: 2,
            meta: Meta::default(),
        };
        write_small_file(dir.path(), &dir_file, META_FILE, &newer).expect("write");
        assert!(read_meta(dir.path()).is_err(), "a newer meta file");
    }

    #[test]
    fn a_small_file_that_cannot_be_opened_is_an_error_not_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(read_vote(dir.path()), Ok(None)), "missing");
        // A regular file where the directory should be: opening
        // `not-a-dir/vote` fails with ENOTDIR, which is not "missing".
        let not_a_dir = dir.path().join("not-a-dir");
        fs::write(&not_a_dir, b"x").expect("write");
        assert!(read_vote(&not_a_dir).is_err());
    }

    #[test]
    fn the_committed_index_is_overwritten_in_place_shorter_or_longer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lid = |index| openraft::testing::log_id::<crate::raft::TypeConfig>(2, 1, index);
        let mut file = CommittedFile::open(dir.path()).expect("open");
        for committed in [Some(lid(5_000_000)), Some(lid(7)), None, Some(lid(300))] {
            file.write(dir.path(), committed).expect("write");
            assert_eq!(read_committed(dir.path()), committed);
        }
        // Reopened, it overwrites what is there.
        let mut file = CommittedFile::open(dir.path()).expect("reopen");
        file.write(dir.path(), Some(lid(1))).expect("write");
        assert_eq!(read_committed(dir.path()), Some(lid(1)));
    }

    #[test]
    fn segment_header_is_checked() {
        let h = segment_header();
        assert!(check_segment_header(&h).is_ok());
        let mut bad = h;
        bad[0] ^= 1;
        assert!(check_segment_header(&bad).is_err());
        let mut newer = h;
        newer[8] = 2;
        assert!(check_segment_header(&newer).is_err());
    }
}
