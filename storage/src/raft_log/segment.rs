//! Reading segment files: the one parser of the segment format, used by
//! recovery and by the tests that inspect or damage segments.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{Damage, LogError};
use super::format::{SEGMENT_HEADER_BYTES, check_segment_header, parse_segment_file_name};
use crate::raft::{Entry, LogId};
use crate::record::{RECORD_HEADER_BYTES, RecordError, decode_record};

const RECORD_HEADER: u64 = RECORD_HEADER_BYTES as u64;

/// The segment files of a log directory, by first index.
pub fn segment_files(dir: &Path) -> Result<BTreeMap<u64, PathBuf>, LogError> {
    let mut names = BTreeMap::new();
    for dirent in fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
        let dirent = dirent.map_err(|e| LogError::io(dir, e))?;
        if let Some(first) = dirent
            .file_name()
            .to_str()
            .and_then(parse_segment_file_name)
        {
            names.insert(first, dirent.path());
        }
    }
    Ok(names)
}

/// What is wrong with the header of a segment of `size` bytes, if anything,
/// and whether it was never written (too short, or all zeros).
pub(crate) fn header_problem(file: &File, size: u64) -> io::Result<Option<(String, bool)>> {
    if size < SEGMENT_HEADER_BYTES {
        return Ok(Some((
            format!("{size} bytes, shorter than the header"),
            true,
        )));
    }
    let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
    file.read_exact_at(&mut header, 0)?;
    Ok(check_segment_header(&header)
        .err()
        .map(|reason| (reason, header.iter().all(|b| *b == 0))))
}

/// Reads the segment file at `path`: its header must be intact; its records
/// are scanned as recovery does (records longer than `max_record` are
/// damage).
pub fn read_segment(path: &Path, max_record: u32) -> Result<SegmentScan, LogError> {
    let first_index = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_segment_file_name)
        .ok_or_else(|| LogError::BadSegmentHeader {
            path: path.to_owned(),
            reason: "not a segment file name".to_owned(),
        })?;
    let file = File::open(path).map_err(|e| LogError::io(path, e))?;
    let size = file.metadata().map_err(|e| LogError::io(path, e))?.len();
    if let Some((reason, _)) = header_problem(&file, size).map_err(|e| LogError::io(path, e))? {
        return Err(LogError::BadSegmentHeader {
            path: path.to_owned(),
            reason,
        });
    }
    scan_segment(&file, path, first_index, size, max_record)
}

/// One intact record of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRecord {
    pub log_id: LogId,
    /// Where its frame starts in the file.
    pub offset: u64,
    /// Its payload's length.
    pub len: u32,
}

impl SegmentRecord {
    /// Where its frame ends in the file.
    pub fn end(&self) -> u64 {
        self.offset + RECORD_HEADER + u64::from(self.len)
    }
}

/// What a scan of one segment found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentScan {
    pub records: Vec<SegmentRecord>,
    /// End of the last intact record.
    pub end: u64,
    /// The first damaged record, if any: its offset and what is wrong.
    pub damage: Option<(u64, Damage)>,
}

/// Reads every record of a segment after its header. Damage (torn or
/// corrupt records) stops the scan and is reported; a record with a valid
/// CRC that does not decode, or does not carry the next index, is an error.
pub fn scan_segment(
    file: &File,
    path: &Path,
    first_index: u64,
    size: u64,
    max_record: u32,
) -> Result<SegmentScan, LogError> {
    let io_err = |e| LogError::io(path, e);
    let mut reader = BufReader::with_capacity(1 << 20, file);
    reader
        .seek(SeekFrom::Start(SEGMENT_HEADER_BYTES))
        .map_err(io_err)?;
    let mut scan = SegmentScan {
        records: Vec::new(),
        end: SEGMENT_HEADER_BYTES,
        damage: None,
    };
    let mut expected = first_index;
    let mut buf = Vec::new();
    while scan.end < size {
        let offset = scan.end;
        let available = size - offset;
        if available < RECORD_HEADER {
            scan.damage = Some((
                offset,
                Damage::Record(RecordError::Truncated {
                    need: RECORD_HEADER,
                    have: available,
                }),
            ));
            break;
        }
        let mut header = [0u8; RECORD_HEADER_BYTES];
        reader.read_exact(&mut header).map_err(io_err)?;
        let mut len = [0u8; 4];
        len.copy_from_slice(&header[..4]);
        let len = u32::from_le_bytes(len);
        let need = RECORD_HEADER + u64::from(len);
        let damage = if len == 0 {
            Some(Damage::EmptyRecord)
        } else if len > max_record {
            Some(Damage::Record(RecordError::TooLarge {
                len: u64::from(len),
                max: u64::from(max_record),
            }))
        } else if need > available {
            Some(Damage::Record(RecordError::Truncated {
                need,
                have: available,
            }))
        } else {
            None
        };
        if let Some(damage) = damage {
            scan.damage = Some((offset, damage));
            break;
        }
        // Bounded by max_record and by the file size.
        buf.clear();
        buf.extend_from_slice(&header);
        buf.resize(need as usize, 0);
        reader
            .read_exact(&mut buf[RECORD_HEADER_BYTES..])
            .map_err(io_err)?;
        let payload = match decode_record(&buf, u64::from(max_record)) {
            Ok((payload, _)) => payload,
            Err(e) => {
                scan.damage = Some((offset, Damage::Record(e)));
                break;
            }
        };
        let bad = |reason: String| LogError::BadRecord {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        let entry: Entry = postcard::from_bytes(payload)
            .map_err(|e| bad(format!("valid CRC but the entry does not decode: {e}")))?;
        if entry.log_id.index != expected {
            return Err(bad(format!(
                "holds index {}, index {expected} expected",
                entry.log_id.index
            )));
        }
        expected += 1;
        scan.records.push(SegmentRecord {
            log_id: entry.log_id,
            offset,
            len,
        });
        scan.end = offset + need;
    }
    Ok(scan)
}
