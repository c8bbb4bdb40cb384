//! One RC queue pair and what it needs: receive buffers posted for the
//! peer's SENDs, send buffers, the credit window, fragment reassembly, and
//! the accounting of READs in flight.
//!
//! Lifecycle: [`Prepared::new`] creates the QP and moves it to INIT with all
//! receive buffers posted (allowed in INIT, and required before the peer
//! may send); its [`QpEndpoint`] goes to the peer over TCP;
//! [`Prepared::connect`] takes the peer's endpoint and moves the QP to RTR
//! then RTS. Any failed completion, protocol error or drop (of the
//! [`Prepared`] too: a refused setup) moves it to the error state and
//! destroys it: outstanding requests are failed with the typed error and
//! their work-request ids become stale.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rdkv_proto::wire::QpEndpoint;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::queue_pair::{
    GenericQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use tokio::sync::{Notify, mpsc};

use super::context::{RdmaContext, Registered, mtu_of_bytes};
use super::poller::WrKind;
use crate::rdma::admission::{ENTRIES_PER_CONNECTION, Ticket};
use crate::rdma::batch::{Batch, BatchOwner, ReadSlots};
use crate::rdma::contexts::Health;
use crate::rdma::credits::CreditWindow;
use crate::rdma::device::{LinkLayer, path_mtu_bytes};
use crate::rdma::error::RdmaError;
use crate::rdma::fragment::{
    FRAGMENT_HEADER_BYTES, FragmentKind, Reassembler, parse, plan, write_header,
};
use crate::rdma::qp_params::{
    ACK_TIMEOUT_EXPONENT, GRH_HOP_LIMIT, MAX_MESSAGE_BYTES, MIN_RNR_TIMER_CODE, PKEY_INDEX,
    READ_QUEUE_DEPTH, READ_TIMEOUT_MS, RECV_BUFFER_BYTES, RECV_BUFFERS, RETRY_COUNT,
    RNR_RETRY_COUNT, ReadDepths, SEND_QUEUE_DEPTH, agree_read_depths, random_psn,
};
use crate::rdma::setup::{Abandon, Unconnected};
use crate::rdma::wait::wait_until;

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a READ-side wait that ran out of time fails with.
pub(crate) const READ_TIMED_OUT: RdmaError = RdmaError::Timeout {
    timeout_ms: READ_TIMEOUT_MS,
};

/// A complete message received, and whether its grant is still owed.
#[derive(Debug)]
pub struct Incoming {
    pub bytes: Vec<u8>,
}

#[derive(Debug)]
struct ConnState {
    credits: CreditWindow,
    reassembler: Reassembler,
    free_send_slots: Vec<u32>,
    failed: Option<RdmaError>,
    /// Largest payload of one fragment (the peer's buffer or ours, minus
    /// the header).
    max_fragment_payload: usize,
    /// READ work requests posted and not completed.
    reads_in_flight: u32,
}

#[derive(Debug)]
pub(crate) struct ConnShared {
    id: u64,
    ctx: Arc<RdmaContext>,
    qp: Mutex<Option<GenericQueuePair>>,
    recv: Registered,
    send: Registered,
    state: Mutex<ConnState>,
    /// Credits, send slots or read-queue room became free, or the connection
    /// failed (async senders wait on this).
    send_ready: Notify,
    /// Same, for readers (waited on through `rdma::wait`).
    read_room: Notify,
    incoming: Mutex<Option<mpsc::UnboundedSender<Incoming>>>,
    closed: AtomicBool,
    /// One message at a time: fragments of two messages never interleave.
    send_lock: tokio::sync::Mutex<()>,
    /// This connection's share of the context's table, returned when the
    /// last reference goes (after teardown drained its entries).
    _ticket: Ticket,
}

/// A connection being set up: QP in INIT, receive buffers posted. Dropped
/// unconnected (the peer refused, the control call failed), it tears the
/// queue pair down, which drains its posted receives from the table and so
/// frees it and its buffers.
#[derive(Debug)]
pub struct Prepared {
    shared: Unconnected<ConnShared>,
    local: QpEndpoint,
    incoming: mpsc::UnboundedReceiver<Incoming>,
}

impl Abandon for ConnShared {
    fn abandon(&self, reason: RdmaError) {
        self.fail(reason);
    }
}

impl BatchOwner for ConnShared {
    fn fail(&self, error: RdmaError) {
        ConnShared::fail(self, error);
    }

    fn release_reads(&self, n: u32) {
        ConnShared::release_reads(self, n);
    }
}

/// A connected queue pair; dropping it tears the connection down.
#[derive(Debug)]
pub struct QpConnection {
    pub(crate) shared: Arc<ConnShared>,
    pub local: QpEndpoint,
    pub remote: QpEndpoint,
}

impl Drop for QpConnection {
    fn drop(&mut self) {
        self.shared
            .fail(RdmaError::Closed("connection dropped".to_owned()));
    }
}

impl Prepared {
    /// Creates the queue pair; `remote_read` lets the peer READ memory
    /// registered with remote-read access through it (the server's side);
    /// `local_ip` is the control connection's local address (the GID).
    /// Refused when the context's completion queue has no room for another
    /// connection's worst case (existing ones keep theirs).
    pub fn new(
        ctx: &Arc<RdmaContext>,
        remote_read: bool,
        local_ip: Option<IpAddr>,
    ) -> Result<Prepared, RdmaError> {
        if ctx.has_failed() {
            return Err(RdmaError::Closed(format!(
                "{} reported a fatal event; reopening it",
                ctx.choice.device
            )));
        }
        let ticket = ctx.admission.admit(ENTRIES_PER_CONNECTION)?;
        let choice = &ctx.choice;
        let (gid_index, gid) = choice.gid_for(local_ip)?;
        let recv = ctx.register_buffers((RECV_BUFFERS * RECV_BUFFER_BYTES) as usize)?;
        let send = ctx.register_buffers((SEND_QUEUE_DEPTH * RECV_BUFFER_BYTES) as usize)?;
        let qp = ctx
            .pd()
            .create_qp_builder()
            .setup_max_send_wr(READ_QUEUE_DEPTH + SEND_QUEUE_DEPTH)
            .setup_max_recv_wr(RECV_BUFFERS)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(ctx.cq.clone())
            .setup_recv_cq(ctx.cq.clone())
            .build()
            .map_err(|e| RdmaError::verbs("ibv_create_qp", e))?;
        let mut qp = GenericQueuePair::from(qp);
        let access = if remote_read {
            AccessFlags::RemoteRead
        } else {
            AccessFlags::LocalWrite
        };
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(PKEY_INDEX)
            .setup_port(ctx.choice.port)
            .setup_access_flags(access);
        qp.modify(&attr)
            .map_err(|e| RdmaError::verbs("ibv_modify_qp(INIT)", e))?;
        let local = QpEndpoint {
            qp_num: qp.qp_number(),
            psn: random_psn(),
            lid: choice.lid,
            gid,
            gid_index,
            port: choice.port,
            mtu_bytes: choice.mtu_bytes,
            recv_credits: RECV_BUFFERS,
            recv_buffer_bytes: RECV_BUFFER_BYTES,
            max_rd_atomic: choice.max_rd_atomic,
            max_dest_rd_atomic: choice.max_dest_rd_atomic,
        };
        local
            .validate()
            .map_err(|e| RdmaError::verbs("local endpoint", e))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(ConnShared {
            id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
            ctx: Arc::clone(ctx),
            qp: Mutex::new(Some(qp)),
            recv,
            send,
            state: Mutex::new(ConnState {
                // Replaced at connect, once the peer's window is known.
                credits: CreditWindow::new(0, RECV_BUFFERS),
                reassembler: Reassembler::new(MAX_MESSAGE_BYTES),
                free_send_slots: (0..SEND_QUEUE_DEPTH).rev().collect(),
                failed: None,
                max_fragment_payload: RECV_BUFFER_BYTES as usize - FRAGMENT_HEADER_BYTES,
                reads_in_flight: 0,
            }),
            send_ready: Notify::new(),
            read_room: Notify::new(),
            incoming: Mutex::new(Some(tx)),
            closed: AtomicBool::new(false),
            send_lock: tokio::sync::Mutex::new(()),
            _ticket: ticket,
        });
        // Device events about this QP or its port now reach it.
        ctx.connections.register(local.qp_num, choice.port, &shared);
        // From here a failure drops the guard, which tears the QP down.
        let shared = Unconnected::new(shared);
        if let Some(conn) = shared.conn() {
            for slot in 0..RECV_BUFFERS {
                conn.post_recv(slot)?;
            }
        }
        Ok(Prepared {
            shared,
            local,
            incoming: rx,
        })
    }

    pub fn local(&self) -> QpEndpoint {
        self.local
    }

    /// RTR then RTS towards `remote` (already validated by the decoder).
    pub fn connect(
        self,
        remote: QpEndpoint,
    ) -> Result<(QpConnection, mpsc::UnboundedReceiver<Incoming>), RdmaError> {
        let Prepared {
            shared,
            local,
            incoming,
        } = self;
        let shared = shared
            .connected()
            .ok_or_else(|| RdmaError::Closed("set up twice".into()))?;
        let connection = QpConnection {
            shared,
            local,
            remote,
        };
        connection.shared.to_rts(&local, &remote)?;
        Ok((connection, incoming))
    }
}

impl ConnShared {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    fn state(&self) -> MutexGuard<'_, ConnState> {
        lock(&self.state)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn failure(&self) -> Option<RdmaError> {
        self.state().failed.clone()
    }

    fn to_rts(&self, local: &QpEndpoint, remote: &QpEndpoint) -> Result<(), RdmaError> {
        let choice = &self.ctx.choice;
        let depths = agree_read_depths(
            ReadDepths {
                initiator: local.max_rd_atomic,
                responder: local.max_dest_rd_atomic,
            },
            ReadDepths {
                initiator: remote.max_rd_atomic,
                responder: remote.max_dest_rd_atomic,
            },
        );
        let mut guard = lock(&self.qp);
        let qp = guard
            .as_mut()
            .ok_or_else(|| RdmaError::Closed("closed before connecting".into()))?;
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid)
            .setup_service_level(0)
            .setup_port(choice.port);
        // RoCE routes by GID (IP) only: the GRH is mandatory there; on
        // InfiniBand it is needed only across subnets.
        if choice.link_layer != LinkLayer::InfiniBand || remote.lid == 0 {
            ah.setup_grh(
                &Gid { raw: remote.gid },
                0,
                local.gid_index,
                GRH_HOP_LIMIT,
                0,
            );
        }
        let mut rtr = QueuePairAttribute::new();
        rtr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu_of_bytes(path_mtu_bytes(
                local.mtu_bytes,
                remote.mtu_bytes,
            )))
            .setup_dest_qp_num(remote.qp_num)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(depths.responder)
            .setup_min_rnr_timer(MIN_RNR_TIMER_CODE)
            .setup_address_vector(&ah);
        qp.modify(&rtr)
            .map_err(|e| RdmaError::verbs("ibv_modify_qp(RTR)", e))?;
        let mut rts = QueuePairAttribute::new();
        rts.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(local.psn)
            .setup_timeout(ACK_TIMEOUT_EXPONENT)
            .setup_retry_cnt(RETRY_COUNT)
            .setup_rnr_retry(RNR_RETRY_COUNT)
            .setup_max_read_atomic(depths.initiator);
        qp.modify(&rts)
            .map_err(|e| RdmaError::verbs("ibv_modify_qp(RTS)", e))?;
        drop(guard);
        let mut state = self.state();
        state.credits = CreditWindow::new(remote.recv_credits, RECV_BUFFERS);
        state.max_fragment_payload = (remote.recv_buffer_bytes.min(RECV_BUFFER_BYTES) as usize)
            .saturating_sub(FRAGMENT_HEADER_BYTES)
            .max(1);
        Ok(())
    }

    /// Posts one work request on the send queue; `kind` completes it.
    fn post_send_wr(
        self: &Arc<ConnShared>,
        kind: WrKind,
        build: impl FnOnce(&mut sideway::ibverbs::queue_pair::GenericPostSendGuard<'_>, u64),
    ) -> Result<(), RdmaError> {
        let wr_id = self.ctx.table().insert(kind)?;
        let mut guard = lock(&self.qp);
        let Some(qp) = guard.as_mut() else {
            drop(guard);
            let kind = self.ctx.table().take(wr_id);
            if let Some(kind) = kind {
                kind.abandon(&RdmaError::Closed("connection closed".into()));
            }
            return Err(self.closed_error());
        };
        let mut post = qp.start_post_send();
        build(&mut post, wr_id);
        if let Err(e) = post.post() {
            drop(guard);
            return self.fail_with(RdmaError::verbs("ibv_post_send", e));
        }
        Ok(())
    }

    fn post_recv(self: &Arc<ConnShared>, slot: u32) -> Result<(), RdmaError> {
        let kind = WrKind::Recv {
            conn: Arc::clone(self),
            slot,
        };
        let wr_id = self.ctx.table().insert(kind)?;
        let mut guard = lock(&self.qp);
        let Some(qp) = guard.as_mut() else {
            drop(guard);
            self.ctx.table().take(wr_id);
            return Err(self.closed_error());
        };
        let mut post = qp.start_post_recv();
        let handle = post.construct_wr(wr_id);
        let addr = self.recv.addr() + u64::from(slot) * u64::from(RECV_BUFFER_BYTES);
        // SAFETY: the buffer is `RECV_BUFFER_BYTES` bytes inside `self.recv`,
        // registered with local write; `self.recv` lives as long as this
        // connection, which outlives the QP (destroyed in `fail` before the
        // last reference to `ConnShared` can go), so the NIC never writes
        // freed memory. The CPU reads it only after the completion.
        unsafe { handle.setup_sge(self.recv.lkey(), addr, RECV_BUFFER_BYTES) };
        if let Err(e) = post.post() {
            drop(guard);
            self.ctx.table().take(wr_id);
            return Err(RdmaError::verbs("ibv_post_recv", e));
        }
        Ok(())
    }

    fn closed_error(&self) -> RdmaError {
        self.failure()
            .unwrap_or_else(|| RdmaError::Closed("connection closed".into()))
    }

    /// A receive completed (poller thread): copy out, re-post, account.
    pub(crate) fn on_recv(self: &Arc<ConnShared>, slot: u32, error: Option<RdmaError>, len: u32) {
        if let Some(e) = error {
            self.fail(e);
            return;
        }
        let len = (len as usize).min(RECV_BUFFER_BYTES as usize);
        let mut bytes = vec![0u8; len];
        let offset = u64::from(slot) * u64::from(RECV_BUFFER_BYTES);
        if let Err(e) = self.recv.memory.read_bytes(offset, &mut bytes) {
            self.fail(RdmaError::verbs("reading a receive buffer", e));
            return;
        }
        // The bytes are copied: the buffer can take the next SEND at once.
        if let Err(e) = self.post_recv(slot) {
            self.fail(e);
            return;
        }
        let result = (|| {
            let fragment = parse(&bytes)?;
            let mut state = self.state();
            state.credits.on_received(fragment.credits_granted)?;
            match fragment.kind {
                FragmentKind::CreditUpdate => {
                    state.credits.on_reposted();
                    Ok(None)
                }
                FragmentKind::Data => match state.reassembler.push(&fragment)? {
                    // The grant of a message's last buffer is owed once the
                    // application takes it (backpressure), the others now.
                    Some(message) => Ok(Some(message)),
                    None => {
                        state.credits.on_reposted();
                        Ok(None)
                    }
                },
            }
        })();
        match result {
            Ok(Some(message)) => {
                if let Some(tx) = lock(&self.incoming).as_ref() {
                    let _ = tx.send(Incoming { bytes: message });
                }
            }
            Ok(None) => {}
            Err(e) => {
                self.fail(e);
                return;
            }
        }
        self.send_ready.notify_waiters();
        self.maybe_send_update();
    }

    /// The application took a message: its last buffer's grant is owed.
    pub(crate) fn consumed(self: &Arc<ConnShared>) {
        self.state().credits.on_reposted();
        self.maybe_send_update();
    }

    pub(crate) fn on_send_done(self: &Arc<ConnShared>, slot: u32, error: Option<RdmaError>) {
        if let Some(e) = error {
            self.fail(e);
            return;
        }
        self.state().free_send_slots.push(slot);
        self.send_ready.notify_waiters();
        self.maybe_send_update();
    }

    /// Sends a credit-only update if one is due and a send slot is free (a
    /// freed slot calls this again).
    fn maybe_send_update(self: &Arc<ConnShared>) {
        let (slot, grant) = {
            let mut state = self.state();
            if state.failed.is_some() || !state.credits.update_due() {
                return;
            }
            let Some(slot) = state.free_send_slots.pop() else {
                return;
            };
            match state.credits.try_send_update() {
                Some(grant) => (slot, grant),
                None => {
                    state.free_send_slots.push(slot);
                    return;
                }
            }
        };
        if let Err(e) = self.send_fragment(slot, FragmentKind::CreditUpdate, grant, 0, 0, &[]) {
            self.fail(e);
        }
    }

    fn send_fragment(
        self: &Arc<ConnShared>,
        slot: u32,
        kind: FragmentKind,
        grant: u32,
        total_bytes: u32,
        offset: u32,
        payload: &[u8],
    ) -> Result<(), RdmaError> {
        let mut header = [0u8; FRAGMENT_HEADER_BYTES];
        write_header(&mut header, kind, grant, total_bytes, offset);
        let slot_offset = u64::from(slot) * u64::from(RECV_BUFFER_BYTES);
        let mut buf = Vec::with_capacity(FRAGMENT_HEADER_BYTES + payload.len());
        buf.extend_from_slice(&header);
        buf.extend_from_slice(payload);
        self.send
            .memory
            .write_bytes(slot_offset, &buf)
            .map_err(|e| RdmaError::verbs("filling a send buffer", e))?;
        let addr = self.send.addr() + slot_offset;
        let lkey = self.send.lkey();
        let len = buf.len() as u32;
        self.post_send_wr(
            WrKind::Send {
                conn: Arc::clone(self),
                slot,
            },
            |post, wr_id| {
                let handle = post
                    .construct_wr(wr_id, WorkRequestFlags::Signaled)
                    .setup_send();
                // SAFETY: `len` bytes at `addr` lie inside `self.send`
                // (slot-sized, registered), filled above and not touched
                // again until this send's completion returns the slot.
                unsafe { handle.setup_sge(lkey, addr, len) };
            },
        )
    }

    /// Sends one message, fragment by fragment, waiting for credits and send
    /// slots until `deadline`. `Ok(false)`: nothing was sent (the deadline
    /// passed first); an error after the first fragment fails the
    /// connection (the peer holds half a message).
    pub(crate) async fn send_message(
        self: &Arc<ConnShared>,
        message: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<bool, RdmaError> {
        let total = u32::try_from(message.len())
            .ok()
            .filter(|&n| n <= MAX_MESSAGE_BYTES)
            .ok_or_else(|| {
                RdmaError::Fragment(crate::rdma::fragment::FragmentError::TooLarge {
                    len_bytes: message.len() as u64,
                    max_bytes: u64::from(MAX_MESSAGE_BYTES),
                })
            })?;
        let Ok(_one_message) = tokio::time::timeout_at(deadline, self.send_lock.lock()).await
        else {
            return Ok(false);
        };
        let max_payload = self.state().max_fragment_payload;
        for (index, (offset, len)) in plan(message.len(), max_payload).enumerate() {
            let (slot, grant) = loop {
                let notified = self.send_ready.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let mut state = self.state();
                    if let Some(e) = &state.failed {
                        return Err(e.clone());
                    }
                    if let Some(&slot) = state.free_send_slots.last()
                        && let Some(grant) = state.credits.try_send_data()
                    {
                        state.free_send_slots.pop();
                        break (slot, grant);
                    }
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    if index == 0 {
                        return Ok(false);
                    }
                    // Half a message is on the wire: the stream cannot go on.
                    return self.fail_with(RdmaError::Closed(
                        "no send credit before the deadline in the middle of a message".into(),
                    ));
                }
            };
            let sent = self.send_fragment(
                slot,
                FragmentKind::Data,
                grant,
                total,
                offset as u32,
                &message[offset..offset + len],
            );
            if let Err(e) = sent {
                return self.fail_with(e);
            }
        }
        Ok(true)
    }

    /// Room for `n` more READs on the send queue, waiting until `deadline`
    /// on a future (not a Condvar: see `rdma::wait`).
    pub(crate) fn reserve_reads(&self, n: u32, deadline: Instant) -> Result<(), RdmaError> {
        wait_until(self.read_room_for(n), deadline).unwrap_or(Err(READ_TIMED_OUT))
    }

    async fn read_room_for(&self, n: u32) -> Result<(), RdmaError> {
        loop {
            let room = self.read_room.notified();
            let mut room = std::pin::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.state();
                if let Some(e) = &state.failed {
                    return Err(e.clone());
                }
                if state.reads_in_flight + n <= READ_QUEUE_DEPTH {
                    state.reads_in_flight += n;
                    return Ok(());
                }
            }
            room.await;
        }
    }

    pub(crate) fn release_reads(&self, n: u32) {
        let mut state = self.state();
        state.reads_in_flight = state.reads_in_flight.saturating_sub(n);
        drop(state);
        self.read_room.notify_waiters();
    }

    /// Posts READs (`(remote addr, rkey, local addr, lkey, len)` each) in
    /// one post: one doorbell for the whole batch.
    pub(crate) fn post_reads(
        self: &Arc<ConnShared>,
        batch: &Arc<ReadBatch>,
        reads: &[(u64, u32, u64, u32, u32)],
    ) -> Result<(), RdmaError> {
        // All or nothing: on refusal nothing of the batch is in the table,
        // and the caller's drop of the batch returns its slots; the
        // connection is not failed for it.
        let ids = self
            .ctx
            .table()
            .insert_all(reads.iter().map(|_| WrKind::Read {
                batch: Arc::clone(batch),
            }))?;
        let mut guard = lock(&self.qp);
        let Some(qp) = guard.as_mut() else {
            drop(guard);
            // Never posted: taken back, so the batch's last reference is
            // the caller's.
            let kinds: Vec<WrKind> = {
                let mut table = self.ctx.table();
                ids.iter().filter_map(|id| table.take(*id)).collect()
            };
            drop(kinds);
            return Err(self.closed_error());
        };
        let mut post = qp.start_post_send();
        for (&(remote_addr, rkey, local_addr, lkey, len), &wr_id) in reads.iter().zip(&ids) {
            let handle = post
                .construct_wr(wr_id, WorkRequestFlags::Signaled)
                .setup_read(rkey, remote_addr);
            // SAFETY: `local_addr..+len` is a slot of the client's registered
            // read pool, reserved for this batch until its last completion
            // (or the QP's destruction) has been seen; nothing else reads or
            // writes it meanwhile.
            unsafe { handle.setup_sge(lkey, local_addr, len) };
        }
        if let Err(e) = post.post() {
            drop(guard);
            // Part of the chain may have been posted: failing the connection
            // flushes those and abandons the rest, completing the batch.
            return self.fail_with(RdmaError::verbs("ibv_post_send(READ)", e));
        }
        Ok(())
    }

    /// Tears the connection down (idempotent): the QP goes to ERR and is
    /// destroyed (the NIC stops touching our buffers), then every request
    /// still in the table for it is failed with `error`.
    pub(crate) fn fail(&self, error: RdmaError) {
        {
            let mut state = self.state();
            if state.failed.is_some() {
                return;
            }
            tracing::debug!(conn = self.id, "rdma connection down: {error}");
            state.failed = Some(error.clone());
        }
        self.closed.store(true, Ordering::Release);
        if let Some(mut qp) = lock(&self.qp).take() {
            self.ctx.connections.remove(qp.qp_number());
            let mut attr = QueuePairAttribute::new();
            attr.setup_state(QueuePairState::Error);
            let _ = qp.modify(&attr);
            drop(qp);
        }
        let drained = self.ctx.table().drain_where(|k| k.conn_id() == self.id);
        for kind in drained {
            kind.abandon(&error);
        }
        lock(&self.incoming).take();
        self.send_ready.notify_waiters();
        self.read_room.notify_waiters();
    }

    /// [`ConnShared::fail`], then `error` for the caller that hit it.
    pub(crate) fn fail_with<T>(&self, error: RdmaError) -> Result<T, RdmaError> {
        self.fail(error.clone());
        Err(error)
    }
}

/// The client's registered read buffers, shared by its connections: the
/// memory here, which slot is free in `slots`.
#[derive(Debug)]
pub(crate) struct ReadPool {
    pub(crate) buffers: Registered,
    pub(crate) slots: Arc<ReadSlots>,
}

impl ReadPool {
    pub(crate) fn new(buffers: Registered, slot_count: u32, slot_bytes: u32) -> ReadPool {
        ReadPool {
            buffers,
            slots: Arc::new(ReadSlots::new(slot_count, slot_bytes)),
        }
    }
}

/// READs posted together on one connection.
pub(crate) type ReadBatch = Batch<ConnShared>;
