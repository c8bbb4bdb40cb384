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
    while next_batch(&mut queued, &mut batch).await {
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

/// Waits for a proposal and fills `batch` with it and what is queued with
/// it, up to [`MAX_BATCH`]; `false` once every handle is dropped.
async fn next_batch<T>(queued: &mut mpsc::UnboundedReceiver<T>, batch: &mut Vec<T>) -> bool {
    let Some(first) = queued.recv().await else {
        return false;
    };
    batch.push(first);
    take_queued(queued, batch);
    if batch.len() == 1 {
        // The first proposal woke this task at once, often while the
        // connections woken with its own (by the same poll of the sockets)
        // wait to run: let them queue theirs first (a yield defers this
        // task behind every ready one). The deferred wake comes once the
        // worker has run what was ready or at its next poll of the I/O
        // driver, so a lone write pays that turn: one write at a time
        // measured no worse through the noise (docs/benchmarks.md, tenth
        // round).
        tokio::task::yield_now().await;
        take_queued(queued, batch);
    }
    true
}

/// Moves what is queued now into `batch`, up to [`MAX_BATCH`].
fn take_queued<T>(queued: &mut mpsc::UnboundedReceiver<T>, batch: &mut Vec<T>) {
    while batch.len() < MAX_BATCH {
        match queued.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Proposals sent by tasks that are ready together (connections woken
    /// by one poll of their sockets) leave as one batch, though the first
    /// send wakes the proposing task at once.
    #[test]
    fn proposals_of_tasks_ready_together_leave_as_one_batch() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a runtime");
        let batch_len = runtime.block_on(async {
            tokio::spawn(async {
                let (queue, mut queued) = mpsc::unbounded_channel();
                let batcher = tokio::spawn(async move {
                    let mut batch = Vec::new();
                    next_batch(&mut queued, &mut batch).await;
                    batch.len()
                });
                // The batcher waits on the queue before the senders run.
                tokio::task::yield_now().await;
                for i in 0..8 {
                    let queue = queue.clone();
                    tokio::spawn(async move { queue.send(i) });
                }
                batcher.await.expect("the batcher")
            })
            .await
            .expect("the test task")
        });
        assert_eq!(batch_len, 8);
    }
}
