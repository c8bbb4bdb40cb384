//! Several keys in two batched rounds of reads (like one doorbell per round
//! on RDMA): every key's neighbourhood, then every candidate block. A key
//! whose first try does not settle cleanly is read again on its own.

use std::sync::atomic::{Ordering, fence};

use bytes::Bytes;
use rdkv_proto::region::{
    BlockVerdict, ChainWalk, KeyHash, NeighbourhoodWords, ValueShape, examine_block,
    neighbourhood_slots,
};
use rdkv_proto::wire::Versioned;

use crate::reader::{ReadError, RegionReader};
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
        let hashes: Vec<KeyHash> = keys.iter().map(|k| self.layout.key_hash(k)).collect();
        let neighbourhoods = self.read_neighbourhoods(&hashes)?;
        let span = self.layout.neighbourhood_bytes() as usize;
        let plans: Vec<Plan> = keys
            .iter()
            .zip(&hashes)
            .zip(neighbourhoods.chunks(span))
            .map(|((key, hash), bytes)| self.plan(key, *hash, bytes))
            .collect();
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
        self.region.read_batch(&mut ops)?;
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
        self.region.read_batch(&mut ops)?;
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
