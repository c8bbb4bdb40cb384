//! Every durability point of the Raft log and the snapshot store: the
//! `fsync`/`fdatasync` of a file, the `fsync` of a directory after an entry
//! in it was created, renamed or removed, and the creation of a directory.
//!
//! In production these are the plain system calls. In test mode
//! (`RDKV_DURABILITY_JOURNAL=<file>` in the environment, or
//! [`enable_journal`] before the first store opens) each of them also appends
//! to a journal what it has made durable, and what a removal or a rename
//! replaced is kept (hard-linked) beside the journal. [`apply_power_loss`]
//! then turns a killed node's directory into what a power cut would have
//! left, as Jepsen's LazyFS does: a SIGKILL keeps the page cache, so without
//! this a missing fsync cannot be seen by a crash test.
//!
//! Limitation of the model: only what goes through this module is known.
//! A file truncated below its synced length keeps its shorter length on a
//! cut (the old bytes are not kept), and a sync whose journal line a kill
//! prevented counts as not done (the cut is then harsher than the truth).
//! A preallocated file (a log segment) is journaled with its written length,
//! and a cut treats its zero tail as never written; a cut that loses bytes
//! shortens the file, where a real one would leave the preallocated length
//! with zeros (recovery reads both alike).

mod journal;
mod power_loss;

use std::fs::{self, File};
use std::io;
use std::path::Path;

pub use journal::{JOURNAL_ENV, enable_journal};
pub use power_loss::{
    PowerCut, PowerLossError, PowerLossReport, UnsyncedTail, XorShift, apply_power_loss,
};

/// `fdatasync`: the file's data (and its length) are durable on return.
pub fn sync_data(file: &File) -> io::Result<()> {
    sync_file(file, WHOLE_FILE, File::sync_data)
}

/// `fdatasync` of a preallocated file (a log segment) whose first
/// `written_len` bytes are what was written to it; the rest of its length
/// is the preallocated zero tail, which the journal does not count as data.
/// `written_len` is called (in test mode only) after the sync has taken its
/// place in the journal's order: a sync of the same file that another
/// thread starts while the length is read (a roll behind the flusher) is
/// then the newer one, and its longer length is not undone by this one's.
pub fn sync_data_written(file: &File, written_len: impl FnOnce() -> u64) -> io::Result<()> {
    sync_file(file, Some(written_len), File::sync_data)
}

/// `fsync`: the file's data and metadata are durable on return.
pub fn sync_all(file: &File) -> io::Result<()> {
    sync_file(file, WHOLE_FILE, File::sync_all)
}

/// No written length: the whole file is data.
const WHOLE_FILE: Option<fn() -> u64> = None;

fn sync_file(
    file: &File,
    written_len: Option<impl FnOnce() -> u64>,
    sync: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<()> {
    let Some(journal) = journal::active() else {
        return sync(file);
    };
    // The length before the sync: bytes written while it runs may not be
    // covered by it.
    let state = journal::FileState::of(file, written_len)?;
    sync(file)?;
    journal.file_synced(&state)
}

/// Preallocates `file` up to `len` bytes (`fallocate`, the size included):
/// later writes inside it change no file size, so their `fdatasync` writes
/// the data alone, not the inode too (etcd preallocates its WAL files so).
/// The new bytes read as zeros. A filesystem that cannot preallocate is
/// told apart from a failure: `Ok(false)`.
pub fn preallocate(file: &File, len: u64) -> io::Result<bool> {
    let current = file.metadata()?.len();
    if current >= len {
        return Ok(true);
    }
    match rustix::fs::fallocate(
        file,
        rustix::fs::FallocateFlags::empty(),
        current,
        len - current,
    ) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

/// `fsync` of the directory `dir` (open as `dir_file`): the entries it has
/// now (creations, renames, removals) are durable on return.
pub fn sync_dir(dir_file: &File, dir: &Path) -> io::Result<()> {
    let Some(journal) = journal::active() else {
        return dir_file.sync_all();
    };
    let listing = journal::Listing::of(dir)?;
    dir_file.sync_all()?;
    journal.dir_synced(&listing)
}

/// Opens `dir` and fsyncs it.
pub fn sync_dir_at(dir: &Path) -> io::Result<()> {
    sync_dir(&File::open(dir)?, dir)
}

/// Renames `from` over `to`. Not durable until the directory is synced.
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(journal) = journal::active() {
        journal.keep(to)?;
    }
    fs::rename(from, to)
}

/// Removes the file `path`. Not durable until the directory is synced.
pub fn remove_file(path: &Path) -> io::Result<()> {
    if let Some(journal) = journal::active() {
        journal.keep(path)?;
    }
    fs::remove_file(path)
}

/// Creates `dir` and its missing parents, each durably: a parent is synced
/// after a directory is created in it, so that a power cut cannot take away
/// a directory whose files were synced.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    create_dir_all(parent)?;
    match fs::create_dir(dir) {
        Ok(()) => {}
        // Created meanwhile by another caller, who syncs the parent.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(e),
    }
    sync_dir_at(parent)
}
