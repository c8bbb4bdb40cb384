//! The single writer of a region: the Raft apply loop owns it. It changes the
//! region only in ways that keep every concurrent reader safe:
//!
//! - a block that a slot points to is never modified (invariant 1): an update
//!   writes a new block and publishes it with one release store into the slot;
//! - a replaced or deleted block goes to the grace queue and is reused only
//!   after `grace_period_us` (invariant 3);
//! - every failure (limits, full region or index, corruption) is reported
//!   before anything visible changes;
//! - a key whose neighbourhood is full goes into its home bucket's overflow
//!   chain (see `rdkv_proto::region::overflow`), so the index refuses a key
//!   only past the chain's bound, not because of where this replica's
//!   history happened to put other keys. A table is linked with one release
//!   store after it is zeroed (and after the anchor's entry, if the anchor
//!   becomes the link, is copied into it), and is never freed.

use std::sync::Arc;

use std::sync::atomic::{Ordering, fence};

use rdkv_proto::region::{
    ANCHOR_SLOT, BLOCK_HEADER_BYTES, BlockHeader, BlockRef, CRC_WORD_OFFSET, ChainWalk,
    DeadlineUnixMs, INVALIDATED_WORD, INVALIDATION_WORD_OFFSET, KeyHash, LeaseDeadline,
    MAX_NEIGHBOURHOOD_SLOTS, MAX_OVERFLOW_TABLE_SLOTS, MAX_OVERFLOW_TABLES, NO_DEADLINE,
    OverflowLink, RegionLayout, RegionState, SLOT_BYTES, SizeClass, Slot, SlotWord, UNIT_BYTES,
    ValueShape, chain_capacity, dynamic_word, encode_block, encoded_block_bytes,
    free_neighbourhood_slot, free_table_slot, may_hold_key, neighbourhood_slots,
    overflow_table_units, revoked_crc_word,
};

use crate::region::alloc::BlockAllocator;
use crate::region::config::RegionConfig;
use crate::region::error::RegionError;
use crate::region::grace::{GraceQueue, RetiredBlock};
use crate::region::live::LiveWalk;
use crate::region::stats::RegionStats;
use rdkv_fabric::Clock;
use rdkv_fabric::RegionMemory;
use rdkv_fabric::{ReadError, ReaderOptions, RegionReader};
use rdkv_proto::wire::Versioned;

/// The most of a new block prefetched before it is written (one 4 KiB
/// page, 64 lines).
const BLOCK_PREFETCH_MAX_BYTES: u64 = 4096;

/// A key's current slot and block, as the writer found them.
#[derive(Debug, Clone, Copy)]
struct Found {
    /// Region offset of the slot word: in the index, or in an overflow
    /// table in the data area (updates and deletes store to it alike).
    slot_offset: u64,
    slot: Slot,
    header: BlockHeader,
}

/// Where a key's slot word will be stored.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// This slot (region offset): the key's own, or an empty one it may take.
    Slot(u64),
    /// Its home chain has no room: a new table first (see [`Extension`]).
    Extend(Extension),
}

/// A new table at the end of a home bucket's overflow chain.
#[derive(Debug, Clone, Copy)]
struct Extension {
    /// Region offset of the word that will link to it: the home anchor, or
    /// the link slot of the chain's last table.
    link_at: u64,
    /// The anchor's entry when the anchor becomes the link: it moves into
    /// the new table's first slot.
    moved: Option<u64>,
    units: u64,
}

/// Space allocated for one put: the block, and where its slot will be.
#[derive(Debug, Clone, Copy)]
struct Reserved {
    block: u64,
    block_units: u64,
    slot: Opening,
}

/// Where a reserved put's slot will be.
#[derive(Debug, Clone, Copy)]
enum Opening {
    Slot(u64),
    /// In the new table allocated at `table` (units), once it is linked.
    NewTable {
        extension: Extension,
        table: u64,
    },
}

/// Region offset of slot `position` of the words read at `words_at`.
fn slot_at(words_at: u64, position: usize) -> u64 {
    words_at + position as u64 * SLOT_BYTES
}

/// How a shared region's memfd is named (then `n<node>-e<epoch>`): what
/// `/proc/<pid>/maps` shows of it, `/memfd:rdkv-region-...`.
pub const REGION_MEMFD_PREFIX: &str = "rdkv-region-";

#[derive(Debug)]
pub struct RegionWriter {
    memory: Arc<RegionMemory>,
    layout: RegionLayout,
    allocator: BlockAllocator,
    grace: GraceQueue,
    clock: Arc<dyn Clock>,
    scratch: Vec<u8>,
    live_keys: u64,
    /// Blocks and overflow tables.
    used_units: u64,
    payload_bytes: u64,
    /// The live pairs' charge against the quota (`rdkv_proto::region::charge`):
    /// their blocks' classes plus a slot each. It counts no overflow table,
    /// fragment or block in its grace period, so it depends on the live
    /// pairs alone and is the same on every replica.
    charged_bytes: u64,
    overflow_tables: u64,
    overflow_units: u64,
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
            let name = format!(
                "{REGION_MEMFD_PREFIX}n{}-e{}",
                config.node_id, config.region_epoch
            );
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
            overflow_tables: 0,
            overflow_units: 0,
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

    /// Inserts or replaces `key` with `value` written by log index `version`,
    /// never expiring. Returns the replaced version, if any. On error the
    /// region is unchanged.
    pub fn put(
        &mut self,
        key: &[u8],
        value: &[u8],
        version: u64,
    ) -> Result<Option<u64>, RegionError> {
        let pair = BlockRef {
            key,
            value,
            version,
            deadline: NO_DEADLINE,
        };
        Ok(self.put_pair(pair)?.map(|old| old.version))
    }

    /// Inserts or replaces `pair.key` with the pair (value, version,
    /// deadline). Returns the replaced pair's header, if any. On error the
    /// region is unchanged.
    pub fn put_pair(&mut self, pair: BlockRef<'_>) -> Result<Option<BlockHeader>, RegionError> {
        let BlockRef {
            key,
            value,
            version,
            ..
        } = pair;
        self.check_limits(key, value)?;
        if version == 0 {
            return Err(RegionError::ZeroVersion);
        }
        let hash = self.layout.key_hash(key);
        let found = self.find(key, hash)?;
        let place = match found {
            Some(found) => Place::Slot(found.slot_offset),
            None => self.place(hash)?,
        };
        let block_bytes = encoded_block_bytes(key.len(), value.len());
        let class = SizeClass::for_bytes(block_bytes).ok_or(RegionError::ValueTooLarge {
            len: value.len(),
            max: self.layout.max_value_bytes,
        })?;
        self.reclaim();
        let space = self.reserve(class, place)?;
        let slot_offset = match self.write_and_open(pair, space) {
            Ok(slot_offset) => slot_offset,
            Err(error) => {
                self.release(space.block, space.block_units);
                return Err(error);
            }
        };
        let slot = Slot::new(hash.fingerprint, class, space.block);
        if let Some(old) = found {
            self.invalidate(old)?;
        }
        let published = self
            .memory
            .store_u64(slot_offset, slot.encode(), Ordering::Release);
        if let Err(error) = published {
            self.release(space.block, space.block_units);
            return Err(error.into());
        }
        self.used_units += space.block_units;
        self.payload_bytes += key.len() as u64 + value.len() as u64;
        self.charged_bytes += class.bytes() + if found.is_none() { SLOT_BYTES } else { 0 };
        match found {
            Some(old) => {
                self.retire(old);
                Ok(Some(old.header))
            }
            None => {
                self.live_keys += 1;
                Ok(None)
            }
        }
    }

    /// Allocates the block of `class` and, when `place` needs one, the new
    /// overflow table: both or neither.
    fn reserve(&mut self, class: SizeClass, place: Place) -> Result<Reserved, RegionError> {
        let block_units = u64::from(class.units());
        let slot = match place {
            Place::Slot(slot_offset) => Opening::Slot(slot_offset),
            Place::Extend(extension) => {
                let needed_bytes = (block_units + extension.units) * UNIT_BYTES;
                let table = self.allocator.alloc(extension.units);
                let table = table.ok_or_else(|| self.region_full(needed_bytes))?;
                Opening::NewTable { extension, table }
            }
        };
        let Some(block) = self.allocator.alloc(block_units) else {
            let mut needed_bytes = block_units * UNIT_BYTES;
            if let Opening::NewTable { extension, table } = slot {
                self.release(table, extension.units);
                needed_bytes += extension.units * UNIT_BYTES;
            }
            return Err(self.region_full(needed_bytes));
        };
        Ok(Reserved {
            block,
            block_units,
            slot,
        })
    }

    fn region_full(&self, needed_bytes: u64) -> RegionError {
        RegionError::RegionFull {
            needed_bytes,
            free_bytes: self.allocator.free_units() * UNIT_BYTES,
            largest_free_bytes: self.allocator.largest_free_units() * UNIT_BYTES,
            pending_reclaim_bytes: self.grace.pending_units() * UNIT_BYTES,
        }
    }

    /// Writes the block into its reserved space, then makes its slot ready:
    /// the region offset the slot word goes to. On error the block's space
    /// is the caller's to release; a table that was not linked is released.
    fn write_and_open(&mut self, pair: BlockRef<'_>, space: Reserved) -> Result<u64, RegionError> {
        let block_at = self.layout.data_offset + space.block * UNIT_BYTES;
        // The block's lines were freed a grace period ago and are likely
        // out of the caches: start loading them while the block is encoded.
        // Its first page at most: a larger value's later lines would leave
        // the cache before the copy reached them (the hardware's own
        // prefetcher follows the copy).
        let block_bytes = encoded_block_bytes(pair.key.len(), pair.value.len());
        self.memory
            .prefetch(block_at, block_bytes.min(BLOCK_PREFETCH_MAX_BYTES));
        encode_block(
            pair.key,
            pair.value,
            pair.version,
            pair.deadline,
            &mut self.scratch,
        );
        // Orders the slot stores that retired this space (before its grace
        // period) ahead of the new contents, so a reader that sees new bytes
        // and then re-reads the slot sees the change (seqlock discipline).
        // A new table's space comes from the allocator too: it is covered.
        fence(Ordering::Release);
        let written = self.memory.write_bytes(block_at, &self.scratch);
        match (written, space.slot) {
            (Ok(()), Opening::Slot(slot_offset)) => Ok(slot_offset),
            (Ok(()), Opening::NewTable { extension, table }) => {
                let opened = self.extend_chain(extension, table);
                if opened.is_err() {
                    self.release(table, extension.units);
                }
                opened
            }
            (Err(error), Opening::NewTable { extension, table }) => {
                self.release(table, extension.units);
                Err(error.into())
            }
            (Err(error), Opening::Slot(_)) => Err(error.into()),
        }
    }

    /// Zeroes the new table at `table` (units), copies the anchor's entry
    /// into its first slot if the anchor is to become the link, and links
    /// it with one release store: a reader that sees the link sees the
    /// table zeroed and the moved entry in it (the entry's block does not
    /// move, so a reader finds it at the anchor before, in the table after).
    /// Returns the region offset of the first slot left for the key. On
    /// error nothing was linked.
    fn extend_chain(&mut self, extension: Extension, table: u64) -> Result<u64, RegionError> {
        let link = OverflowLink::new(extension.units, table);
        let table_at = self.layout.data_offset + table * UNIT_BYTES;
        for position in 0..link.table_slots() {
            self.memory
                .store_u64(slot_at(table_at, position), 0, Ordering::Relaxed)?;
        }
        let mut first_free = 0;
        if let Some(entry) = extension.moved {
            self.memory.store_u64(table_at, entry, Ordering::Relaxed)?;
            first_free = 1;
        }
        self.memory
            .store_u64(extension.link_at, link.encode(), Ordering::Release)?;
        self.overflow_tables += 1;
        self.overflow_units += extension.units;
        self.used_units += extension.units;
        Ok(slot_at(table_at, first_free))
    }

    /// Removes `key`; returns the version it had, or `None` if absent.
    pub fn delete(&mut self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        Ok(self.delete_pair(key)?.map(|old| old.version))
    }

    /// Removes `key`; returns the header of the pair it had, or `None` if
    /// absent.
    pub fn delete_pair(&mut self, key: &[u8]) -> Result<Option<BlockHeader>, RegionError> {
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
        Ok(Some(found.header))
    }

    /// The current value and version of `key` (the writer's own view: no
    /// retries needed as nothing else writes, but the block is still validated
    /// so that a corrupted block is reported, not served).
    pub fn get(&self, key: &[u8]) -> Result<Option<Versioned>, RegionError> {
        Ok(self.get_with_deadline(key)?.map(|(value, _)| value))
    }

    /// Like [`RegionWriter::get`], with the pair's deadline (expired or not:
    /// the writer's view is the region's, whatever the time).
    pub fn get_with_deadline(
        &self,
        key: &[u8],
    ) -> Result<Option<(Versioned, DeadlineUnixMs)>, RegionError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        let Some(found) = self.find(key, self.layout.key_hash(key))? else {
            return Ok(None);
        };
        let mut block = Vec::new();
        let shape = ValueShape::of(&self.read_block(found.slot, &mut block)?);
        let deadline = shape.deadline;
        Ok(Some((shape.take(block), deadline)))
    }

    /// The header (version and deadline) of `key`'s pair, without its value.
    pub fn header_of(&self, key: &[u8]) -> Result<Option<BlockHeader>, RegionError> {
        if !self.layout.admits_key(key) {
            return Ok(None);
        }
        Ok(self.find(key, self.layout.key_hash(key))?.map(|f| f.header))
    }

    /// Copies and validates the block `slot` points to, into `block`.
    fn read_block<'a>(
        &self,
        slot: Slot,
        block: &'a mut Vec<u8>,
    ) -> Result<BlockRef<'a>, RegionError> {
        self.live().read_block(slot, block)
    }

    /// This region's memory and layout, to walk its live pairs.
    pub(crate) fn live(&self) -> LiveWalk<'_> {
        LiveWalk::new(&self.memory, &self.layout)
    }

    /// The version of `key`, for compare-and-swap.
    pub fn version_of(&self, key: &[u8]) -> Result<Option<u64>, RegionError> {
        Ok(self.header_of(key)?.map(|header| header.version))
    }

    /// The live pairs' charge against the quota (see the field).
    pub fn charged_bytes(&self) -> u64 {
        self.charged_bytes
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

    /// Starts loading the index words a lookup of `key` reads first (its
    /// neighbourhood) into the CPU's caches: a hint that changes nothing,
    /// for the apply loop to give a few entries ahead.
    pub fn prefetch_neighbourhood(&self, key: &[u8]) {
        if !self.layout.admits_key(key) {
            return;
        }
        let (start, len) = self.layout.neighbourhood_range(self.layout.key_hash(key));
        self.memory.prefetch(start, len);
    }

    /// Starts loading the block header and key of every slot in `key`'s
    /// neighbourhood whose fingerprint matches: what a lookup compares
    /// next. It reads the neighbourhood now, so it is best given after
    /// [`Self::prefetch_neighbourhood`] has had time to load it. A hint: a
    /// key the region cannot hold and a slot that does not decode are left
    /// for the lookup to refuse or report.
    pub fn prefetch_candidates(&self, key: &[u8]) {
        if !self.layout.admits_key(key) {
            return;
        }
        let hash = self.layout.key_hash(key);
        let mut buf = [0u64; MAX_NEIGHBOURHOOD_SLOTS];
        let Ok((_, words)) = self.read_neighbourhood(hash, &mut buf) else {
            return;
        };
        let compared = (BLOCK_HEADER_BYTES + key.len()) as u64;
        for (_, slot) in neighbourhood_slots(words, hash.fingerprint) {
            if let Some((block, len)) = slot.ok().and_then(|s| self.layout.block_range(s).ok()) {
                self.memory.prefetch(block, compared.min(len));
            }
        }
    }

    /// Reads the neighbourhood of `hash` into `buf`: its region offset and
    /// its words.
    fn read_neighbourhood<'b>(
        &self,
        hash: KeyHash,
        buf: &'b mut [u64; MAX_NEIGHBOURHOOD_SLOTS],
    ) -> Result<(u64, &'b [u64]), RegionError> {
        let (start, len) = self.layout.neighbourhood_range(hash);
        let words = &mut buf[..(len / SLOT_BYTES) as usize];
        self.memory.read_words(start, words, Ordering::Relaxed)?;
        Ok((start, words))
    }

    /// The key's slot and block header: in its neighbourhood, else in its
    /// home bucket's overflow chain. A miss verifies every slot word it
    /// passed, so a corrupted slot is reported instead of a duplicate being
    /// inserted beside it.
    fn find(&self, key: &[u8], hash: KeyHash) -> Result<Option<Found>, RegionError> {
        let mut buf = [0u64; MAX_NEIGHBOURHOOD_SLOTS];
        let (start, words) = self.read_neighbourhood(hash, &mut buf)?;
        if let Some(found) = self.find_among(key, hash.fingerprint, start, words)? {
            return Ok(Some(found));
        }
        let mut walk = ChainWalk::from_neighbourhood(words)?;
        let mut table = [0u64; MAX_OVERFLOW_TABLE_SLOTS];
        while let Some(link) = walk.next_table() {
            let (table_at, words) = self.read_table(link, &mut table)?;
            if let Some(found) = self.find_among(key, hash.fingerprint, table_at, words)? {
                return Ok(Some(found));
            }
            walk.advance(words)?;
        }
        Ok(None)
    }

    /// The key among the candidates of `words`, read at region offset
    /// `words_at`.
    fn find_among(
        &self,
        key: &[u8],
        fingerprint: u16,
        words_at: u64,
        words: &[u64],
    ) -> Result<Option<Found>, RegionError> {
        for (position, slot) in neighbourhood_slots(words, fingerprint) {
            let slot = slot?;
            let (block, _) = self.layout.block_range(slot)?;
            let mut head = [0u8; BLOCK_HEADER_BYTES];
            self.memory.read_bytes(block, &mut head)?;
            let header = self.layout.decode_block_header(&head)?;
            if header.key_len as usize == key.len()
                && self.key_at(block + BLOCK_HEADER_BYTES as u64, key)?
            {
                return Ok(Some(Found {
                    slot_offset: slot_at(words_at, position),
                    slot,
                    header,
                }));
            }
        }
        Ok(None)
    }

    /// Reads the words of the table `link` names into `buf`: the table's
    /// region offset and its words.
    fn read_table<'b>(
        &self,
        link: OverflowLink,
        buf: &'b mut [u64; MAX_OVERFLOW_TABLE_SLOTS],
    ) -> Result<(u64, &'b [u64]), RegionError> {
        self.live().read_table(link, buf)
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

    /// Where a new key's slot goes: an empty slot of its neighbourhood it
    /// may take (the anchor rule, the bucket with the most room), else the
    /// first empty entry slot of its home chain, else a new table at the
    /// chain's end. Changes nothing; `IndexFull` only when the chain has
    /// reached its bound.
    fn place(&self, hash: KeyHash) -> Result<Place, RegionError> {
        let mut buf = [0u64; MAX_NEIGHBOURHOOD_SLOTS];
        let (start, words) = self.read_neighbourhood(hash, &mut buf)?;
        if let Some(position) = free_neighbourhood_slot(words) {
            return Ok(Place::Slot(slot_at(start, position)));
        }
        // The anchor is a slot the key may take, so it is full: with an
        // entry of this home (which moves into the first table) or the link.
        let anchor = words.get(ANCHOR_SLOT).copied().unwrap_or(0);
        let moved = matches!(SlotWord::decode(anchor)?, SlotWord::Entry(_)).then_some(anchor);
        let extension = Extension {
            link_at: slot_at(start, ANCHOR_SLOT),
            moved,
            units: overflow_table_units(0),
        };
        let walk = ChainWalk::from_neighbourhood(words)?;
        self.place_in_chain(walk, extension)
            .map_err(|error| match error {
                RegionError::IndexFull { slots } => RegionError::IndexFull {
                    // The anchor, a slot the key may take, is the chain's link.
                    slots: slots
                        + (0..words.len())
                            .filter(|&p| p != ANCHOR_SLOT && may_hold_key(p))
                            .count(),
                },
                other => other,
            })
    }

    /// The first empty entry slot along `walk`'s chain, else a new table
    /// after its last (`extension` when the chain has none yet).
    fn place_in_chain(
        &self,
        mut walk: ChainWalk,
        mut extension: Extension,
    ) -> Result<Place, RegionError> {
        let mut table = [0u64; MAX_OVERFLOW_TABLE_SLOTS];
        while let Some(link) = walk.next_table() {
            let (table_at, words) = self.read_table(link, &mut table)?;
            if let Some(position) = free_table_slot(words) {
                return Ok(Place::Slot(slot_at(table_at, position)));
            }
            walk.advance(words)?;
            extension = Extension {
                link_at: slot_at(table_at, words.len().saturating_sub(1)),
                moved: None,
                units: overflow_table_units(walk.tables_read()),
            };
        }
        if walk.tables_read() >= MAX_OVERFLOW_TABLES {
            return Err(RegionError::IndexFull {
                slots: chain_capacity(MAX_OVERFLOW_TABLES),
            });
        }
        Ok(Place::Extend(extension))
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

    /// Calls `f(pair)` for every live pair ([`LiveWalk::for_each`]).
    /// Snapshot builds and region rebuilds walk the region's memory with
    /// [`LiveWalk`] directly, without the writer (and its lock).
    pub fn for_each_live(
        &self,
        f: impl FnMut(BlockRef<'_>) -> Result<(), RegionError>,
    ) -> Result<(), RegionError> {
        self.live().for_each(f)
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
            overflow_tables: self.overflow_tables,
            overflow_bytes: self.overflow_units * UNIT_BYTES,
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

    /// Gives this region the words `from` has published for its owner (the
    /// Raft term, the lease, and its retirement if it is retired), for a
    /// region that succeeds `from` (a rebuild, an install): what was
    /// published into the old one while the new one was being filled is
    /// not lost at the swap.
    pub fn carry_published_words(&self, from: &RegionWriter) -> Result<(), RegionError> {
        for word in [
            dynamic_word::RAFT_TERM,
            dynamic_word::LEADER_LEASE,
            dynamic_word::LEADER_LEASE_BOOTTIME,
        ] {
            let value = from.memory.load_u64(word, Ordering::Acquire)?;
            self.memory.store_u64(word, value, Ordering::Release)?;
        }
        if from
            .memory
            .load_u64(dynamic_word::REGION_STATE, Ordering::Acquire)?
            == RegionState::RETIRED
        {
            self.retire_region()?;
        }
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
