//! The neighbourhood: the `neighbourhood_buckets` consecutive buckets from a
//! key's home bucket, the only place the key may live. A lookup reads it in
//! one contiguous read, so its size bounds a reader's fixed buffers.

use crate::region::slot::{BUCKET_BYTES, SLOT_BYTES, SLOTS_PER_BUCKET};

/// Most buckets a neighbourhood may span; a header asking for more is refused.
pub const MAX_NEIGHBOURHOOD_BUCKETS: u64 = 8;
/// Most slots a neighbourhood can have: the size of a reader's word buffer.
pub const MAX_NEIGHBOURHOOD_SLOTS: usize = MAX_NEIGHBOURHOOD_BUCKETS as usize * SLOTS_PER_BUCKET;
/// Most bytes one neighbourhood read copies.
pub const MAX_NEIGHBOURHOOD_BYTES: usize = (MAX_NEIGHBOURHOOD_BUCKETS * BUCKET_BYTES) as usize;
const _: () =
    assert!(MAX_NEIGHBOURHOOD_SLOTS as u64 * SLOT_BYTES == MAX_NEIGHBOURHOOD_BYTES as u64);

/// The slot words of one neighbourhood, decoded from the little-endian bytes
/// a reader copied or loaded as words from a mapping, in a fixed buffer (no
/// allocation on the GET path).
pub type NeighbourhoodWords = SlotWords<MAX_NEIGHBOURHOOD_SLOTS>;

/// Up to `N` slot words, decoded from bytes a reader copied or loaded as
/// words: a neighbourhood
/// ([`NeighbourhoodWords`]) or an overflow table
/// ([`TableWords`](crate::region::TableWords)).
#[derive(Debug, Clone, Copy)]
pub struct SlotWords<const N: usize> {
    words: [u64; N],
    len: usize,
}

impl<const N: usize> SlotWords<N> {
    /// Decodes every whole word of `bytes`, up to `N` (a validated layout
    /// or link never asks for more).
    #[inline]
    pub fn decode(bytes: &[u8]) -> SlotWords<N> {
        let mut words = [0u64; N];
        let mut len = 0;
        for (word, le) in words
            .iter_mut()
            .zip(bytes.chunks_exact(SLOT_BYTES as usize))
        {
            let mut raw = [0u8; SLOT_BYTES as usize];
            raw.copy_from_slice(le);
            *word = u64::from_le_bytes(raw);
            len += 1;
        }
        SlotWords { words, len }
    }

    /// The words of `len_bytes` (whole words, up to `N`, as `decode`: a
    /// validated layout never asks for more), loaded by `load` into the
    /// slice it is given, already in this host's order: a reader of a
    /// mapping loads them from the region directly, without a byte copy
    /// to [`SlotWords::decode`].
    #[inline]
    pub fn fill<E>(
        len_bytes: usize,
        load: impl FnOnce(&mut [u64]) -> Result<(), E>,
    ) -> Result<SlotWords<N>, E> {
        let mut words = [0u64; N];
        let len = (len_bytes / SLOT_BYTES as usize).min(N);
        load(&mut words[..len])?;
        Ok(SlotWords { words, len })
    }

    #[inline]
    pub fn as_slice(&self) -> &[u64] {
        &self.words[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_little_endian_and_bounded() {
        let mut bytes = vec![0u8; MAX_NEIGHBOURHOOD_BYTES + 12];
        bytes[0] = 1;
        bytes[15] = 0x80;
        let words = NeighbourhoodWords::decode(&bytes);
        assert_eq!(words.as_slice().len(), MAX_NEIGHBOURHOOD_SLOTS);
        assert_eq!(words.as_slice()[..2], [1, 0x80 << 56]);
        assert_eq!(NeighbourhoodWords::decode(&bytes[..20]).as_slice().len(), 2);
    }

    #[test]
    fn filled_words_are_the_decoded_ones() {
        let bytes: Vec<u8> = (0..128u8).collect();
        let decoded = NeighbourhoodWords::decode(&bytes);
        let filled = NeighbourhoodWords::fill(bytes.len(), |words| {
            for (word, le) in words.iter_mut().zip(bytes.chunks_exact(8)) {
                *word = u64::from_le_bytes(le.try_into().unwrap());
            }
            Ok::<(), ()>(())
        });
        assert_eq!(filled.unwrap().as_slice(), decoded.as_slice());
    }
}
