//! Region bytes as a one-sided reader sees them (`rdkv_proto::region`): what a
//! reader copies out of a remote region may be torn, stale or hostile, so
//! every decoder must reject it with an error, never panic or index out of
//! bounds.
//!
//! Input: one mode byte, then bytes. Checked:
//! - `BlockRef::validate` never panics; a block that validates has its key
//!   and value inside the input, right after the 24-byte header, lengths
//!   within the limits, a version >= 1 and a CRC that matches; re-encoding it
//!   gives back the same bytes (the block format is canonical);
//! - `SlotWord::decode` (and `Slot::decode`) of every 8-byte word never
//!   panics; a decoded word re-encodes to the same word (the check byte
//!   covers all other bits); a link has fingerprint 0 and is never a
//!   candidate of any key's fingerprint; `verify_neighbourhood` accepts
//!   exactly the words that decode with links in anchors only,
//!   `verify_table` those with a link, if any, in the last slot only;
//! - `RegionLayout::decode` / `DynamicHeader::decode` never panic, on raw
//!   bytes and on headers whose CRC the target fixes up (so the geometry
//!   checks behind the CRC are reached); a layout that validates keeps every
//!   slot's block range and every link's table range inside its data area
//!   and re-encodes to the same static header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdkv_proto::region::{
    BLOCK_HEADER_BYTES, BlockRef, ChainWalk, DynamicHeader, MAX_OVERFLOW_TABLE_BYTES,
    REGION_LAYOUT_VERSION, RegionLayout, STATIC_HEADER_BYTES, Slot, SlotError, SlotWord,
    encode_block, examine_block, is_anchor, neighbourhood_slots, verify_neighbourhood,
    verify_table,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    check_block(bytes, 1024, 1024 * 1024);
    check_block(bytes, 16, 64);
    check_slots(bytes);
    if mode & 1 == 1 && bytes.len() >= 128 {
        // Fix up magic, version and CRC so that only the geometry decides.
        let mut header = bytes.to_vec();
        header[..8].copy_from_slice(b"RDKVREGN");
        header[8..16].copy_from_slice(&REGION_LAYOUT_VERSION.to_le_bytes());
        let crc = u64::from(crc32fast::hash(&header[..STATIC_HEADER_BYTES]));
        header[STATIC_HEADER_BYTES..128].copy_from_slice(&crc.to_le_bytes());
        check_header(&header, bytes);
    } else {
        check_header(bytes, bytes);
    }
});

fn check_block(bytes: &[u8], max_key_bytes: u32, max_value_bytes: u32) {
    let Ok(block) = BlockRef::validate(bytes, max_key_bytes, max_value_bytes) else {
        return;
    };
    // The slices are the input's own bytes, right after the header.
    let key_end = BLOCK_HEADER_BYTES + block.key.len();
    let end = key_end + block.value.len();
    assert!(end <= bytes.len(), "block extends past the bytes read");
    assert_eq!(block.key, &bytes[BLOCK_HEADER_BYTES..key_end]);
    assert_eq!(block.value, &bytes[key_end..end]);
    assert!(block.key.len() <= max_key_bytes as usize);
    assert!(block.value.len() <= max_value_bytes as usize);
    assert!(block.version >= 1);
    // The stored CRC is the CRC of everything after it.
    let stored = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    assert_eq!(stored, crc32fast::hash(&bytes[4..end]));
    // Canonical: the writer's encoding of the same block is the same bytes.
    let mut encoded = Vec::new();
    encode_block(
        block.key,
        block.value,
        block.version,
        block.deadline,
        &mut encoded,
    );
    assert_eq!(&encoded[..], &bytes[..end]);
}

fn check_slots(bytes: &[u8]) {
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect();
    for &raw in &words {
        check_word(raw);
    }
    let neighbourhood_valid = words.iter().enumerate().all(|(p, &raw)| {
        matches!(
            SlotWord::decode(raw),
            Ok(SlotWord::Empty | SlotWord::Entry(_))
        ) || (is_anchor(p) && matches!(SlotWord::decode(raw), Ok(SlotWord::Link(_))))
    });
    assert_eq!(verify_neighbourhood(&words).is_ok(), neighbourhood_valid);
    assert_eq!(
        ChainWalk::from_neighbourhood(&words).is_ok(),
        neighbourhood_valid
    );
    let table_valid = words
        .iter()
        .enumerate()
        .all(|(p, &raw)| match SlotWord::decode(raw) {
            Ok(SlotWord::Empty) => true,
            Ok(SlotWord::Entry(_)) => p + 1 < words.len(),
            Ok(SlotWord::Link(_)) => p + 1 == words.len(),
            Err(_) => false,
        });
    assert_eq!(verify_table(&words).is_ok(), table_valid);
    if let Some(&first) = words.first() {
        // Every candidate has the fingerprint asked for.
        let fingerprint = Slot::raw_fingerprint(first);
        for (position, slot) in neighbourhood_slots(&words, fingerprint) {
            assert_eq!(Slot::raw_fingerprint(words[position]), fingerprint);
            if let Ok(slot) = slot {
                assert_eq!(slot.fingerprint, fingerprint);
            }
        }
    }
}

/// One word: decodes to a kind that re-encodes to it, or is refused.
fn check_word(raw: u64) {
    match SlotWord::decode(raw) {
        Ok(SlotWord::Empty) => assert_eq!(raw, 0),
        Ok(SlotWord::Entry(slot)) => {
            assert_ne!(slot.fingerprint, 0);
            assert_eq!(slot.encode(), raw, "entry does not re-encode to its word");
            assert_eq!(Slot::decode(raw), Ok(Some(slot)));
        }
        Ok(SlotWord::Link(link)) => {
            assert_ne!(raw, 0);
            assert_eq!(Slot::raw_fingerprint(raw), 0);
            assert_eq!(link.encode(), raw, "link does not re-encode to its word");
            assert_eq!(Slot::decode(raw), Err(SlotError::Misplaced { raw }));
            // No key has fingerprint 0, and no other fingerprint picks it.
            assert_eq!(neighbourhood_slots(&[raw], 1).count(), 0);
        }
        Err(error) => assert_eq!(Slot::decode(raw), Err(error)),
    }
}

fn check_header(header: &[u8], rest: &[u8]) {
    let _ = DynamicHeader::decode(header);
    let Ok(layout) = RegionLayout::decode(header) else {
        return;
    };
    assert_eq!(&layout.encode_static()[..], &header[..128]);
    assert!(layout.data_offset + layout.data_bytes <= layout.region_bytes);
    // Any slot word either is refused or names a block inside the data area,
    // no larger than the region's largest block.
    for word in rest.chunks_exact(8) {
        let raw = u64::from_le_bytes(word.try_into().unwrap());
        let range = match SlotWord::decode(raw) {
            Ok(SlotWord::Entry(slot)) => layout.block_range(slot).inspect(|&(_, len)| {
                assert!(len <= layout.max_class().unwrap().bytes());
            }),
            Ok(SlotWord::Link(link)) => layout.table_range(link).inspect(|&(_, len)| {
                assert!(len <= MAX_OVERFLOW_TABLE_BYTES as u64);
            }),
            _ => continue,
        };
        if let Ok((start, len)) = range {
            assert!(start >= layout.data_offset);
            assert!(start + len <= layout.data_offset + layout.data_bytes);
        }
    }
    // Hashing any key lands its neighbourhood inside the index.
    let hash = layout.key_hash(rest);
    let (start, len) = layout.neighbourhood_range(hash);
    assert!(start >= layout.index_offset);
    assert!(start + len <= layout.index_offset + layout.slot_count() * 8);
    let _ = examine_block(&layout, rest, rest);
}
