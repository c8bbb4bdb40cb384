//! Writes proposed at the same time travel to Raft as one batch: one
//! message to RaftCore, one append to the log (one record write and one
//! wait for the group commit), one wake-up of each replication stream,
//! instead of one of each per write. Each command is still its own log
//! entry with its own result.
//!
//! One task takes every proposal queued since it last ran and hands them
//! to Raft in queue order, so a proposal queued after another is placed
//! after it in the log: a write's place is fixed once it is queued. A
//! lone proposal goes to Raft with its own responder; a batch's results
//! are handed on to each proposal's responder by a task of the batch.

use futures::{Stream, StreamExt};
use openraft::impls::ProgressResponder;
use openraft::raft::responder::Responder;
use openraft::raft::{ClientWriteResponse, ClientWriteResult, WriteResult};
use rdkv_proto::shard::ShardId;
use rdkv_storage::raft::{Command, TypeConfig};
use tokio::sync::mpsc;

use crate::Raft;

/// The responder a proposal's outcome is sent to.
pub type Outcome = ProgressResponder<TypeConfig, ClientWriteResult<TypeConfig>>;

/// Most commands one batch carries.
const MAX_BATCH: usize = 256;

/// The handle writes are proposed through; the task ends when every
/// handle is dropped.
#[derive(Debug, Clone)]
pub struct Proposals {
    queue: mpsc::UnboundedSender<(Command, Outcome)>,
}

/// Raft has stopped: the proposal was not handed to it.
#[derive(Debug)]
pub struct Stopped;

impl Proposals {
    /// Starts the proposing task of shard `shard` on the current runtime.
    pub fn start(raft: Raft, shard: ShardId) -> Proposals {
        let (queue, queued) = mpsc::unbounded_channel();
        let batch_sizes =
            metrics::histogram!("rdkv_write_batch_commands", "shard" => shard.to_string());
        tokio::spawn(run(raft, queued, batch_sizes));
        Proposals { queue }
    }

    /// Queues `command`; its result goes to `outcome`. Once this returns,
    /// a proposal queued later is placed after it in the log.
    pub fn propose(&self, command: Command, outcome: Outcome) -> Result<(), Stopped> {
        self.queue.send((command, outcome)).map_err(|_| Stopped)
    }
}

async fn run(
    raft: Raft,
    mut queued: mpsc::UnboundedReceiver<(Command, Outcome)>,
    batch_sizes: metrics::Histogram,
) {
    let mut batch = Vec::new();
    while let Some(first) = queued.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queued.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        batch_sizes.record(batch.len() as f64);
        if batch.len() == 1 {
            if let Some((command, outcome)) = batch.pop() {
                // Dropped on failure: the proposer sees Raft stopped.
                let _ = raft.client_write_ff(command, Some(outcome)).await;
            }
            continue;
        }
        let (commands, outcomes): (Vec<Command>, Vec<Outcome>) = batch.drain(..).unzip();
        // On failure the outcomes are dropped: each proposer sees Raft
        // stopped, its write's fate unknown.
        if let Ok(results) = raft.client_write_many(commands).await {
            tokio::spawn(hand_on(results, outcomes));
        }
    }
}

/// Hands each result of a batch, in order, to its proposal's responder.
async fn hand_on<S, E>(mut results: S, outcomes: Vec<Outcome>)
where
    S: Stream<Item = Result<WriteResult<TypeConfig>, E>> + Unpin,
{
    for outcome in outcomes {
        let Some(Ok(result)) = results.next().await else {
            // Raft stopped: the rest are dropped unanswered.
            return;
        };
        outcome.on_complete(result.map(|written| ClientWriteResponse {
            log_id: written.log_id,
            data: written.response,
            membership: None,
        }));
    }
}
