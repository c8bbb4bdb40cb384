//! Snapshots taken on demand. A clean stop (SIGTERM, SIGINT) first saves a snapshot of what this node
//! has applied, as Redis saves its RDB when it shuts down: the restart then
//! loads the region image instead of applying every entry since the last
//! snapshot again (1,000,000 x 1 KiB here: 1.9 s from a snapshot, 4.9 s by
//! replay). A crash still recovers by replay. The log is durable either
//! way: the snapshot only saves restart time, so a snapshot that fails or
//! takes too long is reported and the stop goes on.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use crate::Raft;

/// Longest a stop waits for its snapshot (a 1 GiB region takes seconds).
pub const STOP_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);

/// Saves a snapshot covering everything applied, unless one already does.
pub async fn snapshot_before_stop(raft: &Raft) {
    if let Err(e) = snapshot_of_applied(raft, STOP_SNAPSHOT_TIMEOUT).await {
        tracing::warn!("no snapshot at stop: {e}; the restart replays the log");
    }
}

/// Makes the node's snapshot cover everything it has applied now (a new
/// one unless the newest already does), waiting at most `timeout`: a clean
/// stop's, and a backup's (`rdkvctl snapshot save`, as etcd's takes a fresh
/// one).
pub async fn snapshot_of_applied(raft: &Raft, timeout: Duration) -> Result<(), String> {
    let (applied, snapshot) = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow_watched();
        (
            metrics.last_applied.map_or(0, |l| l.index),
            metrics.snapshot.map_or(0, |l| l.index),
        )
    };
    if snapshot >= applied {
        return Ok(());
    }
    tracing::info!(applied, snapshot, "saving a snapshot of what is applied");
    raft.trigger().snapshot().await.map_err(|e| e.to_string())?;
    raft.wait(Some(timeout))
        .metrics(
            |m| m.snapshot.is_some_and(|l| l.index >= applied),
            "a snapshot of what is applied",
        )
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(index = applied, "snapshot saved");
    Ok(())
}
