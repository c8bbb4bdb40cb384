//! The client's pool of registered read buffers: one memory region cut into
//! fixed slots. A READ lands in slots only (the NIC writes there, then the
//! data is copied out to the caller), so the pool is registered once, not
//! per read. A read longer than a slot is split into one READ per slot,
//! chained in the same post (one doorbell).
//!
//! This module is the bookkeeping (which slots are free, how a read is
//! split); the registered memory itself is in `verbs::buffers` (feature
//! `rdma`).

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PoolError {
    #[error("slot {slot} released twice (or never acquired)")]
    NotInUse { slot: u32 },
    #[error("a read of {len_bytes} bytes needs {needed} slots; the pool has {capacity}")]
    TooLarge {
        len_bytes: u64,
        needed: u64,
        capacity: u32,
    },
}

/// Which slots are free.
#[derive(Debug)]
pub struct SlotPool {
    slot_bytes: u32,
    free: Vec<u32>,
    in_use: Vec<bool>,
}

impl SlotPool {
    pub fn new(slot_count: u32, slot_bytes: u32) -> SlotPool {
        SlotPool {
            slot_bytes,
            // Popped from the end: low slots first (warm cache lines).
            free: (0..slot_count).rev().collect(),
            in_use: vec![false; slot_count as usize],
        }
    }

    pub fn slot_bytes(&self) -> u32 {
        self.slot_bytes
    }

    pub fn capacity(&self) -> u32 {
        self.in_use.len() as u32
    }

    pub fn free_slots(&self) -> u32 {
        self.free.len() as u32
    }

    /// Slots a read of `len_bytes` needs, or why it can never fit.
    pub fn slots_for(&self, len_bytes: u64) -> Result<u32, PoolError> {
        let needed = len_bytes.div_ceil(u64::from(self.slot_bytes.max(1))).max(1);
        match u32::try_from(needed) {
            Ok(n) if n <= self.capacity() => Ok(n),
            _ => Err(PoolError::TooLarge {
                len_bytes,
                needed,
                capacity: self.capacity(),
            }),
        }
    }

    /// `n` free slots, or `None` (wait for a release) if fewer are free.
    pub fn acquire(&mut self, n: u32) -> Option<Vec<u32>> {
        if (self.free.len() as u64) < u64::from(n) {
            return None;
        }
        let at = self.free.len() - n as usize;
        let slots = self.free.split_off(at);
        for &slot in &slots {
            self.in_use[slot as usize] = true;
        }
        Some(slots)
    }

    pub fn release(&mut self, slot: u32) -> Result<(), PoolError> {
        match self.in_use.get_mut(slot as usize) {
            Some(used) if *used => {
                *used = false;
                self.free.push(slot);
                Ok(())
            }
            _ => Err(PoolError::NotInUse { slot }),
        }
    }
}

/// One READ of a split read: `len` bytes at `remote_offset` into the slot's
/// first bytes, to be copied to `buf[buf_offset..]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPiece {
    pub remote_offset: u64,
    pub buf_offset: usize,
    pub len: u32,
}

/// Cuts a read of `len` bytes at `remote_offset` into slot-sized pieces.
pub fn split_read(remote_offset: u64, len: usize, slot_bytes: u32) -> Vec<ReadPiece> {
    let step = slot_bytes.max(1) as usize;
    let count = len.div_ceil(step).max(1);
    (0..count)
        .map(|i| {
            let buf_offset = i * step;
            ReadPiece {
                remote_offset: remote_offset + buf_offset as u64,
                buf_offset,
                // At most `step`, which is a u32.
                len: step.min(len - buf_offset) as u32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_once_and_come_back() {
        let mut pool = SlotPool::new(4, 1024);
        assert_eq!(pool.slots_for(0), Ok(1));
        assert_eq!(pool.slots_for(1024), Ok(1));
        assert_eq!(pool.slots_for(1025), Ok(2));
        assert_eq!(pool.slots_for(4096), Ok(4));
        assert!(matches!(
            pool.slots_for(4097),
            Err(PoolError::TooLarge { needed: 5, .. })
        ));
        assert!(pool.slots_for(u64::MAX).is_err());
        let a = pool.acquire(3).unwrap();
        assert_eq!(a, vec![2, 1, 0]);
        assert_eq!(pool.acquire(2), None);
        let b = pool.acquire(1).unwrap();
        assert_eq!(b, vec![3]);
        assert_eq!(pool.free_slots(), 0);
        pool.release(1).unwrap();
        assert_eq!(pool.release(1), Err(PoolError::NotInUse { slot: 1 }));
        assert_eq!(pool.release(99), Err(PoolError::NotInUse { slot: 99 }));
        assert_eq!(pool.acquire(1), Some(vec![1]));
        for slot in [0, 1, 2, 3] {
            pool.release(slot).unwrap();
        }
        assert_eq!(pool.free_slots(), 4);
    }

    #[test]
    fn reads_split_into_slot_pieces_that_cover_them_exactly() {
        assert_eq!(
            split_read(100, 0, 64),
            vec![ReadPiece {
                remote_offset: 100,
                buf_offset: 0,
                len: 0
            }]
        );
        for (len, slot) in [
            (1usize, 64u32),
            (64, 64),
            (65, 64),
            (1000, 128),
            (4096, 4096),
        ] {
            let pieces = split_read(4096, len, slot);
            assert_eq!(pieces.len(), len.div_ceil(slot as usize));
            let mut next = 0usize;
            for p in &pieces {
                assert_eq!(p.buf_offset, next);
                assert_eq!(p.remote_offset, 4096 + next as u64);
                assert!(p.len <= slot && p.len > 0);
                next += p.len as usize;
            }
            assert_eq!(next, len);
        }
    }
}
