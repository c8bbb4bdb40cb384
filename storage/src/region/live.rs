//! The walk over a region's live pairs: every bucket of the index, then its
//! overflow chain, each entry's block read and validated. It needs only the
//! region's memory and layout, so a snapshot build walks a region without
//! its writer (and without the state lock); whoever walks keeps the pairs
//! from changing meanwhile (the state machine's pairs gate).

use std::sync::atomic::Ordering;

use rdkv_proto::region::{
    BUCKET_BYTES, BlockRef, ChainWalk, MAX_OVERFLOW_TABLE_SLOTS, OverflowLink, RegionLayout,
    SLOT_BYTES, SLOTS_PER_BUCKET, Slot, SlotWord,
};

use crate::region::RegionMemory;
use crate::region::error::RegionError;

/// A region's memory and layout, read for its live pairs.
#[derive(Debug, Clone, Copy)]
pub struct LiveWalk<'r> {
    memory: &'r RegionMemory,
    layout: &'r RegionLayout,
}

impl<'r> LiveWalk<'r> {
    pub(crate) fn new(memory: &'r RegionMemory, layout: &'r RegionLayout) -> LiveWalk<'r> {
        LiveWalk { memory, layout }
    }

    /// Calls `f(pair)` for every live pair (expired or not), in index order
    /// (each bucket, then its overflow chain), validating each block (a
    /// corrupt one stops the walk with its error). Every entry is reached
    /// once: a table belongs to one chain, reached from its bucket's anchor.
    /// An error of `f` ends the walk with it.
    pub(crate) fn for_each<E: From<RegionError>>(
        &self,
        mut f: impl FnMut(BlockRef<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut block = Vec::new();
        let mut table = [0u64; MAX_OVERFLOW_TABLE_SLOTS];
        for bucket in 0..self.layout.bucket_count {
            let bucket_at = self.layout.index_offset + bucket * BUCKET_BYTES;
            let mut words = [0u64; SLOTS_PER_BUCKET];
            self.memory
                .read_words(bucket_at, &mut words, Ordering::Relaxed)
                .map_err(RegionError::from)?;
            self.each_entry(&words, &mut block, &mut f)?;
            let mut walk = ChainWalk::from_neighbourhood(&words).map_err(RegionError::from)?;
            while let Some(link) = walk.next_table() {
                let (_, words) = self.read_table(link, &mut table)?;
                self.each_entry(words, &mut block, &mut f)?;
                walk.advance(words).map_err(RegionError::from)?;
            }
        }
        Ok(())
    }

    /// `f` for the pair of every entry among `words`.
    fn each_entry<E: From<RegionError>>(
        &self,
        words: &[u64],
        block: &mut Vec<u8>,
        f: &mut impl FnMut(BlockRef<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        for &raw in words {
            if let SlotWord::Entry(slot) = SlotWord::decode(raw).map_err(RegionError::from)? {
                f(self.read_block(slot, block)?)?;
            }
        }
        Ok(())
    }

    /// Copies and validates the block `slot` points to, into `block`.
    pub(crate) fn read_block<'a>(
        &self,
        slot: Slot,
        block: &'a mut Vec<u8>,
    ) -> Result<BlockRef<'a>, RegionError> {
        let (offset, len) = self.layout.block_range(slot)?;
        block.resize(len as usize, 0);
        self.memory.read_bytes(offset, block)?;
        Ok(self.layout.validate_block(block)?)
    }

    /// Reads the words of the table `link` names into `buf`: the table's
    /// region offset and its words.
    pub(crate) fn read_table<'b>(
        &self,
        link: OverflowLink,
        buf: &'b mut [u64; MAX_OVERFLOW_TABLE_SLOTS],
    ) -> Result<(u64, &'b [u64]), RegionError> {
        let (table_at, len) = self.layout.table_range(link)?;
        // A decoded link names at most the largest table: this fits `buf`.
        let words = &mut buf[..(len / SLOT_BYTES) as usize];
        self.memory.read_words(table_at, words, Ordering::Relaxed)?;
        Ok((table_at, words))
    }
}
