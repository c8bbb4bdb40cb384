//! Raft events as log lines and counters: elections, leader changes, role
//! changes, membership changes and snapshots, each logged once when this
//! node's Raft metrics show it.

use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use openraft::ServerState;
use openraft::metrics::{RaftDataMetrics, RaftServerMetrics};
use openraft::type_config::alias::StoredMembershipOf;
use rdkv_storage::raft::TypeConfig;
use tokio::sync::watch;

use crate::Raft;
use crate::raft_watch::RaftWatch;

/// What changed between two views of the Raft metrics that deserves a line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RaftChanges {
    pub new_terms: u64,
    pub leader: Option<Option<u64>>,
    pub state: Option<ServerState>,
    pub membership: Option<Vec<u64>>,
    pub snapshot_index: Option<u64>,
}

/// What this module reads of Raft's state, taken from the server and data
/// parts of its metrics: openraft sends those only when they change, the
/// whole metrics on every loop of RaftCore (every heartbeat included).
#[derive(Debug, Clone)]
pub struct RaftView {
    /// The term of the flushed vote.
    pub term: u64,
    pub leader: Option<u64>,
    pub state: ServerState,
    pub membership: Arc<StoredMembershipOf<TypeConfig>>,
    pub snapshot_index: Option<u64>,
}

impl RaftView {
    pub fn of(server: &RaftServerMetrics<TypeConfig>, data: &RaftDataMetrics<TypeConfig>) -> Self {
        Self {
            term: server.vote.leader_id.term,
            leader: server.current_leader,
            state: server.state,
            membership: server.membership_config.clone(),
            snapshot_index: data.snapshot.map(|l| l.index),
        }
    }
}

/// Compares two views (pure, for tests).
pub fn changes(old: &RaftView, new: &RaftView) -> RaftChanges {
    let members = |v: &RaftView| -> Vec<u64> {
        v.membership
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
    };
    RaftChanges {
        new_terms: new.term.saturating_sub(old.term),
        leader: (old.leader != new.leader).then_some(new.leader),
        state: (old.state != new.state).then_some(new.state),
        membership: (old.membership.log_id() != new.membership.log_id()).then(|| members(new)),
        snapshot_index: (old.snapshot_index != new.snapshot_index)
            .then(|| new.snapshot_index.unwrap_or(0)),
    }
}

/// Logs and counts Raft events until shutdown, or until Raft stops (openraft
/// shows a stopped Raft in its whole metrics only: the parts' watches just
/// close).
pub async fn watch_raft(raft: Raft, mut shutdown: watch::Receiver<bool>) {
    let mut raft_watch = RaftWatch::new(&raft);
    let mut last = raft_watch.read(RaftView::of);
    loop {
        let raft_stopped = tokio::select! {
            running = raft_watch.changed() => !running,
            _ = shutdown.changed() => return,
        };
        if raft_stopped {
            tracing::info!(term = last.term, "raft stopped");
            return;
        }
        let now = raft_watch.read(RaftView::of);
        log_changes(&changes(&last, &now), &now);
        last = now;
        // The data part changes on every applied entry; a burst of writes
        // must not make this task busy.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn log_changes(changes: &RaftChanges, now: &RaftView) {
    if changes.new_terms > 0 {
        counter!("rdkv_raft_elections_total").increment(changes.new_terms);
        tracing::info!(term = now.term, "election: new term");
    }
    if let Some(leader) = changes.leader {
        counter!("rdkv_raft_leader_changes_total").increment(1);
        match leader {
            // No term on these lines: the view's is the flushed vote's, and
            // a follower learns its new leader before that vote is flushed.
            Some(leader) => tracing::info!(leader, "leader changed"),
            None => tracing::warn!("leader lost"),
        }
    }
    if let Some(state) = changes.state {
        tracing::info!(role = ?state, "role changed");
    }
    if let Some(members) = &changes.membership {
        tracing::info!(
            ?members,
            log_index = now.membership.log_id().map_or(0, |l| l.index),
            "membership changed"
        );
    }
    if let Some(index) = changes.snapshot_index {
        tracing::info!(snapshot_index = index, "snapshot taken or installed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_name_what_changed_and_nothing_else() {
        let initial = openraft::RaftMetrics::<TypeConfig>::new_initial(1);
        let old = RaftView {
            term: initial.current_term,
            leader: initial.current_leader,
            state: initial.state,
            membership: initial.membership_config,
            snapshot_index: None,
        };
        assert_eq!(changes(&old, &old), RaftChanges::default());
        let mut new = old.clone();
        new.term = 3;
        new.leader = Some(2);
        new.state = ServerState::Follower;
        let seen = changes(&old, &new);
        assert_eq!(seen.new_terms, 3);
        assert_eq!(seen.leader, Some(Some(2)));
        assert_eq!(seen.state, Some(ServerState::Follower));
        assert_eq!(seen.membership, None);
        assert_eq!(seen.snapshot_index, None);
    }
}
