//! Several keys in two batched rounds of reads (like one doorbell per round
//! on RDMA): every key's neighbourhood, then every candidate block. A key
//! whose first try does not settle cleanly is read again on its own.

use std::cell::RefCell;
use std::sync::atomic::{Ordering, fence};

use bytes::Bytes;
use rdkv_proto::region::{
    BLOCK_HEADER_BYTES, BlockVerdict, ChainWalk, KeyHash, NeighbourhoodWords, SplitVerdict,
    ValueShape, examine_block, examine_block_split, neighbourhood_slots,
};
use rdkv_proto::wire::Versioned;

use crate::reader::landing::{INLINE_KEY_BYTES, ValueInto};
use crate::reader::{GotInto, ReadError, ReadTime, RegionReader};
use crate::transport::ReadOp;

/// What the first round of a batched read decided for one key.
enum Plan {
    /// No candidate slot, every slot checked and no overflow chain: absent.
    Absent,
    /// One candidate: read this block in the second round.
    Block { offset: u64, len: u64 },
    /// Anything else (several candidates, a slot that fails its check, an
    /// overflow chain to walk): read the key on its own.
    Alone,
}

/// Keys read in one pair of rounds: a longer batch is read in chunks of
/// this many, each with its own two rounds (two doorbells on RDMA) and
/// clock reading, so that a round's reads fit on the stack. Chunks of 64
/// made batched YCSB-C reads over shm about 5% slower than 16 (filling a
/// round's array of 128 reads cost more than it saved; docs/benchmarks.md).
pub const BATCH_KEYS: usize = 16;
/// The reads of one round: a chunk's blocks, each as head and value.
const MAX_ROUND_READS: usize = 2 * BATCH_KEYS;

/// What a chunk's rounds keep besides the caller's buffers: kept by the
/// thread from call to call, so that `get_many_into` allocates nothing
/// once they have grown to a chunk's size.
#[derive(Default)]
struct BatchScratch {
    hashes: Vec<KeyHash>,
    neighbourhoods: Vec<u8>,
    plans: Vec<Plan>,
    heads: Vec<u8>,
    landed: Vec<Option<Landed>>,
}

thread_local! {
    static SCRATCH: RefCell<BatchScratch> = RefCell::new(BatchScratch::default());
}

impl RegionReader {
    /// Several keys with two batched rounds of reads per [`BATCH_KEYS`]. A
    /// key whose first try does not settle cleanly (a fingerprint
    /// collision, a torn or invalidated block, a slow round) is read again
    /// on its own with [`RegionReader::get`]: same validation, same answers.
    pub fn get_many(&self, keys: &[Bytes]) -> Result<Vec<Option<Versioned>>, ReadError> {
        let mut values = Vec::with_capacity(keys.len());
        let mut scratch = BatchScratch::default();
        for chunk in keys.chunks(BATCH_KEYS) {
            self.get_many_chunk(chunk, &mut scratch, &mut values)?;
        }
        Ok(values)
    }

    /// One chunk of [`RegionReader::get_many`], its answers pushed to `values`.
    fn get_many_chunk(
        &self,
        keys: &[Bytes],
        scratch: &mut BatchScratch,
        values: &mut Vec<Option<Versioned>>,
    ) -> Result<(), ReadError> {
        let started_us = self.clock.now_us();
        self.plan_into(keys, scratch)?;
        let blocks = self.read_planned_blocks(&scratch.plans)?;
        let too_slow = self.past_abandon_bound(started_us).is_some();
        for ((key, plan), block) in keys.iter().zip(&scratch.plans).zip(blocks) {
            let settled = if too_slow {
                None
            } else {
                self.settle(key, plan, block)
            };
            match settled {
                Some(value) => {
                    self.counters.finished(value.is_some());
                    values.push(value);
                }
                None => values.push(self.get(key)?),
            }
        }
        Ok(())
    }

    /// Round one of a chunk (at most [`BATCH_KEYS`] keys): what it decided
    /// for each key, into `scratch.plans`.
    fn plan_into<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        scratch: &mut BatchScratch,
    ) -> Result<(), ReadError> {
        let span = self.layout.neighbourhood_bytes() as usize;
        scratch.hashes.clear();
        scratch
            .hashes
            .extend(keys.iter().map(|k| self.layout.key_hash(k.as_ref())));
        scratch.neighbourhoods.clear();
        scratch.neighbourhoods.resize(span * keys.len(), 0);
        self.read_neighbourhoods(&scratch.hashes, &mut scratch.neighbourhoods)?;
        scratch.plans.clear();
        let planned = keys
            .iter()
            .zip(&scratch.hashes)
            .zip(scratch.neighbourhoods.chunks(span))
            .map(|((key, hash), bytes)| self.plan(key.as_ref(), *hash, bytes));
        scratch.plans.extend(planned);
        Ok(())
    }

    /// One round of a batch, the reads `ops` yields (at most
    /// [`MAX_ROUND_READS`], gathered on the stack): every range is asked
    /// for (`prefetch`) before any is copied. The copies are independent of
    /// each other, yet a core copying them one after another from a mapping
    /// takes their cache misses about one at a time; asked for first, the
    /// misses overlap, as one doorbell lets an RDMA NIC fetch a whole batch
    /// (a remote region ignores the hint and batches in its transport).
    /// Over shm it lets YCSB-C's batched reads run about a fifth faster
    /// (docs/benchmarks.md, issue 17).
    fn read_round<'a>(&self, ops: impl IntoIterator<Item = ReadOp<'a>>) -> Result<(), ReadError> {
        let mut round: [ReadOp<'a>; MAX_ROUND_READS] = std::array::from_fn(|_| ReadOp {
            offset: 0,
            buf: &mut [],
        });
        let mut count = 0;
        for op in ops {
            assert!(
                count < MAX_ROUND_READS,
                "a round of more than a chunk's reads"
            );
            round[count] = op;
            count += 1;
        }
        let round = &mut round[..count];
        for op in round.iter() {
            self.region.prefetch(op.offset, op.buf.len() as u64);
        }
        self.region.read_batch(round)?;
        Ok(())
    }

    /// Round one: every key's neighbourhood, back to back in
    /// `neighbourhoods` (one span each).
    fn read_neighbourhoods(
        &self,
        hashes: &[KeyHash],
        neighbourhoods: &mut [u8],
    ) -> Result<(), ReadError> {
        let span = self.layout.neighbourhood_bytes() as usize;
        let ops = neighbourhoods
            .chunks_mut(span)
            .zip(hashes)
            .map(|(buf, hash)| ReadOp {
                offset: self.layout.neighbourhood_range(*hash).0,
                buf,
            });
        self.read_round(ops)?;
        fence(Ordering::Acquire);
        Ok(())
    }

    fn plan(&self, key: &[u8], hash: KeyHash, neighbourhood: &[u8]) -> Plan {
        if !self.layout.admits_key(key) {
            return Plan::Absent;
        }
        let words = NeighbourhoodWords::decode(neighbourhood);
        let words = words.as_slice();
        let mut candidates = neighbourhood_slots(words, hash.fingerprint);
        match (candidates.next(), candidates.next()) {
            (None, _) => match ChainWalk::from_neighbourhood(words) {
                Ok(walk) if walk.next_table().is_none() => Plan::Absent,
                _ => Plan::Alone,
            },
            (Some((_, Ok(slot))), None) => match self.layout.block_range(slot) {
                Ok((offset, len)) => Plan::Block { offset, len },
                Err(_) => Plan::Alone,
            },
            _ => Plan::Alone,
        }
    }

    /// Round two: the candidate block of each key that has one (an empty
    /// buffer for the others).
    fn read_planned_blocks(&self, plans: &[Plan]) -> Result<Vec<Vec<u8>>, ReadError> {
        let mut blocks: Vec<Vec<u8>> = plans
            .iter()
            .map(|p| match p {
                Plan::Block { len, .. } => vec![0u8; *len as usize],
                _ => Vec::new(),
            })
            .collect();
        let ops = plans
            .iter()
            .zip(blocks.iter_mut())
            .filter_map(|(plan, buf)| match plan {
                Plan::Block { offset, .. } => Some(ReadOp {
                    offset: *offset,
                    buf: buf.as_mut_slice(),
                }),
                _ => None,
            });
        self.read_round(ops)?;
        fence(Ordering::Acquire);
        Ok(blocks)
    }

    /// The key's answer when its two rounds settle it, `None` when it must
    /// be read on its own.
    fn settle(&self, key: &[u8], plan: &Plan, block: Vec<u8>) -> Option<Option<Versioned>> {
        match plan {
            Plan::Absent => Some(None),
            Plan::Block { .. } => match examine_block(&self.layout, key, &block) {
                BlockVerdict::Match(found) => {
                    let shape = ValueShape::of(&found);
                    // An expired pair is read again alone, where `search`
                    // answers it absent.
                    self.serves(shape.deadline).then(|| Some(shape.take(block)))
                }
                _ => None,
            },
            Plan::Alone => None,
        }
    }
}

/// Where round two of `get_many_into` put a planned key's block: its head
/// (header and key) at `head` in the shared head buffer, its value in the
/// key's own buffer, `tail_len` bytes of it read.
struct Landed {
    head: std::ops::Range<usize>,
    tail_len: usize,
}

impl RegionReader {
    /// [`RegionReader::get_many`] with each value copied straight into its
    /// key's buffer (`bufs[i]` for `keys[i]`, the answer in `out[i]`), by
    /// the rules of [`RegionReader::get_into`]: per chunk of [`BATCH_KEYS`],
    /// every neighbourhood in one batch, every candidate block (header and
    /// key into scratch, value into its buffer) in a second, so two
    /// doorbells on RDMA, and one clock reading after the second round; a
    /// key that does not settle is read again alone. A value longer than
    /// its buffer fails the whole call with `BufferTooSmall`. Nothing is
    /// allocated once the thread's scratch has grown to a chunk's size
    /// (keys up to [`INLINE_KEY_BYTES`], no collision, values that fit).
    pub fn get_many_into(
        &self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
        out: &mut [Option<GotInto>],
        since: ReadTime,
        mut now: impl FnMut() -> ReadTime,
    ) -> Result<ReadTime, ReadError> {
        let n = keys.len().min(bufs.len()).min(out.len());
        if n == 0 {
            return Ok(now());
        }
        let (keys, bufs, out) = (&keys[..n], &mut bufs[..n], &mut out[..n]);
        let mut read = |scratch: &mut BatchScratch| {
            let mut time = since;
            let chunks = keys.chunks(BATCH_KEYS).zip(bufs.chunks_mut(BATCH_KEYS));
            for ((keys, bufs), out) in chunks.zip(out.chunks_mut(BATCH_KEYS)) {
                time = self.get_chunk_into(scratch, keys, bufs, out, time, &mut now)?;
            }
            Ok(time)
        };
        // The thread's scratch is taken already only if `now` itself reads
        // a batch on this thread, and gone while the thread ends: such a
        // read gets buffers of its own.
        let shared = SCRATCH.try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => Some(read(&mut scratch)),
            Err(_) => None,
        });
        match shared {
            Ok(Some(result)) => result,
            _ => read(&mut BatchScratch::default()),
        }
    }

    /// One chunk of [`RegionReader::get_many_into`], its attempt begun after
    /// `since`; returns its clock reading.
    fn get_chunk_into(
        &self,
        scratch: &mut BatchScratch,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
        out: &mut [Option<GotInto>],
        since: ReadTime,
        mut now: impl FnMut() -> ReadTime,
    ) -> Result<ReadTime, ReadError> {
        self.plan_into(keys, scratch)?;
        self.read_split_blocks(keys, bufs, scratch)?;
        let mut time = now();
        let too_slow = self
            .abandon_bound_between(since.monotonic_us, time.monotonic_us)
            .is_some();
        for i in 0..keys.len() {
            let settled = match (&scratch.plans[i], &scratch.landed[i]) {
                (Plan::Absent, _) => Some(None),
                (Plan::Block { .. }, Some(at)) if !too_slow => {
                    let head = &scratch.heads[at.head.clone()];
                    match examine_block_split(&self.layout, keys[i], head, &bufs[i][..at.tail_len])
                    {
                        SplitVerdict::Match {
                            value_len,
                            version,
                            deadline,
                        } => Some(Some(ValueInto {
                            len: value_len,
                            version,
                            deadline,
                        })),
                        _ => None,
                    }
                }
                _ => None,
            };
            out[i] = match settled {
                Some(found) => self.answer_into(found, bufs[i].len(), time)?,
                None => {
                    let (got, later) = self.get_into(keys[i], bufs[i], time, &mut now)?;
                    time = later;
                    got
                }
            };
        }
        Ok(time)
    }

    /// Round two of a chunk of `get_many_into`: each planned block's head
    /// into `scratch.heads` and its value into its key's buffer, one batch;
    /// where each landed in `scratch.landed`.
    fn read_split_blocks(
        &self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
        scratch: &mut BatchScratch,
    ) -> Result<(), ReadError> {
        let BatchScratch {
            plans,
            heads,
            landed,
            ..
        } = scratch;
        landed.clear();
        let mut head_bytes = 0;
        for ((key, plan), buf) in keys.iter().zip(plans.iter()).zip(bufs.iter()) {
            let head_len = BLOCK_HEADER_BYTES + key.len();
            landed.push(match plan {
                Plan::Block { len, .. }
                    if key.len() <= INLINE_KEY_BYTES && head_len as u64 <= *len =>
                {
                    let head = head_bytes..head_bytes + head_len;
                    head_bytes += head_len;
                    let tail_len = (*len as usize - head_len).min(buf.len());
                    Some(Landed { head, tail_len })
                }
                _ => None,
            });
        }
        heads.clear();
        heads.resize(head_bytes, 0);
        let mut rest: &mut [u8] = heads;
        let planned = plans.iter().zip(landed.iter()).zip(bufs.iter_mut());
        let ops_iter = planned.filter_map(|((plan, at), buf)| {
            let (Plan::Block { offset, .. }, Some(at)) = (plan, at) else {
                return None;
            };
            let (head, after) = std::mem::take(&mut rest).split_at_mut(at.head.len());
            rest = after;
            Some([
                ReadOp {
                    offset: *offset,
                    buf: head,
                },
                ReadOp {
                    offset: offset + at.head.len() as u64,
                    buf: &mut buf[..at.tail_len],
                },
            ])
        });
        self.read_round(ops_iter.flatten())?;
        fence(Ordering::Acquire);
        Ok(())
    }
}
