//! The region a reader reads: a mapping in this process (`mem`, `shm`),
//! called directly, so that a GET's few loads (header words, neighbourhood,
//! block) are inlined into it; or any other transport's region, through
//! its trait object. Both run the same [`RemoteRegion`] methods.

use std::sync::Arc;

use rdkv_proto::region::{MAX_NEIGHBOURHOOD_BYTES, NeighbourhoodWords};

use crate::transport::{FabricError, MappedRegion, ReadOp, RemoteRegion};

#[derive(Debug, Clone)]
pub(crate) enum Region {
    Mapped(Arc<MappedRegion>),
    Remote(Arc<dyn RemoteRegion>),
}

impl Region {
    pub(crate) fn new(region: Arc<dyn RemoteRegion>) -> Region {
        match Arc::clone(&region).mapped() {
            Some(mapped) => Region::Mapped(mapped),
            None => Region::Remote(region),
        }
    }

    /// The region as the trait object (for what is not on the GET path).
    pub(crate) fn as_dyn(&self) -> &dyn RemoteRegion {
        match self {
            Region::Mapped(mapped) => mapped.as_ref(),
            Region::Remote(remote) => remote.as_ref(),
        }
    }

    #[inline]
    pub(crate) fn on_this_host(&self) -> bool {
        match self {
            Region::Mapped(mapped) => mapped.on_this_host(),
            Region::Remote(remote) => remote.on_this_host(),
        }
    }

    #[inline]
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        match self {
            Region::Mapped(mapped) => mapped.read(offset, buf),
            Region::Remote(remote) => remote.read(offset, buf),
        }
    }

    #[inline]
    pub(crate) fn read_batch(&self, reads: &mut [ReadOp<'_>]) -> Result<(), FabricError> {
        match self {
            Region::Mapped(mapped) => mapped.read_batch(reads),
            Region::Remote(remote) => remote.read_batch(reads),
        }
    }

    #[inline]
    pub(crate) fn read_split(
        &self,
        offset: u64,
        head: &mut [u8],
        tail: &mut [u8],
    ) -> Result<(), FabricError> {
        match self {
            Region::Mapped(mapped) => mapped.read_split(offset, head, tail),
            Region::Remote(remote) => remote.read_split(offset, head, tail),
        }
    }

    #[inline(always)]
    pub(crate) fn read_words(&self, offset: u64, words: &mut [u64]) -> Result<(), FabricError> {
        match self {
            Region::Mapped(mapped) => mapped.read_words(offset, words),
            Region::Remote(remote) => remote.read_words(offset, words),
        }
    }

    /// The `len_bytes` of slot words at `offset` (a neighbourhood): loaded
    /// as words from a mapping, or read as bytes in one read (one READ on
    /// RDMA) and decoded.
    #[inline]
    pub(crate) fn read_neighbourhood(
        &self,
        offset: u64,
        len_bytes: u64,
    ) -> Result<NeighbourhoodWords, FabricError> {
        let len_bytes = len_bytes as usize;
        match self {
            Region::Mapped(mapped) => {
                NeighbourhoodWords::fill(len_bytes, |words| mapped.read_words(offset, words))
            }
            Region::Remote(remote) => {
                let mut bytes = [0u8; MAX_NEIGHBOURHOOD_BYTES];
                let bytes = &mut bytes[..len_bytes];
                remote.read(offset, bytes)?;
                Ok(NeighbourhoodWords::decode(bytes))
            }
        }
    }

    #[inline]
    pub(crate) fn prefetch(&self, offset: u64, len_bytes: u64) {
        match self {
            Region::Mapped(mapped) => mapped.prefetch(offset, len_bytes),
            Region::Remote(remote) => remote.prefetch(offset, len_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::RegionMemory;
    use crate::transport::{Fabric, MappedFabric, RegionDescriptor};

    /// Any region that is not a mapping: it forwards to one.
    #[derive(Debug)]
    struct Wrapped(Arc<dyn RemoteRegion>);

    impl RemoteRegion for Wrapped {
        fn descriptor(&self) -> RegionDescriptor {
            self.0.descriptor()
        }

        fn on_this_host(&self) -> bool {
            self.0.on_this_host()
        }

        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
            self.0.read(offset, buf)
        }
    }

    /// A mapping is called directly; anything else (RDMA, libfabric, a
    /// test's wrapper) through its trait object; both read the same bytes.
    #[test]
    fn a_mapping_is_called_directly_and_any_other_region_through_its_trait() {
        let fabric = MappedFabric::new();
        let memory = Arc::new(RegionMemory::anonymous(4096).unwrap());
        let word = 0x0102_0304_0506_0708u64;
        memory.write_bytes(64, &word.to_le_bytes()).unwrap();
        let remote = fabric.register(memory, 1, 7);
        let mapped = Region::new(fabric.open(&remote).unwrap());
        assert!(matches!(mapped, Region::Mapped(_)));
        let wrapped = Region::new(Arc::new(Wrapped(fabric.open(&remote).unwrap())));
        assert!(matches!(wrapped, Region::Remote(_)));
        for region in [&mapped, &wrapped] {
            let words = region.read_neighbourhood(64, 8).unwrap();
            assert_eq!(words.as_slice(), [word]);
        }
    }
}
