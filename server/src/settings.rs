//! The cluster's replicated settings, proposed by its leader:
//!
//! - the hash seed (SipHash keys of every replica's region index): a leader
//!   that finds none applied proposes a random one (`Command::SetHashSeed`);
//!   the first one applied becomes the cluster's for good (the state
//!   machine ignores later ones). Until then every replica places keys with
//!   the same placeholder seed, so apply never depends on which replica
//!   runs it.
//! - the cluster identity (`Command::SetClusterId`, see
//!   `rdkv_storage::cluster_id`): a leader that finds none applied
//!   proposes a random one; the first applied is the cluster's for good.
//!   This is also how a cluster upgraded from a version without identities
//!   gets one.
//! - the quota (`Command::SetQuota`): a leader whose `--quota-bytes` (or
//!   its default) differs from the one applied proposes its own, so every
//!   replica refuses the same writes.
//!
//! A leader proposes only once it has applied an entry of its own term:
//! then what it sees applied is the cluster's latest.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use rdkv_storage::cluster_id::ClusterId;
use rdkv_storage::raft::Command;
use rdkv_storage::region::random_seed;
use rdkv_storage::state_machine::RegionStateMachine;
use tokio::sync::watch;

use crate::Raft;
use crate::lease::Leadership;
use crate::raft_watch::RaftWatch;

/// How long to wait before proposing again after a failed proposal.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The setting this node's state lacks, if any, as the command to propose.
fn missing_setting(sm: &RegionStateMachine, quota_bytes: u64) -> Option<Command> {
    if !sm.has_hash_seed() {
        let seed = random_seed();
        return Some(Command::SetHashSeed {
            seed: (seed.0, seed.1),
        });
    }
    if sm.cluster_id().is_none() {
        return Some(Command::SetClusterId {
            id: ClusterId::random(),
        });
    }
    (sm.quota_status().quota_bytes != Some(quota_bytes))
        .then_some(Command::SetQuota { bytes: quota_bytes })
}

/// Whenever this node leads, proposes each setting the applied state lacks
/// or holds differently from this node's configuration; runs until shutdown.
pub async fn propose_while_leading(
    raft: Raft,
    sm: RegionStateMachine,
    quota_bytes: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut raft_watch = RaftWatch::new(&raft);
    loop {
        let leads = raft_watch.read(Leadership::of_parts).leads_with_own_entry();
        if let Some(command) = leads.then(|| missing_setting(&sm, quota_bytes)).flatten() {
            let what = command.to_string();
            match raft.client_write(command).await {
                Ok(_) => continue,
                Err(e) => tracing::warn!("proposing the cluster's setting ({what}): {e}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(RETRY_AFTER) => {}
                _ = shutdown.changed() => return,
            }
            continue;
        }
        // A leader that has applied an entry of its term and found nothing
        // missing stays so until its leadership changes (only a leader
        // proposes settings, and it has applied its predecessors' entries):
        // it waits for the server part only, as a leader's data part
        // changes on almost every loop of RaftCore (the time since its last
        // quorum acknowledgement is part of it).
        if leads {
            tokio::select! {
                changed = raft_watch.server.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
            continue;
        }
        tokio::select! {
            running = raft_watch.changed() => if !running { return },
            _ = shutdown.changed() => return,
        }
    }
}
