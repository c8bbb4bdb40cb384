//! The region's memory: one mapping that remote NICs, other processes and
//! in-process readers read while the writer changes it. Nothing here ever
//! makes a `&[u8]`/`&mut [u8]` over the mapping (the compiler would be allowed
//! to assume no one else writes it); every access is an 8-byte atomic on a
//! raw pointer (invariant 5 in ARCHITECTURE.md).

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::region::error::RegionError;

const WORD: usize = 8;

pub struct RegionMemory {
    /// Owns the mapping. `MmapRaw` exposes raw pointers only (no `Deref` to a
    /// slice), so not even `Debug` can make a reference over the memory.
    _map: MmapRaw,
    base: NonNull<u8>,
    len_bytes: usize,
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
            .finish()
    }
}

impl RegionMemory {
    /// Maps `len_bytes` of zeroed anonymous memory (page aligned by mmap).
    pub fn anonymous(len_bytes: usize) -> io::Result<RegionMemory> {
        if len_bytes == 0 || !len_bytes.is_multiple_of(WORD) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "region length must be a non-zero multiple of 8",
            ));
        }
        let map = MmapRaw::from(memmap2::MmapOptions::new().len(len_bytes).map_anon()?);
        let base = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(RegionMemory {
            _map: map,
            base,
            len_bytes,
        })
    }

    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Start of the mapping, for registration with a NIC or for sharing. Only
    /// for handing to code that accesses it atomically or by DMA.
    pub fn base_ptr(&self) -> *const u8 {
        self.base.as_ptr()
    }

    /// The word at `offset`, or an error if unaligned or out of bounds.
    fn word(&self, offset: u64) -> Result<&AtomicU64, RegionError> {
        self.words(offset, WORD)?
            .first()
            .ok_or(RegionError::OutOfBounds {
                offset,
                len_bytes: WORD as u64,
            })
    }

    /// The words covering `len_bytes` from `offset` (rounded up to whole
    /// words), checked once for alignment and bounds.
    fn words(&self, offset: u64, len_bytes: usize) -> Result<&[AtomicU64], RegionError> {
        let count = len_bytes.div_ceil(WORD);
        let in_bounds = usize::try_from(offset).ok().filter(|&o| {
            o % WORD == 0
                && count
                    .checked_mul(WORD)
                    .and_then(|n| o.checked_add(n))
                    .is_some_and(|end| end <= self.len_bytes)
        });
        let Some(offset) = in_bounds else {
            return Err(RegionError::OutOfBounds {
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

    pub fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64, RegionError> {
        Ok(self.word(offset)?.load(order))
    }

    pub fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<(), RegionError> {
        self.word(offset)?.store(value, order);
        Ok(())
    }

    /// Loads consecutive words, each with `order`.
    pub fn read_words(
        &self,
        offset: u64,
        dst: &mut [u64],
        order: Ordering,
    ) -> Result<(), RegionError> {
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
    pub fn read_bytes(&self, offset: u64, dst: &mut [u8]) -> Result<(), RegionError> {
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

    /// Copies bytes in with relaxed word stores; the last word is zero padded.
    /// Publication (the slot store with release ordering) orders these stores
    /// before any reader that acquires the slot.
    pub fn write_bytes(&self, offset: u64, src: &[u8]) -> Result<(), RegionError> {
        let words = self.words(offset, src.len())?;
        for (chunk, word) in src.chunks(WORD).zip(words) {
            let mut bytes = [0u8; WORD];
            bytes[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Flips bits of one byte in place: fault injection for tests and tools
    /// that prove readers detect corruption.
    pub fn inject_bit_flip(&self, offset: u64, mask: u8) -> Result<(), RegionError> {
        let word_offset = offset & !(WORD as u64 - 1);
        let shift = (offset - word_offset) * 8;
        let word_mask = u64::from(mask) << shift;
        self.word(word_offset)?
            .fetch_xor(word_mask, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        m.inject_bit_flip(65, 0x01).unwrap();
        m.read_bytes(64, &mut out).unwrap();
        assert_eq!(&out, b"hdllo, region");
    }
}
