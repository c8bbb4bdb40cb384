//! A node's side of the `ofi` transport: one RDM endpoint bound to the
//! node's address, a progress thread, and its region registered for remote
//! reads (one registration per region epoch).
//!
//! Progress: providers with manual data progress (`tcp;ofi_rxm`) serve a
//! peer's `fi_read` of this node's memory only while this endpoint is
//! driven, so a thread drives it. Where the completion queue has a wait
//! object the thread sleeps in `fi_cq_sread` (without the endpoint's
//! mutex: the endpoint is `FI_THREAD_SAFE`), which the provider wakes when
//! a peer's request arrives on its sockets and which then serves it: no
//! polling, no sleep to wait out. Without one it polls, spinning while
//! reads arrive and sleeping briefly when idle. (The server posts no
//! operations of its own, so its queue never fills.)
//!
//! Retirement: a registration stops being current when a snapshot install
//! gives the region a new epoch; it is closed after the grace period, so a
//! read already in flight finds valid memory (and then fails validation),
//! and reads with its key fail after that (`BadKey` on the client, which
//! asks for the new grant).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::OfiRegionGrant;

use super::endpoint::{Endpoint, Progress, Registration, SharedEndpoint, lock};
use super::error::OfiError;
use super::ffi::FI_REMOTE_READ;
use crate::memory::RegionMemory;
use crate::transport::random_key;

/// Without a wait object: empty polls before the progress thread sleeps.
const SPIN_POLLS: u32 = 20_000;
/// Its sleep when idle: the latency of the first read after a quiet spell.
const IDLE_SLEEP: Duration = Duration::from_micros(200);
/// With one: the longest sleep in the queue's wait, which bounds how long
/// the thread takes to see `stop` should the wake-up signal be lost, and
/// how long a connection request waits where the provider does not wake
/// the queue for it.
const WAIT_AT_MOST: Duration = Duration::from_millis(50);

#[derive(Debug)]
struct RegionRegistration {
    node_id: u64,
    /// The shard whose region it is: each shard has its own current one.
    shard: ShardId,
    epoch: u64,
    memory: Arc<RegionMemory>,
    registration: Registration,
    addr: u64,
    retired_at: Option<Instant>,
}

#[derive(Debug)]
pub struct OfiServer {
    endpoint: SharedEndpoint,
    provider: String,
    name: Vec<u8>,
    regions: Mutex<Vec<RegionRegistration>>,
    grace: Duration,
    stop: Arc<AtomicBool>,
    /// The progress thread's wait, to wake it when stopping.
    waker: Option<Arc<Progress>>,
    progress: Option<JoinHandle<()>>,
}

impl OfiServer {
    /// Opens an endpoint of `provider` (or the first of `AUTO_PROVIDERS`
    /// that opens) bound to `node` (the node's listen address).
    pub fn open(
        provider: Option<&str>,
        node: Option<&str>,
        grace: Duration,
    ) -> Result<OfiServer, OfiError> {
        let endpoint = open_first(provider, node)?;
        let (provider, name) = {
            let mut ep = lock(&endpoint);
            (ep.provider().to_owned(), ep.name()?)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let waker = Progress::of(&endpoint).map(Arc::new);
        let progress = std::thread::Builder::new()
            .name("ofi-progress".into())
            .spawn({
                let endpoint = Arc::clone(&endpoint);
                let waiting = waker.clone();
                let stop = Arc::clone(&stop);
                move || match waiting {
                    Some(progress) => wait_for_requests(&progress, &stop),
                    None => poll_for_requests(&endpoint, &stop),
                }
            })
            .map_err(|e| OfiError::Unavailable(format!("progress thread: {e}")))?;
        Ok(OfiServer {
            endpoint,
            provider,
            name,
            regions: Mutex::new(Vec::new()),
            grace,
            stop,
            waker,
            progress: Some(progress),
        })
    }

    /// The provider line for the log and `/status`.
    pub fn describe(&self) -> String {
        format!(
            "{} (libfabric {}, progress {})",
            self.provider,
            super::endpoint::version_text(super::endpoint::load().unwrap_or(0)),
            if self.waker.is_some() {
                "waits on the completion queue"
            } else {
                "polled"
            }
        )
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    fn regions(&self) -> MutexGuard<'_, Vec<RegionRegistration>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The grant of `shard`'s current region, registering it for remote
    /// reads on first use; the shard's other registrations start their
    /// grace period (a node hosting several shards has one current region
    /// per shard).
    pub fn grant(
        &self,
        memory: &Arc<RegionMemory>,
        node_id: u64,
        shard: ShardId,
        epoch: u64,
    ) -> Result<OfiRegionGrant, OfiError> {
        let now = Instant::now();
        let mut regions = self.regions();
        for r in regions.iter_mut().filter(|r| r.shard == shard) {
            let current = r.epoch == epoch && Arc::ptr_eq(&r.memory, memory);
            if !current && r.retired_at.is_none() {
                r.retired_at = Some(now);
            }
        }
        let current = regions
            .iter()
            .position(|r| r.shard == shard && r.retired_at.is_none());
        let index = match current {
            Some(index) => index,
            None => {
                regions.push(self.register(memory, node_id, shard, epoch)?);
                regions.len() - 1
            }
        };
        let r = &regions[index];
        Ok(OfiRegionGrant {
            node_id,
            region_epoch: epoch,
            provider: self.provider.clone(),
            endpoint: self.name.clone(),
            addr: r.addr,
            key: r.registration.key(),
            len_bytes: memory.len_bytes() as u64,
        })
    }

    fn register(
        &self,
        memory: &Arc<RegionMemory>,
        node_id: u64,
        shard: ShardId,
        epoch: u64,
    ) -> Result<RegionRegistration, OfiError> {
        let (virtual_addresses, requested_key) = {
            let ep = lock(&self.endpoint);
            let bits = ep.key_bits();
            let key = match bits {
                64.. => random_key(),
                _ => random_key() & ((1u64 << bits) - 1),
            };
            (ep.virtual_addresses(), key)
        };
        let base = memory.base_ptr();
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(memory) as _;
        // Remote-read only: clients can read the region, never write it.
        // SAFETY: `owner` is the `RegionMemory` whose mapping is
        // `[base, base + len)`; the registration holds it, so the mapping
        // outlives the registration.
        let registration = unsafe {
            Registration::new(
                &self.endpoint,
                owner,
                base,
                memory.len_bytes(),
                FI_REMOTE_READ,
                requested_key,
            )?
        };
        tracing::info!(
            %shard,
            epoch,
            bytes = memory.len_bytes(),
            provider = %self.provider,
            "region registered for ofi reads"
        );
        Ok(RegionRegistration {
            node_id,
            shard,
            epoch,
            memory: Arc::clone(memory),
            registration,
            addr: if virtual_addresses { base as u64 } else { 0 },
            retired_at: None,
        })
    }

    /// Starts the grace period of the current registrations of shards not
    /// in `hosted`: a replica moved away or closed releases its region
    /// after the grace period, as an old epoch's does.
    pub fn retire_unhosted(&self, hosted: &[ShardId]) {
        let now = Instant::now();
        let mut regions = self.regions();
        let unhosted = regions.iter_mut().filter(|r| !hosted.contains(&r.shard));
        unhosted.for_each(|r| r.retired_at = r.retired_at.or(Some(now)));
    }

    /// Closes registrations retired longer than the grace period ago.
    pub fn sweep(&self) {
        let now = Instant::now();
        let expired: Vec<RegionRegistration> = {
            let mut regions = self.regions();
            let (keep, expired) = regions.drain(..).partition(|r| {
                r.retired_at
                    .is_none_or(|at| now.duration_since(at) < self.grace)
            });
            *regions = keep;
            expired
        };
        // Closed outside the regions lock (each close takes the endpoint's).
        for r in expired {
            tracing::info!(
                node_id = r.node_id,
                epoch = r.epoch,
                "retired region's ofi registration closed after its grace period"
            );
        }
    }

    /// Registrations open (current and retired), for tests and status.
    pub fn registrations(&self) -> usize {
        self.regions().len()
    }
}

impl Drop for OfiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(waker) = &self.waker {
            waker.signal();
        }
        if let Some(thread) = self.progress.take() {
            let _ = thread.join();
        }
    }
}

fn open_first(provider: Option<&str>, node: Option<&str>) -> Result<SharedEndpoint, OfiError> {
    if let Some(provider) = provider {
        return Endpoint::open(Some(provider), node, true);
    }
    let mut reasons = Vec::new();
    for provider in super::AUTO_PROVIDERS {
        match Endpoint::open(Some(provider), node, true) {
            Ok(endpoint) => return Ok(endpoint),
            Err(e) => reasons.push(format!("{provider}: {e}")),
        }
    }
    Err(OfiError::Unavailable(reasons.join("; ")))
}

/// The progress loop with a wait object: asleep in the queue's wait until
/// a peer's request arrives (the wait then serves it), until `stop`.
fn wait_for_requests(progress: &Progress, stop: &AtomicBool) {
    let mut tags = [0u64; 16];
    while !stop.load(Ordering::Relaxed) {
        if let Err((_, e)) = progress.wait(&mut tags, WAIT_AT_MOST) {
            tracing::debug!("ofi progress: {e}");
            // Not a tight loop should the queue keep failing.
            std::thread::sleep(IDLE_SLEEP);
        }
    }
}

/// The progress loop without one: polls until `stop`, sleeping when idle.
fn poll_for_requests(endpoint: &SharedEndpoint, stop: &AtomicBool) {
    let mut tags = [0u64; 16];
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let polled = lock(endpoint).poll(&mut tags);
        match polled {
            Ok(0) => idle = idle.saturating_add(1),
            Ok(_) => idle = 0,
            Err((_, e)) => {
                tracing::debug!("ofi progress: {e}");
                idle = 0;
            }
        }
        if idle > SPIN_POLLS {
            std::thread::sleep(IDLE_SLEEP);
        } else {
            std::hint::spin_loop();
        }
    }
}
