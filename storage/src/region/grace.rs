//! Retired blocks wait here until no reader can still be reading them
//! (invariant 3): a block goes back to the allocator only `grace_period_us`
//! after the slot that pointed to it was changed.

use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetiredBlock {
    pub retired_at_us: u64,
    pub offset_units: u64,
    pub units: u64,
}

#[derive(Debug, Default)]
pub struct GraceQueue {
    /// In retirement order, which is time order (the clock is monotonic).
    queue: VecDeque<RetiredBlock>,
    pending_units: u64,
}

impl GraceQueue {
    pub fn retire(&mut self, block: RetiredBlock) {
        debug_assert!(
            self.queue
                .back()
                .is_none_or(|last| last.retired_at_us <= block.retired_at_us)
        );
        self.pending_units += block.units;
        self.queue.push_back(block);
    }

    /// Pops the oldest block if its grace period has passed at `now_us`.
    pub fn pop_expired(&mut self, now_us: u64, grace_period_us: u64) -> Option<RetiredBlock> {
        let front = self.queue.front()?;
        if now_us.saturating_sub(front.retired_at_us) < grace_period_us {
            return None;
        }
        let block = self.queue.pop_front()?;
        self.pending_units -= block.units;
        Some(block)
    }

    /// When the oldest pending block becomes reusable, if any is pending.
    pub fn next_expiry_us(&self, grace_period_us: u64) -> Option<u64> {
        self.queue
            .front()
            .map(|b| b.retired_at_us.saturating_add(grace_period_us))
    }

    pub fn pending_units(&self) -> u64 {
        self.pending_units
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(retired_at_us: u64) -> RetiredBlock {
        RetiredBlock {
            retired_at_us,
            offset_units: retired_at_us,
            units: 2,
        }
    }

    #[test]
    fn blocks_come_back_in_order_once_their_grace_period_has_passed() {
        let mut queue = GraceQueue::default();
        assert!(queue.is_empty());
        assert_eq!(queue.next_expiry_us(100), None);
        queue.retire(block(10));
        queue.retire(block(20));
        assert!(!queue.is_empty());
        assert_eq!((queue.len(), queue.pending_units()), (2, 4));
        assert_eq!(queue.next_expiry_us(100), Some(110));
        assert_eq!(queue.pop_expired(109, 100), None);
        assert_eq!(queue.pop_expired(110, 100), Some(block(10)));
        assert_eq!(queue.pop_expired(110, 100), None);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.pop_expired(500, 100), Some(block(20)));
        assert!(queue.is_empty());
    }
}
