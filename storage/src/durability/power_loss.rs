//! A simulated power cut: turns the directories of a killed process into
//! what the disk would hold had the power gone instead, from the journal of
//! what that process made durable.
//!
//! The root itself is taken as durable. Below it, a directory that was
//! synced gets back the entries of its last sync (entries created since are
//! removed, names removed or replaced since come back from the links kept
//! in the journal), and every file in it is cut to the length of its last
//! sync (0 if never synced), with what was written past that handled as
//! [`UnsyncedTail`] says. A directory never synced loses every entry, and
//! is itself lost if its parent was never synced either.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

use super::journal::{Event, FileId, Listing, kept_dir, link_or_copy};

/// What a cut leaves of the bytes written to a file after its last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsyncedTail {
    /// None of them.
    Lost,
    /// All of them (the page cache was written back just in time).
    Kept,
    /// A pseudo-random prefix of them (a partial write-back; may end in the
    /// middle of a record).
    Prefix { seed: u64 },
    /// As many pseudo-random bytes in their place (a torn sector).
    Garbage { seed: u64 },
    /// As many zero bytes (the length reached the disk, the data did not).
    Zeros,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerCut {
    pub unsynced_tail: UnsyncedTail,
}

/// What a cut changed, so a test can tell that it did something.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerLossReport {
    /// Files whose unsynced tail was dropped or damaged.
    pub files_cut: u64,
    /// Bytes past the synced lengths of those files.
    pub unsynced_bytes: u64,
    /// Directory entries created since their directory's last sync.
    pub entries_removed: u64,
    /// Names removed or replaced since their directory's last sync.
    pub entries_restored: u64,
}

#[derive(Debug, Error)]
pub enum PowerLossError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("journal {path} line {line}: {reason}")]
    BadJournal {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    /// The journal does not tell how to bring a name back: the file was
    /// removed or replaced without going through the durability module.
    #[error("cannot restore {path}: no link to file {id} was kept")]
    NotKept { path: PathBuf, id: String },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PowerLossError + '_ {
    move |source| PowerLossError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the journal says is durable.
#[derive(Default)]
struct Durable {
    /// The newest synced length of each file, with when it was taken.
    synced: HashMap<FileId, (u128, u64)>,
    /// The newest synced listing of each directory.
    listings: HashMap<PathBuf, Listing>,
    kept: HashMap<FileId, PathBuf>,
}

fn read_journal(journal: &Path) -> Result<Durable, PowerLossError> {
    let bytes = fs::read(journal).map_err(io_err(journal))?;
    let mut durable = Durable::default();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let event = Event::decode(line).map_err(|reason| PowerLossError::BadJournal {
            path: journal.to_owned(),
            line: i + 1,
            reason,
        })?;
        match event {
            Event::FileSynced { id, len, taken } => {
                let newest = durable.synced.entry(id).or_insert((taken, len));
                if taken >= newest.0 {
                    *newest = (taken, len);
                }
            }
            Event::DirSynced(listing) => {
                let newest = durable
                    .listings
                    .entry(listing.dir.clone())
                    .or_insert_with(|| listing.clone());
                if listing.taken >= newest.taken {
                    *newest = listing;
                }
            }
            Event::Kept { id, at } => {
                durable.kept.insert(id, at);
            }
        }
    }
    Ok(durable)
}

/// Applies a power cut to everything under `root` (itself taken as
/// durable) from the journal at `journal` (which must not be under `root`).
/// The process that wrote the journal must be gone.
pub fn apply_power_loss(
    root: &Path,
    journal: &Path,
    cut: &PowerCut,
) -> Result<PowerLossReport, PowerLossError> {
    let root = fs::canonicalize(root).map_err(io_err(root))?;
    let durable = read_journal(journal)?;
    let scratch = kept_dir(journal);
    fs::create_dir_all(&scratch).map_err(io_err(&scratch))?;
    let mut report = PowerLossReport::default();
    // Parents first, so that a directory whose entry goes is not visited.
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        let listing = durable.listings.get(&dir).map(|l| &l.entries);
        let parent_synced = dir
            .parent()
            .is_some_and(|p| durable.listings.contains_key(p));
        if dir != root && listing.is_none() && !parent_synced {
            fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
            report.entries_removed += 1;
            continue;
        }
        let mut restorer = Restorer {
            dir: &dir,
            durable: &durable,
            scratch: &scratch,
            report: &mut report,
        };
        let empty = Vec::new();
        let listing = match listing {
            Some(listing) => listing,
            // Never synced: none of its entries is durable.
            None if dir != root => &empty,
            None => {
                pending.extend(subdirectories(&dir)?);
                continue;
            }
        };
        restorer.restore_entries(listing)?;
        restorer.cut_files(listing, cut)?;
        pending.extend(subdirectories(&dir)?);
    }
    Ok(report)
}

fn subdirectories(dir: &Path) -> Result<Vec<PathBuf>, PowerLossError> {
    let mut dirs = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        if entry.file_type().map_err(io_err(&entry.path()))?.is_dir() {
            dirs.push(entry.path());
        }
    }
    Ok(dirs)
}

struct Restorer<'a> {
    dir: &'a Path,
    durable: &'a Durable,
    scratch: &'a Path,
    report: &'a mut PowerLossReport,
}

impl Restorer<'_> {
    /// Brings the directory's entries back to `listing`.
    fn restore_entries(&mut self, listing: &[(OsString, FileId)]) -> Result<(), PowerLossError> {
        let dir = self.dir;
        let mut sources: HashMap<FileId, PathBuf> = self.durable.kept.clone();
        let mut current = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let metadata = entry.metadata().map_err(io_err(&entry.path()))?;
            current.push((entry.file_name(), FileId::of(&metadata), metadata.is_dir()));
        }
        let wanted =
            |name: &OsString, id: FileId| listing.iter().any(|(n, i)| n == name && *i == id);
        for (name, id, is_dir) in &current {
            if wanted(name, *id) {
                continue;
            }
            let path = dir.join(name);
            if *is_dir {
                fs::remove_dir_all(&path).map_err(io_err(&path))?;
            } else {
                // Its file may belong under another name (a rename undone).
                static CUT_LINKS: AtomicU64 = AtomicU64::new(0);
                let n = CUT_LINKS.fetch_add(1, Ordering::Relaxed);
                let keep = self.scratch.join(format!("cut-{}-{n}", std::process::id()));
                link_or_copy(&path, &keep).map_err(io_err(&keep))?;
                sources.insert(*id, keep);
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
            self.report.entries_removed += 1;
        }
        for (name, id) in listing {
            if current.iter().any(|(n, i, _)| n == name && i == id) {
                continue;
            }
            let path = dir.join(name);
            let source = sources.get(id).ok_or_else(|| PowerLossError::NotKept {
                path: path.clone(),
                id: id.to_string(),
            })?;
            link_or_copy(source, &path).map_err(io_err(&path))?;
            self.report.entries_restored += 1;
        }
        Ok(())
    }

    /// Cuts every regular file of `listing` to its synced length.
    fn cut_files(
        &mut self,
        listing: &[(OsString, FileId)],
        cut: &PowerCut,
    ) -> Result<(), PowerLossError> {
        for (name, id) in listing {
            let path = self.dir.join(name);
            let metadata = fs::symlink_metadata(&path).map_err(io_err(&path))?;
            let synced = self.durable.synced.get(id).map_or(0, |(_, len)| *len);
            if !metadata.is_file() || metadata.len() <= synced {
                continue;
            }
            if cut.unsynced_tail == UnsyncedTail::Kept {
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_err(&path))?;
            // A preallocated file's zero tail was never written: what a cut
            // may lose or damage ends at its last written byte.
            let written = written_end(&file, metadata.len(), synced).map_err(io_err(&path))?;
            let unsynced = written - synced;
            if unsynced == 0 {
                continue;
            }
            let seed = match cut.unsynced_tail {
                UnsyncedTail::Prefix { seed } | UnsyncedTail::Garbage { seed } => seed,
                _ => 0,
            };
            // Each file its own sequence.
            let mut rng = XorShift::new(seed ^ id.ino ^ id.born_ns as u64);
            match cut.unsynced_tail {
                UnsyncedTail::Lost | UnsyncedTail::Kept => file.set_len(synced),
                UnsyncedTail::Prefix { .. } => {
                    file.set_len(synced + rng.next_u64() % (unsynced + 1))
                }
                UnsyncedTail::Garbage { .. } => {
                    let garbage: Vec<u8> = (0..unsynced).map(|_| rng.next_u64() as u8).collect();
                    file.write_all_at(&garbage, synced)
                }
                UnsyncedTail::Zeros => file.write_all_at(&vec![0u8; unsynced as usize], synced),
            }
            .map_err(io_err(&path))?;
            self.report.files_cut += 1;
            self.report.unsynced_bytes += unsynced;
        }
        Ok(())
    }
}

/// The end of `file`'s last non-zero byte, at least `synced`: past it is a
/// preallocated zero tail (or zeros a write ended with, treated alike).
fn written_end(file: &std::fs::File, len: u64, synced: u64) -> io::Result<u64> {
    const CHUNK: u64 = 1 << 20;
    let mut end = len;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > synced {
        let start = end.saturating_sub(CHUNK).max(synced);
        let chunk = &mut buf[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(last) = chunk.iter().rposition(|b| *b != 0) {
            return Ok(start + last as u64 + 1);
        }
        end = start;
    }
    Ok(synced)
}

/// Deterministic pseudo-random numbers (xorshift64): enough for torn tails
/// here, and the one generator the storage tests draw their operation
/// sequences from.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator whose sequence is fixed by `seed` (any value, 0 too).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
