//! The active expire cycle (Redis's `activeExpireCycle`, replicated): the
//! leader removes expired keys with `Command::ExpireKeys` entries, so that
//! their memory and quota come back on every replica.
//!
//! Every cycle (`--expire-cycle-ms`, default 100) the leader asks its state machine for the keys whose
//! deadline has passed on its wall clock, soonest first, and proposes them
//! in batches of `BATCH_KEYS` (an entry stays small; a cycle with more keys
//! proposes the next batch at once, up to `MAX_BATCHES_PER_CYCLE`, so that
//! client writes interleave). Each key goes with the version the leader
//! saw: apply deletes it only if it still has that version and has expired
//! on the apply clock, so a key written again meanwhile survives, and a
//! batch proposed twice (a new leader repeating an old one's work) deletes
//! nothing the first did not. Reads never wait for this: every reader
//! already treats an expired pair as absent.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use rdkv_fabric::clock::unix_now_ms;
use rdkv_storage::raft::Command;
use rdkv_storage::state_machine::RegionStateMachine;
use tokio::sync::watch;

use crate::Raft;
use crate::lease::leads_with_own_entry;

/// Keys per `ExpireKeys` entry.
const BATCH_KEYS: usize = 256;
/// Batches one cycle may propose before yielding to the next tick.
const MAX_BATCHES_PER_CYCLE: usize = 16;

/// Runs the expire cycle whenever this node leads; until shutdown.
pub async fn expire_while_leading(
    raft: Raft,
    sm: RegionStateMachine,
    cycle: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(cycle);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if leads_with_own_entry(&raft.metrics().borrow_watched()) {
            expire_cycle(&raft, &sm).await;
        }
    }
}

/// One cycle: batches of expired keys until none is left or the cycle's
/// budget is spent. A failed proposal ends the cycle (the next one retries).
async fn expire_cycle(raft: &Raft, sm: &RegionStateMachine) {
    for _ in 0..MAX_BATCHES_PER_CYCLE {
        let now_unix_ms = unix_now_ms();
        let keys = match sm.expired_keys(now_unix_ms, BATCH_KEYS) {
            Ok(keys) => keys,
            Err(e) => {
                tracing::warn!("finding expired keys: {e}");
                return;
            }
        };
        let full_batch = keys.len() == BATCH_KEYS;
        if keys.is_empty() {
            return;
        }
        let command = Command::ExpireKeys { keys }.timed(now_unix_ms);
        match raft.client_write(command).await {
            Ok(written) => {
                if let rdkv_storage::raft::CommandResult::Applied(
                    rdkv_proto::wire::Response::Cleared { removed, .. },
                ) = written.data
                {
                    metrics::counter!("rdkv_expired_keys_total").increment(removed);
                }
            }
            Err(e) => {
                tracing::debug!("proposing expired keys: {e}");
                return;
            }
        }
        if !full_batch {
            return;
        }
    }
}
