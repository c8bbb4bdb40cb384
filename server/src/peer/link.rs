//! The sending side's shared connections of a multi-shard node
//! (docs/sharding.md, section 3): one [`PeerLink`] per (target node,
//! purpose) carries the frames of every shard's Raft to that node, instead
//! of a connection per shard. Any shard's request is written whole under
//! the link's writer lock (no task in between: no extra wake-up on the way
//! out); one reader task per connection hands each answer to the request
//! waiting for its id (ids are unique per connection, not per shard).
//!
//! The connection opens lazily, with the hello of version 3. When it fails
//! every waiting request fails with it (openraft retries), and the next
//! request opens a new one. A request that gives up (timeout, cancelled)
//! removes its waiter; one cancelled in the middle of writing its frame
//! leaves the stream unusable, so that closes the connection too.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::Frame;
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::rpc::RpcError;
use rdkv_storage::state_machine::RegionStateMachine;
use rdkv_tls::{ReadHalf, WriteHalf};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use super::network::{connect, cut_off_error, network, send_request};
use super::redial::{DialPeer, Redial};
use super::{PeerContext, PeerHello, PeerRequest};
use crate::framed::{FrameReader, FrameWriter};

/// What a link carries: Raft's RPCs of every shard, or snapshot chunks (on
/// their own connection, so that a 4 MiB chunk never sits in front of
/// another shard's heartbeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    Raft,
    Snapshot,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Raft => "raft",
            Purpose::Snapshot => "snapshot",
        }
    }
}

/// What every link of a node shares: the node's cluster identity and the
/// count of open connections.
#[derive(Debug, Default)]
struct Shared {
    /// The metadata group's state: its cluster identity is the node's, the
    /// one a link's hello carries (each data shard's own identity is
    /// per shard, so no single shard's could stand for the connection).
    identity: OnceLock<RegionStateMachine>,
    open: AtomicU64,
}

/// The node's links, one per (target node, purpose): held by every shard's
/// `PeerNetwork`.
#[derive(Debug, Default)]
pub struct PeerLinks {
    shared: Arc<Shared>,
    links: Mutex<HashMap<(u64, Purpose), Arc<PeerLink>>>,
}

impl PeerLinks {
    pub fn new() -> PeerLinks {
        PeerLinks::default()
    }

    /// Where the node's cluster identity is read when a link connects: the
    /// metadata group's state (set once, when its Raft starts).
    pub fn set_identity(&self, state: RegionStateMachine) {
        let _ = self.shared.identity.set(state);
    }

    /// Peer connections this node has open now (both purposes).
    pub fn open(&self) -> u64 {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// The link to node `target` at `addr` for `purpose`: the existing one,
    /// or a new one (replacing one to an older address of the node; the
    /// registry holds one per member and purpose).
    pub fn get(&self, target: u64, addr: &str, purpose: Purpose) -> Arc<PeerLink> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let link = links
            .entry((target, purpose))
            .or_insert_with(|| Arc::new(PeerLink::new(&self.shared, target, addr, purpose)));
        if link.addr != addr {
            *link = Arc::new(PeerLink::new(&self.shared, target, addr, purpose));
        }
        Arc::clone(link)
    }
}

#[derive(Debug)]
pub struct PeerLink {
    shared: Arc<Shared>,
    target: u64,
    addr: String,
    purpose: Purpose,
    /// The open connection; its lock is held while connecting (and while
    /// waiting for a dial's turn), so that shards asking at once share one
    /// new connection and one pacing.
    slot: tokio::sync::Mutex<Slot>,
}

/// A link's connection, and the pacing of its dials.
#[derive(Debug, Default)]
struct Slot {
    live: Option<Arc<Live>>,
    redial: Redial,
}

impl PeerLink {
    fn new(shared: &Arc<Shared>, target: u64, addr: &str, purpose: Purpose) -> PeerLink {
        PeerLink {
            shared: Arc::clone(shared),
            target,
            addr: addr.to_owned(),
            purpose,
            slot: tokio::sync::Mutex::new(Slot::default()),
        }
    }

    /// Sends `request` of `shard`, whose answer the returned [`Pending`]
    /// waits for. `ctx` (the shard's) opens the connection if none is open.
    pub(super) async fn send(
        &self,
        ctx: &PeerContext,
        shard: ShardId,
        request: &PeerRequest,
    ) -> Result<Pending, RpcError> {
        let live = self.live(ctx).await?;
        let request_id = live.next_request_id.fetch_add(1, Ordering::Relaxed);
        let pending = live
            .waiters
            .wait(request_id)
            .ok_or_else(|| network(format!("the connection to node {} closed", self.target)))?;
        let mut writer = live.writer.lock().await;
        let unfinished = CloseUnlessDone(Some(&live));
        let sent = send_request(Some(shard), &mut writer, request_id, request).await;
        unfinished.done();
        if let Err(e) = sent {
            live.close();
            return Err(network(format!("send to node {}: {e}", self.target)));
        }
        Ok(pending)
    }

    /// Fault injection cut this node off from the target: the connection
    /// is dropped (waiting requests fail, the next one connects anew) and
    /// the refusal counts as a failed dial, paced as one.
    pub(super) async fn refuse_cut(&self, peer: DialPeer) -> RpcError {
        let mut slot = self.slot.lock().await;
        if let Some(live) = slot.live.take() {
            live.close();
        }
        let refused = async { Err::<Infallible, _>(cut_off_error(self.target)) };
        let Err(refusal) = slot.redial.dial(peer, refused).await;
        refusal
    }

    /// The open connection, or a new one dialed in its turn ([`Redial`]).
    async fn live(&self, ctx: &PeerContext) -> Result<Arc<Live>, RpcError> {
        let mut slot = self.slot.lock().await;
        if let Some(live) = slot.live.as_ref().filter(|live| !live.waiters.is_closed()) {
            return Ok(Arc::clone(live));
        }
        slot.live = None;
        let mut hello = PeerHello::of(ctx);
        hello.cluster_id = self.identity();
        let dial = connect(ctx, self.target, &self.addr, hello.into_wire());
        let (reader, writer) = slot.redial.dial(ctx.dial_peer(self.target), dial).await?;
        let waiters = Arc::new(Waiters::default());
        let reader = tokio::spawn(read_answers(reader, Arc::clone(&waiters))).abort_handle();
        let live = Arc::new(Live {
            writer: tokio::sync::Mutex::new(writer),
            waiters,
            next_request_id: AtomicU64::new(1),
            reader,
            _counted: Opened::count(&self.shared, self.target, self.purpose),
        });
        slot.live = Some(Arc::clone(&live));
        Ok(live)
    }

    fn identity(&self) -> Option<ClusterId> {
        self.shared.identity.get().and_then(|sm| sm.cluster_id())
    }
}

/// One connection of a link.
#[derive(Debug)]
struct Live {
    writer: tokio::sync::Mutex<FrameWriter<WriteHalf>>,
    waiters: Arc<Waiters>,
    next_request_id: AtomicU64,
    reader: AbortHandle,
    _counted: Opened,
}

impl Live {
    fn close(&self) {
        self.waiters.close();
        self.reader.abort();
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.close();
    }
}

/// Counts an open connection while it lives: `PeerLinks::open` and the
/// gauge `rdkv_peer_links` (by purpose and peer).
#[derive(Debug)]
struct Opened {
    shared: Arc<Shared>,
    gauge: metrics::Gauge,
}

impl Opened {
    fn count(shared: &Arc<Shared>, target: u64, purpose: Purpose) -> Opened {
        let gauge = metrics::gauge!(
            "rdkv_peer_links",
            "purpose" => purpose.label(),
            "peer" => target.to_string()
        );
        gauge.increment(1.0);
        shared.open.fetch_add(1, Ordering::Relaxed);
        Opened {
            shared: Arc::clone(shared),
            gauge,
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
        self.shared.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Closes the connection if a write is abandoned before it finished (its
/// frame would be cut short in the stream).
struct CloseUnlessDone<'a>(Option<&'a Live>);

impl CloseUnlessDone<'_> {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for CloseUnlessDone<'_> {
    fn drop(&mut self) {
        if let Some(live) = self.0 {
            live.close();
        }
    }
}

/// The requests of a connection waiting for their answers. Bounded by the
/// requests in flight (at most `MAX_APPENDS_IN_FLIGHT` appends and one call
/// per shard and target): only this node's requests add to it.
#[derive(Debug, Default)]
struct Waiters(Mutex<Waiting>);

#[derive(Debug, Default)]
struct Waiting {
    closed: bool,
    answers: HashMap<u64, oneshot::Sender<Frame>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for request `request_id`'s answer; `None` once closed.
    fn wait(self: &Arc<Self>, request_id: u64) -> Option<Pending> {
        let (answer, waiting) = oneshot::channel();
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        state.answers.insert(request_id, answer);
        Some(Pending {
            request_id,
            answer: waiting,
            waiters: Arc::clone(self),
        })
    }

    /// Hands `frame` to its request (an answer nobody waits for any more,
    /// one that gave up, is dropped).
    fn deliver(&self, frame: Frame) {
        let answer = self.lock().answers.remove(&frame.request_id);
        if let Some(answer) = answer {
            let _ = answer.send(frame);
        }
    }

    fn forget(&self, request_id: u64) {
        self.lock().answers.remove(&request_id);
    }

    /// Fails every waiting request (their senders are dropped) and refuses
    /// new ones.
    fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.answers.clear();
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

/// A request sent on a link, waiting for its answer.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) request_id: u64,
    answer: oneshot::Receiver<Frame>,
    waiters: Arc<Waiters>,
}

impl Pending {
    /// The answer frame. Cancel-safe: waiting again goes on waiting.
    pub(super) async fn answer(&mut self, target: u64) -> Result<Frame, RpcError> {
        (&mut self.answer)
            .await
            .map_err(|_| network(format!("the connection to node {target} was lost")))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.waiters.forget(self.request_id);
    }
}

/// A connection's reader: each answer to its waiting request, until the
/// connection ends; then every request still waiting fails.
async fn read_answers(mut reader: FrameReader<ReadHalf>, waiters: Arc<Waiters>) {
    while let Ok(Some(frame)) = reader.next().await {
        waiters.deliver(frame);
    }
    waiters.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(waiters: &Waiters) -> usize {
        waiters.lock().answers.len()
    }

    #[tokio::test]
    async fn a_request_that_gives_up_leaves_no_waiter_and_a_closed_link_fails_the_others() {
        let waiters = Arc::new(Waiters::default());
        let gave_up = waiters.wait(1).unwrap();
        let mut waits = waiters.wait(2).unwrap();
        assert_eq!(waiting(&waiters), 2);
        drop(gave_up);
        assert_eq!(waiting(&waiters), 1);
        // An answer to a request that gave up is dropped, not kept.
        waiters.deliver(Frame {
            kind: rdkv_proto::wire::FrameKind::Response,
            request_id: 1,
            payload: bytes::Bytes::new(),
        });
        assert_eq!(waiting(&waiters), 1);
        waiters.close();
        assert!(waits.answer(9).await.is_err());
        assert!(waiters.wait(3).is_none());
        assert_eq!(waiting(&waiters), 0);
    }
}
