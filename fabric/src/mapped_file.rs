//! A file's bytes mapped read-only, for reading large files (snapshots)
//! without copying them into the heap: the page cache backs them.

use std::fs::File;
use std::io;
use std::path::Path;

use bytes::Bytes;

/// Maps the whole of the file at `path`, read-only, as `Bytes` (the mapping
/// lives as long as any clone does). An empty file gives empty bytes.
///
/// The caller must only map files that nothing truncates or rewrites in
/// place while mapped (snapshot files are written to a temporary name,
/// synced and renamed, then only ever removed): a truncation under the
/// mapping would make reading its tail fault (SIGBUS).
pub fn map_file(path: &Path) -> io::Result<Bytes> {
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the mapping is read-only and private to this process; Rust
    // sees it only as an immutable byte slice. Its contents change only if
    // the file is modified in place, which the caller rules out (see above);
    // unlinking or renaming the file keeps the mapped inode intact.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(Bytes::from_owner(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_reads_back_and_outlives_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"snapshot bytes").unwrap();
        let bytes = map_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[..], b"snapshot bytes");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(map_file(&empty).unwrap().is_empty());
    }
}
