//! Counters that several threads bump on every read: one cache line per
//! stripe, a thread always bumping the same stripe, so that two readers on
//! two cores do not pass a counter's line back and forth (a shared counter
//! cost each GET a cache miss once two threads read). Sums are taken over
//! the stripes when someone looks.
//!
//! A thread owns its stripe while it lives (a claim on one of [`STRIPES`]
//! indices, the same in every `Striped`, given back when the thread ends):
//! only the owner writes it, so its counters are bumped with a plain load
//! and store ([`Striped::add`]), not a locked read-modify-write (a `lock
//! add` was a fifth of the client's own time per GET). Threads beyond
//! [`STRIPES`] live at once share one more stripe, bumped atomically.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Stripes a thread can own: enough for the reading threads of one client
/// on a large host.
const STRIPES: usize = 16;
/// The stripe of the threads that found none free.
const SHARED: usize = STRIPES;
/// A thread that has not asked yet.
const UNCLAIMED: usize = usize::MAX;

/// A value on a cache line of its own (128 bytes: adjacent-line prefetch
/// pulls lines in pairs on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// `STRIPES` owned copies of `T` and a shared one; a thread uses the one
/// [`Striped::local`] gives it. A fixed-size array: the stripe index is
/// never divided by a length known only at run time.
#[derive(Debug)]
pub struct Striped<T> {
    stripes: Box<[Padded<T>; STRIPES + 1]>,
}

impl<T: Default> Default for Striped<T> {
    fn default() -> Self {
        Striped {
            stripes: Box::new(std::array::from_fn(|_| Padded::default())),
        }
    }
}

/// Which stripe indices living threads own.
struct Claims {
    taken: [AtomicBool; STRIPES],
}

impl Claims {
    const fn new() -> Claims {
        Claims {
            taken: [const { AtomicBool::new(false) }; STRIPES],
        }
    }

    /// A free index, now taken (acquire: the previous owner's last stores
    /// to its stripes are seen before this thread adds to them), or
    /// [`SHARED`] if all are.
    fn claim(&self) -> usize {
        self.taken
            .iter()
            .position(|taken| {
                taken
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            })
            .unwrap_or(SHARED)
    }

    /// Gives `index` back (release: after this thread's last stores).
    fn release(&self, index: usize) {
        if let Some(taken) = self.taken.get(index) {
            taken.store(false, Ordering::Release);
        }
    }
}

static CLAIMS: Claims = Claims::new();

/// A thread's claim, given back when the thread ends.
struct Claim(usize);

impl Drop for Claim {
    fn drop(&mut self) {
        // Bumps after this (other thread-locals' destructors) go to the
        // shared stripe: the index may be someone else's from now on.
        STRIPE.set(SHARED);
        CLAIMS.release(self.0);
    }
}

thread_local! {
    /// This thread's stripe index: read on every bump.
    static STRIPE: Cell<usize> = const { Cell::new(UNCLAIMED) };
    /// Holds the claim until the thread ends (touched once).
    static CLAIM: Claim = Claim(CLAIMS.claim());
}

/// This thread's stripe index, claimed on first use.
#[inline]
fn thread_stripe() -> usize {
    let stripe = STRIPE.get();
    if stripe != UNCLAIMED {
        return stripe;
    }
    claim_stripe()
}

/// The thread's first bump: its claim.
#[cold]
fn claim_stripe() -> usize {
    // During thread teardown the claim is gone: share.
    let claimed = CLAIM.try_with(|claim| claim.0).unwrap_or(SHARED);
    STRIPE.set(claimed);
    claimed
}

impl<T> Striped<T> {
    /// This thread's stripe (for read-modify-writes: another thread may
    /// share it).
    pub fn local(&self) -> &T {
        &self.stripes[thread_stripe().min(SHARED)].0
    }

    /// Adds `n` to one counter of this thread's stripe: a load and a store
    /// on a stripe this thread owns (no other thread writes it; readers
    /// see each word whole), a `fetch_add` on the shared one.
    #[inline]
    pub fn add(&self, counter: impl Fn(&T) -> &AtomicU64, n: u64) {
        let index = thread_stripe().min(SHARED);
        let word = counter(&self.stripes[index].0);
        if index == SHARED {
            word.fetch_add(n, Ordering::Relaxed);
        } else {
            word.store(
                word.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        }
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
        // More threads than stripes at once: the owners' plain adds and the
        // shared stripe's atomic ones together lose nothing.
        let counters: Striped<AtomicU64> = Striped::default();
        std::thread::scope(|scope| {
            for _ in 0..40 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counters.add(|c| c, 1);
                    }
                });
            }
        });
        assert_eq!(counters.sum(|c| c), 40_000);
        assert!(std::ptr::eq(counters.local(), counters.local()));
    }

    #[test]
    fn a_claim_is_owned_by_one_thread_and_given_back() {
        let claims = Claims::new();
        let first: Vec<usize> = (0..STRIPES).map(|_| claims.claim()).collect();
        assert_eq!(first, (0..STRIPES).collect::<Vec<_>>());
        assert_eq!(claims.claim(), SHARED, "all owned: the shared stripe");
        claims.release(5);
        assert_eq!(claims.claim(), 5, "a released index is claimed again");
        claims.release(SHARED);
        assert_eq!(claims.claim(), SHARED);
    }
}
