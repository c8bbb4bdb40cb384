//! openraft's server and data metrics, watched together: what a task that
//! waits for Raft's state to change waits on. openraft sends its whole
//! metrics on every loop of RaftCore (every heartbeat a follower answers
//! included); these two parts only when they change.

use openraft::async_runtime::WatchReceiver;
use openraft::metrics::{RaftDataMetrics, RaftServerMetrics};
use openraft::type_config::alias::WatchReceiverOf;
use rdkv_storage::raft::TypeConfig;

use crate::Raft;

/// A Raft's server and data metrics, as one watch.
pub struct RaftWatch {
    /// The server part alone, for a task that waits on the role only.
    pub server: WatchReceiverOf<TypeConfig, RaftServerMetrics<TypeConfig>>,
    data: WatchReceiverOf<TypeConfig, RaftDataMetrics<TypeConfig>>,
}

impl RaftWatch {
    pub fn new(raft: &Raft) -> Self {
        Self {
            server: raft.server_metrics(),
            data: raft.data_metrics(),
        }
    }

    /// `f` of both parts as they are now, under the watches' guards (not
    /// cloned). The data part is read first: openraft sends it before the
    /// server part in each report, so the server part read after it is as
    /// new or newer.
    pub fn read<R>(
        &self,
        f: impl FnOnce(&RaftServerMetrics<TypeConfig>, &RaftDataMetrics<TypeConfig>) -> R,
    ) -> R {
        let data = self.data.borrow_watched();
        let server = self.server.borrow_watched();
        f(&server, &data)
    }

    /// Waits until either part changes; `false` once Raft has stopped
    /// (openraft shows a stopped Raft in its whole metrics only: the
    /// parts' watches just close).
    pub async fn changed(&mut self) -> bool {
        tokio::select! {
            changed = self.server.changed() => changed.is_ok(),
            changed = self.data.changed() => changed.is_ok(),
        }
    }
}
