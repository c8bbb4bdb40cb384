//! The snapshot store: a node's snapshot files, and snapshots handled as
//! files. A snapshot is as large as the region's live data, so none is ever
//! held whole in memory: it is built by streaming the region into a new
//! file, received chunk by chunk into one, served by reading chunks at
//! offsets, and loaded by reading it as a stream (the format is
//! `snapshot.rs`'s; this module only moves bytes).
//!
//! A new file gets a temp name in the snapshot directory (`*.tmp`), is
//! written, fsynced, and only then *adopted*: renamed to
//! `snap-<last index>.bin`, the directory fsynced, older snapshot files
//! removed, every step through `durability` (the power-loss journal sees
//! them). A file never adopted (a build overtaken by a newer snapshot, a
//! received snapshot refused) is removed when its last handle goes; temp
//! files a crash left behind are removed when the store opens.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::snapshot::SnapshotError;
use crate::durability;

const FILE_PREFIX: &str = "snap-";
const FILE_SUFFIX: &str = ".bin";
const TEMP_SUFFIX: &str = ".tmp";

/// Buffer between a streamed snapshot's records and its file, and between
/// a file and a copy of it.
const COPY_BUFFER_BYTES: usize = 1024 * 1024;

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The name of the snapshot covering `last_index` (names sort by index).
fn final_path(dir: &Path, last_index: u64) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{last_index:020}{FILE_SUFFIX}"))
}

/// A temp file's name, removed (through `durability`, so that a power-loss
/// journal that saw it in a synced listing can bring it back) when dropped
/// unless taken.
#[derive(Debug)]
struct TempName(Option<PathBuf>);

impl Drop for TempName {
    fn drop(&mut self) {
        if let Some(path) = self.0.take()
            && let Err(e) = durability::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!("removing the unused snapshot file {}: {e}", path.display());
        }
    }
}

/// A snapshot file being written, under a temp name in the snapshot
/// directory (removed if this is dropped before [`NewSnapshot::finish`]).
#[derive(Debug)]
pub struct NewSnapshot {
    file: File,
    name: TempName,
    len: u64,
}

impl NewSnapshot {
    /// Creates an empty temp file in `dir` (created durably if missing).
    pub fn create(dir: &Path) -> Result<NewSnapshot, SnapshotError> {
        durability::create_dir_all(dir).map_err(io_error(dir))?;
        // Unique per file: two writers never share a temp file.
        static FILES: AtomicU64 = AtomicU64::new(0);
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("new-{}-{n}{TEMP_SUFFIX}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_error(&path))?;
        Ok(NewSnapshot {
            file,
            name: TempName(Some(path)),
            len: 0,
        })
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes` (a received chunk: large writes, no buffer).
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.file.write_all(bytes).map_err(SnapshotError::Write)?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Lets `write` append through a buffer (a snapshot written record by
    /// record).
    pub fn write_with<E: From<SnapshotError>>(
        &mut self,
        write: impl FnOnce(&mut BufWriter<&File>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut out = BufWriter::with_capacity(COPY_BUFFER_BYTES, &self.file);
        write(&mut out)?;
        out.flush().map_err(SnapshotError::Write)?;
        drop(out);
        self.len = self.file.metadata().map_err(SnapshotError::Write)?.len();
        Ok(())
    }

    /// Syncs the file: it is whole and durable, ready to be adopted.
    pub fn finish(mut self) -> Result<SnapshotFile, SnapshotError> {
        let path = self.name.0.clone().unwrap_or_default();
        durability::sync_all(&self.file).map_err(io_error(&path))?;
        Ok(SnapshotFile {
            inner: Arc::new(FileInner {
                file: self.file,
                len: self.len,
                name: Mutex::new(Name::Temp(TempName(self.name.0.take()))),
            }),
        })
    }
}

/// What a snapshot file is called now.
#[derive(Debug)]
enum Name {
    /// Not adopted yet: removed with the last handle.
    Temp(TempName),
    /// A snapshot of the store (later snapshots may remove it; the open
    /// file stays readable until its last handle goes).
    Adopted(PathBuf),
}

#[derive(Debug)]
struct FileInner {
    file: File,
    len: u64,
    name: Mutex<Name>,
}

/// A whole snapshot file, open: read at offsets or as a stream, by any
/// number of holders at once (each read says where it reads; nothing moves
/// a shared cursor). Cheap to clone. The open file keeps its bytes
/// readable even after a newer snapshot removed its name.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    inner: Arc<FileInner>,
}

impl SnapshotFile {
    /// Opens an adopted snapshot file.
    fn open(path: PathBuf) -> Result<SnapshotFile, SnapshotError> {
        let file = File::open(&path).map_err(io_error(&path))?;
        let len = file.metadata().map_err(io_error(&path))?.len();
        Ok(SnapshotFile {
            inner: Arc::new(FileInner {
                file,
                len,
                name: Mutex::new(Name::Adopted(path)),
            }),
        })
    }

    pub fn len(&self) -> u64 {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Its name in the store once adopted (`None` before).
    pub fn adopted_path(&self) -> Option<PathBuf> {
        match &*self.inner.name.lock().unwrap_or_else(|p| p.into_inner()) {
            Name::Adopted(path) => Some(path.clone()),
            Name::Temp(_) => None,
        }
    }

    /// Up to `max_bytes` from `offset` (fewer at the end, none past it).
    pub fn read_at(&self, offset: u64, max_bytes: usize) -> io::Result<Bytes> {
        let start = offset.min(self.len());
        let len = (self.len() - start).min(max_bytes as u64) as usize;
        let mut buf = vec![0; len];
        self.inner.file.read_exact_at(&mut buf, start)?;
        Ok(Bytes::from(buf))
    }

    /// [`SnapshotFile::read_at`] on a blocking thread, for async callers
    /// (a snapshot sent to a follower or to a backup, chunk by chunk).
    pub async fn read_chunk(&self, offset: u64, max_bytes: usize) -> io::Result<Bytes> {
        let file = self.clone();
        tokio::task::spawn_blocking(move || file.read_at(offset, max_bytes))
            .await
            .map_err(io::Error::other)?
    }

    /// The whole file as a stream from its start (buffer it).
    pub fn reader(&self) -> SnapshotFileReader {
        SnapshotFileReader {
            file: self.clone(),
            offset: 0,
        }
    }

    /// Makes this the snapshot of `dir` covering `last_index`: a temp file
    /// of `dir` is renamed, any other file (another store's) copied; then
    /// older snapshots of `dir` are removed. Returns the adopted file.
    pub fn adopt(self, dir: &Path, last_index: u64) -> Result<SnapshotFile, SnapshotError> {
        let path = final_path(dir, last_index);
        let ours = {
            let mut name = self.inner.name.lock().unwrap_or_else(|p| p.into_inner());
            match &mut *name {
                Name::Adopted(at) => *at == path,
                Name::Temp(temp) => match temp.0.clone() {
                    Some(from) if from.parent() == Some(dir) => {
                        durability::rename(&from, &path).map_err(io_error(&path))?;
                        temp.0 = None;
                        *name = Name::Adopted(path.clone());
                        true
                    }
                    _ => false,
                },
            }
        };
        if !ours {
            return self.copy_into(dir)?.adopt(dir, last_index);
        }
        durability::sync_dir_at(dir).map_err(io_error(dir))?;
        // Only older snapshots go: a newer one written meanwhile must stay.
        for old in snapshot_files(dir)? {
            if old < path {
                durability::remove_file(&old).map_err(io_error(&old))?;
            }
        }
        Ok(self)
    }

    /// A synced copy of this file in `dir`, not yet adopted.
    fn copy_into(&self, dir: &Path) -> Result<SnapshotFile, SnapshotError> {
        let mut copy = NewSnapshot::create(dir)?;
        copy.write_with(|out| {
            let mut input = io::BufReader::with_capacity(COPY_BUFFER_BYTES, self.reader());
            io::copy(&mut input, out).map_err(SnapshotError::Write)?;
            Ok::<_, SnapshotError>(())
        })?;
        copy.finish()
    }
}

/// A snapshot file read from its start, by positional reads.
#[derive(Debug)]
pub struct SnapshotFileReader {
    file: SnapshotFile,
    offset: u64,
}

impl Read for SnapshotFileReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.file.inner.file.read_at(buf, self.offset)?;
        self.offset += read as u64;
        Ok(read)
    }
}

/// Writes the snapshot covering `last_index` durably into `dir`, its bytes
/// produced by `write` into a temp file as they come (a restore streams
/// them), then adopts it (see [`SnapshotFile::adopt`]). If `write` fails,
/// the temp file is removed and nothing else changes.
pub fn persist_with<E: From<SnapshotError>>(
    dir: &Path,
    last_index: u64,
    write: impl FnOnce(&mut BufWriter<&File>) -> Result<(), E>,
) -> Result<SnapshotFile, E> {
    let mut new = NewSnapshot::create(dir)?;
    new.write_with(write)?;
    Ok(new.finish()?.adopt(dir, last_index)?)
}

fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let mut files = Vec::new();
    for name in file_names(dir)? {
        if name.starts_with(FILE_PREFIX) && name.ends_with(FILE_SUFFIX) {
            files.push(dir.join(name));
        }
    }
    files.sort();
    Ok(files)
}

/// The names of the files in `dir` (none if it does not exist).
fn file_names(dir: &Path) -> Result<Vec<String>, SnapshotError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry.map_err(io_error(dir))?.file_name();
        if let Some(name) = name.to_str() {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Removes the temp files of `dir`: what a crash left of snapshots being
/// built, received or restored (none of them was adopted).
pub fn remove_temp_files(dir: &Path) -> Result<(), SnapshotError> {
    for name in file_names(dir)? {
        if name.ends_with(TEMP_SUFFIX) {
            let path = dir.join(name);
            durability::remove_file(&path).map_err(io_error(&path))?;
        }
    }
    Ok(())
}

/// The newest snapshot of `dir`, open, if any.
pub fn load_latest(dir: &Path) -> Result<Option<SnapshotFile>, SnapshotError> {
    snapshot_files(dir)?
        .pop()
        .map(SnapshotFile::open)
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persist(dir: &Path, index: u64, bytes: &[u8]) -> SnapshotFile {
        persist_with(dir, index, |out| {
            out.write_all(bytes).map_err(SnapshotError::Write)
        })
        .unwrap()
    }

    fn whole(file: &SnapshotFile) -> Vec<u8> {
        let mut bytes = Vec::new();
        file.reader().read_to_end(&mut bytes).unwrap();
        bytes
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names = file_names(dir).unwrap();
        names.sort();
        names
    }

    #[test]
    fn an_older_snapshot_never_replaces_a_newer_file() {
        let dir = tempfile::tempdir().unwrap();
        persist(dir.path(), 10, b"ten");
        // A slow build of an older index finishing later:
        persist(dir.path(), 5, b"five");
        let latest = load_latest(dir.path()).unwrap().unwrap();
        assert_eq!(whole(&latest), b"ten");
        persist(dir.path(), 12, b"twelve");
        let latest = load_latest(dir.path()).unwrap().unwrap();
        assert_eq!(whole(&latest), b"twelve");
        // Older files are cleaned up, no temp files are left behind.
        assert_eq!(names(dir.path()), vec!["snap-00000000000000000012.bin"]);
    }

    #[test]
    fn a_file_never_adopted_goes_with_its_last_handle() {
        let dir = tempfile::tempdir().unwrap();
        let mut new = NewSnapshot::create(dir.path()).unwrap();
        new.append(b"abc").unwrap();
        drop(new);
        assert!(names(dir.path()).is_empty());

        let mut new = NewSnapshot::create(dir.path()).unwrap();
        new.append(b"abc").unwrap();
        new.append(b"def").unwrap();
        let file = new.finish().unwrap();
        let reader = file.clone();
        assert_eq!(names(dir.path()).len(), 1);
        drop(file);
        assert_eq!(reader.read_at(2, 3).unwrap(), &b"cde"[..]);
        assert_eq!(reader.read_at(5, 9).unwrap(), &b"f"[..]);
        assert_eq!(reader.read_at(9, 9).unwrap(), &b""[..]);
        drop(reader);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn adopting_renames_a_file_of_the_store_and_copies_another() {
        let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut new = NewSnapshot::create(ours.path()).unwrap();
        new.append(b"received").unwrap();
        let adopted = new.finish().unwrap().adopt(ours.path(), 7).unwrap();
        assert_eq!(names(ours.path()), vec!["snap-00000000000000000007.bin"]);
        // Adopting it again changes nothing.
        let adopted = adopted.adopt(ours.path(), 7).unwrap();
        let copied = adopted.adopt(theirs.path(), 7).unwrap();
        assert_eq!(whole(&copied), b"received");
        assert_eq!(names(theirs.path()), vec!["snap-00000000000000000007.bin"]);
        assert_eq!(names(ours.path()), vec!["snap-00000000000000000007.bin"]);
    }

    #[test]
    fn a_snapshot_stays_readable_after_a_newer_one_removed_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let old = persist(dir.path(), 1, b"old bytes");
        persist(dir.path(), 2, b"new");
        assert_eq!(names(dir.path()), vec!["snap-00000000000000000002.bin"]);
        assert_eq!(whole(&old), b"old bytes");
    }

    #[test]
    fn temp_files_a_crash_left_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        persist(dir.path(), 3, b"kept");
        let new = NewSnapshot::create(dir.path()).unwrap();
        std::mem::forget(new);
        assert_eq!(names(dir.path()).len(), 2);
        remove_temp_files(dir.path()).unwrap();
        assert_eq!(names(dir.path()), vec!["snap-00000000000000000003.bin"]);
    }
}
