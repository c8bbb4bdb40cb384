//! Commands over the keyspace: KEYS, SCAN, TYPE. Both walks are the native
//! `Scan` (key order, one consistent view per page), so a key present for
//! the whole of a SCAN iteration is returned exactly once. On a multi-shard
//! node a page is every shard's pages merged in key order (the forwarding
//! client's scan), so the same walk by key covers every shard.
//!
//! A Redis SCAN cursor is an integer; rdkv's position is a key, whatever
//! the number of shards (one encoding). A node
//! remembers the next key of each cursor it hands out in [`Cursors`] (the
//! newest [`MAX_SCAN_CURSORS`]); a cursor it no longer remembers, or one
//! from another node, is refused with an error rather than restarted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

use super::RespServer;
use super::commands::{integer_arg, upper};
use super::glob::glob_match;
use super::reply::Reply;

/// SCAN cursors a node remembers: with the largest keys (the key limit),
/// a bounded amount of memory whatever clients do.
pub const MAX_SCAN_CURSORS: usize = 16 * 1024;
/// SCAN's page size when the client gives no COUNT (Redis's default).
const DEFAULT_SCAN_COUNT: usize = 10;

/// The next key of each SCAN cursor handed out, oldest forgotten first.
#[derive(Debug, Default)]
pub struct Cursors {
    inner: Mutex<CursorTable>,
}

#[derive(Debug, Default)]
struct CursorTable {
    last_id: u64,
    next_keys: HashMap<u64, Bytes>,
    issued: VecDeque<u64>,
}

impl Cursors {
    fn table(&self) -> MutexGuard<'_, CursorTable> {
        // Each change is one insert or remove pair: consistent after a panic.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new cursor that resumes at `next_key`.
    fn issue(&self, next_key: Bytes) -> u64 {
        let mut table = self.table();
        table.last_id += 1;
        let id = table.last_id;
        table.next_keys.insert(id, next_key);
        table.issued.push_back(id);
        while table.issued.len() > MAX_SCAN_CURSORS {
            if let Some(old) = table.issued.pop_front() {
                table.next_keys.remove(&old);
            }
        }
        id
    }

    /// Where cursor `id` resumes (it stays valid: a client may repeat it).
    fn resume(&self, id: u64) -> Option<Bytes> {
        self.table().next_keys.get(&id).cloned()
    }
}

/// The smallest key after `key` among keys of at most `max_key_bytes`
/// (bytewise order); `None` when `key` is the largest such key.
fn successor(key: &[u8], max_key_bytes: usize) -> Option<Bytes> {
    if key.len() < max_key_bytes {
        let mut next = key.to_vec();
        next.push(0);
        return Some(Bytes::from(next));
    }
    let mut next = key[..max_key_bytes].to_vec();
    while let Some(last) = next.pop() {
        if last < u8::MAX {
            next.push(last + 1);
            return Some(Bytes::from(next));
        }
    }
    None
}

/// One page of the key order from `start`: its keys, and where the next
/// page starts (`None`: the walk is over).
async fn page(
    server: &RespServer,
    start: Bytes,
    count: usize,
) -> Result<(Vec<Bytes>, Option<Bytes>), Reply> {
    let limits = server.handler.limits();
    let max_batch = usize::try_from(limits.max_batch_keys).unwrap_or(usize::MAX);
    let limit = count.clamp(1, max_batch.max(1));
    let (keys, done) = server.scan_keys(start, limit).await?;
    let next = match keys.last() {
        Some(last) if !done => successor(
            last,
            usize::try_from(limits.max_key_bytes).unwrap_or(usize::MAX),
        ),
        _ => None,
    };
    Ok((keys, next))
}

/// KEYS pattern: every key that matches, in key order.
pub async fn keys(server: &RespServer, args: &[Bytes]) -> Reply {
    let pattern = &args[0];
    let mut matched = Vec::new();
    let mut start = Some(Bytes::new());
    while let Some(from) = start {
        let (keys, next) = match page(server, from, usize::MAX).await {
            Ok(page) => page,
            Err(e) => return e,
        };
        matched.extend(
            keys.into_iter()
                .filter(|key| glob_match(pattern, key, false))
                .map(Reply::Bulk),
        );
        start = next;
    }
    Reply::Array(matched)
}

/// What SCAN was asked for, after the cursor.
struct ScanOptions<'b> {
    pattern: Option<&'b Bytes>,
    count: usize,
    strings: bool,
}

fn scan_options(args: &[Bytes]) -> Result<ScanOptions<'_>, Reply> {
    let mut options = ScanOptions {
        pattern: None,
        count: DEFAULT_SCAN_COUNT,
        strings: true,
    };
    let mut rest = args;
    while let Some((option, tail)) = rest.split_first() {
        let [value, more @ ..] = tail else {
            return Err(Reply::syntax());
        };
        match upper(option).as_str() {
            "MATCH" => options.pattern = Some(value),
            "COUNT" => match integer_arg(value).and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n >= 1 => options.count = n,
                Some(_) => return Err(Reply::syntax()),
                None => return Err(Reply::not_integer()),
            },
            // Every rdkv value is a string.
            "TYPE" => options.strings = upper(value) == "STRING",
            _ => return Err(Reply::syntax()),
        }
        rest = more;
    }
    Ok(options)
}

/// SCAN cursor [MATCH pattern] [COUNT count] [TYPE type].
pub async fn scan(server: &RespServer, args: &[Bytes]) -> Reply {
    let start = match std::str::from_utf8(&args[0])
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
    {
        Some(0) => Bytes::new(),
        Some(id) => match server.cursors.resume(id) {
            Some(key) => key,
            None => {
                return Reply::err(format!(
                    "invalid cursor: this node remembers its last {MAX_SCAN_CURSORS} SCAN cursors \
                     and cursor {id} is not one of them; start again from 0"
                ));
            }
        },
        None => return Reply::err("invalid cursor"),
    };
    let options = match scan_options(&args[1..]) {
        Ok(options) => options,
        Err(reply) => return reply,
    };
    let (keys, next) = match page(server, start, options.count).await {
        Ok(page) => page,
        Err(e) => return e,
    };
    let cursor = next.map_or(0, |key| server.cursors.issue(key));
    let keys = keys
        .into_iter()
        .filter(|key| options.strings && options.pattern.is_none_or(|p| glob_match(p, key, false)))
        .map(Reply::Bulk)
        .collect();
    Reply::Array(vec![Reply::bulk(cursor.to_string()), Reply::Array(keys)])
}

/// TYPE key: every rdkv value is a string.
pub async fn key_type(server: &RespServer, args: &[Bytes]) -> Reply {
    match server.get(&args[0]).await {
        Ok(value) => type_reply(value.as_ref()),
        Err(e) => e,
    }
}

/// TYPE's reply for a key holding `value` (`None`: absent).
pub fn type_reply(value: Option<&Bytes>) -> Reply {
    match value {
        Some(_) => Reply::Simple("string"),
        None => Reply::Simple("none"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_successor_is_the_next_key_in_bounded_key_order() {
        assert_eq!(successor(b"a", 4).as_deref(), Some(&b"a\0"[..]));
        assert_eq!(successor(b"", 4).as_deref(), Some(&b"\0"[..]));
        assert_eq!(successor(b"abcd", 4).as_deref(), Some(&b"abce"[..]));
        assert_eq!(successor(b"ab\xff\xff", 4).as_deref(), Some(&b"ac"[..]));
        assert_eq!(successor(b"\xff\xff", 2), None);
    }

    #[test]
    fn cursors_resume_until_forgotten_oldest_first() {
        let cursors = Cursors::default();
        let first = cursors.issue(Bytes::from("k1"));
        assert_eq!(cursors.resume(first).as_deref(), Some(&b"k1"[..]));
        // A cursor may be used again.
        assert_eq!(cursors.resume(first).as_deref(), Some(&b"k1"[..]));
        for i in 0..MAX_SCAN_CURSORS {
            cursors.issue(Bytes::from(format!("n{i}")));
        }
        assert_eq!(cursors.resume(first), None);
        assert_eq!(
            cursors.resume(first + 1).as_deref(),
            Some(&b"n0"[..]),
            "the second oldest is still known"
        );
        assert_eq!(cursors.resume(0), None);
    }
}
