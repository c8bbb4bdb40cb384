//! Raft events as log lines and counters: elections, leader changes, role
//! changes, membership changes and snapshots, each logged once when this
//! node's Raft metrics show it.

use std::time::Duration;

use metrics::counter;
use openraft::async_runtime::WatchReceiver;
use openraft::{RaftMetrics, ServerState};
use rdkv_storage::raft::TypeConfig;
use tokio::sync::watch;

use crate::Raft;

/// What changed between two views of the Raft metrics that deserves a line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RaftChanges {
    pub new_terms: u64,
    pub leader: Option<Option<u64>>,
    pub state: Option<ServerState>,
    pub membership: Option<Vec<u64>>,
    pub snapshot_index: Option<u64>,
}

/// Compares two views of the metrics (pure, for tests).
pub fn changes(old: &RaftMetrics<TypeConfig>, new: &RaftMetrics<TypeConfig>) -> RaftChanges {
    let members = |m: &RaftMetrics<TypeConfig>| -> Vec<u64> {
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
    };
    RaftChanges {
        new_terms: new.current_term.saturating_sub(old.current_term),
        leader: (old.current_leader != new.current_leader).then_some(new.current_leader),
        state: (old.state != new.state).then_some(new.state),
        membership: (old.membership_config.log_id() != new.membership_config.log_id())
            .then(|| members(new)),
        snapshot_index: (old.snapshot != new.snapshot).then(|| new.snapshot.map_or(0, |l| l.index)),
    }
}

/// Logs and counts Raft events until shutdown.
pub async fn watch_raft(raft: Raft, mut shutdown: watch::Receiver<bool>) {
    let mut metrics = raft.metrics();
    let mut last = metrics.borrow_watched().clone();
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let now = metrics.borrow_watched().clone();
        log_changes(&changes(&last, &now), &now);
        last = now;
        // Metrics change on every applied entry; a burst of writes must not
        // make this task busy.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn log_changes(changes: &RaftChanges, now: &RaftMetrics<TypeConfig>) {
    if changes.new_terms > 0 {
        counter!("rdkv_raft_elections_total").increment(changes.new_terms);
        tracing::info!(term = now.current_term, "election: new term");
    }
    if let Some(leader) = changes.leader {
        counter!("rdkv_raft_leader_changes_total").increment(1);
        match leader {
            Some(leader) => tracing::info!(term = now.current_term, leader, "leader changed"),
            None => tracing::warn!(term = now.current_term, "leader lost"),
        }
    }
    if let Some(state) = changes.state {
        tracing::info!(term = now.current_term, role = ?state, "role changed");
    }
    if let Some(members) = &changes.membership {
        tracing::info!(
            ?members,
            log_index = now.membership_config.log_id().map_or(0, |l| l.index),
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
        let old = RaftMetrics::<TypeConfig>::new_initial(1);
        assert_eq!(changes(&old, &old), RaftChanges::default());
        let mut new = old.clone();
        new.current_term = 3;
        new.current_leader = Some(2);
        new.state = ServerState::Follower;
        let seen = changes(&old, &new);
        assert_eq!(seen.new_terms, 3);
        assert_eq!(seen.leader, Some(Some(2)));
        assert_eq!(seen.state, Some(ServerState::Follower));
        assert_eq!(seen.membership, None);
        assert_eq!(seen.snapshot_index, None);
    }
}
