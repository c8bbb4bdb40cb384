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
    deserializer.deserialize_seq(BoundedVecVisitor(PhantomData))
}

#[derive(Debug)]
struct BoundedVecVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for BoundedVecVisitor<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a sequence of at most {HARD_MAX_BATCH_ENTRIES} entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let hard_max = usize::try_from(HARD_MAX_BATCH_ENTRIES).unwrap_or(usize::MAX);
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
