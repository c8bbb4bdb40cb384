//! What a transport offers a one-sided reader, whatever moves the bytes:
//! a region is registered by its owner and described to readers by a
//! [`RegionDescriptor`] (address, key, length, epoch); a reader then reads
//! `(descriptor, offset, len)` one-sided, alone or as a batch (one doorbell on
//! RDMA). Every transport reports the same errors: an unknown key or a stale
//! epoch is [`FabricError::BadKey`], a read outside the region is
//! [`FabricError::OutOfRange`] (checked before any byte moves), a peer that
//! went away is [`FabricError::PeerGone`].
//!
//! Transports:
//! - [`MappedFabric`]: regions mapped into this process, either local memory
//!   registered by its owner (`mem`: the server's own readers, embedded
//!   clusters) or a server's region mapped read-only from a memfd (`shm`,
//!   see [`crate::shm`]). Reads are atomic word copies.
//! - `tcp` carries no one-sided reads: GETs over TCP are RPCs, served by the
//!   server's own `mem` reader (the protocol is in `rdkv_proto::wire`).
//! - `rdma` (feature `rdma`, a later issue): NIC READs of the same bytes.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;

use crate::memory::{MemoryError, RegionMemory};

/// A registered region as a remote reader names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionDescriptor {
    pub node_id: u64,
    /// Base address in the owner's address space (RDMA READs name it; the
    /// mapped transports report the mapping's address for diagnostics).
    pub addr: u64,
    /// The key that authorises reads (an rkey on RDMA); unguessable.
    pub key: u64,
    pub len_bytes: u64,
    /// The region's epoch: a region rebuilt from a snapshot is a new region.
    pub epoch: u64,
}

#[derive(Debug, Error)]
pub enum FabricError {
    #[error("no region is registered under key {key:#x} (or its epoch changed)")]
    BadKey { key: u64 },
    #[error(
        "read of {len_bytes} bytes at offset {offset} is outside the {region_bytes}-byte region"
    )]
    OutOfRange {
        offset: u64,
        len_bytes: u64,
        region_bytes: u64,
    },
    #[error("the peer is gone: {0}")]
    PeerGone(String),
    #[error("region memory: {0}")]
    Memory(#[from] MemoryError),
}

/// One read of a batch.
#[derive(Debug)]
pub struct ReadOp<'a> {
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// A transport: resolves a descriptor into a readable remote region (on
/// RDMA: a queue pair plus the rkey; here: the mapping).
pub trait Fabric: Send + Sync + Debug {
    fn open(&self, remote: &RegionDescriptor) -> Result<Arc<dyn RemoteRegion>, FabricError>;
}

/// A remote region a reader can read one-sided.
pub trait RemoteRegion: Send + Sync + Debug {
    fn descriptor(&self) -> RegionDescriptor;

    /// Whether the region's memory is on this host (a mapping), so that its
    /// owner's host clocks are this process's clocks too.
    fn on_this_host(&self) -> bool;

    /// Copies `buf.len()` bytes at `offset` into `buf`. The copy may mix two
    /// writes if the owner changes those bytes meanwhile: callers validate
    /// what they read.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError>;

    /// Several reads posted together; all succeed or the first error is
    /// returned (ranges are all checked before any byte moves).
    fn read_batch(&self, reads: &mut [ReadOp<'_>]) -> Result<(), FabricError> {
        reads
            .iter_mut()
            .try_for_each(|op| self.read(op.offset, op.buf))
    }

    /// Reads `head.len() + tail.len()` consecutive bytes from `offset`, the
    /// first into `head` and the rest into `tail` (a block's header and key
    /// into a scratch buffer, its value straight into the caller's): one
    /// batch, so one doorbell on RDMA.
    fn read_split(&self, offset: u64, head: &mut [u8], tail: &mut [u8]) -> Result<(), FabricError> {
        let tail_offset = offset.saturating_add(head.len() as u64);
        self.read_batch(&mut [
            ReadOp { offset, buf: head },
            ReadOp {
                offset: tail_offset,
                buf: tail,
            },
        ])
    }

    /// Loads `words.len()` consecutive aligned words (little-endian, as
    /// every region word) from `offset`, each read whole: the header words
    /// a GET checks. Transports that map the region load them directly
    /// (no byte copy, no buffer); the default reads their bytes, up to
    /// [`WORDS_PER_READ`] words a read.
    fn read_words(&self, offset: u64, words: &mut [u64]) -> Result<(), FabricError> {
        let mut bytes = [0u8; WORDS_PER_READ * WORD_BYTES];
        let mut at = offset;
        for chunk in words.chunks_mut(WORDS_PER_READ) {
            let bytes = &mut bytes[..chunk.len() * WORD_BYTES];
            self.read(at, bytes)?;
            for (word, le) in chunk.iter_mut().zip(bytes.chunks_exact(WORD_BYTES)) {
                let mut one = [0u8; WORD_BYTES];
                one.copy_from_slice(le);
                *word = u64::from_le_bytes(one);
            }
            at = at.saturating_add(bytes.len() as u64);
        }
        Ok(())
    }

    /// A hint that `[offset, offset + len_bytes)` will be read next (the CPU
    /// may start loading it into its caches). Transports without such a
    /// notion ignore it.
    fn prefetch(&self, _offset: u64, _len_bytes: u64) {}

    /// This region as a mapping, if it is one ([`MappedRegion`]): a reader
    /// then calls it directly (the GET's reads inlined, not dispatched
    /// through the trait object). Other transports are not.
    fn mapped(self: Arc<Self>) -> Option<Arc<MappedRegion>> {
        None
    }
}

/// Words [`RemoteRegion::read_words`] reads at once by default (a
/// region's dynamic header is six).
pub const WORDS_PER_READ: usize = 8;
const WORD_BYTES: usize = 8;

/// Checks a read against a region's length before any byte moves.
#[inline]
pub fn check_range(
    remote: &RegionDescriptor,
    offset: u64,
    len_bytes: u64,
) -> Result<(), FabricError> {
    match offset.checked_add(len_bytes) {
        Some(end) if end <= remote.len_bytes => Ok(()),
        _ => Err(FabricError::OutOfRange {
            offset,
            len_bytes,
            region_bytes: remote.len_bytes,
        }),
    }
}

pub(crate) fn random_key() -> u64 {
    // OS-seeded, like std's HashMap keys; never 0.
    let key = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    key.max(1)
}

/// A region mapped into this process.
#[derive(Debug)]
pub struct MappedRegion {
    descriptor: RegionDescriptor,
    memory: Arc<RegionMemory>,
    /// Cleared by `deregister`: reads through handles opened before then
    /// fail as a dead peer's would (one relaxed load per read, no lock).
    live: AtomicBool,
}

impl MappedRegion {
    /// Any offset, like a NIC READ: the memory is copied a word at a time,
    /// so an unaligned read copies the enclosing words and trims them.
    #[inline]
    fn copy(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        Ok(self.memory.read_bytes_unaligned(offset, buf)?)
    }

    /// `PeerGone` once the region is deregistered: every read checks it
    /// before any byte moves.
    #[inline]
    fn check_live(&self) -> Result<(), FabricError> {
        if self.live.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(deregistered())
        }
    }
}

/// A read through a handle of a region deregistered since.
#[cold]
#[inline(never)]
fn deregistered() -> FabricError {
    FabricError::PeerGone("the region was deregistered".into())
}

impl RemoteRegion for MappedRegion {
    fn descriptor(&self) -> RegionDescriptor {
        self.descriptor
    }

    #[inline]
    fn on_this_host(&self) -> bool {
        true
    }

    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.check_live()?;
        check_range(&self.descriptor, offset, buf.len() as u64)?;
        self.copy(offset, buf)
    }

    #[inline]
    fn read_batch(&self, reads: &mut [ReadOp<'_>]) -> Result<(), FabricError> {
        self.check_live()?;
        for op in reads.iter() {
            check_range(&self.descriptor, op.offset, op.buf.len() as u64)?;
        }
        reads
            .iter_mut()
            .try_for_each(|op| self.copy(op.offset, op.buf))
    }

    #[inline(always)]
    fn read_words(&self, offset: u64, words: &mut [u64]) -> Result<(), FabricError> {
        self.check_live()?;
        check_range(&self.descriptor, offset, (words.len() * WORD_BYTES) as u64)?;
        self.memory.read_words(offset, words, Ordering::Relaxed)?;
        // The memory holds each word's bytes in this host's order; the
        // region's words are little-endian (a no-op on x86 and arm64).
        for word in words.iter_mut() {
            *word = u64::from_le(*word);
        }
        Ok(())
    }

    #[inline]
    fn prefetch(&self, offset: u64, len_bytes: u64) {
        self.memory.prefetch(offset, len_bytes);
    }

    fn mapped(self: Arc<Self>) -> Option<Arc<MappedRegion>> {
        Some(self)
    }
}

/// Regions mapped into this process (`mem` and `shm`), by key.
#[derive(Debug, Default)]
pub struct MappedFabric {
    regions: Mutex<HashMap<u64, Arc<MappedRegion>>>,
}

impl MappedFabric {
    pub fn new() -> MappedFabric {
        MappedFabric::default()
    }

    fn regions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<MappedRegion>>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `memory` (owned here, or mapped from a peer) for one-sided
    /// reads and describes it. The length is the mapping's: a reader cannot
    /// widen it.
    pub fn register(
        &self,
        memory: Arc<RegionMemory>,
        node_id: u64,
        epoch: u64,
    ) -> RegionDescriptor {
        let descriptor = RegionDescriptor {
            node_id,
            addr: memory.base_ptr() as u64,
            key: random_key(),
            len_bytes: memory.len_bytes() as u64,
            epoch,
        };
        let region = Arc::new(MappedRegion {
            descriptor,
            memory,
            live: AtomicBool::new(true),
        });
        self.regions().insert(descriptor.key, region);
        descriptor
    }

    /// Removes a region: opening it fails with `BadKey`, and handles opened
    /// before fail with `PeerGone`.
    pub fn deregister(&self, remote: &RegionDescriptor) {
        if let Some(region) = self.regions().remove(&remote.key) {
            region.live.store(false, Ordering::Relaxed);
        }
    }
}

impl Fabric for MappedFabric {
    fn open(&self, remote: &RegionDescriptor) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        match self.regions().get(&remote.key) {
            Some(region) if region.descriptor.epoch == remote.epoch => {
                Ok(Arc::clone(region) as Arc<dyn RemoteRegion>)
            }
            _ => Err(FabricError::BadKey { key: remote.key }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_keys_stale_epochs_and_out_of_range_reads_are_refused() {
        let fabric = MappedFabric::new();
        let memory = Arc::new(RegionMemory::anonymous(4096).unwrap());
        memory.write_bytes(64, b"abcdefgh").unwrap();
        let remote = fabric.register(Arc::clone(&memory), 1, 7);
        let region = fabric.open(&remote).unwrap();
        let mut buf = [0u8; 8];
        region.read(64, &mut buf).unwrap();
        assert_eq!(&buf, b"abcdefgh");

        let wrong_key = RegionDescriptor {
            key: remote.key ^ 1,
            ..remote
        };
        assert!(matches!(
            fabric.open(&wrong_key),
            Err(FabricError::BadKey { .. })
        ));
        let stale = RegionDescriptor { epoch: 6, ..remote };
        assert!(matches!(
            fabric.open(&stale),
            Err(FabricError::BadKey { .. })
        ));
        // A caller cannot widen the region by lying about its length.
        let lying = RegionDescriptor {
            len_bytes: u64::MAX,
            ..remote
        };
        let region = fabric.open(&lying).unwrap();
        assert_eq!(region.descriptor().len_bytes, 4096);
        assert!(matches!(
            region.read(4092, &mut buf),
            Err(FabricError::OutOfRange { .. })
        ));
        assert!(matches!(
            region.read(u64::MAX - 3, &mut buf),
            Err(FabricError::OutOfRange { .. })
        ));

        let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
        let mut batch = [
            ReadOp {
                offset: 64,
                buf: &mut a,
            },
            ReadOp {
                offset: 68,
                buf: &mut b,
            },
        ];
        region.read_batch(&mut batch).unwrap();
        assert_eq!((&a, &b), (b"abcd", b"efgh"));
        let mut c = [0u8; 8];
        let mut bad_batch = [ReadOp {
            offset: 4090,
            buf: &mut c,
        }];
        assert!(matches!(
            region.read_batch(&mut bad_batch),
            Err(FabricError::OutOfRange { .. })
        ));

        fabric.deregister(&remote);
        assert!(matches!(
            region.read(64, &mut buf),
            Err(FabricError::PeerGone(_))
        ));
        assert!(matches!(
            fabric.open(&remote),
            Err(FabricError::BadKey { .. })
        ));
    }
}
