//! The work-request id table: every posted work request carries a 64-bit
//! `wr_id`, and its completion hands the id back. The id is a slab index
//! (low 32 bits) plus the slot's generation (high 32 bits), bumped every
//! time the slot is freed, so a late or duplicated completion for a request
//! that already completed (or was failed at teardown) finds another
//! generation and completes nothing.
//!
//! Bounded: the table holds at most `capacity` requests (the completion
//! queue's depth), so a full table is back-pressure, never growth.

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("all {capacity} work-request ids are in use")]
pub struct WrTableFull {
    pub capacity: u32,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

#[derive(Debug)]
pub struct WrTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    capacity: u32,
    len: u32,
}

fn split(wr_id: u64) -> (u32, u32) {
    // Truncations are the encoding: high half generation, low half index.
    ((wr_id >> 32) as u32, wr_id as u32)
}

impl<T> WrTable<T> {
    pub fn new(capacity: u32) -> WrTable<T> {
        WrTable {
            slots: Vec::new(),
            free: Vec::new(),
            capacity,
            len: 0,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Stores `value`; the returned id goes into the work request.
    pub fn insert(&mut self, value: T) -> Result<u64, WrTableFull> {
        let index = match self.free.pop() {
            Some(index) => index,
            None if (self.slots.len() as u64) < u64::from(self.capacity) => {
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                (self.slots.len() - 1) as u32
            }
            None => {
                return Err(WrTableFull {
                    capacity: self.capacity,
                });
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.value = Some(value);
        self.len += 1;
        Ok((u64::from(slot.generation) << 32) | u64::from(index))
    }

    /// Stores every entry, or none: on refusal the entries inserted so far
    /// are taken back, so nothing of a half-registered batch stays behind
    /// for a completion that can never come.
    pub fn insert_all(
        &mut self,
        entries: impl IntoIterator<Item = T>,
    ) -> Result<Vec<u64>, WrTableFull> {
        let mut ids = Vec::new();
        for entry in entries {
            match self.insert(entry) {
                Ok(id) => ids.push(id),
                Err(full) => {
                    for id in ids {
                        self.take(id);
                    }
                    return Err(full);
                }
            }
        }
        Ok(ids)
    }

    /// The request a completion names, removed; `None` for an id that is not
    /// (or no longer) live: a stale generation, a free slot, an index never
    /// handed out.
    pub fn take(&mut self, wr_id: u64) -> Option<T> {
        let (generation, index) = split(wr_id);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.len -= 1;
        Some(value)
    }

    /// The live request an id names, without removing it.
    pub fn get(&self, wr_id: u64) -> Option<&T> {
        let (generation, index) = split(wr_id);
        let slot = self.slots.get(index as usize)?;
        (slot.generation == generation)
            .then_some(slot.value.as_ref())
            .flatten()
    }

    /// Removes every live request (connection teardown): their ids become
    /// stale, so completions still in the queue match nothing.
    pub fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len as usize);
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if let Some(value) = slot.value.take() {
                slot.generation = slot.generation.wrapping_add(1);
                self.free.push(index as u32);
                out.push(value);
            }
        }
        self.len = 0;
        out
    }

    /// Removes the live requests `matches` selects (one connection's, on a
    /// shared completion queue).
    pub fn drain_where(&mut self, mut matches: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.value.as_ref().is_some_and(&mut matches)
                && let Some(value) = slot.value.take()
            {
                slot.generation = slot.generation.wrapping_add(1);
                self.free.push(index as u32);
                self.len -= 1;
                out.push(value);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_complete_once_and_stale_ids_match_nothing() {
        let mut table = WrTable::new(2);
        let a = table.insert("a").unwrap();
        let b = table.insert("b").unwrap();
        assert_eq!(table.insert("c"), Err(WrTableFull { capacity: 2 }));
        assert_eq!(table.get(a), Some(&"a"));
        assert_eq!(table.take(a), Some("a"));
        // A duplicated completion of `a` finds nothing.
        assert_eq!(table.take(a), None);
        // The slot is reused under a new generation: the old id stays dead.
        let c = table.insert("c").unwrap();
        assert_eq!(c as u32, a as u32, "same slot");
        assert_ne!(c, a, "another generation");
        assert_eq!(table.take(a), None);
        assert_eq!(table.take(c), Some("c"));
        assert_eq!(table.take(b), Some("b"));
        assert!(table.is_empty());
        // Ids never handed out.
        assert_eq!(table.take(u64::MAX), None);
        assert_eq!(table.take(7), None);
    }

    #[test]
    fn drained_requests_cannot_be_completed_later() {
        let mut table = WrTable::new(8);
        let ids: Vec<u64> = (0..5).map(|i| table.insert(i).unwrap()).collect();
        let mut evens = table.drain_where(|v| v % 2 == 0);
        evens.sort_unstable();
        assert_eq!(evens, vec![0, 2, 4]);
        assert_eq!(table.len(), 2);
        assert_eq!(table.take(ids[0]), None);
        let mut rest = table.drain();
        rest.sort_unstable();
        assert_eq!(rest, vec![1, 3]);
        assert!(ids.iter().all(|id| table.take(*id).is_none()));
        // Capacity comes back in full.
        for i in 0..8 {
            table.insert(i).unwrap();
        }
        assert!(table.insert(9).is_err());
    }

    #[test]
    fn a_batch_is_inserted_whole_or_not_at_all() {
        let mut table = WrTable::new(4);
        let kept = table.insert(0).unwrap();
        assert_eq!(
            table.insert_all([1, 2, 3, 4]),
            Err(WrTableFull { capacity: 4 })
        );
        assert_eq!(table.len(), 1);
        let ids = table.insert_all([1, 2, 3]).unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(table.take(kept), Some(0));
    }

    #[test]
    fn generations_wrap_without_colliding_with_live_ids() {
        let mut table = WrTable::new(1);
        let first = table.insert(()).unwrap();
        table.take(first).unwrap();
        for _ in 0..1000 {
            let id = table.insert(()).unwrap();
            assert_eq!(table.take(first), None);
            table.take(id).unwrap();
        }
    }
}
