//! The entries of one `apply` call, pulled a few ahead of the one being
//! applied, so that the apply loop can start loading their keys' index
//! words and blocks into the CPU's caches while it applies the entries
//! before them. A write's lookup in a large region misses the caches twice
//! (the neighbourhood, then the block header it names): in a profile of
//! an update-only follower, `find` and `find_among`, nearly all
//! of it those two loads, were 14.7% of its samples (docs/benchmarks.md,
//! twenty-seventh round).
//!
//! openraft hands `apply` the whole committed range: the log store keeps
//! openraft's default `entries_stream`, which reads the range before the
//! stream starts, so the entries after the current one are ready. Only
//! entries ready now are pulled ahead, never awaited (were the stream to
//! yield them one by one, this would stay correct and merely stop
//! helping). Entries, and an error in its place, come out in the stream's
//! order.

use std::collections::VecDeque;
use std::io;

use futures::{FutureExt, Stream, TryStreamExt};
use openraft::EntryPayload;
use openraft::storage::EntryResponder;

use crate::raft::{Entry, TypeConfig};

/// How many entries are pulled beyond the one being applied. The estimate
/// behind it: an update's apply takes several microseconds of a
/// follower's CPU here and a miss a few hundred nanoseconds, so the entry
/// right after the current one is early enough for its second miss; the
/// first is started when an entry is pulled, up to this many entries
/// earlier.
const LOOKAHEAD_ENTRIES: usize = 4;

type Item = EntryResponder<TypeConfig>;

/// Pulls entries of `S` ahead of the one being applied.
pub(super) struct Lookahead<S> {
    entries: S,
    /// Pulled, not yet handed out.
    ahead: VecDeque<Item>,
    /// The stream's error, pulled after `ahead`'s entries.
    failed: Option<io::Error>,
    /// The stream ended or failed: it is not polled again.
    ended: bool,
}

impl<S> Lookahead<S>
where
    S: Stream<Item = io::Result<Item>> + Unpin,
{
    pub(super) fn new(entries: S) -> Self {
        Lookahead {
            entries,
            ahead: VecDeque::with_capacity(LOOKAHEAD_ENTRIES + 1),
            failed: None,
            ended: false,
        }
    }

    /// The next entry to apply; `pulled` sees each entry as it is pulled
    /// ahead (of those ready now, up to [`LOOKAHEAD_ENTRIES`] beyond the
    /// one returned).
    pub(super) async fn next(&mut self, pulled: impl FnMut(&Entry)) -> io::Result<Option<Item>> {
        self.pull_ready(pulled);
        if let Some(item) = self.ahead.pop_front() {
            return Ok(Some(item));
        }
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        if self.ended {
            return Ok(None);
        }
        let item = self.entries.try_next().await;
        self.ended = !matches!(item, Ok(Some(_)));
        item
    }

    /// The entry after the one `next` handed out last, if it is pulled.
    pub(super) fn following(&self) -> Option<&Entry> {
        self.ahead.front().map(|(entry, _)| entry)
    }

    /// Pulls the entries ready now, until the one `next` hands out has
    /// [`LOOKAHEAD_ENTRIES`] behind it.
    fn pull_ready(&mut self, mut pulled: impl FnMut(&Entry)) {
        while !self.ended && self.ahead.len() <= LOOKAHEAD_ENTRIES {
            let Some(item) = self.entries.try_next().now_or_never() else {
                return;
            };
            match item {
                Ok(Some(item)) => {
                    pulled(&item.0);
                    self.ahead.push_back(item);
                }
                Ok(None) => self.ended = true,
                Err(error) => {
                    self.ended = true;
                    self.failed = Some(error);
                }
            }
        }
    }
}

/// The key `entry`'s apply looks up first, if it names one.
pub(super) fn first_key(entry: &Entry) -> Option<&[u8]> {
    match &entry.payload {
        EntryPayload::Normal(command) => command.first_key().map(|key| &key[..]),
        EntryPayload::Blank | EntryPayload::Membership(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::stream;
    use openraft::entry::RaftEntry;

    use crate::raft::Command;

    fn entry(index: u64) -> Entry {
        let key = Bytes::from(format!("k{index}"));
        let command = Command::Put {
            key,
            value: Bytes::from_static(b"v"),
        };
        Entry::new_normal(
            openraft::testing::log_id::<TypeConfig>(1, 1, index),
            command,
        )
    }

    fn index(item: &Item) -> u64 {
        item.0.log_id.index
    }

    #[tokio::test]
    async fn entries_come_out_in_order_with_the_limit_pulled_ahead() {
        let items: Vec<io::Result<Item>> = (1..=10).map(|i| Ok((entry(i), None))).collect();
        let mut lookahead = Lookahead::new(stream::iter(items));
        let mut pulled = Vec::new();
        let mut applied = Vec::new();
        while let Some(item) = lookahead
            .next(|e| pulled.push(e.log_id.index))
            .await
            .unwrap()
        {
            let following = lookahead.following().map(|e| e.log_id.index);
            let now = index(&item);
            assert_eq!(following, (now < 10).then_some(now + 1));
            // Pulled so far: the limit past this entry, or to the end.
            let furthest = *pulled.last().unwrap();
            let expected = (now + LOOKAHEAD_ENTRIES as u64).min(10);
            assert_eq!(furthest, expected, "pulled ahead of {now}");
            applied.push(now);
        }
        assert_eq!(applied, (1..=10).collect::<Vec<_>>());
        assert_eq!(pulled, (1..=10).collect::<Vec<_>>());
        assert!(lookahead.next(|_| {}).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_error_comes_out_after_the_entries_before_it() {
        let items: Vec<io::Result<Item>> = vec![
            Ok((entry(1), None)),
            Ok((entry(2), None)),
            Err(io::Error::other("log read failed")),
            Ok((entry(4), None)),
        ];
        let mut lookahead = Lookahead::new(stream::iter(items));
        assert_eq!(index(&lookahead.next(|_| {}).await.unwrap().unwrap()), 1);
        assert_eq!(index(&lookahead.next(|_| {}).await.unwrap().unwrap()), 2);
        match lookahead.next(|_| {}).await {
            Err(error) => assert_eq!(error.to_string(), "log read failed"),
            Ok(item) => panic!("entry {:?} instead of the error", item.map(|i| index(&i))),
        }
        assert!(lookahead.next(|_| {}).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_error_pulled_in_a_later_window_comes_out_in_its_place() {
        let mut items: Vec<io::Result<Item>> = (1..=8).map(|i| Ok((entry(i), None))).collect();
        items.push(Err(io::Error::other("log read failed")));
        let mut lookahead = Lookahead::new(stream::iter(items));
        for expected in 1..=8 {
            let item = lookahead.next(|_| {}).await.unwrap().unwrap();
            assert_eq!(index(&item), expected);
        }
        assert!(lookahead.next(|_| {}).await.is_err());
        assert!(lookahead.next(|_| {}).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn entries_not_ready_yet_are_awaited_in_turn() {
        let (send, receive) = futures::channel::mpsc::unbounded::<io::Result<Item>>();
        let mut lookahead = Lookahead::new(receive);
        let feeder = tokio::spawn(async move {
            for i in 1..=3 {
                tokio::task::yield_now().await;
                send.unbounded_send(Ok((entry(i), None))).unwrap();
            }
        });
        let mut applied = Vec::new();
        let apply_all = async {
            while let Some(item) = lookahead.next(|_| {}).await.unwrap() {
                applied.push(index(&item));
            }
        };
        // A lost wake-up would hang here rather than fail.
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), apply_all).await;
        assert!(waited.is_ok(), "an entry sent later was never handed out");
        feeder.await.unwrap();
        assert_eq!(applied, vec![1, 2, 3]);
    }
}
