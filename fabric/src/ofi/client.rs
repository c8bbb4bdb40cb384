//! A client's side of the `ofi` transport: one session per server (its own
//! endpoint, a registered bounce buffer, the server's address and grant),
//! and the [`Fabric`]/[`RemoteRegion`] over it, so that
//! [`RegionReader`](crate::RegionReader) validates and retries as over shm.
//!
//! A batch is posted as rounds of reads (`plan`), then their completions
//! awaited on the calling thread: [`RemoteRegion`] is synchronous, and with
//! a manual-progress provider (`tcp;ofi_rxm`) reading the completion queue
//! is what moves the bytes. A few polls first (a completion may already be
//! there), then the thread sleeps in the queue's wait (`fi_cq_sread`),
//! which the provider ends when the answer arrives on its socket; on a
//! multi-threaded tokio runtime's worker that sleep runs in
//! `block_in_place` ([`blocking`]), so the worker's other tasks move on.
//! On a healthy path a round takes tens of microseconds; it is bounded by
//! [`READ_TIMEOUT`], after which the endpoint's transfers are ended and the
//! session is closed (the reader falls back to RPC and the topology
//! attaches again later).
//!
//! Reads land in the bounce buffer, never in the caller's buffer: a read
//! that outlives its deadline can then only write memory the session owns
//! (until its transfers are ended), never a buffer the caller got back.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkv_proto::wire::OfiRegionGrant;

use super::endpoint::{Endpoint, Registration, SharedEndpoint, lock};
use super::error::OfiError;
use super::ffi::FI_READ;
use super::plan::{Cursor, Piece, next_round};
use crate::rdma::wait::blocking;
use crate::transport::{Fabric, FabricError, ReadOp, RegionDescriptor, RemoteRegion, check_range};

/// The bounce buffer: a default-size value (1 MiB) four times over; longer
/// reads take several rounds.
pub const BOUNCE_BYTES: usize = 4 << 20;
/// Reads posted together at most (one round).
pub const MAX_POSTED: usize = 32;
/// How long a round may take before the session is given up.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Empty polls between yields of the CPU while waiting on a queue without
/// a wait object.
const POLLS_PER_YIELD: u32 = 1024;
/// Polls of a round's completions before the thread sleeps in the wait.
const EAGER_POLLS: u32 = 32;
/// The longest single sleep in the queue's wait (the round's deadline
/// bounds the whole).
const WAIT_SLICE: Duration = Duration::from_millis(10);

/// The descriptor a reader uses for a granted region.
pub fn descriptor_of(grant: &OfiRegionGrant) -> RegionDescriptor {
    RegionDescriptor {
        node_id: grant.node_id,
        addr: grant.addr,
        key: grant.key,
        len_bytes: grant.len_bytes,
        epoch: grant.region_epoch,
    }
}

/// Page-aligned memory the provider writes reads into.
#[derive(Debug)]
struct Bounce {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by this value; it is written by
// the provider and read by the session only under the session's lock.
unsafe impl Send for Bounce {}
// SAFETY: as above; `&Bounce` exposes only the pointer value.
unsafe impl Sync for Bounce {}

impl Bounce {
    fn new(len: usize) -> Result<Bounce, OfiError> {
        let layout = Layout::from_size_align(len, 4096)
            .map_err(|e| OfiError::Unavailable(format!("bounce buffer: {e}")))?;
        // SAFETY: `layout` has a non-zero size (BOUNCE_BYTES).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| OfiError::Unavailable("bounce buffer: out of memory".into()))?;
        Ok(Bounce { ptr, layout })
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once. The
        // registration (holding an `Arc` of this) is closed and the
        // endpoint's transfers ended before the last `Arc` drops.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[derive(Debug)]
struct SessionState {
    // Dropped first (field order): the registration below then holds the
    // last reference, so the endpoint closes right after the registration.
    endpoint: SharedEndpoint,
    registration: Registration,
    bounce: Arc<Bounce>,
    peer: u64,
    failure: Option<String>,
}

/// One server's region over an endpoint of the provider it granted.
#[derive(Debug)]
pub struct OfiSession {
    state: Mutex<SessionState>,
    grant: OfiRegionGrant,
}

impl OfiSession {
    /// Opens an endpoint of the grant's provider (bound to `source`, the
    /// local address toward the server, when given: see
    /// [`source_toward`](super::source_toward)), registers the bounce
    /// buffer and inserts the server's address. Everything opened is
    /// closed again if a later step fails.
    pub fn open(grant: OfiRegionGrant, source: Option<&str>) -> Result<Arc<OfiSession>, OfiError> {
        let endpoint = Endpoint::open(Some(&grant.provider), source, false)?;
        let bounce = Arc::new(Bounce::new(BOUNCE_BYTES)?);
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(&bounce) as _;
        // SAFETY: `owner` is the `Bounce` allocation `[ptr, ptr + len)`;
        // the registration holds it, so it outlives the registration.
        let registration = unsafe {
            Registration::new(
                &endpoint,
                owner,
                bounce.ptr.as_ptr(),
                BOUNCE_BYTES,
                FI_READ,
                0,
            )?
        };
        let peer = lock(&endpoint).insert_peer(&grant.endpoint)?;
        Ok(Arc::new(OfiSession {
            state: Mutex::new(SessionState {
                endpoint,
                registration,
                bounce,
                peer,
                failure: None,
            }),
            grant,
        }))
    }

    pub fn grant(&self) -> &OfiRegionGrant {
        &self.grant
    }

    pub fn provider(&self) -> &str {
        &self.grant.provider
    }

    fn state(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why the session closed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.state().failure.clone()
    }

    pub fn fabric(self: &Arc<Self>) -> Arc<OfiFabric> {
        Arc::new(OfiFabric {
            session: Arc::clone(self),
        })
    }

    fn read_all(&self, reads: &mut [ReadOp<'_>]) -> Result<(), OfiError> {
        let mut state = self.state();
        if let Some(why) = &state.failure {
            return Err(OfiError::Closed(why.clone()));
        }
        let max_posted = MAX_POSTED.min(lock(&state.endpoint).tx_size().max(1));
        let mut pieces = [Piece::default(); MAX_POSTED];
        let mut cursor = Cursor::default();
        loop {
            let n = next_round(
                |i| reads.get(i).map(|op| op.buf.len()),
                &mut cursor,
                BOUNCE_BYTES,
                &mut pieces[..max_posted],
            );
            if n == 0 {
                return Ok(());
            }
            let round = &pieces[..n];
            if let Err(e) = self.run_round(&mut state, reads, round) {
                if !matches!(e, OfiError::Completion { code, .. } if super::error::is_access_error(code))
                {
                    state.failure = Some(e.to_string());
                }
                return Err(e);
            }
            copy_out(&state.bounce, reads, round);
        }
    }

    /// Posts `round` and waits for every one of its completions.
    fn run_round(
        &self,
        state: &mut SessionState,
        reads: &[ReadOp<'_>],
        round: &[Piece],
    ) -> Result<(), OfiError> {
        let deadline = Instant::now() + READ_TIMEOUT;
        let mut ep = lock(&state.endpoint);
        let mut waiter = Waiter::default();
        let mut posted = 0;
        while posted < round.len() && waiter.error.is_none() {
            let p = round[posted];
            let remote = self.grant.addr + reads[p.op].offset + p.op_offset as u64;
            // SAFETY: the piece lies inside the bounce buffer (`plan` keeps
            // rounds within BOUNCE_BYTES), which the session owns and the
            // registration covers; nobody touches it until every completion
            // of the round is polled below or the transfers are ended.
            let sent = unsafe {
                ep.post_read(
                    state.bounce.ptr.as_ptr().add(p.bounce_offset),
                    p.len,
                    state.registration.desc(),
                    state.peer,
                    remote,
                    self.grant.key,
                    posted as u64,
                )
            };
            match sent {
                Ok(true) => posted += 1,
                Ok(false) => waiter.poll(&mut ep),
                Err(e) => waiter.error = Some(e),
            }
            waiter.check_deadline(&mut ep, deadline)?;
        }
        for _ in 0..EAGER_POLLS {
            if waiter.done >= posted {
                break;
            }
            waiter.poll(&mut ep);
        }
        if waiter.done < posted {
            blocking(|| {
                while waiter.done < posted {
                    waiter.sleep(&mut ep, deadline);
                    waiter.check_deadline(&mut ep, deadline)?;
                }
                Ok::<(), OfiError>(())
            })?;
        }
        waiter.error.map_or(Ok(()), Err)
    }
}

/// Completions of a round counted so far, and its first error.
#[derive(Default)]
struct Waiter {
    done: usize,
    error: Option<OfiError>,
    empty_polls: u32,
}

impl Waiter {
    fn poll(&mut self, ep: &mut Endpoint) {
        let mut tags = [0u64; MAX_POSTED];
        let polled = ep.poll(&mut tags);
        self.count(ep, polled);
    }

    /// Sleeps in the queue's wait until a completion (or `deadline`, or a
    /// slice of it); polls where the queue has no wait object.
    fn sleep(&mut self, ep: &mut Endpoint, deadline: Instant) {
        if !ep.waitable() {
            return self.poll(ep);
        }
        let mut tags = [0u64; MAX_POSTED];
        let left = deadline.saturating_duration_since(Instant::now());
        let waited = ep.wait(&mut tags, left.min(WAIT_SLICE));
        // An empty wait already slept: no spinning to add.
        if !matches!(waited, Ok(0)) {
            self.count(ep, waited);
        }
    }

    fn count(&mut self, ep: &mut Endpoint, polled: Result<usize, (u64, OfiError)>) {
        match polled {
            Ok(0) => {
                self.empty_polls += 1;
                if self.empty_polls.is_multiple_of(POLLS_PER_YIELD) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            Ok(n) => self.done += n,
            Err((_, e @ OfiError::Completion { .. })) => {
                self.done += 1;
                self.error.get_or_insert(e);
            }
            // The queue itself failed: no completion can be counted on.
            Err((_, e)) => {
                ep.close_transfers();
                self.error.get_or_insert(e);
                self.done = usize::MAX;
            }
        }
    }

    /// Past the deadline, ends the endpoint's transfers (so no late read
    /// writes the bounce buffer) and fails the round.
    fn check_deadline(&mut self, ep: &mut Endpoint, deadline: Instant) -> Result<(), OfiError> {
        if Instant::now() < deadline {
            return Ok(());
        }
        ep.close_transfers();
        Err(OfiError::Timeout {
            ms: READ_TIMEOUT.as_millis() as u64,
        })
    }
}

fn copy_out(bounce: &Bounce, reads: &mut [ReadOp<'_>], round: &[Piece]) {
    for p in round {
        let dst = &mut reads[p.op].buf[p.op_offset..p.op_offset + p.len];
        // SAFETY: every read of the round completed, so the provider no
        // longer writes `[bounce_offset, bounce_offset + len)`, which lies
        // inside the buffer (`plan`); the session lock is held by the
        // caller, and `dst` is a distinct, exclusively borrowed buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bounce.ptr.as_ptr().add(p.bounce_offset),
                dst.as_mut_ptr(),
                p.len,
            );
        }
    }
}

/// The regions one session can read: the granted one.
#[derive(Debug)]
pub struct OfiFabric {
    session: Arc<OfiSession>,
}

impl Fabric for OfiFabric {
    fn open(&self, remote: &RegionDescriptor) -> Result<Arc<dyn RemoteRegion>, FabricError> {
        let current = descriptor_of(&self.session.grant);
        // The grant is the truth about the region: a caller cannot widen it
        // or name another key (the provider would refuse, but refuse early).
        if remote.key != current.key || remote.epoch != current.epoch {
            return Err(FabricError::BadKey { key: remote.key });
        }
        if let Some(why) = self.session.failure() {
            return Err(FabricError::PeerGone(why));
        }
        Ok(Arc::new(OfiRegion {
            session: Arc::clone(&self.session),
            descriptor: current,
        }))
    }
}

/// A granted region read with `fi_read`.
#[derive(Debug)]
pub struct OfiRegion {
    session: Arc<OfiSession>,
    descriptor: RegionDescriptor,
}

impl RemoteRegion for OfiRegion {
    fn descriptor(&self) -> RegionDescriptor {
        self.descriptor
    }

    /// Even over loopback: the grant says nothing of where the owner runs.
    fn on_this_host(&self) -> bool {
        false
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.read_batch(&mut [ReadOp { offset, buf }])
    }

    fn read_batch(&self, reads: &mut [ReadOp<'_>]) -> Result<(), FabricError> {
        for op in reads.iter() {
            check_range(&self.descriptor, op.offset, op.buf.len() as u64)?;
        }
        self.session
            .read_all(reads)
            .map_err(|e| e.into_fabric(self.descriptor.key))
    }
}
