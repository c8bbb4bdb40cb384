//! Several keys in two batched rounds of reads (like one doorbell per round
//! on RDMA): every key's neighbourhood, then every candidate block. A key
//! whose first try does not settle cleanly is read again on its own.

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

impl RegionReader {
    /// Several keys with two batched rounds of reads. A key whose first try
    /// does not settle cleanly (a fingerprint collision, a torn or
    /// invalidated block, a slow round) is read again on its own with
    /// [`RegionReader::get`]: same validation, same answers.
    pub fn get_many(&self, keys: &[Bytes]) -> Result<Vec<Option<Versioned>>, ReadError> {
        let started_us = self.clock.now_us();
        let plans = self.plan_all(keys)?;
        let blocks = self.read_planned_blocks(&plans)?;
        let too_slow = self.past_abandon_bound(started_us).is_some();
        let mut values = Vec::with_capacity(keys.len());
        for ((key, plan), block) in keys.iter().zip(&plans).zip(blocks) {
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
        Ok(values)
    }

    /// Round one, and what it decided for each key.
    fn plan_all<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Plan>, ReadError> {
        let hashes: Vec<KeyHash> = keys
            .iter()
            .map(|k| self.layout.key_hash(k.as_ref()))
            .collect();
        let neighbourhoods = self.read_neighbourhoods(&hashes)?;
        let span = self.layout.neighbourhood_bytes() as usize;
        Ok(keys
            .iter()
            .zip(&hashes)
            .zip(neighbourhoods.chunks(span))
            .map(|((key, hash), bytes)| self.plan(key.as_ref(), *hash, bytes))
            .collect())
    }

    /// One round of a batch: every range is asked for (`prefetch`) before
    /// any is copied. The copies are independent of each other, yet a
    /// core copying them one after another from a mapping takes their
    /// cache misses about one at a time; asked for first, the misses
    /// overlap, as one doorbell lets an RDMA NIC fetch a whole batch (a
    /// remote region ignores the hint and batches in its transport). Over
    /// shm it lets YCSB-C's batched reads run about a fifth faster
    /// (docs/benchmarks.md, issue 17).
    fn read_round(&self, ops: &mut [ReadOp<'_>]) -> Result<(), ReadError> {
        for op in ops.iter() {
            self.region.prefetch(op.offset, op.buf.len() as u64);
        }
        self.region.read_batch(ops)?;
        Ok(())
    }

    /// Round one: every key's neighbourhood, back to back in one buffer.
    fn read_neighbourhoods(&self, hashes: &[KeyHash]) -> Result<Vec<u8>, ReadError> {
        let span = self.layout.neighbourhood_bytes() as usize;
        let mut neighbourhoods = vec![0u8; span * hashes.len()];
        let mut ops: Vec<ReadOp<'_>> = neighbourhoods
            .chunks_mut(span)
            .zip(hashes)
            .map(|(buf, hash)| ReadOp {
                offset: self.layout.neighbourhood_range(*hash).0,
                buf,
            })
            .collect();
        self.read_round(&mut ops)?;
        drop(ops);
        fence(Ordering::Acquire);
        Ok(neighbourhoods)
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
        let mut ops: Vec<ReadOp<'_>> = plans
            .iter()
            .zip(blocks.iter_mut())
            .filter_map(|(plan, buf)| match plan {
                Plan::Block { offset, .. } => Some(ReadOp {
                    offset: *offset,
                    buf: buf.as_mut_slice(),
                }),
                _ => None,
            })
            .collect();
        self.read_round(&mut ops)?;
        drop(ops);
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
    /// the rules of [`RegionReader::get_into`]: every neighbourhood in one
    /// batch, every candidate block (header and key into scratch, value into
    /// its buffer) in a second, so two doorbells on RDMA. The batch's clock
    /// is read once, after the second round; a key that does not settle is
    /// read again alone. A value longer than its buffer fails the whole
    /// call with `BufferTooSmall`.
    pub fn get_many_into(
        &self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
        out: &mut [Option<GotInto>],
        since: ReadTime,
        mut now: impl FnMut() -> ReadTime,
    ) -> Result<ReadTime, ReadError> {
        let n = keys.len().min(bufs.len()).min(out.len());
        let (keys, bufs, out) = (&keys[..n], &mut bufs[..n], &mut out[..n]);
        let plans = self.plan_all(keys)?;
        let (heads, landed) = self.read_split_blocks(keys, &plans, bufs)?;
        let mut time = now();
        let too_slow = self
            .abandon_bound_between(since.monotonic_us, time.monotonic_us)
            .is_some();
        for i in 0..n {
            let settled = match (&plans[i], &landed[i]) {
                (Plan::Absent, _) => Some(None),
                (Plan::Block { .. }, Some(at)) if !too_slow => {
                    let tail = &bufs[i][..at.tail_len];
                    match examine_block_split(&self.layout, keys[i], &heads[at.head.clone()], tail)
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

    /// Round two of `get_many_into`: each planned block's head into one
    /// scratch buffer and its value into its key's buffer, one batch.
    fn read_split_blocks(
        &self,
        keys: &[&[u8]],
        plans: &[Plan],
        bufs: &mut [&mut [u8]],
    ) -> Result<(Vec<u8>, Vec<Option<Landed>>), ReadError> {
        let mut landed: Vec<Option<Landed>> = Vec::with_capacity(keys.len());
        let mut head_bytes = 0;
        for ((key, plan), buf) in keys.iter().zip(plans).zip(bufs.iter()) {
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
        let mut heads = vec![0u8; head_bytes];
        let mut ops: Vec<ReadOp<'_>> = Vec::with_capacity(2 * keys.len());
        let mut rest: &mut [u8] = &mut heads;
        for ((plan, at), buf) in plans.iter().zip(&landed).zip(bufs.iter_mut()) {
            let (Plan::Block { offset, .. }, Some(at)) = (plan, at) else {
                continue;
            };
            let (head, after) = std::mem::take(&mut rest).split_at_mut(at.head.len());
            rest = after;
            ops.push(ReadOp {
                offset: *offset,
                buf: head,
            });
            ops.push(ReadOp {
                offset: offset + at.head.len() as u64,
                buf: &mut buf[..at.tail_len],
            });
        }
        self.read_round(&mut ops)?;
        drop(ops);
        fence(Ordering::Acquire);
        Ok((heads, landed))
    }
}
