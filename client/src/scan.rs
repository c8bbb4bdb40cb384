//! Scans larger than one reply: pages of at most `DEFAULT_MAX_BATCH_KEYS`
//! pairs, each continuing after the last key of the one before.

use bytes::Bytes;
use rdkv_proto::wire::{Consistency, DEFAULT_MAX_BATCH_KEYS, Op, Request, Versioned};

use crate::error::{Error, Result};
use crate::outcome::{ScanPage, answer};
use crate::routing::Router;

/// What [`range`] scans: `start_key` (inclusive) to `end_key` (exclusive;
/// `None`: no end), at most `limit` pairs.
pub(crate) struct ScanRange {
    pub(crate) start_key: Bytes,
    pub(crate) end_key: Option<Bytes>,
    pub(crate) limit: usize,
    pub(crate) consistency: Consistency,
}

/// The pairs of `range` in key order, page by page (each page one consistent
/// view, the pages not with each other).
pub(crate) async fn range(router: &Router, range: ScanRange) -> Result<Vec<(Bytes, Versioned)>> {
    if router.is_sharded() {
        return Err(Error::NotAcrossShards { op: "scan" });
    }
    let ScanRange {
        mut start_key,
        end_key,
        limit,
        consistency,
    } = range;
    let mut out: Vec<(Bytes, Versioned)> = Vec::new();
    while out.len() < limit {
        let page_limit = (limit - out.len()).min(DEFAULT_MAX_BATCH_KEYS as usize);
        let request = Request::Scan {
            start_key: start_key.clone(),
            end_key: end_key.clone(),
            limit: u32::try_from(page_limit).unwrap_or(DEFAULT_MAX_BATCH_KEYS),
            consistency,
        };
        let page = checked_page(
            answer(Op::Scan, router.send(request).await?)?,
            page_limit,
            &start_key,
        )?;
        let Some((last, _)) = page.pairs.last() else {
            break;
        };
        let page_full = page.pairs.len() == page_limit;
        // The smallest key after `last`.
        let mut next = last.to_vec();
        next.push(0);
        start_key = Bytes::from(next);
        out.extend(page.pairs);
        if !page.more && !page_full {
            break;
        }
    }
    Ok(out)
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
        return Err(Error::UnexpectedResponse {
            request: Op::Scan.name(),
            response: "pairs out of key order or before the start key".to_owned(),
        });
    }
    Ok(page)
}
