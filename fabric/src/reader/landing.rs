//! How an attempt reads and judges a candidate block, once the slot search
//! found one: into a new buffer that becomes the returned value
//! ([`WholeBlock`], `get`), or with the value straight into a caller's
//! buffer ([`IntoBuffer`], `get_into`). The search around them, the
//! retries and the checks are the reader's, the same for both.

use std::sync::atomic::{Ordering, fence};

use rdkv_proto::region::{
    BLOCK_HEADER_BYTES, BlockVerdict, DeadlineUnixMs, SplitVerdict, ValueShape, examine_block,
    examine_block_split,
};

use super::{AttemptError, CachedLocation, Found, ReadProblem, ReadTime, RegionReader};

/// Keys up to this length are copied into a buffer on the stack: a GET of
/// such a key does not allocate. (The default `max_key_bytes`.)
pub const INLINE_KEY_BYTES: usize = 1024;
/// Most keys are short: their buffer is smaller, so clearing it is cheap.
const SHORT_KEY_BYTES: usize = 64;

/// What the block turned out to be.
pub(crate) enum Landed<T> {
    Match(T),
    /// A whole block of another key: the search checks the slot and goes on.
    OtherKey,
}

pub(crate) trait Landing {
    type Found;

    /// Reads the block at `offset` (its slot's class: `len` bytes) and
    /// judges it for `key`.
    fn land(
        &mut self,
        reader: &RegionReader,
        key: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Landed<Self::Found>, AttemptError>;
}

fn torn(error: rdkv_proto::region::BlockError) -> AttemptError {
    AttemptError::Retry(ReadProblem::Block(error))
}

/// The block at `offset` copied whole into a new buffer (its class: `len`
/// bytes), ordered before what the caller reads next.
fn read_whole(reader: &RegionReader, offset: u64, len: u64) -> Result<Vec<u8>, AttemptError> {
    let mut block = vec![0u8; len as usize];
    reader.region.read(offset, &mut block)?;
    // Keeps the slot re-read (and any clock read) after the copy.
    fence(Ordering::Acquire);
    Ok(block)
}

/// The block copied into a new buffer, which becomes the value (`get`);
/// the abandon bound is checked against `started_us` after the copy.
pub(crate) struct WholeBlock {
    pub(crate) started_us: u64,
}

impl Landing for WholeBlock {
    type Found = Found;

    fn land(
        &mut self,
        reader: &RegionReader,
        key: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Landed<Found>, AttemptError> {
        let block = read_whole(reader, offset, len)?;
        if let Some(elapsed_us) = reader.past_abandon_bound(self.started_us) {
            return Err(AttemptError::Retry(ReadProblem::Slow { elapsed_us }));
        }
        let shape = match examine_block(&reader.layout, key, &block) {
            BlockVerdict::Match(found) => ValueShape::of(&found),
            BlockVerdict::OtherKey => return Ok(Landed::OtherKey),
            BlockVerdict::Torn(error) => return Err(torn(error)),
        };
        let (version, deadline) = (shape.version, shape.deadline);
        Ok(Landed::Match(Found {
            value: shape.take(block),
            deadline,
            location: CachedLocation {
                epoch: reader.layout.region_epoch,
                block_offset: offset,
                block_len: len,
                version,
            },
        }))
    }
}

/// A value found by [`IntoBuffer`]: the first `len` bytes of the buffer,
/// unless it is longer than the buffer (then the buffer holds nothing).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ValueInto {
    pub(crate) len: usize,
    pub(crate) version: u64,
    pub(crate) deadline: DeadlineUnixMs,
}

/// The block's header and key copied into a stack buffer and its value
/// straight into the caller's buffer, in one split read (one doorbell on
/// RDMA); no allocation. The GET's clock is read right after the copy,
/// before the block is judged (the judging, CRC included, reads nothing
/// more: the reading is after every byte the answer rests on, and the
/// clock's ordering waits for the copy's loads only, not for the CRC);
/// the abandon bound is the caller's to check with it. What puts the
/// reading after the loads is the clock itself, not the fence (an acquire
/// fence orders memory accesses, and on x86 compiles to nothing): the
/// vDSO's `clock_gettime` reads the counter ordered (`lfence; rdtsc` or
/// `rdtscp` on x86, `isb` before the counter on arm64), so it waits for
/// every earlier load. A clock read from a raw, unordered counter would
/// break that. Each candidate block landed takes a reading (a collision's
/// or a torn block's is discarded); the matching one's is the GET's.
pub(crate) struct IntoBuffer<'b, C> {
    pub(crate) buf: &'b mut [u8],
    pub(crate) now: C,
    /// The reading after the copy of the block that matched: the attempt
    /// returned right after it, so it is the GET's reading. `None` after
    /// any other verdict (the caller reads the clock after the attempt).
    pub(crate) matched_at: Option<ReadTime>,
}

impl<C: FnMut() -> ReadTime> IntoBuffer<'_, C> {
    /// The split read with a head buffer of `N` bytes (header + key).
    fn land_split<const N: usize>(
        &mut self,
        reader: &RegionReader,
        key: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Landed<ValueInto>, AttemptError> {
        let mut head = [0u8; N];
        let head = &mut head[..BLOCK_HEADER_BYTES + key.len()];
        // The class bounds the value: read no more of it than is there.
        let room = (len as usize).saturating_sub(head.len());
        let tail_len = room.min(self.buf.len());
        let tail = &mut self.buf[..tail_len];
        reader.region.read_split(offset, head, tail)?;
        // As after a whole copy: validation sees the bytes the slot published.
        fence(Ordering::Acquire);
        let time = (self.now)();
        match examine_block_split(&reader.layout, key, head, tail) {
            SplitVerdict::Match {
                value_len,
                version,
                deadline,
            } => {
                self.matched_at = Some(time);
                Ok(Landed::Match(ValueInto {
                    len: value_len,
                    version,
                    deadline,
                }))
            }
            SplitVerdict::OtherKey => Ok(Landed::OtherKey),
            SplitVerdict::Torn(error) => Err(torn(error)),
            SplitVerdict::Unread => self.land_whole(reader, key, offset, len),
        }
    }

    /// A long key, or a block longer than the split read took (another
    /// key's, or a value longer than the buffer): the block read whole and
    /// judged as `get` judges it; a value that fits is copied out.
    fn land_whole(
        &mut self,
        reader: &RegionReader,
        key: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Landed<ValueInto>, AttemptError> {
        let block = read_whole(reader, offset, len)?;
        let time = (self.now)();
        match examine_block(&reader.layout, key, &block) {
            BlockVerdict::Match(found) => {
                if let Some(out) = self.buf.get_mut(..found.value.len()) {
                    out.copy_from_slice(found.value);
                }
                self.matched_at = Some(time);
                Ok(Landed::Match(ValueInto {
                    len: found.value.len(),
                    version: found.version,
                    deadline: found.deadline,
                }))
            }
            BlockVerdict::OtherKey => Ok(Landed::OtherKey),
            BlockVerdict::Torn(error) => Err(torn(error)),
        }
    }
}

impl<C: FnMut() -> ReadTime> Landing for IntoBuffer<'_, C> {
    type Found = ValueInto;

    fn land(
        &mut self,
        reader: &RegionReader,
        key: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<Landed<ValueInto>, AttemptError> {
        self.matched_at = None;
        // The whole block starts loading while its header is read and checked.
        reader.region.prefetch(offset, len);
        if BLOCK_HEADER_BYTES as u64 + key.len() as u64 > len {
            // Too small a class for this key: not its block, if whole.
            self.land_whole(reader, key, offset, len)
        } else if key.len() <= SHORT_KEY_BYTES {
            self.land_split::<{ BLOCK_HEADER_BYTES + SHORT_KEY_BYTES }>(reader, key, offset, len)
        } else if key.len() <= INLINE_KEY_BYTES {
            self.land_split::<{ BLOCK_HEADER_BYTES + INLINE_KEY_BYTES }>(reader, key, offset, len)
        } else {
            self.land_whole(reader, key, offset, len)
        }
    }
}
