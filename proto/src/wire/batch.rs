//! Bounded deserialisation of batch vectors.
//!
//! Every element of a batch costs at least one payload byte but up to 64 bytes of
//! memory once decoded (two `Bytes` handles), so without a cap a frame full of empty
//! keys would decode into ~32x its own size before [`Limits`](super::limits::Limits)
//! could reject it. The cap is a protocol constant because deserialisation runs
//! before any per-server configuration is consulted.

use core::fmt;
use core::marker::PhantomData;

use serde::Deserializer;
use serde::de::{Deserialize, Error as _, SeqAccess, Visitor};

/// No batch on the wire may have more entries than this, whatever the configured
/// `max_batch_keys` (which must not exceed it).
pub const HARD_MAX_BATCH_ENTRIES: u32 = 65_536;

/// Up-front capacity is capped far below the hard limit because the announced
/// length is untrusted; a genuine large batch just grows the vector as it decodes.
const MAX_PREALLOC_ENTRIES: usize = 1024;

pub(crate) fn bounded_vec<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let hard_max = usize::try_from(HARD_MAX_BATCH_ENTRIES).unwrap_or(usize::MAX);
    deserializer.deserialize_seq(BoundedVecVisitor {
        hard_max,
        item: PhantomData,
    })
}

/// [`bounded_vec`] with a cap of `MAX` entries: for sequences whose protocol
/// bound is far below a batch's (the shard map's parts).
pub(crate) fn capped_vec<'de, D, T, const MAX: usize>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_seq(BoundedVecVisitor {
        hard_max: MAX,
        item: PhantomData,
    })
}

#[derive(Debug)]
struct BoundedVecVisitor<T> {
    hard_max: usize,
    item: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for BoundedVecVisitor<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a sequence of at most {} entries", self.hard_max)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let hard_max = self.hard_max;
        let announced = seq.size_hint().unwrap_or(0);
        if announced > hard_max {
            return Err(A::Error::invalid_length(announced, &self));
        }
        let mut out = Vec::with_capacity(announced.min(MAX_PREALLOC_ENTRIES));
        while let Some(item) = seq.next_element()? {
            if out.len() >= hard_max {
                return Err(A::Error::invalid_length(out.len().saturating_add(1), &self));
            }
            out.push(item);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::capped_vec;
    use crate::wire::{WireError, decode_exact};

    #[derive(Debug, Deserialize)]
    struct UpToFour(#[serde(deserialize_with = "capped_vec::<_, _, 4>")] Vec<u8>);

    fn decode(len: u8, entries: usize) -> Result<UpToFour, WireError> {
        let mut bytes = vec![len];
        bytes.resize(1 + entries, 7);
        decode_exact(&bytes)
    }

    #[test]
    fn a_capped_sequence_takes_up_to_its_cap() {
        assert_eq!(decode(4, 4).unwrap().0, [7; 4]);
        assert_eq!(decode(0, 0).unwrap().0, [0u8; 0]);
        // Past the cap it is refused (serde's invalid length, a custom
        // error to postcard), even with every entry present.
        assert!(matches!(
            decode(5, 5),
            Err(WireError::Decode(postcard::Error::SerdeDeCustom))
        ));
        assert!(decode(200, 3).is_err());
    }
}
