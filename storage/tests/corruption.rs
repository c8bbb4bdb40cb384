//! Bytes of a block, a slot and the header are corrupted in place; the reader
//! must report the corruption and never return data for it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rdkv_proto::region::{
    BLOCK_HEADER_BYTES, BlockError, HeaderError, INVALIDATION_WORD_OFFSET, MAX_DATA_UNITS,
    SLOT_BYTES, Slot, SlotError, UNIT_BYTES,
};
use rdkv_storage::region::IndexCache;
use rdkv_storage::{
    ManualClock, ReadError, ReadProblem, ReaderOptions, RegionConfig, RegionError, RegionReader,
    RegionWriter,
};

fn setup() -> (RegionWriter, RegionReader) {
    let config = RegionConfig {
        region_bytes: 1024 * 1024,
        ..RegionConfig::default()
    };
    let mut writer = RegionWriter::create(&config, Arc::new(ManualClock::default())).unwrap();
    for i in 0..100u64 {
        let key = format!("key-{i}");
        writer
            .put(key.as_bytes(), format!("value-{i}").as_bytes(), i + 1)
            .unwrap();
    }
    let reader = writer
        .reader(ReaderOptions::for_layout(writer.layout()))
        .unwrap();
    (writer, reader)
}

/// Region byte offsets of a key's slot and of its block.
fn locate(writer: &RegionWriter, key: &[u8]) -> (u64, u64) {
    let layout = writer.layout();
    let hash = layout.key_hash(key);
    let (start, len) = layout.neighbourhood_range(hash);
    for slot_offset in (start..start + len).step_by(SLOT_BYTES as usize) {
        let raw = writer
            .memory()
            .load_u64(slot_offset, Ordering::Acquire)
            .unwrap();
        if let Ok(Some(slot)) = Slot::decode(raw) {
            let block = layout.data_offset + slot.offset_units * UNIT_BYTES;
            let mut head = vec![0u8; BLOCK_HEADER_BYTES + key.len()];
            writer.memory().read_bytes(block, &mut head).unwrap();
            if slot.fingerprint == hash.fingerprint && &head[BLOCK_HEADER_BYTES..] == key {
                return (slot_offset, block);
            }
        }
    }
    panic!("key not found");
}

fn assert_exhausted(
    result: Result<Option<rdkv_storage::Versioned>, ReadError>,
    check: impl Fn(ReadProblem) -> bool,
) {
    match result {
        Err(ReadError::Exhausted { last, .. }) if check(last) => {}
        other => panic!("expected a reported corruption, got {other:?}"),
    }
}

#[test]
fn corrupted_value_byte_is_reported() {
    let (writer, reader) = setup();
    let (_, block) = locate(&writer, b"key-7");
    let value_offset = block + (BLOCK_HEADER_BYTES + b"key-7".len()) as u64 + 2;
    writer.memory().inject_bit_flip(value_offset, 0x04).unwrap();
    assert_exhausted(reader.get(b"key-7"), |p| {
        matches!(p, ReadProblem::Block(BlockError::Checksum { .. }))
    });
    let stats = reader.stats();
    assert_eq!(
        stats.retries_block,
        u64::from(ReaderOptions::DEFAULT_MAX_ATTEMPTS)
    );
    assert_eq!(stats.exhausted, 1);
    // Other keys are unaffected.
    assert_eq!(
        &reader.get(b"key-8").unwrap().unwrap().value[..],
        b"value-8"
    );
}

#[test]
fn corrupted_block_header_is_reported() {
    let (writer, reader) = setup();
    let (_, block) = locate(&writer, b"key-9");
    // value_len grows past what a reader fetched or past the CRC's coverage.
    writer.memory().inject_bit_flip(block + 9, 0x01).unwrap();
    assert_exhausted(reader.get(b"key-9"), |p| matches!(p, ReadProblem::Block(_)));
    let (_, block) = locate(&writer, b"key-10");
    // The version word.
    writer.memory().inject_bit_flip(block + 16, 0x80).unwrap();
    assert_exhausted(reader.get(b"key-10"), |p| {
        matches!(p, ReadProblem::Block(BlockError::Checksum { .. }))
    });
}

#[test]
fn corrupted_slot_is_reported_not_taken_for_a_miss() {
    let (mut writer, reader) = setup();
    // A fingerprint bit: the key no longer matches any slot, yet the reader
    // must not answer "absent".
    let (slot, _) = locate(&writer, b"key-3");
    writer.memory().inject_bit_flip(slot + 6, 0x02).unwrap();
    assert_exhausted(reader.get(b"key-3"), |p| {
        matches!(p, ReadProblem::Slot(SlotError::Check { .. }))
    });
    // The writer refuses to insert a duplicate beside a corrupted slot.
    assert!(matches!(
        writer.put(b"key-3", b"again", 1000),
        Err(RegionError::CorruptSlot(SlotError::Check { .. }))
    ));
    // An offset bit: the slot would send the reader to another block.
    let (slot, _) = locate(&writer, b"key-4");
    writer.memory().inject_bit_flip(slot, 0x01).unwrap();
    assert_exhausted(reader.get(b"key-4"), |p| {
        matches!(p, ReadProblem::Slot(SlotError::Check { .. }))
    });
}

#[test]
fn corrupted_header_is_reported() {
    let (writer, reader) = setup();
    assert!(reader.check_header().is_ok());
    // bucket_count (offset 48): a reader using it would look in the wrong place.
    writer.memory().inject_bit_flip(48, 0x01).unwrap();
    let attach = RegionReader::attach(
        Arc::clone(writer.memory()),
        Arc::new(ManualClock::default()),
        ReaderOptions::for_layout(writer.layout()),
    );
    assert!(matches!(
        attach,
        Err(ReadError::Header(HeaderError::Checksum { .. }))
    ));
    assert!(matches!(
        reader.check_header(),
        Err(ReadError::Header(HeaderError::Checksum { .. }))
    ));
    // Restore, then break the magic.
    writer.memory().inject_bit_flip(48, 0x01).unwrap();
    assert!(reader.check_header().is_ok());
    writer.memory().inject_bit_flip(0, 0x20).unwrap();
    assert!(matches!(
        reader.check_header(),
        Err(ReadError::Header(HeaderError::BadMagic { .. }))
    ));
}

/// A cached location points at a block the writer has since replaced. When
/// the freed block is reused for a pair of the same key and value lengths,
/// the reusing writer's first stores put back the very value_len and magic
/// that invalidation cleared, while the rest of the block still holds the
/// old pair: a reader copying it then must not find the old version valid.
#[test]
fn a_reused_block_never_revives_a_cached_old_version() {
    let (mut writer, reader) = setup();
    let cache = IndexCache::new(16);
    let key = b"key-7";
    let cached = reader.get_cached(key, &cache).unwrap();
    assert_eq!(cached.map(|v| v.version), Some(8));
    let (_, old_block) = locate(&writer, key);
    let word_at = old_block + INVALIDATION_WORD_OFFSET;
    let live_word = writer
        .memory()
        .load_u64(word_at, Ordering::Acquire)
        .unwrap();

    writer.put(key, b"value-7-new", 1_000).unwrap();
    writer
        .memory()
        .store_u64(word_at, live_word, Ordering::Release)
        .unwrap();

    let got = reader.get_cached(key, &cache).unwrap();
    assert_eq!(got.map(|v| v.version), Some(1_000), "a stale version");
}

/// The apply loop's prefetch of a key's candidate blocks skips a slot that
/// does not decode, and one that decodes but points past the data area:
/// nothing is read for it, and the write that follows still reports the
/// corrupt slot.
#[test]
fn a_corrupt_slot_is_skipped_by_the_prefetch_and_reported_by_the_write() {
    let (mut writer, _reader) = setup();
    // An offset bit: the fingerprint still matches, the check fails.
    let (slot, _) = locate(&writer, b"key-5");
    writer.memory().inject_bit_flip(slot, 0x01).unwrap();
    writer.prefetch_neighbourhood(b"key-5");
    writer.prefetch_candidates(b"key-5");
    assert!(matches!(
        writer.put(b"key-5", b"again", 1000),
        Err(RegionError::CorruptSlot(SlotError::Check { .. }))
    ));
    // A well-sealed slot whose block lies past the data area.
    let (slot, _) = locate(&writer, b"key-6");
    let raw = writer.memory().load_u64(slot, Ordering::Acquire).unwrap();
    let valid = Slot::decode(raw).unwrap().unwrap();
    let far = Slot::new(valid.fingerprint, valid.class, MAX_DATA_UNITS - 1);
    writer
        .memory()
        .write_bytes(slot, &far.encode().to_ne_bytes())
        .unwrap();
    writer.prefetch_candidates(b"key-6");
    assert!(matches!(
        writer.put(b"key-6", b"again", 1001),
        Err(RegionError::CorruptSlot(SlotError::OutOfRange { .. }))
    ));
}
