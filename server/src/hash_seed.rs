//! The cluster's hash seed (SipHash keys of every replica's region index):
//! a leader that has applied an entry of its own term and finds no seed
//! applied proposes a random one (`Command::SetHashSeed`); the first one
//! applied becomes the cluster's for good (the state machine ignores later
//! ones). Until it is applied every replica places keys with the same
//! placeholder seed, so apply never depends on which replica runs it.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use rdkv_storage::raft::Command;
use rdkv_storage::region::random_seed;
use rdkv_storage::state_machine::RegionStateMachine;
use tokio::sync::watch;

use crate::Raft;
use crate::lease::leads_with_own_entry;

/// How long to wait before proposing again after a failed proposal.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// Proposes the cluster's seed whenever this node leads and none is
/// applied; returns once one is (it never changes afterwards).
pub async fn propose_while_unseeded(
    raft: Raft,
    sm: RegionStateMachine,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    while !sm.has_hash_seed() {
        if leads_with_own_entry(&metrics.borrow_watched()) {
            let seed = random_seed();
            let command = Command::SetHashSeed {
                seed: (seed.0, seed.1),
            };
            match raft.client_write(command).await {
                Ok(_) => continue,
                Err(e) => tracing::warn!("proposing the cluster's hash seed: {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(RETRY_AFTER) => {}
                _ = shutdown.changed() => return,
            }
            continue;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}
