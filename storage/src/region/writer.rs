//! The single writer of a region: the Raft apply loop owns it. It changes the
//! region only in ways that keep every concurrent reader safe:
//!
//! - a block that a slot points to is never modified (invariant 1): an update
//!   writes a new block and publishes it with one release store into the slot;
//! - a replaced or deleted block goes to the grace queue and is reused only
//!   after `grace_period_us` (invariant 3);
//! - every failure (limits, full region or index, corruption) is reported
//!   before anything visible changes.

use std::sync::Arc;

use std::sync::atomic::{Ordering, fence};

use rdkv_proto::region::{
    BLOCK_HEADER_BYTES, BUCKET_BYTES, BlockHeader, BlockRef, CRC_WORD_OFFSET, INVALIDATED_WORD,
    INVALIDATION_WORD_OFFSET, KeyHash, LeaseDeadline, MAX_NEIGHBOURHOOD_SLOTS, RegionLayout,
    RegionState, SLOT_BYTES, SizeClass, Slot, UNIT_BYTES, ValueShape, dynamic_word, encode_block,
    encoded_block_bytes, neighbourhood_slots, revoked_crc_word, verify_neighbourhood,
};

use crate::region::alloc::BlockAllocator;
use crate::region::config::RegionConfig;
use crate::region::error::RegionError;
use crate::region::grace::{GraceQueue, RetiredBlock};
use crate::region::stats::RegionStats;
use rdkv_fabric::Clock;
use rdkv_fabric::RegionMemory;
use rdkv_fabric::{ReadError, ReaderOptions, RegionReader};
use rdkv_proto::wire::Versioned;

/// A key's current slot and block, as the writer found them.
#[derive(Debug, Clone, Copy)]
struct Found {
    slot_offset: u64,
    slot: Slot,
    header: BlockHeader,
}

#[derive(Debug)]
pub struct RegionWriter {
    memory: Arc<RegionMemory>,
    layout: RegionLayout,
    allocator: BlockAllocator,
    grace: GraceQueue,
    clock: Arc<dyn Clock>,
    scratch: Vec<u8>,
    live_keys: u64,
    used_units: u64,
    payload_bytes: u64,
    /// The live pairs' charge against the quota (`rdkv_proto::region::charge`):
    /// their blocks' classes plus a slot each. It counts no overflow table,
    /// fragment or block in its grace period, so it depends on the live
    /// pairs alone and is the same on every replica.
    charged_bytes: u64,
    reclaimed_blocks_total: u64,
    reclaimed_units_total: u64,
}

impl RegionWriter {
    /// Maps a fresh region and writes its header; the region starts empty and
    /// serving.
    pub fn create(
        config: &RegionConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<RegionWriter, RegionError> {
        let layout = config.layout()?;
        let len_bytes = usize::try_from(layout.region_bytes)
            .map_err(|_| RegionError::Config("region larger than the address space".into()))?;
        let memory = Arc::new(if config.shared_memory {
            let name = format!("rdkv-region-n{}-e{}", config.node_id, config.region_epoch);
            RegionMemory::shared(len_bytes, &name)?
        } else {
            RegionMemory::anonymous(len_bytes)?
        });
        memory.write_bytes(0, &layout.encode_static())?;
        memory.store_u64(
            dynamic_word::REGION_STATE,
            RegionState::SERVING,
            Ordering::Release,
        )?;
        Ok(RegionWriter {
            memory,
            allocator: BlockAllocator::new(layout.data_bytes / UNIT_BYTES),
            layout,
            grace: GraceQueue::default(),
            clock,
            scratch: Vec::new(),
            live_keys: 0,
            used_units: 0,
            payload_bytes: 0,
            charged_bytes: 0,
            reclaimed_blocks_total: 0,
            reclaimed_units_total: 0,
        })
    }

    pub fn layout(&self) -> &RegionLayout {
        &self.layout
    }

    pub fn memory(&self) -> &Arc<RegionMemory> {
        &self.memory
    }

    /// A lock-free reader of this region sharing the writer's clock.
    pub fn reader(&self, options: ReaderOptions) -> Result<RegionReader, ReadError> {
        RegionReader::attach(Arc::clone(&self.memory), Arc::clone(&self.clock), options)
    }

    fn check_limits(&self, key: &[u8], value: &[u8]) -> Result<(), RegionError> {
        if !self.layout.admits_key(key) {
            return Err(RegionError::KeyTooLarge {
                len: key.len(),
                max: self.layout.max_key_bytes,
            });
        }
        if value.len() > self.layout.max_value_bytes as usize {
            return Err(RegionError::ValueTooLarge {
                len: value.len(),
                max: self.layout.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Inserts or replaces `key` with `value` written by log index `version`.
    /// Returns the replaced version, if any. On error the region is unchanged.
    pub fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        version: u64,
    ) -> Result<Option<u64>, RegionError> {
        self.check_limits(key, value)?;
        if version == 0 {
            return Err(RegionError::ZeroVersion);
        }
        let hash = self.layout.key_hash(key);
        let found = self.find(key, hash)?;
        let slot_offset = match found {
            Some(found) => found.slot_offset,
            None => self.free_slot(hash)?,
        };
        let block_bytes = encoded_block_bytes(key.len(), value.len());
        let class = SizeClass::for_bytes(block_bytes).ok_or(RegionError::ValueTooLarge {
            len: value.len(),
            max: self.layout.max_value_bytes,
        })?;
        self.reclaim();
        let units = u64::from(class.units());
        let Some(offset_units) = self.allocator.alloc(units) else {
            return Err(RegionError::RegionFull {
                needed_bytes: class.bytes(),
                free_bytes: self.allocator.free_units() * UNIT_BYTES,
                largest_free_bytes: self.allocator.largest_free_units() * UNIT_BYTES,
                pending_reclaim_bytes: self.grace.pending_units() * UNIT_BYTES,
            });
        };
        encode_block(key, value, version, &mut self.scratch);
        // Orders the slot stores that retired this space (before its grace
        // period) ahead of the new contents, so a reader that sees new bytes
        // and then re-reads the slot sees the change (seqlock discipline).
        fence(Ordering::Release);
        let written = self.memory.write_bytes(
            self.layout.data_offset + offset_units * UNIT_BYTES,
            &self.scratch,
        );
        if let Err(error) = written {
            self.release(offset_units, units);
            return Err(error.into());
        }
        let slot = Slot::new(hash.fingerprint, class, offset_units);
        if let Some(old) = found {
            self.invalidate(old)?;
        }
        let published = self
            .memory
            .store_u64(slot_offset, slot.encode(), Ordering::Release);
        if let Err(error) = published {
            self.release(offset_units, units);
            return Err(error.into());
        }
        self.used_units += units;
        self.payload_bytes += key.len() as u64 + value.len() as u64;
        self.charged_bytes += class.bytes() + if found.is_none() { SLOT_BYTES } else { 0 };
        match found {
            Some(old) => {
                self.retire(old);
                Ok(Some(old.header.version))
            }
            None => {
                self.live_keys += 1;
                Ok(None)
            }
        }
    }

    /// Removes `key`; returns the version it had, or `None` if absent.
    pub fn delete(&mut self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        let hash = self.layout.key_hash(key);
        let Some(found) = self.find(key, hash)? else {
            return Ok(None);
        };
        self.invalidate(found)?;
        self.memory
            .store_u64(found.slot_offset, 0, Ordering::Release)?;
        self.live_keys -= 1;
        self.charged_bytes -= SLOT_BYTES;
        self.retire(found);
        Ok(Some(found.header.version))
    }

    /// The current value and version of `key` (the writer's own view: no
    /// retries needed as nothing else writes, but the block is still validated
    /// so that a corrupted block is reported, not served).
    pub fn get(&self, key: &[u8]) -> Result<Option<Versioned>, RegionError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        let Some(found) = self.find(key, self.layout.key_hash(key))? else {
            return Ok(None);
        };
        let mut block = Vec::new();
        let shape = ValueShape::of(&self.read_block(found.slot, &mut block)?);
        Ok(Some(shape.take(block)))
    }

    /// Copies and validates the block `slot` points to, into `block`.
    fn read_block<'a>(
        &self,
        slot: Slot,
        block: &'a mut Vec<u8>,
    ) -> Result<BlockRef<'a>, RegionError> {
        let (offset, len) = self.layout.block_range(slot)?;
        block.resize(len as usize, 0);
        self.memory.read_bytes(offset, block)?;
        Ok(self.layout.validate_block(block)?)
    }

    /// The version of `key`, for compare-and-swap.
    pub fn version_of(&self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        Ok(self
            .find(key, self.layout.key_hash(key))?
            .map(|f| f.header.version))
    }

    /// What `key`'s current pair is charged against the quota (`None`: absent).
    pub fn charge_of(&self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        Ok(self
            .find(key, self.layout.key_hash(key))?
            .map(|f| f.slot.class.bytes() + SLOT_BYTES))
    }

    /// The key's slot and block header. A miss verifies every slot of the
    /// neighbourhood, so a corrupted slot is reported instead of a duplicate
    /// being inserted beside it.
    fn find(&self, key: &[u8], hash: KeyHash) -> Result<Option<Found>, RegionError> {
        let (start, len) = self.layout.neighbourhood_range(hash);
        let mut words = [0u64; MAX_NEIGHBOURHOOD_SLOTS];
        let words = &mut words[..(len / SLOT_BYTES) as usize];
        self.memory.read_words(start, words, Ordering::Relaxed)?;
        for (position, slot) in neighbourhood_slots(words, hash.fingerprint) {
            let slot = slot?;
            let (block, _) = self.layout.block_range(slot)?;
            let mut head = [0u8; BLOCK_HEADER_BYTES];
            self.memory.read_bytes(block, &mut head)?;
            let header = self.layout.decode_block_header(&head)?;
            if header.key_len as usize == key.len()
                && self.key_at(block + BLOCK_HEADER_BYTES as u64, key)?
            {
                return Ok(Some(Found {
                    slot_offset: start + position as u64 * SLOT_BYTES,
                    slot,
                    header,
                }));
            }
        }
        verify_neighbourhood(words)?;
        Ok(None)
    }

    /// Compares the key stored at `offset` (8-aligned) with `key`, a chunk at a
    /// time, without allocating.
    fn key_at(&self, offset: u64, key: &[u8]) -> Result<bool, RegionError> {
        const CHUNK_BYTES: usize = 64;
        let mut chunk = [0u8; CHUNK_BYTES];
        for (i, expected) in key.chunks(CHUNK_BYTES).enumerate() {
            let stored = &mut chunk[..expected.len()];
            self.memory
                .read_bytes(offset + (i * CHUNK_BYTES) as u64, stored)?;
            if stored != expected {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A free slot in the key's neighbourhood, in the bucket with the most room.
    fn free_slot(&self, hash: KeyHash) -> Result<u64, RegionError> {
        let (start, len) = self.layout.neighbourhood_range(hash);
        let mut best: Option<(usize, u64)> = None;
        for bucket in (start..start + len).step_by(BUCKET_BYTES as usize) {
            let mut free = 0;
            let mut first_free = None;
            for slot_offset in (bucket..bucket + BUCKET_BYTES).step_by(SLOT_BYTES as usize) {
                if self.memory.load_u64(slot_offset, Ordering::Relaxed)? == 0 {
                    free += 1;
                    first_free.get_or_insert(slot_offset);
                }
            }
            if let Some(offset) = first_free.filter(|_| best.is_none_or(|(n, _)| free > n)) {
                best = Some((free, offset));
            }
        }
        best.map(|(_, offset)| offset)
            .ok_or(RegionError::IndexFull {
                slots: (len / SLOT_BYTES) as usize,
            })
    }

    /// Makes a block that is about to be replaced fail validation (as
    /// `BlockError::Invalidated`) before the slot moves away from it.
    /// A reader holding a cached location of this key then cannot return the
    /// old version once the new one is published; it falls back to the slot
    /// read. This is the one change a writer makes to a block a slot still
    /// points to (invariant 1): two atomic stores, only to take the block
    /// out of service. The first fails every later validation at once; the
    /// second (the CRC revoked) keeps the old pair from validating again when
    /// a reuse of the block puts the first word back (see `proto`'s block).
    fn invalidate(&self, old: Found) -> Result<(), RegionError> {
        let (block, _) = self.layout.block_range(old.slot)?;
        self.memory.store_u64(
            block + INVALIDATION_WORD_OFFSET,
            INVALIDATED_WORD,
            Ordering::Release,
        )?;
        self.memory.store_u64(
            block + CRC_WORD_OFFSET,
            revoked_crc_word(&old.header),
            Ordering::Release,
        )?;
        Ok(())
    }

    fn retire(&mut self, old: Found) {
        let units = u64::from(old.slot.class.units());
        self.used_units -= units;
        self.charged_bytes -= old.slot.class.bytes();
        self.payload_bytes -= old.header.key_len as u64 + old.header.value_len as u64;
        // Stamped after the slot store: no reader that saw the old slot can
        // have started after this instant.
        self.grace.retire(RetiredBlock {
            retired_at_us: self.clock.now_us(),
            offset_units: old.slot.offset_units,
            units,
        });
    }

    fn release(&mut self, offset_units: u64, units: u64) {
        let freed = self.allocator.free(offset_units, units);
        debug_assert!(freed.is_ok(), "allocator bookkeeping broken: {freed:?}");
    }

    /// Calls `f(key, value, version)` for every live pair, in index order,
    /// validating each block (a corrupt one stops the scan with its error).
    /// Snapshots are built with this.
    pub fn for_each_live(
        &self,
        mut f: impl FnMut(&[u8], &[u8], u64) -> Result<(), RegionError>,
    ) -> Result<(), RegionError> {
        let mut block = Vec::new();
        let slots_end = self.layout.index_offset + self.layout.slot_count() * SLOT_BYTES;
        for slot_offset in (self.layout.index_offset..slots_end).step_by(SLOT_BYTES as usize) {
            let Some(slot) = Slot::decode(self.memory.load_u64(slot_offset, Ordering::Relaxed)?)?
            else {
                continue;
            };
            let valid = self.read_block(slot, &mut block)?;
            f(valid.key, valid.value, valid.version)?;
        }
        Ok(())
    }

    /// Returns blocks whose grace period has passed to the allocator.
    pub fn reclaim(&mut self) -> u64 {
        let now_us = self.clock.now_us();
        let mut reclaimed = 0;
        while let Some(block) = self.grace.pop_expired(now_us, self.layout.grace_period_us) {
            self.release(block.offset_units, block.units);
            reclaimed += 1;
            self.reclaimed_units_total += block.units;
        }
        self.reclaimed_blocks_total += reclaimed;
        reclaimed
    }

    /// When the oldest retired block becomes reusable (clock µs), if any: an
    /// apply loop that got `RegionFull` can wait until then and retry.
    pub fn next_reclaim_at_us(&self) -> Option<u64> {
        self.grace.next_expiry_us(self.layout.grace_period_us)
    }

    pub fn stats(&self) -> RegionStats {
        let free_bytes = self.allocator.free_units() * UNIT_BYTES;
        let largest_free_bytes = self.allocator.largest_free_units() * UNIT_BYTES;
        RegionStats {
            data_capacity_bytes: self.layout.data_bytes,
            used_bytes: self.used_units * UNIT_BYTES,
            payload_bytes: self.payload_bytes,
            pending_reclaim_bytes: self.grace.pending_units() * UNIT_BYTES,
            pending_reclaim_blocks: self.grace.len() as u64,
            free_bytes,
            largest_free_bytes,
            fragmentation: if free_bytes == 0 {
                0.0
            } else {
                1.0 - largest_free_bytes as f64 / free_bytes as f64
            },
            live_keys: self.live_keys,
            charged_bytes: self.charged_bytes,
            index_slots: self.layout.slot_count(),
            reclaimed_blocks_total: self.reclaimed_blocks_total,
            reclaimed_bytes_total: self.reclaimed_units_total * UNIT_BYTES,
        }
    }

    /// Publishes the last applied log index (and when) for follower reads.
    pub fn publish_applied(&self, applied_index: u64, at_unix_us: u64) -> Result<(), RegionError> {
        self.memory.store_u64(
            dynamic_word::APPLIED_AT_UNIX_US,
            at_unix_us,
            Ordering::Release,
        )?;
        self.memory.store_u64(
            dynamic_word::APPLIED_INDEX,
            applied_index,
            Ordering::Release,
        )?;
        Ok(())
    }

    pub fn publish_term(&self, term: u64) -> Result<(), RegionError> {
        Ok(self
            .memory
            .store_u64(dynamic_word::RAFT_TERM, term, Ordering::Release)?)
    }

    /// `Some(deadline)` while leader with a lease; `None` clears the flag (on
    /// step-down, at once). The word 0 means "not leader", so a deadline of 0
    /// (the epoch, long past) is published as 1: equally expired.
    pub fn publish_lease(&self, deadline: Option<LeaseDeadline>) -> Result<(), RegionError> {
        // Each reader reads one of the two words: they need not change together.
        let word = |us: Option<u64>| us.map_or(0, |us| us.max(1));
        self.memory.store_u64(
            dynamic_word::LEADER_LEASE,
            word(deadline.map(|d| d.unix_us)),
            Ordering::Release,
        )?;
        self.memory.store_u64(
            dynamic_word::LEADER_LEASE_BOOTTIME,
            word(deadline.map(|d| d.boottime_us)),
            Ordering::Release,
        )?;
        Ok(())
    }

    /// Marks the region retired: readers must re-attach to its successor.
    pub fn retire_region(&self) -> Result<(), RegionError> {
        self.memory.store_u64(
            dynamic_word::REGION_STATE,
            RegionState::RETIRED,
            Ordering::Release,
        )?;
        Ok(())
    }
}
