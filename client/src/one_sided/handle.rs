//! The synchronous one-sided read path, the core every one-sided GET runs:
//! [`ReadHandle`] for a thread or task that reads into its own buffers
//! (`get_into`, `get_many_into`: no lock, no allocation, one clock reading
//! per GET or per chunk of 16 keys of a batch), and [`OneSided::serve`], which the handle and the
//! async `Client::get` share.

use std::sync::Arc;

use rdkv_fabric::clock::boottime_now_us;
use rdkv_fabric::{GotInto, ReadError, ReadTime, RegionReader};
use rdkv_proto::wire::Consistency;
use thiserror::Error;

use super::OneSided;
use super::view::{GroupView, ReadView};
use crate::options::Transport;

/// Why a read was not served one-sided; the server can answer it instead
/// (`Client::get_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum NotServed {
    #[error("linearizable reads and the tcp transport always go to the server")]
    Consistency,
    #[error("no region of the node to read is attached (yet)")]
    NoRegion,
    #[error("the leader's lease does not hold")]
    Lease,
    #[error("no attached replica is within the lag bound")]
    Lag,
    #[error("the region has not yet applied what this client has seen")]
    Behind,
    #[error("validation kept failing")]
    Exhausted,
    #[error("the region could not be read (it is attached again on the next refresh)")]
    Unreadable,
}

/// What [`ReadHandle::get_into`] can fail with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum GetIntoError {
    #[error("not served one-sided: {0}")]
    NotServed(#[from] NotServed),
    /// The value (validated) is `needed` bytes; nothing was read into the buffer.
    #[error("the value is {needed} bytes, the buffer {len}")]
    BufferTooSmall { needed: usize, len: usize },
}

/// A read through the chosen region: given the reader, the time before
/// the read began and the view whose clock (`ReadView::now`) the GET
/// reads, the answer and the clock's reading. Generic, not a trait
/// object: the read is inlined into `serve`.
pub(super) trait RegionRead<T>:
    FnOnce(&RegionReader, ReadTime, &ReadView) -> Result<(T, ReadTime), ReadError>
{
}

impl<T, F> RegionRead<T> for F where
    F: FnOnce(&RegionReader, ReadTime, &ReadView) -> Result<(T, ReadTime), ReadError>
{
}

impl OneSided {
    /// One read at `consistency` from `view`: the region chosen, `read`
    /// run on it, and the choice confirmed at the read's one clock reading
    /// (returned through `since`, the reading before it). `keys` is how many
    /// GETs it serves (an MGet's keys). Inlined whole into each caller:
    /// what a GET does is then one function (no struct returned through
    /// memory between its steps).
    #[inline(always)]
    pub(super) fn serve<T>(
        &self,
        view: &ReadView,
        group: Option<&GroupView>,
        consistency: Consistency,
        since: &mut ReadTime,
        keys: u64,
        read: impl RegionRead<T>,
    ) -> Result<T, GetIntoError> {
        if self.transport == Transport::Tcp {
            return Err(NotServed::Consistency.into());
        }
        let Some(group) = group else {
            // No view yet, or one of a map without the key's shard.
            return Err(self.no_region().into());
        };
        let choice = match self.choose(view, group, consistency) {
            Ok(choice) => choice,
            Err(not_served) => return Err(self.refused(view, not_served).into()),
        };
        let (value, time) = match read(choice.reader, *since, view) {
            Ok(read) => read,
            Err(error) => return Err(self.read_failed(error)),
        };
        *since = time;
        self.note_age(view, time);
        self.confirm(view, &choice, time)?;
        self.counters.add(|c| &c.served, keys);
        self.read_from(group.shard, choice.reader);
        Ok(value)
    }

    /// A refused read is the server's (slow) anyway: it reads the clock so
    /// that a view that keeps refusing (a region behind, of a dead
    /// incarnation) still ages into a refresh.
    #[cold]
    #[inline(never)]
    fn refused(&self, view: &ReadView, not_served: NotServed) -> NotServed {
        self.note_age(view, view.now());
        not_served
    }

    /// Asks for a refresh once `view` is older than its TTL at `time`.
    #[inline]
    fn note_age(&self, view: &ReadView, time: ReadTime) {
        if time.monotonic_us > view.fresh_until_us {
            self.views.want_refresh();
        }
    }

    #[cold]
    #[inline(never)]
    fn read_failed(&self, error: ReadError) -> GetIntoError {
        match error {
            ReadError::BufferTooSmall { needed, len } => {
                GetIntoError::BufferTooSmall { needed, len }
            }
            ReadError::Exhausted { .. } => {
                self.counters.add(|c| &c.fallbacks, 1);
                NotServed::Exhausted.into()
            }
            error => {
                tracing::debug!("one-sided read failed: {error}");
                // A lost RDMA session or a re-registered region: look again
                // (and reconnect).
                self.views.want_refresh();
                NotServed::Unreadable.into()
            }
        }
    }
}

/// A thread's (or task's) own way into the one-sided read path
/// (`Client::read_handle`): synchronous, and on the hot path lock-free and
/// allocation-free. It keeps its own copy of the client's read view (the
/// regions, the leader) and only looks at the view's generation number to
/// see that a refresh swapped in a new one; a refresh never waits for it,
/// nor it for a refresh (an old view is asked to be refreshed, in the
/// background, and read meanwhile: every read is judged by the lease or
/// the lag in the region's own header). One clock reading per GET (per
/// chunk of 16 keys of a batch), after the copy, judges the lease, the pair's deadline and the
/// abandon bound (measured from this handle's previous reading).
///
/// A read it does not serve ([`GetIntoError::NotServed`]) is for the
/// server: `Client::get_with` (which also refreshes the view at once).
#[derive(Debug)]
pub struct ReadHandle {
    one_sided: Arc<OneSided>,
    view: Arc<ReadView>,
    generation: u64,
    since: ReadTime,
    consistency: Consistency,
}

impl ReadHandle {
    pub(crate) fn new(one_sided: Arc<OneSided>) -> ReadHandle {
        one_sided.start_refresher();
        let (view, generation) = one_sided.views.load_full();
        let consistency = one_sided.default_consistency;
        ReadHandle {
            one_sided,
            view,
            generation,
            since: ReadTime {
                monotonic_us: boottime_now_us(),
                unix_ms: 0,
            },
            consistency,
        }
    }

    /// Makes a wanted refresh of the client's view of the cluster now (the
    /// first one, at least, is wanted before any read), and adopts it. A
    /// thread that only reads through handles on a runtime it does not
    /// otherwise poll calls this now and then (or when a read is
    /// `NotServed`); elsewhere the background refresher does it.
    pub async fn refresh(&mut self) {
        drop(self.one_sided.view_for_read().await);
        self.fresh_view();
    }

    /// The current view: the handle's own unless a refresh published another.
    #[inline]
    fn fresh_view(&mut self) {
        let generation = self.one_sided.views.generation();
        if generation != self.generation {
            (self.view, self.generation) = self.one_sided.views.load_full();
        }
    }

    /// Reads `key` at the client's default consistency into `buf`: the
    /// value is `buf[..len]` of the answer (`None`: absent). Nothing is
    /// allocated for keys up to `rdkv_fabric::INLINE_KEY_BYTES` (a
    /// fingerprint collision or a value longer than `buf` reads its block
    /// whole once).
    pub fn get_into(
        &mut self,
        key: &[u8],
        buf: &mut [u8],
    ) -> Result<Option<GotInto>, GetIntoError> {
        self.get_into_with(key, buf, self.consistency)
    }

    /// [`ReadHandle::get_into`] at `consistency`.
    pub fn get_into_with(
        &mut self,
        key: &[u8],
        buf: &mut [u8],
        consistency: Consistency,
    ) -> Result<Option<GotInto>, GetIntoError> {
        self.fresh_view();
        let read = |reader: &RegionReader, since: ReadTime, view: &ReadView| {
            reader.get_into(key, buf, since, || view.now())
        };
        let group = self.view.group_of(key);
        self.one_sided
            .serve(&self.view, group, consistency, &mut self.since, 1, read)
    }

    /// Reads `keys` at `consistency`, each value into its buffer
    /// (`bufs[i]`, the answer in `out[i]`): per shard the keys are in and
    /// per chunk of `rdkv_fabric`'s `BATCH_KEYS` (16) of its keys, two
    /// rounds of reads (two doorbells on RDMA) and one clock reading. Keys of several shards are read shard by shard (each
    /// batch from its own shard's region); an error ends the call, the
    /// answers of shards read before it kept.
    pub fn get_many_into(
        &mut self,
        keys: &[&[u8]],
        bufs: &mut [&mut [u8]],
        out: &mut [Option<GotInto>],
        consistency: Consistency,
    ) -> Result<(), GetIntoError> {
        self.fresh_view();
        let (one_sided, view, since) = (&self.one_sided, &self.view, &mut self.since);
        if let Some(group) = view.one_group_of(keys.iter().copied()) {
            return read_batch(
                one_sided,
                view,
                since,
                group,
                (keys, bufs, out),
                consistency,
            );
        }
        let groups: Vec<Option<&GroupView>> = keys.iter().map(|key| view.group_of(key)).collect();
        for (first, group) in groups.iter().enumerate() {
            if groups[..first].iter().any(|g| same_group(*g, *group)) {
                continue;
            }
            let Some(group) = *group else {
                one_sided.views.want_refresh();
                return Err(NotServed::NoRegion.into());
            };
            let picked: Vec<usize> = (first..keys.len())
                .filter(|&i| same_group(groups[i], Some(group)))
                .collect();
            let part_keys: Vec<&[u8]> = picked.iter().map(|&i| keys[i]).collect();
            let mut part_bufs: Vec<&mut [u8]> = picked
                .iter()
                .map(|&i| std::mem::take(&mut bufs[i]))
                .collect();
            let mut part_out = vec![None; picked.len()];
            let part = (&part_keys[..], &mut part_bufs[..], &mut part_out[..]);
            let read = read_batch(one_sided, view, since, group, part, consistency);
            for ((&i, buf), got) in picked.iter().zip(part_bufs).zip(part_out) {
                bufs[i] = buf;
                out[i] = got;
            }
            read?;
        }
        Ok(())
    }
}

/// Keys, their buffers and their answers, index for index.
type Batch<'b, 'k, 'v> = (
    &'b [&'k [u8]],
    &'b mut [&'v mut [u8]],
    &'b mut [Option<GotInto>],
);

/// One batch of keys, all of `group`'s shard, read from `view`.
fn read_batch(
    one_sided: &OneSided,
    view: &ReadView,
    since: &mut ReadTime,
    group: &GroupView,
    (keys, bufs, out): Batch<'_, '_, '_>,
    consistency: Consistency,
) -> Result<(), GetIntoError> {
    let read = |reader: &RegionReader, since: ReadTime, view: &ReadView| {
        Ok((
            (),
            reader.get_many_into(keys, bufs, out, since, || view.now())?,
        ))
    };
    let count = keys.len() as u64;
    one_sided.serve(view, Some(group), consistency, since, count, read)
}

/// Whether two keys' groups are the same one (both absent counts too).
fn same_group(a: Option<&GroupView>, b: Option<&GroupView>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => std::ptr::eq(a, b),
        (None, None) => true,
        _ => false,
    }
}
