//! Asynchronous device events (`ibv_get_async_event`) and what rdkv does
//! about each. Before, they were never read: a completion-queue overrun or
//! a dead device left every connection waiting for completions that would
//! never come, until each request's own timeout.
//!
//! - `CQ_ERR` (the shared completion queue overran or failed) and
//!   `DEVICE_FATAL`: every connection of the context fails and the context
//!   is marked failed, so the next session through that port opens a new
//!   one (the client meanwhile reads over RPC and re-attaches on its next
//!   refresh after the back-off).
//! - `QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`: that queue pair's
//!   connection fails.
//! - `PORT_ERR`: the port's connections fail (their path is down); logged.
//!   `PORT_ACTIVE`: logged.
//! - Everything else: logged at debug.
//!
//! `verbs` reads the events; [`action_of`] and [`apply`] are pure over a
//! [`Connections`] registry, so they are tested with the fake backend.

use std::sync::atomic::{AtomicBool, Ordering};

use super::connections::{Connections, Target};
use super::error::RdmaError;
use super::setup::Abandon;

/// `enum ibv_event_type` (include/infiniband/verbs.h; ABI-stable numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    CqError,
    QpFatal,
    QpRequestError,
    QpAccessError,
    CommEstablished,
    SqDrained,
    PathMigrated,
    PathMigrationError,
    DeviceFatal,
    PortActive,
    PortError,
    LidChange,
    PkeyChange,
    SmChange,
    SrqError,
    SrqLimitReached,
    QpLastWqeReached,
    ClientReregister,
    GidChange,
    WqFatal,
    DeviceSpeedChange,
    /// A number this build does not know (newer rdma-core).
    Other(u32),
}

/// What the event's `element` union holds, by its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    Cq,
    Qp,
    Srq,
    Wq,
    Port,
    Device,
}

impl EventKind {
    pub fn from_raw(raw: u32) -> EventKind {
        use EventKind::*;
        match raw {
            0 => CqError,
            1 => QpFatal,
            2 => QpRequestError,
            3 => QpAccessError,
            4 => CommEstablished,
            5 => SqDrained,
            6 => PathMigrated,
            7 => PathMigrationError,
            8 => DeviceFatal,
            9 => PortActive,
            10 => PortError,
            11 => LidChange,
            12 => PkeyChange,
            13 => SmChange,
            14 => SrqError,
            15 => SrqLimitReached,
            16 => QpLastWqeReached,
            17 => ClientReregister,
            18 => GidChange,
            19 => WqFatal,
            20 => DeviceSpeedChange,
            other => Other(other),
        }
    }

    /// Which member of the event's element union is valid.
    pub fn element(self) -> Element {
        use EventKind::*;
        match self {
            CqError => Element::Cq,
            QpFatal | QpRequestError | QpAccessError | CommEstablished | SqDrained
            | PathMigrated | PathMigrationError | QpLastWqeReached => Element::Qp,
            SrqError | SrqLimitReached => Element::Srq,
            WqFatal => Element::Wq,
            PortActive | PortError | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange | DeviceSpeedChange => Element::Port,
            DeviceFatal | Other(_) => Element::Device,
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventKind::Other(n) => write!(f, "async event {n}"),
            known => write!(f, "{known:?}"),
        }
    }
}

/// One event, with the queue pair or port it names (when it names one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceEvent {
    pub kind: EventKind,
    pub qp_num: Option<u32>,
    pub port: Option<u8>,
}

/// How loudly an event is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

/// What to do about an event: which connections fail (if any), whether
/// the whole context is unusable, and the log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    pub fail: Option<Target>,
    pub context_failed: bool,
    pub level: Level,
}

const fn act(fail: Option<Target>, context_failed: bool, level: Level) -> Action {
    Action {
        fail,
        context_failed,
        level,
    }
}

pub fn action_of(event: &DeviceEvent) -> Action {
    use EventKind::*;
    match (event.kind, event.qp_num, event.port) {
        (CqError | DeviceFatal, _, _) => act(Some(Target::All), true, Level::Error),
        (QpFatal | QpRequestError | QpAccessError, Some(qp), _) => {
            act(Some(Target::Qp(qp)), false, Level::Warn)
        }
        (PortError, _, Some(port)) => act(Some(Target::Port(port)), false, Level::Warn),
        (PortActive, _, _) => act(None, false, Level::Info),
        // A QP or port event without its element (a null pointer from the
        // library): nothing to fail, so say it loudly.
        (QpFatal | QpRequestError | QpAccessError | PortError, _, _) => {
            act(None, false, Level::Warn)
        }
        _ => act(None, false, Level::Debug),
    }
}

/// Logs `event` and carries out its action on `connections`; marks the
/// context failed when the device says it is unusable. Returns how many
/// connections were failed.
pub fn apply<C: Abandon>(
    event: &DeviceEvent,
    connections: &Connections<C>,
    context_failed: &AtomicBool,
    device: &str,
) -> usize {
    let action = action_of(event);
    let (kind, qp, port) = (event.kind, event.qp_num, event.port);
    match action.level {
        Level::Error => tracing::error!(device, %kind, ?qp, ?port, "rdma device event"),
        Level::Warn => tracing::warn!(device, %kind, ?qp, ?port, "rdma device event"),
        Level::Info => tracing::info!(device, %kind, ?qp, ?port, "rdma device event"),
        Level::Debug => tracing::debug!(device, %kind, ?qp, ?port, "rdma device event"),
    }
    if action.context_failed {
        context_failed.store(true, Ordering::Release);
    }
    action.fail.map_or(0, |target| {
        connections.fail(target, &RdmaError::DeviceEvent { event: kind })
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::rdma::admission::ENTRIES_PER_CONNECTION;
    use crate::rdma::batch::{Batch, ReadSlots};
    use crate::rdma::fake::{FakeConn, FakeContext};
    use crate::rdma::wait::wait_until;

    fn event(raw: u32, qp_num: Option<u32>, port: Option<u8>) -> DeviceEvent {
        DeviceEvent {
            kind: EventKind::from_raw(raw),
            qp_num,
            port,
        }
    }

    /// Every `ibv_event_type` number, its element and its action.
    #[test]
    fn each_event_maps_to_its_action() {
        use EventKind::*;
        let all = Some(Target::All);
        #[rustfmt::skip]
        let table: [(u32, EventKind, Element, Option<Target>, bool, Level); 23] = [
            (0, CqError, Element::Cq, all, true, Level::Error),
            (1, QpFatal, Element::Qp, Some(Target::Qp(7)), false, Level::Warn),
            (2, QpRequestError, Element::Qp, Some(Target::Qp(7)), false, Level::Warn),
            (3, QpAccessError, Element::Qp, Some(Target::Qp(7)), false, Level::Warn),
            (4, CommEstablished, Element::Qp, None, false, Level::Debug),
            (5, SqDrained, Element::Qp, None, false, Level::Debug),
            (6, PathMigrated, Element::Qp, None, false, Level::Debug),
            (7, PathMigrationError, Element::Qp, None, false, Level::Debug),
            (8, DeviceFatal, Element::Device, all, true, Level::Error),
            (9, PortActive, Element::Port, None, false, Level::Info),
            (10, PortError, Element::Port, Some(Target::Port(2)), false, Level::Warn),
            (11, LidChange, Element::Port, None, false, Level::Debug),
            (12, PkeyChange, Element::Port, None, false, Level::Debug),
            (13, SmChange, Element::Port, None, false, Level::Debug),
            (14, SrqError, Element::Srq, None, false, Level::Debug),
            (15, SrqLimitReached, Element::Srq, None, false, Level::Debug),
            (16, QpLastWqeReached, Element::Qp, None, false, Level::Debug),
            (17, ClientReregister, Element::Port, None, false, Level::Debug),
            (18, GidChange, Element::Port, None, false, Level::Debug),
            (19, WqFatal, Element::Wq, None, false, Level::Debug),
            (20, DeviceSpeedChange, Element::Port, None, false, Level::Debug),
            (21, Other(21), Element::Device, None, false, Level::Debug),
            (u32::MAX, Other(u32::MAX), Element::Device, None, false, Level::Debug),
        ];
        for (raw, kind, element, fail, context_failed, level) in table {
            assert_eq!(EventKind::from_raw(raw), kind, "{raw}");
            assert_eq!(kind.element(), element, "{kind}");
            let e = DeviceEvent {
                kind,
                qp_num: (element == Element::Qp).then_some(7),
                port: (element == Element::Port).then_some(2),
            };
            let want = Action {
                fail,
                context_failed,
                level,
            };
            assert_eq!(action_of(&e), want, "{kind}");
        }
        // A QP event whose QP the library could not name fails nothing.
        assert_eq!(action_of(&event(1, None, None)).fail, None);
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// Two connections on port 1, one on port 2, each with READs posted.
    fn three_connections(ctx: &FakeContext) -> [Arc<FakeConn>; 3] {
        [1, 1, 2].map(|port| FakeConn::prepare_on(ctx, port).unwrap())
    }

    /// A batch of `n` of `pool`'s slots posted on `conn`.
    fn post_batch(conn: &Arc<FakeConn>, pool: &Arc<ReadSlots>, n: u32) -> Arc<Batch<FakeConn>> {
        let slots = wait_until(pool.acquire(n), far()).unwrap();
        let batch = Arc::new(Batch::new(Arc::clone(conn), Arc::clone(pool), slots));
        conn.post_reads(&batch, n).unwrap();
        batch
    }

    /// `CQ_ERR` fails every connection of the context: their reads finish
    /// with the event's error, and once the callers let go the read slots,
    /// table entries, pinned buffers and admission are all back; the
    /// context is marked failed. (Before, events were never read: the reads
    /// waited out their timeout and the slots stayed taken meanwhile.)
    #[test]
    fn a_cq_error_fails_every_connection_and_releases_what_they_held() {
        let ctx = FakeContext::new(4 * ENTRIES_PER_CONNECTION);
        let (free_buffers, pool) = (ctx.free_buffers(), Arc::new(ReadSlots::new(8, 64)));
        let conns = three_connections(&ctx);
        let batches = conns.each_ref().map(|c| post_batch(c, &pool, 2));
        assert_eq!(pool.free_slots(), 2);
        let failed = ctx.inject(event(0, None, None));
        assert_eq!(failed, 3);
        let error = RdmaError::DeviceEvent {
            event: EventKind::CqError,
        };
        for (conn, batch) in conns.iter().zip(&batches) {
            assert_eq!(conn.failure(), Some(error.clone()));
            assert_eq!(
                wait_until(batch.finished(), far()),
                Some(Err(error.clone()))
            );
        }
        assert!(ctx.has_failed());
        assert_eq!(ctx.table_len(), 0);
        drop(batches);
        assert_eq!(pool.free_slots(), 8);
        drop(conns);
        assert_eq!(ctx.free_buffers(), free_buffers);
        assert_eq!(ctx.reserved(), 0);
        assert_eq!(ctx.registered(), 0);
    }

    /// A QP event fails that QP's connection only; `PORT_ERR` fails the
    /// port's; `PORT_ACTIVE` and the rest fail nothing.
    #[test]
    fn qp_and_port_events_fail_only_their_connections() {
        let ctx = FakeContext::new(4 * ENTRIES_PER_CONNECTION);
        let pool = Arc::new(ReadSlots::new(8, 64));
        let conns = three_connections(&ctx);
        let batches = conns.each_ref().map(|c| post_batch(c, &pool, 2));
        let entries_each = ctx.table_len() / 3;
        assert_eq!(ctx.inject(event(9, None, Some(1))), 0);
        assert_eq!(ctx.inject(event(4, Some(conns[0].qp_num()), None)), 0);
        assert_eq!(ctx.inject(event(3, Some(conns[0].qp_num()), None)), 1);
        assert!(conns[0].failure().is_some());
        assert!(conns[1].failure().is_none() && conns[2].failure().is_none());
        assert_eq!(ctx.table_len(), 2 * entries_each);
        assert_eq!(ctx.inject(event(10, None, Some(2))), 1);
        assert!(conns[1].failure().is_none() && conns[2].failure().is_some());
        assert_eq!(ctx.table_len(), entries_each);
        assert!(!ctx.has_failed());
        drop(batches);
        assert_eq!(pool.free_slots(), 6, "conns[1]'s READs are still posted");
        conns[1].abandon_setup();
        assert_eq!(pool.free_slots(), 8);
    }
}
