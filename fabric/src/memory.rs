//! Registered region memory: one mapping that remote NICs, other processes and
//! in-process readers read while the writer changes it. Nothing here ever
//! makes a `&[u8]`/`&mut [u8]` over the mapping (the compiler would be allowed
//! to assume no one else writes it); every access is an 8-byte atomic on a
//! raw pointer (invariant 5 in ARCHITECTURE.md).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;
use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};
use thiserror::Error;

const WORD: usize = 8;

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("region access out of bounds: offset {offset}, {len_bytes} bytes")]
    OutOfBounds { offset: u64, len_bytes: u64 },
    #[error("the region is mapped read-only here")]
    ReadOnly,
    #[error("mapping the region: {0}")]
    Map(#[from] io::Error),
}

pub struct RegionMemory {
    /// Owns the mapping. `MmapRaw` exposes raw pointers only (no `Deref` to a
    /// slice), so not even `Debug` can make a reference over the memory.
    _map: MmapRaw,
    base: NonNull<u8>,
    len_bytes: usize,
    writable: bool,
    /// The memfd behind a shared region (kept to hand out read-only fds).
    memfd: Option<OwnedFd>,
}

// SAFETY: `RegionMemory` hands out no references into the mapping; all reads
// and writes go through `AtomicU64` views of 8-byte-aligned words inside
// `len_bytes`, which are data-race free under Rust's memory model.
unsafe impl Send for RegionMemory {}
// SAFETY: as for `Send`: shared access is atomic-only.
unsafe impl Sync for RegionMemory {}

impl std::fmt::Debug for RegionMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionMemory")
            .field("base", &self.base)
            .field("len_bytes", &self.len_bytes)
            .field("writable", &self.writable)
            .field("shared", &self.memfd.is_some())
            .finish()
    }
}

impl RegionMemory {
    fn check_len(len_bytes: usize) -> io::Result<()> {
        if len_bytes == 0 || !len_bytes.is_multiple_of(WORD) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "region length must be a non-zero multiple of 8",
            ));
        }
        Ok(())
    }

    fn from_map(
        map: MmapRaw,
        len_bytes: usize,
        writable: bool,
        memfd: Option<OwnedFd>,
    ) -> io::Result<RegionMemory> {
        let base = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(RegionMemory {
            _map: map,
            base,
            len_bytes,
            writable,
            memfd,
        })
    }

    /// Maps `len_bytes` of zeroed anonymous memory (page aligned by mmap),
    /// private to this process.
    pub fn anonymous(len_bytes: usize) -> io::Result<RegionMemory> {
        Self::check_len(len_bytes)?;
        let map = MmapRaw::from(memmap2::MmapOptions::new().len(len_bytes).map_anon()?);
        ask_for_huge_pages(&map);
        Self::from_map(map, len_bytes, true, None)
    }

    /// Maps `len_bytes` of zeroed memory backed by a memfd, so that other
    /// processes on this host can map it (read-only) from a handed-out fd.
    /// The memfd is sealed against growing, shrinking and any future writable
    /// mapping: only this mapping can ever write it.
    pub fn shared(len_bytes: usize, name: &str) -> io::Result<RegionMemory> {
        Self::check_len(len_bytes)?;
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len_bytes as u64)?;
        let file = File::from(fd.try_clone()?);
        let map = memmap2::MmapOptions::new().len(len_bytes).map_raw(&file)?;
        ask_for_huge_pages(&map);
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
        )?;
        Self::from_map(map, len_bytes, true, Some(fd))
    }

    /// Maps a region handed over by its owner, read-only. `len_bytes` must
    /// not exceed the memfd's size (checked: a short file would fault).
    pub fn map_read_only(fd: OwnedFd, len_bytes: usize) -> io::Result<RegionMemory> {
        Self::check_len(len_bytes)?;
        let size = rustix::fs::fstat(&fd)?.st_size;
        if u64::try_from(size).unwrap_or(0) < len_bytes as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("region fd holds {size} bytes, {len_bytes} expected"),
            ));
        }
        let file = File::from(fd);
        let map = memmap2::MmapOptions::new()
            .len(len_bytes)
            .map_raw_read_only(&file)?;
        ask_for_huge_pages(&map);
        Self::from_map(map, len_bytes, false, None)
    }

    /// A new read-only fd of a shared region for another process: the memfd
    /// reopened `O_RDONLY`, on top of the seals (defence in depth).
    pub fn read_only_fd(&self) -> io::Result<OwnedFd> {
        let Some(memfd) = &self.memfd else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this region is not shared (anonymous memory)",
            ));
        };
        let path = format!("/proc/self/fd/{}", memfd.as_fd().as_raw_fd());
        Ok(rustix::fs::open(
            path.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    pub fn is_shared(&self) -> bool {
        self.memfd.is_some()
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Start of the mapping, for registration with a NIC or for sharing. Only
    /// for handing to code that accesses it atomically or by DMA.
    pub fn base_ptr(&self) -> *const u8 {
        self.base.as_ptr()
    }

    /// What this mapping asked for and got (`/proc/self/smaps`): whether its
    /// pages are 2 MiB ones is the kernel's choice ([`crate::pages`]).
    pub fn pages(&self) -> io::Result<crate::pages::MappingPages> {
        crate::pages::MappingPages::of_this_process(self.base.as_ptr() as usize)
    }

    fn check_writable(&self) -> Result<(), MemoryError> {
        if self.writable {
            Ok(())
        } else {
            Err(MemoryError::ReadOnly)
        }
    }

    /// The word at `offset`, or an error if unaligned or out of bounds.
    #[inline]
    fn word(&self, offset: u64) -> Result<&AtomicU64, MemoryError> {
        self.words(offset, WORD)?
            .first()
            .ok_or(MemoryError::OutOfBounds {
                offset,
                len_bytes: WORD as u64,
            })
    }

    /// The words covering `len_bytes` from `offset` (rounded up to whole
    /// words), checked once for alignment and bounds.
    #[inline(always)]
    fn words(&self, offset: u64, len_bytes: usize) -> Result<&[AtomicU64], MemoryError> {
        let count = len_bytes.div_ceil(WORD);
        let in_bounds = usize::try_from(offset).ok().filter(|&o| {
            o % WORD == 0
                && count
                    .checked_mul(WORD)
                    .and_then(|n| o.checked_add(n))
                    .is_some_and(|end| end <= self.len_bytes)
        });
        let Some(offset) = in_bounds else {
            return Err(MemoryError::OutOfBounds {
                offset,
                len_bytes: len_bytes as u64,
            });
        };
        // SAFETY: the range `offset .. offset + 8 * count` is 8-aligned (the
        // mapping is page aligned) and inside the live mapping, which outlives
        // the borrow of `self`. A shared slice of `AtomicU64` asserts no
        // exclusivity (atomics are interior-mutable), and every access to this
        // memory in the process is atomic, so nothing races non-atomically.
        Ok(unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(offset).cast::<AtomicU64>(), count)
        })
    }

    pub fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64, MemoryError> {
        Ok(self.word(offset)?.load(order))
    }

    pub fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<(), MemoryError> {
        self.check_writable()?;
        self.word(offset)?.store(value, order);
        Ok(())
    }

    /// Loads consecutive words, each with `order`.
    #[inline(always)]
    pub fn read_words(
        &self,
        offset: u64,
        dst: &mut [u64],
        order: Ordering,
    ) -> Result<(), MemoryError> {
        let words = self.words(offset, dst.len() * WORD)?;
        for (out, word) in dst.iter_mut().zip(words) {
            *out = word.load(order);
        }
        Ok(())
    }

    /// Copies bytes out with relaxed word loads: the seqlock-reader copy. The
    /// result may mix two writes if the writer reuses the memory meanwhile;
    /// callers validate it (CRC) before use. Reads whole words, so the range is
    /// rounded up to 8 bytes (still inside the mapping).
    #[inline]
    pub fn read_bytes(&self, offset: u64, dst: &mut [u8]) -> Result<(), MemoryError> {
        let words = self.words(offset, dst.len())?;
        let mut chunks = dst.chunks_exact_mut(WORD);
        let mut words = words.iter();
        // Whole words as fixed-size copies (no memcpy call per word), then the tail.
        for (chunk, word) in (&mut chunks).zip(&mut words) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = chunks.into_remainder();
        if let Some(word) = words.next() {
            let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
            tail.copy_from_slice(&bytes[..tail.len()]);
        }
        Ok(())
    }

    /// Like [`RegionMemory::read_bytes`] from any offset, without allocating:
    /// the words covering the range are loaded (relaxed) and the bytes of
    /// the range taken out of them (a value starts right after its key,
    /// rarely on a word boundary).
    #[inline]
    pub fn read_bytes_unaligned(&self, offset: u64, dst: &mut [u8]) -> Result<(), MemoryError> {
        let skip = (offset % WORD as u64) as usize;
        if skip == 0 {
            return self.read_bytes(offset, dst);
        }
        let words = self.words(offset - skip as u64, skip + dst.len())?;
        let Some((first, rest)) = words.split_first() else {
            return Ok(());
        };
        let head_len = (WORD - skip).min(dst.len());
        let bytes = first.load(Ordering::Relaxed).to_ne_bytes();
        let (head, body) = dst.split_at_mut(head_len);
        head.copy_from_slice(&bytes[skip..skip + head_len]);
        let mut chunks = body.chunks_exact_mut(WORD);
        let mut rest = rest.iter();
        for (chunk, word) in (&mut chunks).zip(&mut rest) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = chunks.into_remainder();
        if let Some(word) = rest.next() {
            let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
            tail.copy_from_slice(&bytes[..tail.len()]);
        }
        Ok(())
    }

    /// Asks the CPU to start loading `[offset, offset + len_bytes)` into its
    /// caches (a block, once its slot named it, while the slot is checked):
    /// a hint only, ignored outside the mapping and off x86_64.
    #[inline]
    pub fn prefetch(&self, offset: u64, len_bytes: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            const LINE: u64 = 64;
            let end = offset.saturating_add(len_bytes).min(self.len_bytes as u64);
            let mut at = offset - offset % LINE;
            while at < end {
                // SAFETY: `at < len_bytes`, so the pointer is inside the live
                // mapping; a prefetch reads nothing into the program (it cannot
                // race or fault) and SSE is part of the x86_64 baseline.
                unsafe {
                    let line = self.base.as_ptr().add(at as usize).cast::<i8>();
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line);
                }
                at += LINE;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len_bytes);
    }

    /// Copies bytes in with relaxed word stores; the last word is zero padded.
    /// Publication (the slot store with release ordering) orders these stores
    /// before any reader that acquires the slot.
    pub fn write_bytes(&self, offset: u64, src: &[u8]) -> Result<(), MemoryError> {
        self.check_writable()?;
        let words = self.words(offset, src.len())?;
        let mut chunks = src.chunks_exact(WORD);
        let mut words = words.iter();
        // Whole words as fixed-size loads (no memcpy call per word, as in
        // `read_bytes`), then the zero-padded tail.
        for (chunk, word) in (&mut chunks).zip(&mut words) {
            let mut bytes = [0u8; WORD];
            bytes.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        let tail = chunks.remainder();
        if let Some(word) = words.next() {
            let mut bytes = [0u8; WORD];
            bytes[..tail.len()].copy_from_slice(tail);
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Allocates the pages of `[offset, offset + len_bytes)` now, as writes
    /// would (`MADV_POPULATE_WRITE`): a thread filling a fresh region (a
    /// snapshot load) can have another thread take the page faults ahead of
    /// it. The range is widened to whole pages. Contents are unchanged.
    /// Kernels before 5.14 lack the advice: then nothing is done.
    pub fn populate(&self, offset: u64, len_bytes: u64) -> Result<(), MemoryError> {
        self.check_writable()?;
        let Some((start, len)) = page_range(offset, len_bytes, self.len_bytes as u64)? else {
            return Ok(());
        };
        // SAFETY: `[start, start + len)` lies inside this mapping
        // (`page_range` checked it; the mapping is page aligned and
        // `len_bytes` long). MADV_POPULATE_WRITE only faults pages in as a
        // write would, without changing their contents, so no access
        // through the atomics can observe it.
        let advised = unsafe {
            rustix::mm::madvise(
                self.base.as_ptr().add(start as usize).cast(),
                len as usize,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        };
        match advised {
            Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(()),
            Err(e) => Err(MemoryError::Map(e.into())),
        }
    }

    /// Flips bits of one byte in place: fault injection for tests and tools
    /// that prove readers detect corruption.
    pub fn inject_bit_flip(&self, offset: u64, mask: u8) -> Result<(), MemoryError> {
        self.check_writable()?;
        let word_offset = offset & !(WORD as u64 - 1);
        let shift = (offset - word_offset) * 8;
        let word_mask = u64::from(mask) << shift;
        self.word(word_offset)?
            .fetch_xor(word_mask, Ordering::SeqCst);
        Ok(())
    }
}

/// The whole pages covering `[offset, offset + len_bytes)` of a mapping of
/// `region_bytes`, as (start, length); `None` when there is nothing to
/// cover. A range past the mapping is refused.
fn page_range(
    offset: u64,
    len_bytes: u64,
    region_bytes: u64,
) -> Result<Option<(u64, u64)>, MemoryError> {
    const PAGE_BYTES: u64 = 4096;
    let end = offset
        .checked_add(len_bytes)
        .filter(|&end| end <= region_bytes)
        .ok_or(MemoryError::OutOfBounds { offset, len_bytes })?;
    let start = offset - offset % PAGE_BYTES;
    let end = end.next_multiple_of(PAGE_BYTES).min(region_bytes);
    Ok((start != end).then(|| (start, end - start)))
}

/// Asks for transparent huge pages over a region's mapping
/// (`MADV_HUGEPAGE`; [`crate::pages`] says why and who decides). A kernel
/// that refuses (built without them) leaves 4 KiB pages, which are correct,
/// only slower to miss: nothing to report.
fn ask_for_huge_pages(map: &MmapRaw) {
    let _ = map.advise(memmap2::Advice::HugePage);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populating_covers_whole_pages_inside_the_mapping() {
        let range = |offset, len| page_range(offset, len, 3 * 4096).unwrap();
        assert_eq!(range(4100, 5000), Some((4096, 2 * 4096)));
        assert_eq!(range(100, 10), Some((0, 4096)));
        assert_eq!(range(3 * 4096 - 1, 1), Some((2 * 4096, 4096)));
        assert_eq!(range(0, 3 * 4096), Some((0, 3 * 4096)));
        assert_eq!(range(4096, 0), None);
        assert_eq!(range(3 * 4096, 0), None);
        // A mapping that ends inside a page: the range stops at its end.
        assert_eq!(page_range(9000, 1000, 10_000).unwrap(), Some((8192, 1808)));
        assert!(page_range(3 * 4096, 1, 3 * 4096).is_err());
        assert!(page_range(8, 3 * 4096, 3 * 4096).is_err());
        assert!(page_range(8, u64::MAX, 3 * 4096).is_err());
    }

    #[test]
    fn populating_keeps_contents_and_refuses_ranges_outside() {
        let memory = RegionMemory::shared(3 * 4096, "rdkv-test").unwrap();
        memory.write_bytes(4096 + 8, b"kept").unwrap();
        memory.populate(4100, 5000).unwrap();
        memory.populate(0, 3 * 4096).unwrap();
        let mut out = [0u8; 4];
        memory.read_bytes(4096 + 8, &mut out).unwrap();
        assert_eq!(&out, b"kept");
        assert!(memory.populate(3 * 4096, 1).is_err());
        assert!(memory.populate(8, 3 * 4096).is_err());
        assert!(memory.populate(8, u64::MAX).is_err());
    }

    #[test]
    fn a_shared_region_is_seen_read_only_through_its_fd() {
        let owner = RegionMemory::shared(8192, "rdkv-test").unwrap();
        owner.write_bytes(128, b"shared bytes").unwrap();
        let fd = owner.read_only_fd().unwrap();
        let reader = RegionMemory::map_read_only(fd, 8192).unwrap();
        let mut out = [0u8; 12];
        reader.read_bytes(128, &mut out).unwrap();
        assert_eq!(&out, b"shared bytes");
        // Later writes by the owner are visible: it is the same memory.
        owner.write_bytes(128, b"SHARED").unwrap();
        reader.read_bytes(128, &mut out[..6]).unwrap();
        assert_eq!(&out[..6], b"SHARED");
        assert!(matches!(
            reader.store_u64(0, 1, Ordering::Relaxed),
            Err(MemoryError::ReadOnly)
        ));
        assert!(matches!(
            reader.write_bytes(0, b"x"),
            Err(MemoryError::ReadOnly)
        ));
        // Mapping more than the memfd holds is refused, not a later SIGBUS.
        assert!(RegionMemory::map_read_only(owner.read_only_fd().unwrap(), 16384).is_err());
        // Nobody can map it writable: not with the handed-out fd...
        let ro = File::from(owner.read_only_fd().unwrap());
        assert!(memmap2::MmapOptions::new().len(8192).map_raw(&ro).is_err());
        // ...nor with the memfd itself (sealed against future writes).
        let rw = File::from(owner.memfd.as_ref().unwrap().try_clone().unwrap());
        assert!(memmap2::MmapOptions::new().len(8192).map_raw(&rw).is_err());
        assert!(RegionMemory::anonymous(64).unwrap().read_only_fd().is_err());
    }

    /// Every region mapping asks for huge pages; whether it gets them is
    /// the kernel's setting and luck (a free 2 MiB page), so the figure is
    /// printed, not checked.
    #[test]
    fn every_region_mapping_asks_for_huge_pages() {
        const LEN: usize = 8 << 20;
        let owner = RegionMemory::shared(LEN, "rdkv-test").unwrap();
        let reader = RegionMemory::map_read_only(owner.read_only_fd().unwrap(), LEN).unwrap();
        let anonymous = RegionMemory::anonymous(LEN).unwrap();
        for memory in [&owner, &reader, &anonymous] {
            for page in (0..LEN as u64).step_by(4096) {
                if memory.writable {
                    memory.store_u64(page, page, Ordering::Relaxed).unwrap();
                } else {
                    memory.load_u64(page, Ordering::Relaxed).unwrap();
                }
            }
            let pages = memory.pages().unwrap();
            assert!(pages.asked_for_huge, "{memory:?}: {pages:?}");
            assert!(pages.len_bytes >= LEN as u64, "{memory:?}: {pages:?}");
            eprintln!("{memory:?}: {} bytes on 2 MiB pages", pages.huge_bytes);
        }
    }

    #[test]
    fn a_handed_out_fd_is_closed_on_exec() {
        // Only the process it is handed to may hold it, not its children.
        let owner = RegionMemory::shared(8192, "rdkv-test").unwrap();
        let fd = owner.read_only_fd().unwrap();
        let flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC), "{flags:?}");
    }

    #[test]
    fn a_write_of_any_length_pads_its_last_word_with_zeros_and_nothing_more() {
        let m = RegionMemory::anonymous(4096).unwrap();
        let src: Vec<u8> = (1..=40).collect();
        for len in 0..=src.len() {
            m.write_bytes(0, &[0xAA; 64]).unwrap();
            m.write_bytes(8, &src[..len]).unwrap();
            let mut got = [0u8; 64];
            m.read_bytes(0, &mut got).unwrap();
            let padded_end = 8 + len.div_ceil(WORD) * WORD;
            let mut want = [0xAAu8; 64];
            want[8..padded_end].fill(0);
            want[8..8 + len].copy_from_slice(&src[..len]);
            assert_eq!(got, want, "len {len}");
        }
    }

    #[test]
    fn bytes_round_trip_and_bounds_are_enforced() {
        let m = RegionMemory::anonymous(4096).unwrap();
        m.write_bytes(64, b"hello, region").unwrap();
        let mut out = [0u8; 13];
        m.read_bytes(64, &mut out).unwrap();
        assert_eq!(&out, b"hello, region");
        assert!(m.read_bytes(4090, &mut out).is_err());
        assert!(m.read_bytes(3, &mut out).is_err());
        assert!(m.load_u64(4096, Ordering::Relaxed).is_err());
        assert!(m.load_u64(u64::MAX - 3, Ordering::Relaxed).is_err());
        for offset in 64..72 {
            for len in 0..13 {
                let mut any = vec![0u8; len];
                m.read_bytes_unaligned(offset, &mut any).unwrap();
                let start = (offset - 64) as usize;
                let expected: Vec<u8> =
                    b"hello, region\0\0\0\0\0\0\0\0\0\0"[start..start + len].to_vec();
                assert_eq!(any, expected, "offset {offset} len {len}");
            }
        }
        assert!(m.read_bytes_unaligned(4093, &mut out[..4]).is_err());
        m.prefetch(4000, 1 << 20);
        m.inject_bit_flip(65, 0x01).unwrap();
        m.read_bytes(64, &mut out).unwrap();
        assert_eq!(&out, b"hdllo, region");
    }
}
