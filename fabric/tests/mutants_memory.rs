//! Exact-boundary tests of `RegionMemory`, written to kill the mutants
//! cargo-mutants found surviving in `fabric/src/memory.rs` (see mutants.md):
//! the bounds and alignment checks on both sides of each limit, the byte
//! copies at every tail length, and the bit-flip injector's word arithmetic.

use std::sync::atomic::Ordering;

use rdkv_fabric::{MemoryError, RegionMemory};

const LEN: usize = 4096;

fn memory() -> RegionMemory {
    RegionMemory::anonymous(LEN).expect("anonymous mapping")
}

#[test]
fn lengths_must_be_nonzero_multiples_of_a_word() {
    assert!(RegionMemory::anonymous(0).is_err());
    assert!(RegionMemory::anonymous(12).is_err());
    assert!(RegionMemory::shared(12, "rdkv-mutants").is_err());
    let m = RegionMemory::anonymous(8).expect("one word");
    assert_eq!(m.len_bytes(), 8);
    assert!(!m.is_shared());
    assert!(!m.base_ptr().is_null());
    let shared = RegionMemory::shared(LEN, "rdkv-mutants").expect("memfd");
    assert!(shared.is_shared());
    assert_eq!(shared.len_bytes(), LEN);
}

#[test]
fn the_last_word_is_in_bounds_and_the_next_is_not() {
    let m = memory();
    let last = (LEN - 8) as u64;
    m.store_u64(last, 0xdead_beef, Ordering::Relaxed)
        .expect("last word");
    assert_eq!(
        m.load_u64(last, Ordering::Relaxed).expect("load"),
        0xdead_beef
    );
    assert!(matches!(
        m.load_u64(LEN as u64, Ordering::Relaxed),
        Err(MemoryError::OutOfBounds { .. })
    ));
    let mut tail = [0u8; 8];
    m.read_bytes(last, &mut tail)
        .expect("a read ending at the end");
    assert_eq!(tail, 0xdead_beef_u64.to_le_bytes());
    let mut over = [0u8; 9];
    assert!(m.read_bytes(last, &mut over).is_err());
    let mut words = [0u64; 2];
    assert!(m.read_words(last, &mut words, Ordering::Relaxed).is_err());
    m.read_words(last - 8, &mut words, Ordering::Relaxed)
        .expect("two last words");
    assert_eq!(words, [0, 0xdead_beef]);
    // One word and three words: the count of words read is exactly the
    // destination's length, up to the end of the mapping.
    let mut one = [0u64; 1];
    m.read_words(last, &mut one, Ordering::Relaxed)
        .expect("the last word");
    assert_eq!(one, [0xdead_beef]);
    m.store_u64(last - 16, 7, Ordering::Relaxed).expect("store");
    let mut three = [u64::MAX; 3];
    m.read_words(last - 16, &mut three, Ordering::Relaxed)
        .expect("three last words");
    assert_eq!(three, [7, 0, 0xdead_beef]);
}

#[test]
fn unaligned_offsets_are_refused() {
    let m = memory();
    for offset in [1u64, 4, 7, 9] {
        assert!(
            matches!(
                m.load_u64(offset, Ordering::Relaxed),
                Err(MemoryError::OutOfBounds { .. })
            ),
            "offset {offset}"
        );
        assert!(m.write_bytes(offset, b"x").is_err(), "offset {offset}");
    }
}

#[test]
fn bytes_round_trip_at_every_tail_length_without_touching_the_next_word() {
    let m = memory();
    let pattern: Vec<u8> = (1..=40u8).collect();
    for len in 0..=24usize {
        // The word after the copy holds a sentinel: a short read must leave
        // the rest of `out` alone, and a write must not spill past its words.
        m.store_u64(64, u64::MAX, Ordering::Relaxed)
            .expect("sentinel");
        m.store_u64(32, 0, Ordering::Relaxed).expect("clear");
        m.store_u64(40, 0, Ordering::Relaxed).expect("clear");
        m.store_u64(48, 0, Ordering::Relaxed).expect("clear");
        m.write_bytes(32, &pattern[..len]).expect("write");
        let mut out = [0xAAu8; 40];
        m.read_bytes(32, &mut out[..len]).expect("read");
        assert_eq!(&out[..len], &pattern[..len], "len {len}");
        assert!(out[len..].iter().all(|&b| b == 0xAA), "len {len}");
        // The last word is zero padded past the copied bytes.
        let mut whole = [0u8; 24];
        m.read_bytes(32, &mut whole).expect("read the three words");
        assert_eq!(&whole[..len], &pattern[..len]);
        let padded = len.div_ceil(8) * 8;
        assert!(whole[len..padded].iter().all(|&b| b == 0), "len {len}");
        assert_eq!(
            m.load_u64(64, Ordering::Relaxed).expect("sentinel"),
            u64::MAX
        );
    }
}

#[test]
fn a_bit_flip_changes_exactly_the_named_byte() {
    let m = memory();
    for offset in [0u64, 7, 8, 13, (LEN - 1) as u64] {
        let word = offset & !7;
        m.store_u64(word, 0, Ordering::Relaxed).expect("clear");
        m.inject_bit_flip(offset, 0x81).expect("flip");
        let mut expected = [0u8; 8];
        expected[(offset - word) as usize] = 0x81;
        assert_eq!(
            m.load_u64(word, Ordering::Relaxed).expect("load"),
            u64::from_le_bytes(expected),
            "offset {offset}"
        );
    }
    assert!(m.inject_bit_flip(LEN as u64, 1).is_err());
}

#[test]
fn a_read_only_mapping_needs_a_large_enough_file_and_refuses_every_write() {
    let owner = RegionMemory::shared(LEN, "rdkv-mutants").expect("memfd");
    owner.store_u64(8, 42, Ordering::Relaxed).expect("store");
    let exact = RegionMemory::map_read_only(owner.read_only_fd().expect("fd"), LEN)
        .expect("a mapping of exactly the file's size");
    assert_eq!(exact.load_u64(8, Ordering::Relaxed).expect("load"), 42);
    assert!(!exact.is_shared());
    assert!(matches!(
        exact.inject_bit_flip(8, 1),
        Err(MemoryError::ReadOnly)
    ));
    assert!(RegionMemory::map_read_only(owner.read_only_fd().expect("fd"), LEN + 8).is_err());
    assert!(RegionMemory::map_read_only(owner.read_only_fd().expect("fd"), 0).is_err());
}
