//! Counters that several threads bump on every read: one cache line per
//! stripe, a thread always bumping the same stripe, so that two readers on
//! two cores do not pass a counter's line back and forth (a shared counter
//! cost each GET a cache miss once two threads read). Sums are taken over
//! the stripes when someone looks.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stripes per set: enough for the threads of one client on a large host
/// to rarely share one.
const STRIPES: usize = 16;

/// A value on a cache line of its own (128 bytes: adjacent-line prefetch
/// pulls lines in pairs on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// `STRIPES` copies of `T`; a thread uses the one [`Striped::local`] gives it.
/// A fixed-size array: the stripe index is masked, not divided by a length
/// known only at run time (a `div` on every counted GET).
#[derive(Debug)]
pub struct Striped<T> {
    stripes: Box<[Padded<T>; STRIPES]>,
}

const _: () = assert!(STRIPES.is_power_of_two());

impl<T: Default> Default for Striped<T> {
    fn default() -> Self {
        Striped {
            stripes: Box::new(std::array::from_fn(|_| Padded::default())),
        }
    }
}

/// Which stripe this thread uses: threads are numbered in the order they
/// first ask.
fn thread_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|stripe| {
        if stripe.get() == usize::MAX {
            stripe.set(NEXT.fetch_add(1, Ordering::Relaxed) & (STRIPES - 1));
        }
        stripe.get()
    })
}

impl<T> Striped<T> {
    /// This thread's stripe.
    pub fn local(&self) -> &T {
        &self.stripes[thread_stripe() & (STRIPES - 1)].0
    }

    /// Every stripe, to sum.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.stripes.iter().map(|padded| &padded.0)
    }

    /// The sum over the stripes of one counter of `T`.
    pub fn sum(&self, counter: impl Fn(&T) -> &AtomicU64) -> u64 {
        self.iter()
            .map(|stripe| counter(stripe).load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_threads_counts_are_in_the_sum() {
        let counters: Striped<AtomicU64> = Striped::default();
        std::thread::scope(|scope| {
            for _ in 0..40 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counters.local().fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(counters.sum(|c| c), 40_000);
        assert!(std::ptr::eq(counters.local(), counters.local()));
    }
}
