//! The k-way merge of a scan over several sources (docs/sharding.md,
//! section 6): one cursor per source (a shard, or the one group), each
//! holding at most one page; the smallest key at the head of a cursor is
//! taken next, and a source is asked for its next page only when its page
//! is used up. Each source's pages are checked in key order and after the
//! key asked from, and the merged keys strictly ascending, so a key is
//! never returned out of order or twice, whatever a source answers.

use std::collections::VecDeque;
use std::future::Future;

use bytes::Bytes;
use futures::future::join_all;
use rdkv_proto::wire::{DEFAULT_MAX_BATCH_KEYS, Op, Versioned};

use crate::error::{Error, Result};
use crate::outcome::ScanPage;

/// One source's place in the merge.
struct Cursor<S> {
    source: S,
    /// Where its next page starts (inclusive).
    start_key: Bytes,
    /// The rest of its last page.
    page: VecDeque<(Bytes, Versioned)>,
    /// Its last page said it holds nothing after it.
    exhausted: bool,
}

impl<S> Cursor<S> {
    fn needs_page(&self) -> bool {
        self.page.is_empty() && !self.exhausted
    }

    /// Takes the `page` answered to a request of at most `page_limit`
    /// pairs from `start_key` on.
    fn take(&mut self, page: ScanPage, page_limit: usize) -> Result<()> {
        let page = checked_page(page, page_limit, &self.start_key)?;
        let page_full = page.pairs.len() == page_limit;
        match page.pairs.last() {
            None => self.exhausted = true,
            Some((last, _)) => {
                // The smallest key after `last`.
                let mut next = last.to_vec();
                next.push(0);
                self.start_key = Bytes::from(next);
                self.exhausted = !page.more && !page_full;
            }
        }
        self.page = page.pairs.into();
        Ok(())
    }
}

/// Up to `limit` pairs of every source from `start_key` on, in key order:
/// `fetch(source, start_key, page_limit)` answers one page of one source
/// (at most `page_limit` pairs, from `start_key` on, in key order). Pages
/// of the sources that need one are asked for at once.
pub(crate) async fn merge<S, F, Fut>(
    sources: Vec<S>,
    start_key: Bytes,
    limit: usize,
    mut fetch: F,
) -> Result<Vec<(Bytes, Versioned)>>
where
    S: Copy,
    F: FnMut(S, Bytes, usize) -> Fut,
    Fut: Future<Output = Result<ScanPage>>,
{
    let mut cursors: Vec<Cursor<S>> = sources
        .into_iter()
        .map(|source| Cursor {
            source,
            start_key: start_key.clone(),
            page: VecDeque::new(),
            exhausted: false,
        })
        .collect();
    let mut out: Vec<(Bytes, Versioned)> = Vec::new();
    while out.len() < limit {
        let page_limit = (limit - out.len()).min(DEFAULT_MAX_BATCH_KEYS as usize);
        refill(&mut cursors, page_limit, &mut fetch).await?;
        let Some(pair) = smallest_head(&mut cursors) else {
            break;
        };
        if out.last().is_some_and(|(last, _)| *last >= pair.0) {
            return Err(out_of_order("a key at or before one already returned"));
        }
        out.push(pair);
    }
    Ok(out)
}

/// Asks every cursor whose page is used up (and whose source may hold
/// more) for its next page of at most `page_limit` pairs.
async fn refill<S, F, Fut>(
    cursors: &mut [Cursor<S>],
    page_limit: usize,
    fetch: &mut F,
) -> Result<()>
where
    S: Copy,
    F: FnMut(S, Bytes, usize) -> Fut,
    Fut: Future<Output = Result<ScanPage>>,
{
    let asks = cursors.iter_mut().filter(|c| c.needs_page()).map(|cursor| {
        let page = fetch(cursor.source, cursor.start_key.clone(), page_limit);
        async move { (cursor, page.await) }
    });
    for (cursor, page) in join_all(asks).await {
        cursor.take(page?, page_limit)?;
    }
    Ok(())
}

/// Takes the smallest key at the head of a cursor (every cursor that may
/// hold more has a page: `refill` ran).
fn smallest_head<S>(cursors: &mut [Cursor<S>]) -> Option<(Bytes, Versioned)> {
    let (at, _) = cursors
        .iter()
        .enumerate()
        .filter_map(|(at, cursor)| cursor.page.front().map(|(key, _)| (at, key)))
        .min_by(|(_, a), (_, b)| a.cmp(b))?;
    cursors.get_mut(at)?.page.pop_front()
}

/// `page` if it holds at most `page_limit` pairs, in key order, from
/// `start_key` on.
fn checked_page(page: ScanPage, page_limit: usize, start_key: &Bytes) -> Result<ScanPage> {
    if page.pairs.len() > page_limit {
        return Err(Error::UnexpectedResponse {
            request: Op::Scan.name(),
            response: format!("{} pairs when {page_limit} were asked", page.pairs.len()),
        });
    }
    let in_order = page.pairs.windows(2).all(|w| w[0].0 < w[1].0);
    if !in_order
        || page
            .pairs
            .first()
            .is_some_and(|(first, _)| first < start_key)
    {
        return Err(out_of_order(
            "pairs out of key order or before the start key",
        ));
    }
    Ok(page)
}

fn out_of_order(what: &str) -> Error {
    Error::UnexpectedResponse {
        request: Op::Scan.name(),
        response: what.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;
    use futures::future::{Ready, ready};
    use proptest::collection::{btree_set, vec};
    use proptest::prelude::*;

    use super::*;

    fn pair(key: &Bytes) -> (Bytes, Versioned) {
        let versioned = Versioned {
            value: key.clone(),
            version: 1,
        };
        (key.clone(), versioned)
    }

    /// Sources over in-memory key lists, whose pages are cut short (with
    /// `more`, as a full frame cuts a server's) at the caps in turn.
    struct Sources {
        keys: Vec<Vec<Bytes>>,
        caps: Vec<usize>,
        calls: usize,
        /// Pairs handed out so far.
        fetched: usize,
    }

    impl Sources {
        fn page(
            &mut self,
            source: usize,
            from: Bytes,
            page_limit: usize,
        ) -> Ready<Result<ScanPage>> {
            let cap = self.caps[self.calls % self.caps.len()];
            self.calls += 1;
            let rest: Vec<&Bytes> = self.keys[source].iter().filter(|k| **k >= from).collect();
            let n = rest.len().min(page_limit).min(cap);
            self.fetched += n;
            ready(Ok(ScanPage {
                pairs: rest[..n].iter().map(|k| pair(k)).collect(),
                more: n < rest.len() && n < page_limit,
            }))
        }
    }

    proptest! {
        #[test]
        fn the_merge_is_the_sorted_union_from_the_start_key(
            keys in btree_set(vec(any::<u8>(), 0..5), 0..300),
            owners in vec(any::<usize>(), 300),
            source_count in 1usize..6,
            caps in vec(1usize..9, 1..8),
            start in vec(any::<u8>(), 0..3),
            limit in 0usize..320,
        ) {
            let mut per_source = vec![Vec::new(); source_count];
            for (key, owner) in keys.iter().zip(&owners) {
                per_source[owner % source_count].push(Bytes::from(key.clone()));
            }
            let mut sources = Sources { keys: per_source, caps, calls: 0, fetched: 0 };
            let start = Bytes::from(start);
            let merged = block_on(merge(
                (0..source_count).collect(),
                start.clone(),
                limit,
                |source, from, page_limit| sources.page(source, from, page_limit),
            ))
            .unwrap();
            let expected: Vec<(Bytes, Versioned)> = keys
                .iter()
                .map(|k| Bytes::from(k.clone()))
                .filter(|k| *k >= start)
                .take(limit)
                .map(|k| pair(&k))
                .collect();
            prop_assert_eq!(&merged, &expected);
            // At most one page per source was held beyond what was returned.
            let page = limit.min(DEFAULT_MAX_BATCH_KEYS as usize);
            prop_assert!(sources.fetched - merged.len() <= source_count * page);
        }
    }

    #[test]
    fn a_key_two_sources_return_is_refused() {
        let both = vec![Bytes::from_static(b"a")];
        let mut sources = Sources {
            keys: vec![both.clone(), both],
            caps: vec![8],
            calls: 0,
            fetched: 0,
        };
        let merged = block_on(merge(vec![0, 1], Bytes::new(), 10, |s, from, n| {
            sources.page(s, from, n)
        }));
        assert!(matches!(merged, Err(Error::UnexpectedResponse { .. })));
    }
}
