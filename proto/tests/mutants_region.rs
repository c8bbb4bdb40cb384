//! Exact-boundary tests of the region layout decoders, written to kill the
//! mutants cargo-mutants found surviving in `proto/src/region` (see
//! mutants.md): each bound is checked on both sides, and each derived
//! number (ranges, counts, lengths) is compared with its exact value, so an
//! off-by-one or a swapped operator in a decoder fails here.

use rdkv_proto::region::{
    BLOCK_HEADER_BYTES, BlockError, BlockHeader, BlockRef, BlockVerdict, DynamicHeader,
    HEADER_BYTES, HEADER_USED_BYTES, HeaderError, KeyHash, LayoutParams, MAX_BLOCK_UNITS,
    MAX_DATA_UNITS, RegionLayout, RegionState, STATIC_HEADER_BYTES, SizeClass, Slot, SlotError,
    UNIT_BYTES, dynamic_word, encode_block, encoded_block_bytes, examine_block,
    neighbourhood_slots, verify_neighbourhood,
};

fn layout() -> RegionLayout {
    RegionLayout::plan(LayoutParams::for_tests()).expect("a valid geometry")
}

/// Encodes `layout` as stored (a valid CRC whatever the geometry) and decodes
/// it again: the decoder's own geometry check decides.
fn redecode(layout: RegionLayout) -> Result<RegionLayout, HeaderError> {
    RegionLayout::decode(&layout.encode_static())
}

fn geometry_refused(layout: RegionLayout) -> bool {
    matches!(redecode(layout), Err(HeaderError::Geometry(_)))
}

/// Whether `plan` itself refuses `params` for their geometry.
fn plan_refused(params: LayoutParams) -> bool {
    matches!(RegionLayout::plan(params), Err(HeaderError::Geometry(_)))
}

#[test]
fn plan_places_the_data_area_on_the_next_page_and_rounds_it_to_units() {
    // 3 buckets end the index at 4096 + 192: the data area starts a page later.
    let p = LayoutParams {
        bucket_count: 3,
        region_bytes: (1 << 20) + 100,
        ..LayoutParams::for_tests()
    };
    let layout = RegionLayout::plan(p).expect("valid");
    assert_eq!(layout.index_offset, HEADER_BYTES);
    assert_eq!(layout.data_offset, 8192);
    // 100 trailing bytes are one whole unit (64) and 36 unusable bytes.
    assert_eq!(layout.data_bytes, (1 << 20) + 64 - 8192);
    assert_eq!(redecode(layout), Ok(layout));
}

#[test]
fn neighbourhood_bounds_are_one_to_eight_buckets() {
    for (n, ok) in [(0, false), (1, true), (8, true), (9, false)] {
        let layout = RegionLayout {
            neighbourhood_buckets: n,
            ..layout()
        };
        assert_eq!(redecode(layout).is_ok(), ok, "neighbourhood {n}");
    }
}

#[test]
fn a_region_may_hold_exactly_one_neighbourhood_of_buckets() {
    let exact = LayoutParams {
        bucket_count: 2,
        ..LayoutParams::for_tests()
    };
    assert!(RegionLayout::plan(exact).is_ok());
    let fewer = LayoutParams {
        bucket_count: 1,
        ..LayoutParams::for_tests()
    };
    assert!(plan_refused(fewer));
}

#[test]
fn the_index_must_start_right_after_the_header() {
    let moved = RegionLayout {
        index_offset: HEADER_BYTES + 64,
        ..layout()
    };
    assert!(geometry_refused(moved));
}

#[test]
fn the_data_area_may_start_at_the_index_end_but_not_inside_it() {
    // 64 buckets end the index exactly on a page: 4096 + 64 * 64 = 8192.
    let touching = RegionLayout::plan(LayoutParams {
        bucket_count: 64,
        ..LayoutParams::for_tests()
    })
    .expect("valid");
    assert_eq!(touching.data_offset, 8192);
    assert_eq!(redecode(touching), Ok(touching));
    let overlapping = RegionLayout {
        data_offset: 4096,
        data_bytes: touching.data_bytes + 4096,
        ..touching
    };
    assert!(geometry_refused(overlapping));
    let unaligned = RegionLayout {
        data_offset: 8192 + 64,
        data_bytes: touching.data_bytes - 64,
        ..touching
    };
    assert!(geometry_refused(unaligned));
}

#[test]
fn the_data_area_must_end_inside_the_region_in_whole_units() {
    let layout = layout();
    let one_byte_short = RegionLayout {
        region_bytes: layout.region_bytes - 1,
        ..layout
    };
    assert!(geometry_refused(one_byte_short));
    let partial_unit = RegionLayout {
        data_bytes: layout.data_bytes - 8,
        ..layout
    };
    assert!(geometry_refused(partial_unit));
    let empty = RegionLayout {
        data_bytes: 0,
        ..layout
    };
    assert!(geometry_refused(empty));
    let data_end_overflows = RegionLayout {
        data_offset: !4095,
        ..layout
    };
    assert!(geometry_refused(data_end_overflows));
}

#[test]
fn the_data_area_may_be_exactly_as_large_as_a_slot_can_address() {
    let region_bytes = 8192 + MAX_DATA_UNITS * UNIT_BYTES;
    let max = RegionLayout::plan(LayoutParams {
        bucket_count: 64,
        region_bytes,
        ..LayoutParams::for_tests()
    })
    .expect("the largest addressable data area is valid");
    assert_eq!(max.data_bytes / UNIT_BYTES, MAX_DATA_UNITS);
    let one_unit_more = LayoutParams {
        bucket_count: 64,
        region_bytes: region_bytes + UNIT_BYTES,
        ..LayoutParams::for_tests()
    };
    assert!(plan_refused(one_unit_more));
}

#[test]
fn header_decode_needs_the_whole_static_part() {
    let bytes = layout().encode_static();
    assert_eq!(
        RegionLayout::decode(&bytes[..127]),
        Err(HeaderError::Truncated {
            len: 127,
            need: 128
        })
    );
    assert_eq!(RegionLayout::decode(&bytes), Ok(layout()));
}

#[test]
fn size_limits_that_do_not_fit_u32_are_refused() {
    let mut bytes = layout().encode_static();
    bytes[96..104].copy_from_slice(&(u64::from(u32::MAX) + 1).to_le_bytes());
    let crc = u64::from(crc32fast::hash(&bytes[..STATIC_HEADER_BYTES]));
    bytes[STATIC_HEADER_BYTES..].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        RegionLayout::decode(&bytes),
        Err(HeaderError::Geometry(_))
    ));
}

#[test]
fn neighbourhood_range_and_slot_count_are_exact() {
    let layout = layout();
    let hash = KeyHash {
        fingerprint: 1,
        home_bucket: 5,
    };
    assert_eq!(layout.neighbourhood_range(hash), (4096 + 5 * 64, 2 * 64));
    assert_eq!(layout.slot_count(), 512 * 8);
}

#[test]
fn block_range_is_offset_by_the_data_area() {
    let layout = layout();
    let class = SizeClass::for_units(2).expect("class");
    let slot = Slot::new(9, class, 3);
    assert_eq!(
        layout.block_range(slot),
        Ok((layout.data_offset + 3 * 64, 128))
    );
}

fn dynamic_bytes(words: [(u64, u64); 6]) -> [u8; HEADER_USED_BYTES] {
    let mut bytes = [0u8; HEADER_USED_BYTES];
    for (offset, value) in words {
        let at = offset as usize;
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    bytes
}

#[test]
fn dynamic_header_words_decode_from_their_offsets() {
    let words = |lease, state| {
        [
            (dynamic_word::RAFT_TERM, 3),
            (dynamic_word::APPLIED_INDEX, 41),
            (dynamic_word::APPLIED_AT_UNIX_US, 1_000_000),
            (dynamic_word::LEADER_LEASE, lease),
            (dynamic_word::REGION_STATE, state),
            (dynamic_word::LEADER_LEASE_BOOTTIME, lease * 2),
        ]
    };
    let leader = DynamicHeader::decode(&dynamic_bytes(words(77, 1))).expect("decodes");
    assert_eq!(
        leader,
        DynamicHeader {
            raft_term: 3,
            applied_index: 41,
            applied_at_unix_us: 1_000_000,
            lease_deadline_unix_us: Some(77),
            state: RegionState::Serving,
            lease_deadline_boottime_us: Some(154),
        }
    );
    let follower = DynamicHeader::decode(&dynamic_bytes(words(0, 2))).expect("decodes");
    assert_eq!(follower.lease_deadline_unix_us, None);
    assert_eq!(follower.lease_deadline_boottime_us, None);
    assert_eq!(follower.state, RegionState::Retired);
    let bytes = dynamic_bytes(words(0, 1));
    assert_eq!(
        DynamicHeader::decode(&bytes[..HEADER_USED_BYTES - 1]),
        Err(HeaderError::Truncated {
            len: HEADER_USED_BYTES - 1,
            need: HEADER_USED_BYTES
        })
    );
}

#[test]
fn region_state_words_other_than_serving_and_retired_are_unknown() {
    assert_eq!(RegionState::from_word(1), RegionState::Serving);
    assert_eq!(RegionState::from_word(2), RegionState::Retired);
    assert_eq!(RegionState::from_word(0), RegionState::Unknown(0));
    assert_eq!(RegionState::from_word(3), RegionState::Unknown(3));
}

#[test]
fn size_class_indices_stop_at_the_last_class() {
    let last = SizeClass::from_index(99).expect("100 classes");
    assert_eq!(last.units(), MAX_BLOCK_UNITS);
    assert_eq!(last.bytes(), u64::from(MAX_BLOCK_UNITS) * 64);
    assert_eq!(SizeClass::from_index(100), None);
    let first = SizeClass::from_index(0).expect("class 0");
    assert_eq!((first.units(), first.bytes()), (1, 64));
    assert_eq!(SizeClass::for_units(17).map(SizeClass::units), Some(17));
    assert_eq!(SizeClass::for_units(33).map(SizeClass::units), Some(40));
    // The largest block has a class (the last); one unit more has none.
    assert_eq!(SizeClass::for_units(u64::from(MAX_BLOCK_UNITS)), Some(last));
    assert_eq!(SizeClass::for_units(u64::from(MAX_BLOCK_UNITS) + 1), None);
    assert_eq!(SizeClass::for_units(0), None);
}

#[test]
fn slot_fields_are_masked_and_read_back_from_their_bits() {
    let class = SizeClass::from_index(5).expect("class");
    let slot = Slot::new(0x1234, class, 99);
    let raw = slot.encode();
    assert_eq!(Slot::raw_fingerprint(raw), 0x1234);
    assert_eq!((raw >> 41) & 0x7fff, 0x1234);
    assert_eq!((raw >> 34) & 0x7f, 5);
    assert_eq!(raw & ((1 << 34) - 1), 99);
    assert_eq!(Slot::decode(raw), Ok(Some(slot)));
}

fn block(key: &[u8], value: &[u8], version: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_block(key, value, version, 1_700_000_000_123, &mut out);
    out
}

#[test]
fn block_lengths_at_the_limits_are_accepted_and_one_more_is_refused() {
    let key = [7u8; 8];
    let value = [9u8; 16];
    let bytes = block(&key, &value, 5);
    assert_eq!(bytes.len(), BLOCK_HEADER_BYTES + 24);
    assert_eq!(encoded_block_bytes(8, 16), 56);
    let exact = BlockRef::validate(&bytes, 8, 16).expect("lengths at the limits");
    assert_eq!(
        (exact.key, exact.value, exact.version, exact.deadline),
        (&key[..], &value[..], 5, 1_700_000_000_123)
    );
    let header = BlockHeader::decode(&bytes, 8, 16).expect("header");
    assert_eq!(header.total_bytes(), 56);
    assert_eq!(
        (
            header.key_len,
            header.value_len,
            header.version,
            header.deadline
        ),
        (8, 16, 5, 1_700_000_000_123)
    );
    assert!(matches!(
        BlockHeader::decode(&bytes, 7, 16),
        Err(BlockError::Length { .. })
    ));
    assert!(matches!(
        BlockHeader::decode(&bytes, 8, 15),
        Err(BlockError::Length { .. })
    ));
}

#[test]
fn a_block_header_needs_its_32_bytes_and_a_nonzero_version() {
    let empty = block(b"", b"", 1);
    assert_eq!(empty.len(), BLOCK_HEADER_BYTES);
    assert!(BlockRef::validate(&empty, 0, 0).is_ok());
    assert_eq!(
        BlockHeader::decode(&empty[..31], 0, 0),
        Err(BlockError::Truncated { len: 31, need: 32 })
    );
    let never_committed = block(b"k", b"v", 0);
    assert_eq!(
        BlockRef::validate(&never_committed, 8, 8),
        Err(BlockError::ZeroVersion)
    );
}

#[test]
fn examine_block_tells_match_other_key_and_torn_apart() {
    let layout = layout();
    let bytes = block(b"key", b"value", 4);
    match examine_block(&layout, b"key", &bytes) {
        BlockVerdict::Match(found) => {
            assert_eq!(
                (found.key, found.value, found.version),
                (&b"key"[..], &b"value"[..], 4)
            );
        }
        other => panic!("expected a match, got {other:?}"),
    }
    assert_eq!(
        examine_block(&layout, b"kez", &bytes),
        BlockVerdict::OtherKey
    );
    let mut torn = bytes.clone();
    torn[30] ^= 1;
    assert!(matches!(
        examine_block(&layout, b"key", &torn),
        BlockVerdict::Torn(BlockError::Checksum { .. })
    ));
}

#[test]
fn candidates_skip_empty_and_foreign_slots_and_report_corrupt_ones() {
    let class = SizeClass::for_units(1).expect("class");
    let mine = Slot::new(5, class, 1).encode();
    // Same fingerprint bits, broken check byte: a candidate that fails.
    let corrupt = Slot::new(5, class, 2).encode() ^ (1 << 60);
    let words = [0, Slot::new(6, class, 3).encode(), mine, corrupt];
    let found: Vec<_> = neighbourhood_slots(&words, 5).collect();
    assert_eq!(found.len(), 2);
    assert_eq!(found[0], (2, Ok(Slot::new(5, class, 1))));
    assert_eq!(found[1], (3, Err(SlotError::Check { raw: corrupt })));
    assert_eq!(verify_neighbourhood(&words[..3]), Ok(()));
    assert_eq!(
        verify_neighbourhood(&words),
        Err(SlotError::Check { raw: corrupt })
    );
    // An empty neighbourhood has no candidate even for fingerprint bits 0.
    assert_eq!(neighbourhood_slots(&[0, 0], 0).count(), 0);
}

/// The header's sizes as documented in the format table of
/// `proto/src/region/header.rs`: readers of other builds depend on them, and
/// the reader code only ever uses them symbolically.
#[test]
fn the_header_sizes_are_the_documented_ones() {
    assert_eq!(STATIC_HEADER_BYTES, 120, "static words before the CRC");
    // The last dynamic word (the boottime lease, offset 168) ends at 176.
    assert_eq!(dynamic_word::REGION_STATE, 160);
    assert_eq!(dynamic_word::LEADER_LEASE_BOOTTIME, 168);
    assert_eq!(HEADER_USED_BYTES, 176);
    assert_eq!(HEADER_BYTES, 4096);
}

#[test]
fn a_key_is_admitted_up_to_the_limit_and_not_one_byte_more() {
    let layout = layout();
    let limit = layout.max_key_bytes as usize;
    assert!(layout.admits_key(b""));
    assert!(layout.admits_key(&vec![b'k'; limit]));
    assert!(!layout.admits_key(&vec![b'k'; limit + 1]));
}
