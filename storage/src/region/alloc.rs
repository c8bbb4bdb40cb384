//! The data-area allocator. Blocks are sized by class (see
//! `rdkv_proto::region::SizeClass`), carved best-fit from free extents that
//! coalesce on free, so space freed by one class serves any other and
//! fragmentation stays measurable (1 - largest extent / free).
//!
//! Units are 64-byte data-area units; the allocator never touches memory.

use std::collections::{BTreeMap, BTreeSet};

/// A free that overlaps free space: the caller's bookkeeping is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoubleFree {
    pub offset_units: u64,
    pub units: u64,
}

#[derive(Debug, Clone)]
pub struct BlockAllocator {
    /// offset -> length of every free extent.
    by_offset: BTreeMap<u64, u64>,
    /// (length, offset) of every free extent, for best fit.
    by_size: BTreeSet<(u64, u64)>,
    total_units: u64,
    free_units: u64,
}

impl BlockAllocator {
    pub fn new(total_units: u64) -> BlockAllocator {
        let mut allocator = BlockAllocator {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
            total_units,
            free_units: 0,
        };
        if total_units > 0 {
            allocator.insert_extent(0, total_units);
        }
        allocator
    }

    fn insert_extent(&mut self, offset: u64, units: u64) {
        self.by_offset.insert(offset, units);
        self.by_size.insert((units, offset));
        self.free_units += units;
    }

    fn remove_extent(&mut self, offset: u64, units: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(units, offset));
        self.free_units -= units;
    }

    /// Smallest free extent that fits (lowest offset among equals), split from
    /// its front. `None` when no extent is large enough.
    pub fn alloc(&mut self, units: u64) -> Option<u64> {
        debug_assert!(units > 0);
        let &(extent_units, offset) = self.by_size.range((units, 0)..).next()?;
        self.remove_extent(offset, extent_units);
        if extent_units > units {
            self.insert_extent(offset + units, extent_units - units);
        }
        Some(offset)
    }

    /// Returns an extent, merging it with free neighbours.
    pub fn free(&mut self, offset: u64, units: u64) -> Result<(), DoubleFree> {
        let end = offset.checked_add(units);
        let error = DoubleFree {
            offset_units: offset,
            units,
        };
        let Some(end) = end.filter(|&e| units > 0 && e <= self.total_units) else {
            return Err(error);
        };
        let before = self
            .by_offset
            .range(..=offset)
            .next_back()
            .map(|(&o, &l)| (o, l));
        let after = self.by_offset.range(offset..).next().map(|(&o, &l)| (o, l));
        if before.is_some_and(|(o, l)| o + l > offset) || after.is_some_and(|(o, _)| o < end) {
            return Err(error);
        }
        let (mut start, mut stop) = (offset, end);
        if let Some((o, l)) = before.filter(|&(o, l)| o + l == offset) {
            self.remove_extent(o, l);
            start = o;
        }
        if let Some((o, l)) = after.filter(|&(o, _)| o == end) {
            self.remove_extent(o, l);
            stop = o + l;
        }
        self.insert_extent(start, stop - start);
        Ok(())
    }

    pub fn free_units(&self) -> u64 {
        self.free_units
    }

    pub fn largest_free_units(&self) -> u64 {
        self.by_size.last().map_or(0, |&(units, _)| units)
    }

    pub fn free_extents(&self) -> usize {
        self.by_offset.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_that_are_empty_overrun_or_overlap_one_side_are_refused() {
        let mut allocator = BlockAllocator::new(100);
        let first = allocator.alloc(10).expect("first"); // 0..10
        let second = allocator.alloc(10).expect("second"); // 10..20
        assert!(allocator.free(first, 0).is_err(), "empty");
        assert!(allocator.free(95, 10).is_err(), "past the end");
        // 15..25 overlaps the free extent after it (20..100) alone.
        assert!(allocator.free(second + 5, 10).is_err(), "overlaps after");
        allocator.free(first, 10).expect("free first");
        // 5..15 overlaps the free extent before it (0..10) alone.
        assert!(allocator.free(5, 10).is_err(), "overlaps before");
        assert_eq!(allocator.free_units(), 90);
    }
    use proptest::prelude::*;

    #[test]
    fn split_and_coalesce() {
        let mut a = BlockAllocator::new(100);
        let x = a.alloc(10).unwrap();
        let y = a.alloc(20).unwrap();
        let z = a.alloc(30).unwrap();
        assert_eq!((x, y, z), (0, 10, 30));
        assert_eq!(a.free_units(), 40);
        a.free(y, 20).unwrap();
        assert_eq!(a.free_extents(), 2);
        assert_eq!(a.alloc(15), Some(10), "best fit takes the 20-unit hole");
        a.free(10, 15).unwrap();
        a.free(x, 10).unwrap();
        a.free(z, 30).unwrap();
        assert_eq!(a.free_extents(), 1);
        assert_eq!(a.largest_free_units(), 100);
        assert_eq!(a.alloc(101), None);
    }

    #[test]
    fn double_and_out_of_range_frees_are_refused() {
        let mut a = BlockAllocator::new(100);
        let x = a.alloc(10).unwrap();
        a.free(x, 10).unwrap();
        assert!(a.free(x, 10).is_err());
        assert!(a.free(95, 10).is_err());
        assert!(a.free(u64::MAX, 2).is_err());
        assert_eq!(a.free_units(), 100);
    }

    proptest! {
        #[test]
        fn never_hands_out_overlapping_extents(ops in proptest::collection::vec((any::<bool>(), 1u64..40), 1..300)) {
            let mut a = BlockAllocator::new(1000);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (is_alloc, n) in ops {
                if is_alloc || live.is_empty() {
                    if let Some(off) = a.alloc(n) {
                        for &(o, l) in &live {
                            prop_assert!(off + n <= o || o + l <= off);
                        }
                        prop_assert!(off + n <= 1000);
                        live.push((off, n));
                    } else {
                        prop_assert!(a.largest_free_units() < n);
                    }
                } else {
                    let (o, l) = live.swap_remove((n as usize) % live.len());
                    a.free(o, l).unwrap();
                }
                let used: u64 = live.iter().map(|&(_, l)| l).sum();
                prop_assert_eq!(used + a.free_units(), 1000);
            }
            for (o, l) in live { a.free(o, l).unwrap(); }
            prop_assert_eq!(a.largest_free_units(), 1000);
        }
    }
}
