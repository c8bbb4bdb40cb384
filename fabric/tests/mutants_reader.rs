//! Deterministic tests of `RegionReader`, written to kill the mutants
//! cargo-mutants found surviving in `fabric/src/reader.rs` (see mutants.md).
//! The fabric crate has no region writer, so each test lays out its region
//! by hand with the `rdkv_proto::region` encoders; races (a slot that moves
//! between two reads, a slow copy) are staged with a fabric whose reads run
//! a hook and a clock that advances by a fixed step per reading.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rdkv_fabric::{
    Clock, Fabric, FabricError, GotInto, IndexCache, MappedFabric, ReadError, ReadProblem,
    ReadStats, ReadTime, ReaderOptions, RegionDescriptor, RegionMemory, RegionReader, RemoteRegion,
};
use rdkv_proto::region::{
    ANCHOR_SLOT, BlockError, HashSeed, LayoutParams, MAX_OVERFLOW_TABLES, NO_DEADLINE,
    OverflowLink, RegionLayout, SLOTS_PER_BUCKET, SizeClass, Slot, SlotError, dynamic_word,
    encode_block,
};
use rdkv_proto::wire::Versioned;

const REGION_BYTES: u64 = 1 << 16;
const GRACE_US: u64 = 1000;
const MAX_KEY_BYTES: u32 = 16;

fn layout_with(epoch: u64, region_bytes: u64) -> RegionLayout {
    layout_of(epoch, region_bytes, 2)
}

fn layout_of(epoch: u64, region_bytes: u64, neighbourhood_buckets: u64) -> RegionLayout {
    RegionLayout::plan(LayoutParams {
        region_bytes,
        bucket_count: 16,
        neighbourhood_buckets,
        region_epoch: epoch,
        node_id: 1,
        hash_seed: HashSeed(5, 6),
        max_key_bytes: MAX_KEY_BYTES,
        max_value_bytes: 512,
        grace_period_us: GRACE_US,
    })
    .expect("a valid geometry")
}

/// A clock that moves `step_us` every time it is read (0: stands still).
#[derive(Debug, Default)]
struct SteppingClock {
    now_us: AtomicU64,
    step_us: AtomicU64,
}

impl SteppingClock {
    fn stepping(step_us: u64) -> Arc<SteppingClock> {
        let clock = SteppingClock::default();
        clock.step_us.store(step_us, Ordering::SeqCst);
        Arc::new(clock)
    }
}

impl Clock for SteppingClock {
    fn now_us(&self) -> u64 {
        let step = self.step_us.load(Ordering::SeqCst);
        self.now_us.fetch_add(step, Ordering::SeqCst)
    }
}

type Hook = Box<dyn Fn(u64) + Send + Sync>;

/// What a hooked region was asked, in order: a range prefetched or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Prefetch { offset: u64, len: u64 },
    Read { offset: u64, len: u64 },
}

/// A mapped region whose reads count themselves and run a hook (with the
/// read's offset) after copying: a writer "between two reads".
struct HookedFabric {
    inner: MappedFabric,
    reads: Arc<AtomicUsize>,
    hook: Arc<Mutex<Option<Hook>>>,
    accesses: Arc<Mutex<Vec<Access>>>,
    /// Its regions say they are on another host (as RDMA ones do).
    elsewhere: bool,
}

struct HookedRegion {
    inner: Arc<dyn RemoteRegion>,
    reads: Arc<AtomicUsize>,
    hook: Arc<Mutex<Option<Hook>>>,
    accesses: Arc<Mutex<Vec<Access>>>,
    elsewhere: bool,
}

impl std::fmt::Debug for HookedFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedFabric").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for HookedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedRegion").finish_non_exhaustive()
    }
}

impl Fabric for HookedFabric {
    fn open(&self, remote: &RegionDescriptor) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        Ok(Arc::new(HookedRegion {
            inner: self.inner.open(remote)?,
            reads: Arc::clone(&self.reads),
            hook: Arc::clone(&self.hook),
            accesses: Arc::clone(&self.accesses),
            elsewhere: self.elsewhere,
        }))
    }
}

impl RemoteRegion for HookedRegion {
    fn descriptor(&self) -> RegionDescriptor {
        self.inner.descriptor()
    }

    fn on_this_host(&self) -> bool {
        !self.elsewhere && self.inner.on_this_host()
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.inner.read(offset, buf)?;
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.log(Access::Read {
            offset,
            len: buf.len() as u64,
        });
        if let Some(hook) = self.hook.lock().expect("hook lock").as_ref() {
            hook(offset);
        }
        Ok(())
    }

    fn prefetch(&self, offset: u64, len_bytes: u64) {
        self.log(Access::Prefetch {
            offset,
            len: len_bytes,
        });
    }
}

impl HookedRegion {
    fn log(&self, access: Access) {
        self.accesses.lock().expect("access log").push(access);
    }
}

/// A region laid out by hand: header, slots and blocks.
struct Region {
    memory: Arc<RegionMemory>,
    layout: RegionLayout,
    next_unit: u64,
}

impl Region {
    fn new() -> Region {
        Region::sized(REGION_BYTES as usize, layout_with(1, REGION_BYTES))
    }

    /// A region holding `KEY` = `one` at version 1, and that block's slot.
    fn with_key() -> (Region, Slot) {
        let mut region = Region::new();
        let slot = region.put(KEY, b"one", 1);
        (region, slot)
    }

    /// [`Region::with_key`] plus `OTHER` = `two` at version 2.
    fn with_two_keys() -> (Region, Slot) {
        let (mut region, slot) = Region::with_key();
        region.put(OTHER, b"two", 2);
        (region, slot)
    }

    fn sized(memory_bytes: usize, layout: RegionLayout) -> Region {
        let memory = Arc::new(RegionMemory::anonymous(memory_bytes).expect("mapping"));
        memory
            .write_bytes(0, &layout.encode_static())
            .expect("header");
        Region {
            memory,
            layout,
            next_unit: 0,
        }
    }

    /// Writes a block of `key` at the next free units; returns its slot.
    fn block(&mut self, fingerprint: u16, key: &[u8], value: &[u8], version: u64) -> Slot {
        let mut bytes = Vec::new();
        encode_block(key, value, version, NO_DEADLINE, &mut bytes);
        let class = SizeClass::for_bytes(bytes.len() as u64).expect("class");
        let offset_units = self.next_unit;
        self.next_unit += u64::from(class.units());
        self.memory
            .write_bytes(self.layout.data_offset + offset_units * 64, &bytes)
            .expect("block");
        Slot::new(fingerprint, class, offset_units)
    }

    fn fingerprint(&self, key: &[u8]) -> u16 {
        self.layout.key_hash(key).fingerprint
    }

    /// Slots in a neighbourhood.
    fn slots(&self) -> u64 {
        self.layout.neighbourhood_buckets * SLOTS_PER_BUCKET as u64
    }

    /// Region offset of the `index`th slot of `key`'s neighbourhood.
    fn slot_offset(&self, key: &[u8], index: u64) -> u64 {
        self.layout.neighbourhood_range(self.layout.key_hash(key)).0 + index * 8
    }

    fn publish(&self, key: &[u8], index: u64, raw: u64) {
        self.memory
            .store_u64(self.slot_offset(key, index), raw, Ordering::Release)
            .expect("slot");
    }

    /// A block of `key` published in the first empty slot of its
    /// neighbourhood (keys may share buckets).
    fn put(&mut self, key: &[u8], value: &[u8], version: u64) -> Slot {
        let index = (0..self.slots())
            .find(|&i| {
                let word = self
                    .memory
                    .load_u64(self.slot_offset(key, i), Ordering::Acquire);
                word.expect("slot word") == 0
            })
            .expect("a free slot in the neighbourhood");
        self.put_at(key, index, value, version)
    }

    /// A block of `key` published in slot `index` of its neighbourhood.
    fn put_at(&mut self, key: &[u8], index: u64, value: &[u8], version: u64) -> Slot {
        let slot = self.block(self.fingerprint(key), key, value, version);
        self.publish(key, index, slot.encode());
        slot
    }

    /// A fingerprint collision: a block of `OTHER` published in slot
    /// `index` of `KEY`'s neighbourhood under `KEY`'s fingerprint.
    fn collide(&mut self, index: u64) -> Slot {
        let foreign = self.block(self.fingerprint(KEY), OTHER, b"foreign", 4);
        self.publish(KEY, index, foreign.encode());
        foreign
    }

    /// Where `slot` sits in `key`'s neighbourhood.
    fn index_of(&self, key: &[u8], slot: Slot) -> u64 {
        (0..self.slots())
            .find(|&i| {
                let word = self
                    .memory
                    .load_u64(self.slot_offset(key, i), Ordering::Acquire);
                word.expect("slot word") == slot.encode()
            })
            .expect("published")
    }

    /// A zeroed overflow table of `units` at the next free units, not yet
    /// linked from anywhere.
    fn table(&mut self, units: u64) -> OverflowLink {
        let link = OverflowLink::new(units, self.next_unit);
        self.next_unit += units;
        let (at, len) = self.layout.table_range(link).expect("in range");
        self.memory
            .write_bytes(at, &vec![0u8; len as usize])
            .expect("table");
        link
    }

    /// Region offset of slot `index` of the table `link` names.
    fn table_slot(&self, link: OverflowLink, index: u64) -> u64 {
        self.layout.table_range(link).expect("in range").0 + index * 8
    }

    fn publish_in_table(&self, link: OverflowLink, index: u64, raw: u64) {
        self.memory
            .store_u64(self.table_slot(link, index), raw, Ordering::Release)
            .expect("table slot");
    }

    /// `KEY`'s home anchor linked to a new table of one unit.
    fn anchored_table(&mut self) -> OverflowLink {
        let link = self.table(1);
        self.publish(KEY, ANCHOR_SLOT as u64, link.encode());
        link
    }

    fn block_offset(&self, slot: Slot) -> u64 {
        self.layout.block_range(slot).expect("in range").0
    }

    fn reader(&self, options: ReaderOptions) -> RegionReader {
        RegionReader::attach(
            Arc::clone(&self.memory),
            SteppingClock::stepping(0),
            options,
        )
        .expect("attach")
    }

    fn default_reader(&self) -> RegionReader {
        self.reader(ReaderOptions::for_layout(&self.layout))
    }

    /// A hooked reader with the layout's default options and a clock that
    /// stands still.
    fn default_hooked_reader(&self) -> HookedReader {
        self.hooked_reader(
            SteppingClock::stepping(0),
            ReaderOptions::for_layout(&self.layout),
        )
    }

    fn hooked_reader(&self, clock: Arc<dyn Clock>, options: ReaderOptions) -> HookedReader {
        self.reader_through(clock, options, false)
    }

    /// A reader whose region says it is on another host.
    fn remote_reader(&self) -> HookedReader {
        self.reader_through(SteppingClock::stepping(0), reader_options(1, None), true)
    }

    fn reader_through(
        &self,
        clock: Arc<dyn Clock>,
        options: ReaderOptions,
        elsewhere: bool,
    ) -> HookedReader {
        let fabric = Arc::new(HookedFabric {
            inner: MappedFabric::new(),
            reads: Arc::default(),
            hook: Arc::default(),
            accesses: Arc::default(),
            elsewhere,
        });
        let remote = fabric.inner.register(Arc::clone(&self.memory), 1, 0);
        let reader = RegionReader::over(
            Arc::clone(&fabric) as Arc<dyn Fabric>,
            remote,
            clock,
            options,
        )
        .expect("reader");
        // Count the reads of GETs only, not the header read of attaching.
        fabric.reads.store(0, Ordering::SeqCst);
        HookedReader { reader, fabric }
    }
}

struct HookedReader {
    reader: RegionReader,
    fabric: Arc<HookedFabric>,
}

impl HookedReader {
    fn reads(&self) -> usize {
        self.fabric.reads.load(Ordering::SeqCst)
    }

    /// What the region was asked since the reader attached, and forgets it.
    fn take_accesses(&self) -> Vec<Access> {
        std::mem::take(&mut *self.fabric.accesses.lock().expect("access log"))
    }

    fn set_hook(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        *self.fabric.hook.lock().expect("hook lock") = Some(Box::new(hook));
    }

    /// Once `copied`'s block has been read, stores `new` into the slot word
    /// at `slot_at`: the writer moving a key while a reader copies a block.
    fn move_slot_after_copy(&self, region: &Region, copied: Slot, slot_at: u64, new: Slot) {
        let copied_at = region.block_offset(copied);
        let memory = Arc::clone(&region.memory);
        self.set_hook(move |offset| {
            if offset == copied_at {
                memory
                    .store_u64(slot_at, new.encode(), Ordering::Release)
                    .expect("slot");
            }
        });
    }
}

fn versioned(value: &[u8], version: u64) -> Option<Versioned> {
    Some(Versioned {
        value: Bytes::copy_from_slice(value),
        version,
    })
}

/// `max_attempts` attempts per read, each given up after `abandon_after_us`
/// (`None`: never).
fn reader_options(max_attempts: u32, abandon_after_us: Option<u64>) -> ReaderOptions {
    ReaderOptions {
        max_attempts,
        abandon_after_us,
        expiry_margin_ms: 0,
    }
}

/// `KEY`, read through `cache`.
fn cached(reader: &RegionReader, cache: &IndexCache) -> Option<Versioned> {
    reader.get_cached(KEY, cache).expect("get")
}

/// `KEY` read through the batched path.
fn many_of_key(reader: &RegionReader) -> Vec<Option<Versioned>> {
    reader
        .get_many(&[Bytes::from_static(KEY)])
        .expect("get_many")
}

/// Reads `KEY` and then `OTHER` through `cache`.
fn cache_both(reader: &RegionReader, cache: &IndexCache) {
    for key in [KEY, OTHER] {
        reader.get_cached(key, cache).expect("get");
    }
}

fn stats(reads: u64, hits: u64, misses: u64) -> ReadStats {
    ReadStats {
        reads,
        hits,
        misses,
        ..ReadStats::default()
    }
}

const KEY: &[u8] = b"alpha";
const OTHER: &[u8] = b"bravo";

/// A valid fingerprint other than `fingerprint`.
fn other_fingerprint(fingerprint: u16) -> u16 {
    if fingerprint == 1 { 2 } else { 1 }
}

#[test]
fn a_published_key_is_read_whole_and_an_absent_one_is_a_miss() {
    let mut region = Region::new();
    region.put(KEY, b"value-1", 3);
    let reader = region.default_reader();
    assert_eq!(reader.get(KEY).expect("get"), versioned(b"value-1", 3));
    assert_eq!(reader.get(OTHER).expect("get"), None);
    assert_eq!(reader.stats(), stats(2, 1, 1));
}

#[test]
fn a_key_of_exactly_the_maximum_length_is_found_and_a_longer_one_is_absent() {
    let mut region = Region::new();
    let longest = [b'k'; MAX_KEY_BYTES as usize];
    region.put(&longest, b"v", 2);
    let reader = region.default_reader();
    assert_eq!(reader.get(&longest).expect("get"), versioned(b"v", 2));
    let too_long = [b'k'; MAX_KEY_BYTES as usize + 1];
    assert_eq!(reader.get(&too_long).expect("get"), None);
    let many = reader
        .get_many(&[
            Bytes::copy_from_slice(&longest),
            Bytes::copy_from_slice(&too_long),
        ])
        .expect("get_many");
    assert_eq!(many, vec![versioned(b"v", 2), None]);
}

#[test]
fn a_fingerprint_collision_is_skipped_when_its_slot_did_not_change() {
    let mut region = Region::new();
    // Slot 0: another key's block under KEY's fingerprint; slot 1: KEY.
    region.collide(0);
    region.put_at(KEY, 1, b"mine", 5);
    let hooked = region.default_hooked_reader();
    assert_eq!(hooked.reader.get(KEY).expect("get"), versioned(b"mine", 5));
    // Neighbourhood, foreign block, the foreign slot again, KEY's block.
    assert_eq!(hooked.reads(), 4);
    assert_eq!(hooked.reader.stats(), stats(1, 1, 0));
    // The batched path sees two candidates and reads the key on its own.
    let many = many_of_key(&hooked.reader);
    assert_eq!(many, vec![versioned(b"mine", 5)]);
}

#[test]
fn a_slot_that_moved_while_its_block_was_read_is_read_again() {
    let mut region = Region::new();
    let foreign = region.collide(0);
    let mine = region.block(region.fingerprint(KEY), KEY, b"mine", 5);
    let hooked = region.default_hooked_reader();
    // Once the foreign block has been copied, the writer puts KEY in slot 0.
    hooked.move_slot_after_copy(&region, foreign, region.slot_offset(KEY, 0), mine);
    assert_eq!(hooked.reader.get(KEY).expect("get"), versioned(b"mine", 5));
    let seen = hooked.reader.stats();
    assert_eq!((seen.retries_moved, seen.hits, seen.retries()), (1, 1, 1));
}

#[test]
fn a_corrupt_candidate_slot_is_retried_until_the_budget_is_spent() {
    let mut region = Region::new();
    let slot = region.put(KEY, b"v", 1);
    let corrupt = slot.encode() ^ (1 << 60);
    region.publish(KEY, 0, corrupt);
    let options = reader_options(3, None);
    let reader = region.reader(options);
    match reader.get(KEY) {
        Err(ReadError::Exhausted { attempts, last }) => {
            assert_eq!(attempts, 3);
            assert_eq!(last, ReadProblem::Slot(SlotError::Check { raw: corrupt }));
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
    let seen = reader.stats();
    assert_eq!((seen.retries_slot, seen.exhausted, seen.reads), (3, 1, 1));
    assert_eq!(seen.retries(), 3);
}

#[test]
fn a_corrupt_slot_of_another_fingerprint_turns_a_miss_into_an_error() {
    let mut region = Region::new();
    let slot = region.block(other_fingerprint(region.fingerprint(KEY)), OTHER, b"v", 1);
    region.publish(KEY, 0, slot.encode() ^ (1 << 3));
    let reader = region.reader(reader_options(2, None));
    assert!(matches!(
        reader.get(KEY),
        Err(ReadError::Exhausted {
            attempts: 2,
            last: ReadProblem::Slot(SlotError::Check { .. })
        })
    ));
    let many = reader.get_many(&[Bytes::from_static(KEY)]);
    assert!(matches!(many, Err(ReadError::Exhausted { .. })));
}

#[test]
fn a_slot_beyond_the_region_limits_is_a_slot_problem() {
    let region = Region::new();
    let fingerprint = region.fingerprint(KEY);
    let max = region.layout.max_class().expect("max class");
    let too_big = SizeClass::from_index(max.index() + 1).expect("a larger class");
    region.publish(KEY, 0, Slot::new(fingerprint, too_big, 0).encode());
    let reader = region.reader(reader_options(1, None));
    assert!(matches!(
        reader.get(KEY),
        Err(ReadError::Exhausted {
            last: ReadProblem::Slot(SlotError::SizeClass { .. }),
            ..
        })
    ));
    assert_eq!(reader.stats().retries_slot, 1);
}

#[test]
fn an_invalidated_block_and_a_torn_block_are_counted_apart() {
    let mut region = Region::new();
    let slot = region.put(KEY, b"value", 7);
    let block_at = region.block_offset(slot);
    // The writer's invalidation: the word holding value length and magic.
    region
        .memory
        .store_u64(
            block_at + rdkv_proto::region::INVALIDATION_WORD_OFFSET,
            rdkv_proto::region::INVALIDATED_WORD,
            Ordering::Release,
        )
        .expect("invalidate");
    let options = reader_options(2, None);
    let reader = region.reader(options);
    assert!(matches!(
        reader.get(KEY),
        Err(ReadError::Exhausted {
            last: ReadProblem::Block(BlockError::Invalidated),
            ..
        })
    ));
    assert_eq!(reader.stats().retries_invalidated, 2);
    assert_eq!(reader.stats().retries_block, 0);

    let torn_slot = region.put(OTHER, b"value", 8);
    let torn_at = region.block_offset(torn_slot);
    region
        .memory
        .inject_bit_flip(torn_at + 30, 1)
        .expect("flip");
    let reader = region.reader(options);
    assert!(matches!(
        reader.get(OTHER),
        Err(ReadError::Exhausted {
            last: ReadProblem::Block(BlockError::Checksum { .. }),
            ..
        })
    ));
    assert_eq!(reader.stats().retries_block, 2);
    assert_eq!(reader.stats().retries_invalidated, 0);
}

#[test]
fn an_attempt_is_abandoned_only_when_it_takes_longer_than_the_bound() {
    let mut region = Region::new();
    region.put(KEY, b"v", 1);
    // Each attempt reads the clock twice: the elapsed time is one step.
    let on_time = region.hooked_reader(SteppingClock::stepping(100), reader_options(2, Some(100)));
    assert_eq!(on_time.reader.get(KEY).expect("get"), versioned(b"v", 1));
    assert_eq!(on_time.reader.stats().retries_slow, 0);
    let late = region.hooked_reader(SteppingClock::stepping(101), reader_options(2, Some(100)));
    assert!(matches!(
        late.reader.get(KEY),
        Err(ReadError::Exhausted {
            last: ReadProblem::Slow { elapsed_us: 101 },
            ..
        })
    ));
    assert_eq!(late.reader.stats().retries_slow, 2);
    // Without a bound, no attempt is ever slow.
    let unbounded =
        region.hooked_reader(SteppingClock::stepping(1_000_000), reader_options(1, None));
    assert_eq!(unbounded.reader.get(KEY).expect("get"), versioned(b"v", 1));
}

#[test]
fn the_abandon_bound_may_be_half_the_grace_period_but_not_more() {
    let region = Region::new();
    let defaults = ReaderOptions::for_layout(&region.layout);
    assert_eq!(defaults.max_attempts, ReaderOptions::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(defaults.abandon_after_us, Some(GRACE_US / 2));
    let clock = || SteppingClock::stepping(0) as Arc<dyn Clock>;
    let half = reader_options(1, Some(GRACE_US / 2));
    assert!(RegionReader::attach(Arc::clone(&region.memory), clock(), half).is_ok());
    let over = ReaderOptions {
        abandon_after_us: Some(GRACE_US / 2 + 1),
        ..half
    };
    assert!(matches!(
        RegionReader::attach(Arc::clone(&region.memory), clock(), over),
        Err(ReadError::AbandonBound {
            abandon_after_us: 501,
            grace_period_us: GRACE_US
        })
    ));
}

#[test]
fn a_mapping_shorter_than_its_header_says_is_refused() {
    let clock = || SteppingClock::stepping(0) as Arc<dyn Clock>;
    let options = reader_options(1, None);
    let short = Region::sized(1 << 15, layout_with(1, (1 << 15) + 4096));
    assert!(matches!(
        RegionReader::attach(Arc::clone(&short.memory), clock(), options),
        Err(ReadError::ShortMapping {
            len_bytes: 32768,
            region_bytes: 36864
        })
    ));
    let exact = Region::sized(1 << 15, layout_with(1, 1 << 15));
    let reader = RegionReader::attach(Arc::clone(&exact.memory), clock(), options).expect("exact");
    assert_eq!(reader.layout(), &exact.layout);
}

#[test]
fn header_words_are_read_and_a_rebuilt_region_is_noticed() {
    let region = Region::new();
    region
        .memory
        .store_u64(dynamic_word::APPLIED_INDEX, 12, Ordering::Release)
        .expect("store");
    region
        .memory
        .store_u64(dynamic_word::RAFT_TERM, 4, Ordering::Release)
        .expect("store");
    let reader = region.default_reader();
    let dynamic = reader.dynamic_header().expect("dynamic");
    assert_eq!((dynamic.applied_index, dynamic.raft_term), (12, 4));
    assert_eq!(reader.applied_index().expect("applied"), 12);
    // A mapping is on this host: its lease is judged on the boottime clock;
    // a reader says so of its region, whatever the transport says.
    assert!(reader.on_this_host());
    assert!(!region.remote_reader().reader.on_this_host());
    assert_eq!(reader.check_header().expect("same header"), dynamic);
    region
        .memory
        .write_bytes(0, &layout_with(2, REGION_BYTES).encode_static())
        .expect("new header");
    assert!(matches!(
        reader.check_header(),
        Err(ReadError::EpochChanged {
            attached: 1,
            found: 2
        })
    ));
}

#[test]
fn get_many_answers_like_get_in_two_batched_rounds() {
    let (region, _) = Region::with_two_keys();
    let hooked = region.default_hooked_reader();
    let keys = [
        Bytes::from_static(KEY),
        Bytes::from_static(b"absent"),
        Bytes::from_static(OTHER),
    ];
    let many = hooked.reader.get_many(&keys).expect("get_many");
    assert_eq!(many, vec![versioned(b"one", 1), None, versioned(b"two", 2)]);
    // Three neighbourhoods, then two blocks: no key needed a read on its own.
    assert_eq!(hooked.reads(), 5);
    assert_eq!(hooked.reader.stats(), stats(3, 2, 1));
    assert_eq!(hooked.reader.get_many(&[]).expect("empty"), Vec::new());
}

#[test]
fn get_many_reads_a_key_again_on_its_own_when_its_block_does_not_match() {
    let (region, slot) = Region::with_key();
    let hooked = region.default_hooked_reader();
    let many = many_of_key(&hooked.reader);
    assert_eq!(many, vec![versioned(b"one", 1)]);
    // One neighbourhood, one block.
    assert_eq!(hooked.reads(), 2);

    // A block that does not validate in round two is read again alone.
    let block_at = region.block_offset(slot);
    region
        .memory
        .inject_bit_flip(block_at + 26, 1)
        .expect("flip");
    let reader = region.reader(reader_options(1, None));
    assert!(matches!(
        reader.get_many(&[Bytes::from_static(KEY)]),
        Err(ReadError::Exhausted { .. })
    ));
    assert_eq!(reader.stats().retries_block, 1);
}

#[test]
fn get_many_that_took_too_long_reads_every_key_again() {
    let (region, _) = Region::with_key();
    let keys = [Bytes::from_static(KEY), Bytes::from_static(b"absent")];
    // get_many reads the clock twice (one step); each get attempt twice.
    let on_time = region.hooked_reader(SteppingClock::stepping(100), reader_options(1, Some(100)));
    assert_eq!(
        on_time.reader.get_many(&keys).expect("get_many"),
        vec![versioned(b"one", 1), None]
    );
    assert_eq!(on_time.reads(), 3);
    // One step over the bound: nothing from the batched rounds is trusted.
    let late = region.hooked_reader(SteppingClock::stepping(101), reader_options(1, Some(100)));
    let absent = [Bytes::from_static(b"absent")];
    assert_eq!(late.reader.get_many(&absent).expect("get_many"), vec![None]);
    // The batched neighbourhood, then the key alone.
    assert_eq!(late.reads(), 2);
    // KEY's lone attempt is slow too: the reader gives up.
    assert!(matches!(
        late.reader.get_many(&keys),
        Err(ReadError::Exhausted {
            last: ReadProblem::Slow { .. },
            ..
        })
    ));
}

#[test]
fn a_cached_location_costs_one_read_while_the_block_is_current() {
    let (region, _) = Region::with_key();
    let cache = IndexCache::new(16);
    let hooked = region.default_hooked_reader();
    assert!(cache.is_empty());
    assert_eq!(cached(&hooked.reader, &cache), versioned(b"one", 1));
    assert_eq!(cache.len(), 1);
    assert_eq!(hooked.reads(), 2);
    assert_eq!(cached(&hooked.reader, &cache), versioned(b"one", 1));
    assert_eq!(hooked.reads(), 3);
    let seen = hooked.reader.stats();
    assert_eq!((seen.cache_hits, seen.cache_misses, seen.hits), (1, 1, 2));
    // Absent keys are not cached.
    assert_eq!(hooked.reader.get_cached(OTHER, &cache).expect("get"), None);
    assert_eq!(cache.len(), 1);
}

#[test]
fn a_replaced_block_sends_the_cached_read_back_to_the_slot() {
    let (mut region, old) = Region::with_key();
    let cache = IndexCache::new(16);
    let reader = region.default_reader();
    assert_eq!(cached(&reader, &cache), versioned(b"one", 1));
    // The writer invalidates the old block and publishes a new one.
    region
        .memory
        .store_u64(region.block_offset(old) + 8, 0, Ordering::Release)
        .expect("invalidate");
    region.put_at(KEY, region.index_of(KEY, old), b"two", 2);
    assert_eq!(cached(&reader, &cache), versioned(b"two", 2));
    assert_eq!(cached(&reader, &cache), versioned(b"two", 2));
    let seen = reader.stats();
    assert_eq!((seen.cache_hits, seen.cache_misses), (1, 2));
}

#[test]
fn a_cached_block_of_another_version_is_not_trusted() {
    let (region, slot) = Region::with_key();
    let cache = IndexCache::new(16);
    let reader = region.default_reader();
    reader.get_cached(KEY, &cache).expect("get");
    // Same place, same key, newer version (a writer never does this; the
    // version check is what would catch a reused location).
    let mut bytes = Vec::new();
    encode_block(KEY, b"uno", 9, NO_DEADLINE, &mut bytes);
    region
        .memory
        .write_bytes(region.block_offset(slot), &bytes)
        .expect("rewrite");
    assert_eq!(cached(&reader, &cache), versioned(b"uno", 9));
    assert_eq!(reader.stats().cache_hits, 0);
}

#[test]
fn a_slow_cached_read_falls_back_to_the_slot() {
    let (region, _) = Region::with_key();
    let cache = IndexCache::new(16);
    let fast = region.hooked_reader(SteppingClock::stepping(0), reader_options(1, Some(100)));
    fast.reader.get_cached(KEY, &cache).expect("fill the cache");
    let slow = region.hooked_reader(SteppingClock::stepping(101), reader_options(1, Some(400)));
    // A cached read that takes exactly the bound is still on time.
    let at_bound = region.hooked_reader(SteppingClock::stepping(100), reader_options(1, Some(100)));
    assert_eq!(cached(&at_bound.reader, &cache), versioned(b"one", 1));
    assert_eq!(at_bound.reader.stats().cache_hits, 1);
    // The cached read takes 101 µs (not over 400): a cache hit.
    assert_eq!(cached(&slow.reader, &cache), versioned(b"one", 1));
    assert_eq!(slow.reader.stats().cache_hits, 1);
    let slower = region.hooked_reader(SteppingClock::stepping(101), reader_options(1, Some(100)));
    // Over the bound: the cached read is dropped and the slot read (also
    // slow) gives up: the cached block, the neighbourhood, the block.
    assert!(matches!(
        slower.reader.get_cached(KEY, &cache),
        Err(ReadError::Exhausted { .. })
    ));
    assert_eq!(slower.reader.stats().cache_hits, 0);
    assert_eq!(slower.reads(), 3);
}

#[test]
fn the_index_cache_is_bounded_and_keyed_by_epoch() {
    let (region, _) = Region::with_two_keys();
    let reader = region.default_reader();
    let one = IndexCache::new(1);
    cache_both(&reader, &one);
    assert_eq!(one.len(), 1);
    let none = IndexCache::new(0);
    reader.get_cached(KEY, &none).expect("get");
    assert!(none.is_empty());

    // A cache filled under epoch 1 is not used for the rebuilt region.
    let cache = IndexCache::new(16);
    reader.get_cached(KEY, &cache).expect("get");
    let mut rebuilt = Region::sized(REGION_BYTES as usize, layout_with(2, REGION_BYTES));
    rebuilt.put(KEY, b"new", 3);
    let new_reader = rebuilt.default_reader();
    assert_eq!(cached(&new_reader, &cache), versioned(b"new", 3));
    assert_eq!(new_reader.stats().cache_hits, 0);
}

#[test]
fn keys_fill_whole_neighbourhoods() {
    // Sixteen keys in the neighbourhood slots of KEY (slot 0 ..= 15).
    let mut region = Region::new();
    let fingerprint = region.fingerprint(KEY);
    for index in 0..(2 * SLOTS_PER_BUCKET as u64 - 1) {
        let other = region.block(other_fingerprint(fingerprint), OTHER, b"x", 1);
        region.publish(KEY, index, other.encode());
    }
    region.put_at(KEY, 2 * SLOTS_PER_BUCKET as u64 - 1, b"last", 6);
    let reader = region.default_reader();
    assert_eq!(reader.get(KEY).expect("get"), versioned(b"last", 6));
}

#[test]
fn the_widest_neighbourhood_is_read_to_its_last_slot() {
    // Eight buckets of eight slots: the reader's slot buffers must hold 64.
    let mut region = Region::sized(REGION_BYTES as usize, layout_of(1, REGION_BYTES, 8));
    let last = region.slots() - 1;
    assert_eq!(last, 63);
    region.put_at(KEY, last, b"far", 4);
    let reader = region.default_reader();
    assert_eq!(reader.get(KEY).expect("get"), versioned(b"far", 4));
    let many = many_of_key(&reader);
    assert_eq!(many, vec![versioned(b"far", 4)]);
}

#[test]
fn get_many_reads_the_whole_neighbourhood() {
    // A key in the second bucket of its neighbourhood (slot 9 of 16).
    let mut region = Region::new();
    region.put_at(KEY, 9, b"second bucket", 2);
    let reader = region.default_reader();
    let many = many_of_key(&reader);
    assert_eq!(many, vec![versioned(b"second bucket", 2)]);
    assert_eq!(reader.stats(), stats(1, 1, 0));
}

#[test]
fn the_index_cache_holds_distinct_keys_and_forgets_a_deleted_one() {
    let (region, slot) = Region::with_two_keys();
    let reader = region.default_reader();
    let cache = IndexCache::new(16);
    cache_both(&reader, &cache);
    assert_eq!(cache.len(), 2);
    assert!(!cache.is_empty());
    // The writer deletes KEY: invalidates its block, clears its slot.
    region
        .memory
        .store_u64(region.block_offset(slot) + 8, 0, Ordering::Release)
        .expect("invalidate");
    region.publish(KEY, region.index_of(KEY, slot), 0);
    assert_eq!(cached(&reader, &cache), None);
    assert_eq!(cache.len(), 1);
}

#[test]
fn a_collision_past_the_first_slot_rereads_its_own_slot() {
    let mut region = Region::new();
    region.collide(2);
    region.put_at(KEY, 5, b"mine", 5);
    let reader = region.reader(reader_options(2, None));
    assert_eq!(reader.get(KEY).expect("get"), versioned(b"mine", 5));
    assert_eq!(reader.stats().retries_moved, 0);
}

// Overflow chains: a key whose neighbourhood was full lives in a table its
// home anchor links to.

#[test]
fn a_key_in_an_overflow_table_is_found_through_its_home_anchor() {
    let mut region = Region::new();
    let table = region.anchored_table();
    let slot = region.block(region.fingerprint(KEY), KEY, b"overflowed", 6);
    region.publish_in_table(table, 3, slot.encode());
    let hooked = region.default_hooked_reader();
    assert_eq!(
        hooked.reader.get(KEY).expect("get"),
        versioned(b"overflowed", 6)
    );
    // Neighbourhood, table, block.
    assert_eq!(hooked.reads(), 3);
    // The batched path has no candidate but a chain: it reads the key alone.
    assert_eq!(
        many_of_key(&hooked.reader),
        vec![versioned(b"overflowed", 6)]
    );
    let cache = IndexCache::new(4);
    assert_eq!(cached(&hooked.reader, &cache), versioned(b"overflowed", 6));
    assert_eq!(cached(&hooked.reader, &cache), versioned(b"overflowed", 6));
    assert_eq!(hooked.reader.stats().cache_hits, 1);
    // Without the link the key is absent, and the batch says so at once.
    region.publish(KEY, ANCHOR_SLOT as u64, 0);
    assert_eq!(hooked.reader.get(KEY).expect("get"), None);
    assert_eq!(many_of_key(&hooked.reader), vec![None]);
}

#[test]
fn a_chain_is_followed_table_by_table_to_its_end() {
    let mut region = Region::new();
    let first = region.anchored_table();
    let second = region.table(2);
    region.publish_in_table(first, 7, second.encode());
    let slot = region.block(region.fingerprint(KEY), KEY, b"deep", 9);
    region.publish_in_table(second, 14, slot.encode());
    let hooked = region.default_hooked_reader();
    assert_eq!(hooked.reader.get(KEY).expect("get"), versioned(b"deep", 9));
    // Neighbourhood, two tables, block.
    assert_eq!(hooked.reads(), 4);
    assert_eq!(hooked.reader.get(OTHER).expect("get"), None);
}

#[test]
fn only_the_home_anchor_starts_a_chain_and_links_elsewhere_are_corrupt() {
    let mut region = Region::new();
    let table = region.table(1);
    let slot = region.block(region.fingerprint(KEY), KEY, b"v", 2);
    region.publish_in_table(table, 0, slot.encode());
    // The next bucket's anchor is another home's chain: not KEY's.
    region.publish(KEY, (SLOTS_PER_BUCKET + ANCHOR_SLOT) as u64, table.encode());
    let reader = region.reader(reader_options(2, None));
    assert_eq!(reader.get(KEY).expect("get"), None);
    // A link in a slot that is no anchor is refused, not followed.
    region.publish(KEY, 3, table.encode());
    assert!(matches!(
        reader.get(KEY),
        Err(ReadError::Exhausted {
            last: ReadProblem::Slot(SlotError::Misplaced { .. }),
            ..
        })
    ));
}

#[test]
fn a_chain_that_loops_is_refused_after_the_bound() {
    let mut region = Region::new();
    let table = region.anchored_table();
    region.publish_in_table(table, 7, table.encode());
    let hooked = region.hooked_reader(SteppingClock::stepping(0), reader_options(1, None));
    assert!(matches!(
        hooked.reader.get(KEY),
        Err(ReadError::Exhausted {
            last: ReadProblem::Slot(SlotError::ChainTooLong { .. }),
            ..
        })
    ));
    // The neighbourhood and the bound's worth of tables, no more.
    assert_eq!(hooked.reads(), 1 + MAX_OVERFLOW_TABLES);
}

#[test]
fn a_corrupt_table_word_turns_a_miss_into_an_error() {
    let mut region = Region::new();
    let table = region.anchored_table();
    let slot = region.block(other_fingerprint(region.fingerprint(KEY)), OTHER, b"v", 1);
    region.publish_in_table(table, 2, slot.encode() ^ (1 << 3));
    let reader = region.reader(reader_options(2, None));
    assert!(matches!(
        reader.get(KEY),
        Err(ReadError::Exhausted {
            last: ReadProblem::Slot(SlotError::Check { .. }),
            ..
        })
    ));
}

#[test]
fn a_collision_in_a_table_rereads_its_table_slot() {
    let mut region = Region::new();
    let table = region.anchored_table();
    let foreign = region.block(region.fingerprint(KEY), OTHER, b"foreign", 4);
    region.publish_in_table(table, 0, foreign.encode());
    let mine = region.block(region.fingerprint(KEY), KEY, b"mine", 5);
    region.publish_in_table(table, 1, mine.encode());
    let hooked = region.default_hooked_reader();
    assert_eq!(hooked.reader.get(KEY).expect("get"), versioned(b"mine", 5));
    // Neighbourhood, table, foreign block, its table slot again, KEY's block.
    assert_eq!(hooked.reads(), 5);
    assert_eq!(hooked.reader.stats().retries_moved, 0);
}

#[test]
fn a_table_slot_that_moved_while_its_block_was_read_is_read_again() {
    let mut region = Region::new();
    let table = region.anchored_table();
    let foreign = region.block(region.fingerprint(KEY), OTHER, b"foreign", 4);
    region.publish_in_table(table, 0, foreign.encode());
    let mine = region.block(region.fingerprint(KEY), KEY, b"mine", 5);
    let hooked = region.default_hooked_reader();
    // Once the foreign block has been copied, the writer puts KEY in its slot.
    hooked.move_slot_after_copy(&region, foreign, region.table_slot(table, 0), mine);
    assert_eq!(hooked.reader.get(KEY).expect("get"), versioned(b"mine", 5));
    let seen = hooked.reader.stats();
    assert_eq!((seen.retries_moved, seen.hits), (1, 1));
}

/// `get_into` at a fixed time (no abandon bound in the default options).
fn get_into_now(
    reader: &RegionReader,
    key: &[u8],
    buf: &mut [u8],
) -> Result<Option<GotInto>, ReadError> {
    let time = ReadTime {
        monotonic_us: 1,
        unix_ms: 1,
    };
    reader.get_into(key, buf, time, || time).map(|(got, _)| got)
}

#[test]
fn a_buffer_too_small_is_not_counted_as_a_read() {
    let mut region = Region::new();
    region.put(KEY, b"value-1", 3);
    let reader = region.default_reader();
    let mut tiny = [0u8; 2];
    let too_small = get_into_now(&reader, KEY, &mut tiny);
    assert!(
        matches!(
            too_small,
            Err(ReadError::BufferTooSmall { needed: 7, len: 2 })
        ),
        "{too_small:?}"
    );
    let mut buf = [0u8; 16];
    let got = get_into_now(&reader, KEY, &mut buf).expect("get_into");
    assert_eq!(got, Some(GotInto { len: 7, version: 3 }));
    assert_eq!(&buf[..7], b"value-1");
    // One GET answered: the client reports these counts as its reads.
    assert_eq!(reader.stats(), stats(1, 1, 0));
}

/// A GET's clock for `get_into` that notes, at each reading, how many reads
/// the region had served: reading `i` (from 1) reads as `base_us + i *
/// step_us`.
struct NotingClock<'h> {
    hooked: &'h HookedReader,
    base_us: u64,
    step_us: u64,
    /// Reads served when each reading was taken.
    taken: Vec<usize>,
}

impl<'h> NotingClock<'h> {
    fn new(hooked: &'h HookedReader) -> NotingClock<'h> {
        NotingClock::stepping(hooked, 0, 1)
    }

    fn stepping(hooked: &'h HookedReader, base_us: u64, step_us: u64) -> NotingClock<'h> {
        NotingClock {
            hooked,
            base_us,
            step_us,
            taken: Vec::new(),
        }
    }

    fn now(&mut self) -> ReadTime {
        self.taken.push(self.hooked.reads());
        ReadTime {
            monotonic_us: self.base_us + self.taken.len() as u64 * self.step_us,
            unix_ms: 1,
        }
    }

    /// Reads served when the reading that reads as `time` was taken.
    fn reads_at(&self, time: ReadTime) -> usize {
        let index = (time.monotonic_us - self.base_us) / self.step_us;
        self.taken[index as usize - 1]
    }
}

const SINCE_START: ReadTime = ReadTime {
    monotonic_us: 0,
    unix_ms: 1,
};

/// `key` by `get_into` through `hooked`, its clock noted by `clock`.
fn get_into_noted(
    hooked: &HookedReader,
    clock: &mut NotingClock<'_>,
    key: &[u8],
    buf: &mut [u8],
) -> (Option<GotInto>, ReadTime) {
    hooked
        .reader
        .get_into(key, buf, SINCE_START, || clock.now())
        .expect("get_into")
}

#[test]
fn get_into_reads_the_clock_once_after_the_last_copy() {
    let mut region = Region::new();
    region.put(KEY, b"value-1", 3);
    let hooked = region.default_hooked_reader();
    let mut buf = [0u8; 16];
    let mut clock = NotingClock::new(&hooked);
    let (got, time) = get_into_noted(&hooked, &mut clock, KEY, &mut buf);
    assert_eq!(got, Some(GotInto { len: 7, version: 3 }));
    // Neighbourhood, then the block's head and value (one split read).
    assert_eq!(hooked.reads(), 3);
    // One reading, taken after every read, and it is the one returned.
    assert_eq!(clock.taken, vec![3]);
    assert_eq!(clock.reads_at(time), 3);

    // An absent key: one reading, after the neighbourhood read.
    let mut clock = NotingClock::new(&hooked);
    let (got, time) = get_into_noted(&hooked, &mut clock, OTHER, &mut buf);
    assert_eq!(got, None);
    assert_eq!(clock.taken, vec![4]);
    assert_eq!(clock.reads_at(time), 4);
}

#[test]
fn after_a_collision_get_into_answers_with_a_reading_after_the_last_copy() {
    let mut region = Region::new();
    // Slot 0: another key's block under KEY's fingerprint; slot 1: KEY.
    region.collide(0);
    region.put_at(KEY, 1, b"mine", 5);
    let hooked = region.default_hooked_reader();
    let mut buf = [0u8; 16];
    let mut clock = NotingClock::new(&hooked);
    let (got, time) = get_into_noted(&hooked, &mut clock, KEY, &mut buf);
    assert_eq!(got, Some(GotInto { len: 4, version: 5 }));
    assert_eq!(&buf[..4], b"mine");
    // Neighbourhood, the foreign block (split), its slot again, KEY's block
    // (split): the answer's reading is after all of them.
    assert_eq!(hooked.reads(), 6);
    assert_eq!(clock.reads_at(time), 6);
    assert_eq!(clock.taken.last(), Some(&6));

    // A foreign value longer than the buffer: its split read leaves it
    // unread and its block is read whole (a copy more) before KEY's.
    let mut short = [0u8; 4];
    let mut clock = NotingClock::new(&hooked);
    let (got, time) = get_into_noted(&hooked, &mut clock, KEY, &mut short);
    assert_eq!(got, Some(GotInto { len: 4, version: 5 }));
    assert_eq!(hooked.reads(), 6 + 7);
    assert_eq!(clock.reads_at(time), 6 + 7);
}

#[test]
fn a_block_read_whole_answers_with_a_reading_after_its_copy() {
    // A key longer than the split read's head buffer: its block is read
    // whole.
    let layout = RegionLayout::plan(LayoutParams {
        region_bytes: REGION_BYTES,
        bucket_count: 16,
        neighbourhood_buckets: 2,
        region_epoch: 1,
        node_id: 1,
        hash_seed: HashSeed(5, 6),
        max_key_bytes: 2048,
        max_value_bytes: 512,
        grace_period_us: GRACE_US,
    })
    .expect("a valid geometry");
    let mut region = Region::sized(REGION_BYTES as usize, layout);
    let long_key = vec![b'k'; 1500];
    region.put(&long_key, b"long", 2);
    let hooked = region.default_hooked_reader();
    let mut buf = [0u8; 16];
    let mut clock = NotingClock::new(&hooked);
    let (got, time) = get_into_noted(&hooked, &mut clock, &long_key, &mut buf);
    assert_eq!(got, Some(GotInto { len: 4, version: 2 }));
    assert_eq!(&buf[..4], b"long");
    // Neighbourhood, the whole block.
    assert_eq!(hooked.reads(), 2);
    assert_eq!(clock.taken, vec![2]);
    assert_eq!(clock.reads_at(time), 2);
}

#[test]
fn a_slow_get_into_answers_with_the_reading_after_its_last_attempt() {
    let mut region = Region::new();
    region.put(KEY, b"v", 1);
    let hooked = region.hooked_reader(SteppingClock::stepping(0), reader_options(3, Some(100)));
    let mut buf = [0u8; 16];
    // First reading 1000 µs after `since`: slow, tried again; the second,
    // 50 µs after the first, answers.
    let mut clock = NotingClock::stepping(&hooked, 950, 50);
    let (got, time) = get_into_noted(&hooked, &mut clock, KEY, &mut buf);
    assert_eq!(got, Some(GotInto { len: 1, version: 1 }));
    assert_eq!(hooked.reader.stats().retries_slow, 1);
    // One reading per attempt, each after that attempt's reads.
    assert_eq!(clock.taken, vec![3, 6]);
    assert_eq!(time.monotonic_us, 1050);
    assert_eq!(clock.reads_at(time), 6);
}

#[test]
fn get_many_into_answers_with_a_reading_after_its_last_copy() {
    let mut region = Region::new();
    region.put(KEY, b"one", 1);
    region.put(OTHER, b"two", 2);
    let hooked = region.default_hooked_reader();
    let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
    let mut bufs: [&mut [u8]; 2] = [&mut a, &mut b];
    let mut out = [None; 2];
    let mut clock = NotingClock::new(&hooked);
    let time = hooked
        .reader
        .get_many_into(&[KEY, OTHER], &mut bufs, &mut out, SINCE_START, || {
            clock.now()
        })
        .expect("get_many_into");
    assert_eq!(
        out,
        [
            Some(GotInto { len: 3, version: 1 }),
            Some(GotInto { len: 3, version: 2 })
        ]
    );
    // Two neighbourhoods, two heads and two values: one reading after all.
    assert_eq!(hooked.reads(), 6);
    assert_eq!(clock.taken, vec![6]);
    assert_eq!(clock.reads_at(time), 6);

    // KEY's neighbourhood with a collision: KEY is read again alone, and
    // the batch's reading is the one after that read.
    let mut region = Region::new();
    region.collide(0);
    region.put_at(KEY, 1, b"mine", 5);
    region.put(OTHER, b"two", 2);
    let hooked = region.default_hooked_reader();
    let mut clock = NotingClock::new(&hooked);
    let time = hooked
        .reader
        .get_many_into(&[OTHER, KEY], &mut bufs, &mut out, SINCE_START, || {
            clock.now()
        })
        .expect("get_many_into");
    assert_eq!(out[1], Some(GotInto { len: 4, version: 5 }));
    let reads = hooked.reads();
    assert_eq!(clock.reads_at(time), reads);
    assert_eq!(clock.taken.last(), Some(&reads));
}

/// The accesses a batch of rounds should make: each round's ranges
/// prefetched, all of them, before the round's first read (`rounds`: how
/// many reads each round made, in order).
fn prefetched_rounds(reads: &[Access], rounds: &[usize]) -> Vec<Access> {
    let mut expected = Vec::new();
    let mut rest = reads;
    for &n in rounds {
        let (round, after) = rest.split_at(n);
        expected.extend(round.iter().map(|read| match *read {
            Access::Read { offset, len } | Access::Prefetch { offset, len } => {
                Access::Prefetch { offset, len }
            }
        }));
        expected.extend_from_slice(round);
        rest = after;
    }
    expected
}

#[test]
fn a_batch_asks_for_every_range_of_a_round_before_it_copies_any() {
    let mut region = Region::new();
    region.put(KEY, b"one", 1);
    region.put(OTHER, b"two", 2);
    let hooked = region.default_hooked_reader();
    hooked.take_accesses();
    let reads_only = |accesses: &[Access]| -> Vec<Access> {
        accesses
            .iter()
            .copied()
            .filter(|a| matches!(a, Access::Read { .. }))
            .collect()
    };

    // get_many_into: two neighbourhoods, then each block's head and value.
    let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
    let mut bufs: [&mut [u8]; 2] = [&mut a, &mut b];
    let mut out = [None; 2];
    hooked
        .reader
        .get_many_into(&[KEY, OTHER], &mut bufs, &mut out, SINCE_START, || {
            SINCE_START
        })
        .expect("get_many_into");
    assert_eq!(out[0], Some(GotInto { len: 3, version: 1 }));
    let accesses = hooked.take_accesses();
    let reads = reads_only(&accesses);
    assert_eq!(reads.len(), 6, "{accesses:?}");
    assert_eq!(accesses, prefetched_rounds(&reads, &[2, 4]));

    // get_many: two neighbourhoods, then the two blocks whole.
    let many = hooked
        .reader
        .get_many(&[Bytes::from_static(KEY), Bytes::from_static(OTHER)])
        .expect("get_many");
    assert_eq!(many, vec![versioned(b"one", 1), versioned(b"two", 2)]);
    let accesses = hooked.take_accesses();
    let reads = reads_only(&accesses);
    assert_eq!(reads.len(), 4, "{accesses:?}");
    assert_eq!(accesses, prefetched_rounds(&reads, &[2, 2]));
}
