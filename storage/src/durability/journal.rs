//! The durability journal of test mode: one line per event, appended with a
//! single write each (so lines from concurrent threads or processes sharing
//! the file do not interleave, and a SIGKILL, which keeps the page cache,
//! cannot lose a line already written).
//!
//! ```text
//! sync-file <dev:ino:born> <len> <taken>         the file's first len bytes are durable
//! sync-dir  <taken> <dir> (<name> <dev:ino:born>)*  the directory's entries are durable as listed
//! keep      <dev:ino:born> <path>                     a link to that file, made before its name went
//! ```
//!
//! Fields are tab-separated; paths and names escape `%`, tab and newline as
//! `%XX`. Directory paths are canonical. `taken` orders the states a sync
//! covers (wall-clock nanoseconds, strictly increasing in a process): two
//! syncs of one file can finish in the other order than they started, and
//! then the line written last is not the newest state.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// The environment variable that turns test mode on in a process.
pub const JOURNAL_ENV: &str = "RDKV_DURABILITY_JOURNAL";

/// A file's identity: links and renames keep it, unlike its path. The
/// birth time tells apart files that reuse a freed inode number (files
/// removed behind the journal's back, as test directories are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub born_ns: u128,
}

impl FileId {
    pub fn of(metadata: &fs::Metadata) -> FileId {
        let born_ns = metadata
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        FileId {
            dev: metadata.dev(),
            ino: metadata.ino(),
            born_ns,
        }
    }

    fn parse(field: &str) -> Option<FileId> {
        let mut parts = field.split(':');
        let id = FileId {
            dev: parts.next()?.parse().ok()?,
            ino: parts.next()?.parse().ok()?,
            born_ns: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(id)
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.dev, self.ino, self.born_ns)
    }
}

/// When a state was taken: wall-clock nanoseconds, strictly increasing in
/// this process (and across the processes of a test, barring clock steps).
fn taken_now() -> u128 {
    static LAST: Mutex<u128> = Mutex::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    *last = now.max(*last + 1);
    *last
}

/// A file's identity and length, taken before it is synced.
pub(crate) struct FileState {
    id: FileId,
    len: u64,
    taken: u128,
}

impl FileState {
    /// `file`'s state: its length, or `written_len()` when the file is
    /// preallocated past what was written. The order is taken first, then
    /// the length: a sync ordered before this one read its length before
    /// this one reads its own, so this length is at least that one, unless
    /// the file was cut in between (the log's `truncate_after`, which
    /// lowers the written length before its own sync takes its place).
    /// Either way the newest line holds what was written before its sync
    /// began: never more than is durable.
    pub fn of(file: &File, written_len: Option<impl FnOnce() -> u64>) -> io::Result<FileState> {
        let taken = taken_now();
        let metadata = file.metadata()?;
        Ok(FileState {
            id: FileId::of(&metadata),
            len: written_len.map_or(metadata.len(), |len| len()),
            taken,
        })
    }
}

/// A directory's entries, taken before it is synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    pub taken: u128,
    pub dir: PathBuf,
    pub entries: Vec<(OsString, FileId)>,
}

impl Listing {
    pub fn of(dir: &Path) -> io::Result<Listing> {
        let taken = taken_now();
        let dir = fs::canonicalize(dir)?;
        let mut entries = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            match entry.metadata() {
                Ok(metadata) => entries.push((entry.file_name(), FileId::of(&metadata))),
                // Removed meanwhile: not part of what the sync covers.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        entries.sort();
        Ok(Listing {
            taken,
            dir,
            entries,
        })
    }
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    FileSynced { id: FileId, len: u64, taken: u128 },
    DirSynced(Listing),
    Kept { id: FileId, at: PathBuf },
}

impl Event {
    fn encode(&self) -> Vec<u8> {
        let mut line = Vec::new();
        match self {
            Event::FileSynced { id, len, taken } => {
                line.extend_from_slice(format!("sync-file\t{id}\t{len}\t{taken}").as_bytes());
            }
            Event::DirSynced(listing) => {
                line.extend_from_slice(format!("sync-dir\t{}\t", listing.taken).as_bytes());
                escape(listing.dir.as_os_str(), &mut line);
                for (name, id) in &listing.entries {
                    line.push(b'\t');
                    escape(name, &mut line);
                    line.extend_from_slice(format!("\t{id}").as_bytes());
                }
            }
            Event::Kept { id, at } => {
                line.extend_from_slice(format!("keep\t{id}\t").as_bytes());
                escape(at.as_os_str(), &mut line);
            }
        }
        line.push(b'\n');
        line
    }

    /// Decodes one line (without its newline); the reason when it is not one.
    pub fn decode(line: &[u8]) -> Result<Event, String> {
        let fields: Vec<&[u8]> = line.split(|b| *b == b'\t').collect();
        let text = |i: usize| {
            fields
                .get(i)
                .and_then(|f| std::str::from_utf8(f).ok())
                .ok_or(format!("field {i} is missing or not text"))
        };
        let id = |i: usize| FileId::parse(text(i)?).ok_or(format!("field {i} is not dev:ino:born"));
        let os = |i: usize| {
            fields
                .get(i)
                .ok_or(format!("field {i} is missing"))
                .and_then(|f| unescape(f))
        };
        match fields.first().copied() {
            Some(b"sync-file") if fields.len() == 4 => Ok(Event::FileSynced {
                id: id(1)?,
                len: text(2)?.parse().map_err(|e| format!("length: {e}"))?,
                taken: text(3)?.parse().map_err(|e| format!("taken: {e}"))?,
            }),
            Some(b"sync-dir") if fields.len() % 2 == 1 => {
                let mut entries = Vec::new();
                for i in (3..fields.len()).step_by(2) {
                    entries.push((os(i)?, id(i + 1)?));
                }
                Ok(Event::DirSynced(Listing {
                    taken: text(1)?.parse().map_err(|e| format!("taken: {e}"))?,
                    dir: PathBuf::from(os(2)?),
                    entries,
                }))
            }
            Some(b"keep") if fields.len() == 3 => Ok(Event::Kept {
                id: id(1)?,
                at: PathBuf::from(os(2)?),
            }),
            _ => Err("unknown event or wrong field count".to_owned()),
        }
    }
}

fn escape(s: &OsStr, out: &mut Vec<u8>) {
    for &b in s.as_bytes() {
        match b {
            b'%' | b'\t' | b'\n' => out.extend_from_slice(format!("%{b:02X}").as_bytes()),
            _ => out.push(b),
        }
    }
}

fn unescape(field: &[u8]) -> Result<OsString, String> {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail
                .get(..2)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a bad %-escape")?;
            out.push(hex);
            rest = &tail[2..];
        } else {
            out.push(b);
            rest = tail;
        }
    }
    Ok(OsString::from_vec(out))
}

/// Where the journal of `journal` keeps the files whose names went.
pub(crate) fn kept_dir(journal: &Path) -> PathBuf {
    let mut name = journal.as_os_str().to_owned();
    name.push(".kept");
    PathBuf::from(name)
}

/// Links (or, across file systems, copies) `from` to `to`.
pub(crate) fn link_or_copy(from: &Path, to: &Path) -> io::Result<()> {
    match fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::CrossesDevices => fs::copy(from, to).map(|_| ()),
        Err(e) => Err(e),
    }
}

pub(crate) struct Journal {
    path: PathBuf,
    file: Mutex<File>,
    kept_dir: PathBuf,
    kept: AtomicU64,
}

static JOURNAL: OnceLock<Option<Journal>> = OnceLock::new();

/// The journal of this process, if test mode is on.
pub(crate) fn active() -> Option<&'static Journal> {
    JOURNAL
        .get_or_init(|| {
            let path = std::env::var_os(JOURNAL_ENV)?;
            match Journal::open(Path::new(&path)) {
                Ok(journal) => Some(journal),
                Err(e) => {
                    // Test mode was asked for: running without it would
                    // make a power-loss test pass without checking anything.
                    eprintln!("{JOURNAL_ENV}={}: {e}; aborting", path.display());
                    std::process::abort();
                }
            }
        })
        .as_ref()
}

/// Turns test mode on for this process, journaling to `path` (for tests
/// that run the stores in process). Must come before the first store is
/// opened; an error if the process already runs without a journal or with
/// another one.
pub fn enable_journal(path: &Path) -> io::Result<()> {
    let mut opened = None;
    let journal = JOURNAL.get_or_init(|| match Journal::open(path) {
        Ok(journal) => Some(journal),
        Err(e) => {
            opened = Some(e);
            None
        }
    });
    match (opened, journal) {
        (Some(e), _) => Err(e),
        (None, Some(journal)) if journal.path == path => Ok(()),
        (None, _) => Err(io::Error::other(
            "this process already runs without a durability journal or with another one",
        )),
    }
}

impl Journal {
    fn open(path: &Path) -> io::Result<Journal> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let kept_dir = kept_dir(path);
        fs::create_dir_all(&kept_dir)?;
        Ok(Journal {
            path: path.to_owned(),
            file: Mutex::new(file),
            kept_dir,
            kept: AtomicU64::new(0),
        })
    }

    fn append(&self, event: &Event) -> io::Result<()> {
        let line = event.encode();
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(&line)
    }

    pub fn file_synced(&self, state: &FileState) -> io::Result<()> {
        self.append(&Event::FileSynced {
            id: state.id,
            len: state.len,
            taken: state.taken,
        })
    }

    pub fn dir_synced(&self, listing: &Listing) -> io::Result<()> {
        self.append(&Event::DirSynced(listing.clone()))
    }

    /// Keeps a link to the file at `path`, if there is one, before its name
    /// is removed or replaced: a cut before the directory is synced brings
    /// it back.
    pub fn keep(&self, path: &Path) -> io::Result<()> {
        let metadata = match fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let n = self.kept.fetch_add(1, Ordering::Relaxed);
        let at = self.kept_dir.join(format!("{}-{n}", std::process::id()));
        link_or_copy(path, &at)?;
        self.append(&Event::Kept {
            id: FileId::of(&metadata),
            at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_awkward_names() {
        let id = FileId {
            dev: 3,
            ino: 77,
            born_ns: 1_700_000_000_123_456_789,
        };
        let events = [
            Event::FileSynced {
                id,
                len: 12345,
                taken: 7,
            },
            Event::DirSynced(Listing {
                taken: 8,
                dir: PathBuf::from("/a b/%c\td"),
                entries: vec![(OsString::from("seg\n1"), id), (OsString::from("vote"), id)],
            }),
            Event::DirSynced(Listing {
                taken: 9,
                dir: PathBuf::from("/empty"),
                entries: Vec::new(),
            }),
            Event::Kept {
                id,
                at: PathBuf::from("/j.kept/1-0"),
            },
        ];
        for event in events {
            let line = event.encode();
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
            assert_eq!(Event::decode(&line[..line.len() - 1]), Ok(event));
        }
        assert!(Event::decode(b"sync-file\t1:2:3\t4").is_err());
        assert!(Event::decode(b"sync-file\t1:2\t3\t4").is_err());
        assert!(Event::decode(b"sync-file\t12\t3").is_err());
        assert!(Event::decode(b"keep\t1:2:3\t%G1").is_err());
        assert!(Event::decode(b"nonsense").is_err());
    }
}
