//! The live connections of a context, by queue-pair number and port, so an
//! asynchronous device event (`rdma::async_event`) can fail the ones it is
//! about: one QP, one port's, or all of them. Held weakly: the registry
//! never keeps a connection alive, and a connection leaves it when it is
//! torn down.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::error::RdmaError;
use super::setup::Abandon;

/// Which connections an event fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    All,
    Qp(u32),
    Port(u8),
}

#[derive(Debug)]
struct Entry<C> {
    qp_num: u32,
    port: u8,
    conn: Weak<C>,
}

#[derive(Debug)]
pub struct Connections<C> {
    entries: Mutex<Vec<Entry<C>>>,
}

impl<C> Default for Connections<C> {
    fn default() -> Self {
        Connections {
            entries: Mutex::new(Vec::new()),
        }
    }
}

impl<C: Abandon> Connections<C> {
    fn entries(&self) -> MutexGuard<'_, Vec<Entry<C>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new queue pair on `port`; entries of dropped connections go.
    pub fn register(&self, qp_num: u32, port: u8, conn: &Arc<C>) {
        let mut entries = self.entries();
        entries.retain(|e| e.conn.strong_count() > 0);
        entries.push(Entry {
            qp_num,
            port,
            conn: Arc::downgrade(conn),
        });
    }

    /// The connection of `qp_num` was torn down.
    pub fn remove(&self, qp_num: u32) {
        self.entries().retain(|e| e.qp_num != qp_num);
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tears down the connections `target` names with `reason`; returns
    /// how many. Outside the lock: teardown removes its own entry.
    pub fn fail(&self, target: Target, reason: &RdmaError) -> usize {
        let hit: Vec<Arc<C>> = self
            .entries()
            .iter()
            .filter(|e| match target {
                Target::All => true,
                Target::Qp(qp_num) => e.qp_num == qp_num,
                Target::Port(port) => e.port == port,
            })
            .filter_map(|e| e.conn.upgrade())
            .collect();
        for conn in &hit {
            conn.abandon(reason.clone());
        }
        hit.len()
    }
}
