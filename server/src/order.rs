//! The order a pipelined connection's commands must keep, by key: a command
//! waits for the earlier ones it could observe or be observed by (a read
//! after a write of its key, a write after any earlier use of its key), and
//! nothing else. Commands on different keys run at once, so a pipeline of
//! independent commands costs one round of the store, not one per command.
//! A store command without keys (FLUSHDB, SCAN) waits for everything before
//! it, and everything after it waits for it.
//!
//! A write that is one log entry (every native write, and the RESP
//! commands whose only store call is one write: SET, INCR, DEL, ...) need
//! not wait for an earlier write of its key to finish, only for it to be
//! *placed*: once the earlier one is proposed, the later one is ordered
//! after it in the log, and apply decides each in log order. Such a write
//! still finishes (and lets the reads after it run) only after the earlier
//! one has finished, so a read after both sees both even if the later one
//! failed early. A write of several steps (a RESP command that may read its
//! key before it writes) waits for the earlier write to finish.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::Notify;

/// [`Completion::state`]'s bit set once the command has finished.
const FINISHED: usize = 1;
/// What [`Completion::state`] grows by for each waiter that went on.
const PASSED: usize = 2;

#[derive(Debug, Default)]
struct Completion {
    /// [`FINISHED`], plus [`PASSED`] for every wait that returned: one word,
    /// so that taking a signal back ([`Done::withdraw`]) and a waiter going
    /// past it cannot both happen.
    state: AtomicUsize,
    notify: Notify,
}

/// A command's completion, awaited by the commands that must follow it.
#[derive(Debug, Clone)]
pub struct Done(Arc<Completion>);

impl Done {
    /// Whether both signal the same command's completion.
    fn is(&self, other: &Done) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn finished(&self) -> bool {
        self.0.state.load(Ordering::Acquire) & FINISHED != 0
    }

    /// Counts this waiter as gone past, if the command has finished.
    fn pass(&self) -> bool {
        self.0
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & FINISHED != 0).then_some(state + PASSED)
            })
            .is_ok()
    }

    /// Resolves once the command has finished (or was dropped).
    pub async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            if self.pass() {
                return;
            }
            notified.await;
        }
    }

    /// Takes back a finished signal that no waiter has gone past yet: it is
    /// unfinished again, until the returned handle is dropped. `None` once
    /// a waiter went on (or it has not finished). A RESP write refused by
    /// Raft after its place was given (`RespServer::call_placed`) takes its
    /// place back this way to be tried again ahead of the writes behind it.
    pub fn withdraw(&self) -> Option<Finish> {
        self.0
            .state
            .compare_exchange(FINISHED, 0, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Finish(Arc::clone(&self.0)))
    }
}

/// Held by a running command; dropping it finishes the command's [`Done`].
#[derive(Debug)]
pub struct Finish(Arc<Completion>);

impl Finish {
    /// The signal this handle fires.
    pub fn done(&self) -> Done {
        Done(Arc::clone(&self.0))
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.state.fetch_or(FINISHED, Ordering::Release);
        self.0.notify.notify_waiters();
    }
}

/// A new command's completion signal and the handle that fires it.
pub fn completion() -> (Finish, Done) {
    let shared = Arc::new(Completion::default());
    (Finish(Arc::clone(&shared)), Done(shared))
}

/// The commands in flight on one key.
#[derive(Debug, Default)]
struct KeyState {
    last_write: Option<Write>,
    reads_since_write: Vec<Done>,
}

/// A write in flight: when its place in the log is fixed, and when it has
/// finished.
#[derive(Debug, Clone)]
struct Write {
    placed: Done,
    finished: Done,
}

/// What an admitted command waits for: `to_start` before it runs, and
/// `to_finish` before it may report itself finished.
#[derive(Debug, Default)]
pub struct Waits {
    pub to_start: Vec<Done>,
    pub to_finish: Vec<Done>,
}

impl Waits {
    /// Waits for everything the command must follow before it runs.
    pub async fn start(&self) {
        for earlier in &self.to_start {
            earlier.wait().await;
        }
    }

    /// Waits for everything that must finish before the command does.
    pub async fn finish(&self) {
        for earlier in &self.to_finish {
            earlier.wait().await;
        }
    }
}

impl KeyState {
    fn finished(&self) -> bool {
        self.last_write
            .as_ref()
            .is_none_or(|w| w.finished.finished())
            && self.reads_since_write.iter().all(Done::finished)
    }
}

/// Finished commands are forgotten once the commands tracked reach twice
/// the count left after the last time (and at least this many). Why not at
/// every admit: that scan cost O(commands in flight) per command (1.2% of
/// a leader's CPU with 128 writes in flight per connection); doubling makes
/// it O(1) amortized, and what is tracked stays the keys of at most twice
/// the most commands ever in flight at once (or of this many). A
/// connection that goes quiet keeps its last finished ones until its next
/// command: a bounded few, and waiting for any of them returns at once.
const FORGET_MIN_COMMANDS: usize = 32;

/// What one connection's commands in flight hold, by key.
#[derive(Debug, Default)]
pub struct KeyOrder {
    keys: HashMap<Bytes, KeyState>,
    /// Every admitted command not yet seen finished.
    in_flight: Vec<Done>,
    /// The last keyless store command, if it may still run.
    barrier: Option<Done>,
    /// `in_flight`'s length at which finished commands are next forgotten.
    forget_at: usize,
}

impl KeyOrder {
    /// Admits a command on `keys` (`writes`: it may change them) whose
    /// completion is `done` and whose place among the writes of its keys is
    /// fixed at `placed` (a command that is one log entry: once proposed;
    /// any other: `done` itself); returns what it must wait for. A later
    /// write of the same keys that is placed before it finishes waits only
    /// for `placed` to start; one placed only when it finishes (`placed` is
    /// `done`), for the earlier one to finish.
    pub fn admit(&mut self, keys: &[&Bytes], writes: bool, done: &Done, placed: &Done) -> Waits {
        if self.in_flight.len() >= self.forget_at {
            self.forget_finished();
            self.forget_at = (2 * self.in_flight.len()).max(FORGET_MIN_COMMANDS);
        }
        let mut waits = Waits {
            to_start: self.barrier.iter().cloned().collect(),
            to_finish: Vec::new(),
        };
        if keys.is_empty() {
            waits.to_start.extend(self.in_flight.iter().cloned());
            self.barrier = Some(done.clone());
        }
        // A key named twice (MSET k 1 k 2) is one use: the command must not
        // wait for itself. (One key, the common case, needs no copy.)
        let deduplicated;
        let unique = if keys.len() <= 1 {
            keys
        } else {
            let mut sorted = keys.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            deduplicated = sorted;
            &deduplicated[..]
        };
        for &key in unique {
            let entry = self.keys.entry(key.clone()).or_default();
            if writes {
                if let Some(earlier) = entry.last_write.take() {
                    // Only a write placed before it finishes (one log
                    // entry, decided in apply) may start once the earlier
                    // one is placed; one of several steps may read the key
                    // first. Placed only when finished: one wait.
                    if placed.is(done) || earlier.placed.is(&earlier.finished) {
                        waits.to_start.push(earlier.finished);
                    } else {
                        waits.to_start.push(earlier.placed);
                        waits.to_finish.push(earlier.finished);
                    }
                }
                waits.to_start.append(&mut entry.reads_since_write);
                entry.last_write = Some(Write {
                    placed: placed.clone(),
                    finished: done.clone(),
                });
            } else {
                waits
                    .to_start
                    .extend(entry.last_write.iter().map(|w| w.finished.clone()));
                entry.reads_since_write.push(done.clone());
            }
        }
        self.in_flight.push(done.clone());
        waits
    }

    /// Whether a read of `keys` may run now, ahead of the commands in
    /// flight: none of them may write those keys (earlier reads of them do
    /// not matter to it), and no keyless command is in flight. Such a read
    /// finishes before anything later is admitted, so it is not tracked.
    pub fn read_may_run_now(&self, keys: &[impl AsRef<[u8]>]) -> bool {
        self.barrier.as_ref().is_none_or(Done::finished)
            && keys.iter().all(|key| {
                self.keys.get(key.as_ref()).is_none_or(|state| {
                    state
                        .last_write
                        .as_ref()
                        .is_none_or(|w| w.finished.finished())
                })
            })
    }

    /// Drops what finished commands left behind: the map then holds only
    /// keys of commands still in flight. What a finished command leaves
    /// until then is harmless: waiting for it returns at once.
    fn forget_finished(&mut self) {
        self.in_flight.retain(|done| !done.finished());
        if self.in_flight.is_empty() {
            self.keys.clear();
            self.barrier = None;
            return;
        }
        self.keys.retain(|_, state| !state.finished());
        if self.barrier.as_ref().is_some_and(Done::finished) {
            self.barrier = None;
        }
    }

    /// Keys of the commands tracked: those in flight and those finished
    /// but not yet forgotten (for tests of the bound).
    #[cfg(test)]
    fn tracked_keys(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &'static str) -> Bytes {
        Bytes::from_static(k.as_bytes())
    }

    /// Admits a command and returns its finish handle and how many
    /// unfinished commands it waits for.
    fn admit(order: &mut KeyOrder, keys: &[&'static str], writes: bool) -> (Finish, usize) {
        let (finish, done) = completion();
        let keys: Vec<Bytes> = keys.iter().map(|k| key(k)).collect();
        let refs: Vec<&Bytes> = keys.iter().collect();
        let waits = order.admit(&refs, writes, &done, &done);
        let unfinished = waits.to_start.iter().chain(&waits.to_finish);
        (finish, unfinished.filter(|d| !d.finished()).count())
    }

    #[test]
    fn a_read_waits_for_the_write_before_it_on_its_key_only() {
        let mut order = KeyOrder::default();
        let (_w, waits) = admit(&mut order, &["a"], true);
        assert_eq!(waits, 0);
        let (_r, waits) = admit(&mut order, &["a"], false);
        assert_eq!(waits, 1, "GET a after SET a");
        let (_other, waits) = admit(&mut order, &["b"], false);
        assert_eq!(waits, 0, "GET b is independent");
        let (_r2, waits) = admit(&mut order, &["a"], false);
        assert_eq!(waits, 1, "reads of a run together, after the write");
    }

    #[test]
    fn a_write_waits_for_every_earlier_use_of_its_keys() {
        let mut order = KeyOrder::default();
        let (_r1, _) = admit(&mut order, &["a"], false);
        let (_r2, _) = admit(&mut order, &["a", "b"], false);
        let (_w, waits) = admit(&mut order, &["a"], true);
        assert_eq!(waits, 2, "SET a after two reads of a");
        let (_w2, waits) = admit(&mut order, &["a", "c"], true);
        assert_eq!(waits, 1, "the second write waits for the first only");
    }

    #[test]
    fn a_read_runs_now_only_with_no_unfinished_write_of_its_keys_or_barrier() {
        let mut order = KeyOrder::default();
        let (a, b) = (key("a"), key("b"));
        assert!(order.read_may_run_now(&[&a]), "nothing in flight");
        let (_read_a, _) = admit(&mut order, &["a"], false);
        assert!(
            order.read_may_run_now(&[&a]),
            "an earlier read does not matter"
        );
        let (write_b, _) = admit(&mut order, &["b"], true);
        assert!(order.read_may_run_now(&[&a]));
        assert!(!order.read_may_run_now(&[&b]), "SET b is in flight");
        assert!(
            !order.read_may_run_now(&[&a, &b]),
            "MGET a b waits for it too"
        );
        drop(write_b);
        assert!(order.read_may_run_now(&[&b]), "once SET b has finished");
        let (flush, _) = admit(&mut order, &[], true);
        assert!(!order.read_may_run_now(&[&a]), "FLUSHDB is in flight");
        drop(flush);
        assert!(order.read_may_run_now(&[&a]));
    }

    #[test]
    fn a_key_named_twice_does_not_make_a_command_wait_for_itself() {
        let mut order = KeyOrder::default();
        let (_mset, waits) = admit(&mut order, &["k", "j", "k"], true);
        assert_eq!(waits, 0);
        let (_mget, waits) = admit(&mut order, &["k", "k"], false);
        assert_eq!(waits, 1, "after the MSET");
    }

    #[test]
    fn a_keyless_command_is_a_barrier_both_ways() {
        let mut order = KeyOrder::default();
        let (_a, _) = admit(&mut order, &["a"], true);
        let (_b, _) = admit(&mut order, &["b"], false);
        let (_flush, waits) = admit(&mut order, &[], true);
        assert_eq!(waits, 2, "FLUSHDB waits for everything before it");
        let (_c, waits) = admit(&mut order, &["c"], false);
        assert_eq!(waits, 1, "and everything after waits for it");
    }

    /// Admits a command whose place is fixed before it finishes; returns
    /// its two handles and the unfinished commands it waits for to start
    /// and to finish.
    fn admit_placed(
        order: &mut KeyOrder,
        keys: &[&'static str],
        writes: bool,
    ) -> ((Finish, Finish), (usize, usize)) {
        let (finish, done) = completion();
        let (place, placed) = completion();
        let keys: Vec<Bytes> = keys.iter().map(|k| key(k)).collect();
        let refs: Vec<&Bytes> = keys.iter().collect();
        let waits = order.admit(&refs, writes, &done, &placed);
        let open = |list: &[Done]| list.iter().filter(|d| !d.finished()).count();
        (
            (place, finish),
            (open(&waits.to_start), open(&waits.to_finish)),
        )
    }

    #[test]
    fn a_write_after_a_placed_write_starts_at_once_and_finishes_after_it() {
        let mut order = KeyOrder::default();
        let ((place1, finish1), waits) = admit_placed(&mut order, &["a"], true);
        assert_eq!(waits, (0, 0));
        let ((_p, _f), waits) = admit_placed(&mut order, &["a"], true);
        assert_eq!(waits, (1, 1), "before the first is placed, it waits");
        drop(place1);
        let ((_p3, _f3), waits) = admit_placed(&mut order, &["a"], true);
        assert_eq!(
            waits,
            (1, 1),
            "the third follows the second (not yet placed) only"
        );
        let ((_p4, _f4), waits) = admit_placed(&mut order, &["b"], true);
        assert_eq!(waits, (0, 0), "another key is independent");
        drop(finish1);
    }

    #[test]
    fn a_read_after_writes_waits_for_the_last_one_to_finish() {
        let mut order = KeyOrder::default();
        let ((place1, finish1), _) = admit_placed(&mut order, &["a"], true);
        drop(place1);
        let ((place2, finish2), waits) = admit_placed(&mut order, &["a"], true);
        assert_eq!(waits, (0, 1), "placed: starts now, finishes after it");
        drop(place2);
        let ((_p, _f), waits) = admit_placed(&mut order, &["a"], false);
        assert_eq!(waits, (1, 0), "the read waits for the second write");
        drop(finish1);
        drop(finish2);
        let ((_p, _f), waits) = admit_placed(&mut order, &["a"], true);
        assert_eq!(waits, (1, 0), "a write after the read waits for it");
    }

    /// A write placed only when it finishes (a RESP command of several
    /// steps, such as GETEX, which may read its key first) must not start
    /// before an earlier write of its key has finished, even one placed
    /// long before: it would read the key without that write.
    #[test]
    fn a_write_of_several_steps_waits_for_a_placed_write_to_finish() {
        let mut order = KeyOrder::default();
        let ((place1, finish1), _) = admit_placed(&mut order, &["a"], true);
        drop(place1);
        let (_finish, done) = completion();
        let a = key("a");
        let waits = order.admit(&[&a], true, &done, &done);
        let to_start = waits.to_start.iter().filter(|d| !d.finished()).count();
        assert_eq!(to_start, 1, "GETEX a starts after a placed SET a finished");
        drop(finish1);
        let ((_p, _f), waits) = admit_placed(&mut order, &["a"], true);
        assert_eq!(
            waits,
            (1, 0),
            "a placed write after it waits for it to finish"
        );
    }

    /// A place given and taken back before any later write went past it
    /// holds them again; once one went past, it cannot be taken back.
    #[tokio::test]
    async fn a_signal_is_taken_back_only_before_a_waiter_went_past_it() {
        let (finish, done) = completion();
        assert!(done.withdraw().is_none(), "not yet given");
        let waiter = tokio::spawn({
            let done = done.clone();
            async move { done.wait().await }
        });
        tokio::task::yield_now().await;
        drop(finish);
        let again = done.withdraw().expect("nobody went past it yet");
        assert!(!done.finished());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "woken, but held again");
        drop(again);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert!(done.withdraw().is_none(), "a waiter went past it");
        assert!(done.finished());
    }

    #[tokio::test]
    async fn waiting_ends_when_the_earlier_command_finishes() {
        let (finish, done) = completion();
        let waiter = tokio::spawn({
            let done = done.clone();
            async move { done.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing has finished yet");
        drop(finish);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("joined");
        done.wait().await;
    }

    #[test]
    fn a_finished_command_holds_up_nothing() {
        let mut order = KeyOrder::default();
        let (first, _) = admit(&mut order, &["a"], true);
        let (second, _) = admit(&mut order, &["b"], true);
        drop(first);
        let (_third, waits) = admit(&mut order, &["a"], false);
        assert_eq!(waits, 0, "the write of a has finished");
        drop(second);
        let (_fourth, waits) = admit(&mut order, &["b"], true);
        assert_eq!(waits, 0, "the write of b has finished");
    }

    #[test]
    fn finished_commands_are_forgotten_once_the_tracked_ones_reach_the_minimum() {
        let mut order = KeyOrder::default();
        let names = ["a", "b", "c", "d"];
        for i in 0..FORGET_MIN_COMMANDS {
            let (_finished, _) = admit(&mut order, &[names[i % names.len()]], true);
        }
        assert_eq!(order.tracked_keys(), names.len(), "not yet forgotten");
        let (_last, _) = admit(&mut order, &["e"], true);
        assert_eq!(order.tracked_keys(), 1, "only the command now in flight");
    }

    #[test]
    fn the_keys_tracked_stay_within_twice_the_commands_in_flight() {
        let mut order = KeyOrder::default();
        let names: Vec<&'static str> = (0..10_000)
            .map(|i| &*Box::leak(format!("k{i}").into_boxed_str()))
            .collect();
        let live = 100;
        let mut held = Vec::new();
        let mut most = 0;
        for (i, name) in names.iter().enumerate() {
            let (finish, _) = admit(&mut order, &[name], i % 2 == 0);
            // The first `live` stay in flight; every later one finishes at once.
            if i < live {
                held.push(finish);
            }
            most = most.max(order.tracked_keys());
        }
        let bound = (2 * live).max(FORGET_MIN_COMMANDS);
        assert!(most <= bound, "{most} keys tracked, bound {bound}");
        let (_last, waits) = admit(&mut order, &[names[0]], true);
        assert_eq!(waits, 1, "a key still in flight is remembered");
        drop(held);
    }
}
