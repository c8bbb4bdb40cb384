//! Linearizable reads that wait at the same time share one ReadIndex round,
//! as etcd batches its ReadIndex requests: one task takes every read
//! waiting, confirms leadership once (a heartbeat acknowledged by a quorum,
//! then the state machine applied up to the commit index), and answers them
//! all. A read that arrives while a round runs joins the next one, so every
//! read's round starts after the read did: that is what makes it
//! linearizable. Per read, this replaces a message to RaftCore, a pending
//! read there and a timer with a channel send. A round first tries a read
//! fence ([`ReadFence`], on unless `--read-fence=false`), and runs a
//! ReadIndex round only when the fence does not confirm.

use std::time::Duration;

use openraft::ReadPolicy;
use openraft::errors::{LinearizableReadError, RaftError};
use rdkv_proto::wire::{ErrorCode, ErrorReply};
use rdkv_storage::raft::TypeConfig;
use tokio::sync::{mpsc, oneshot};

use super::read_fence::ReadFence;
use super::within;
use crate::Raft;

pub type ReadError = RaftError<TypeConfig, LinearizableReadError<TypeConfig>>;
/// A round's outcome; the outer error is the timeout.
pub type Confirmed = Result<Result<(), ReadError>, ErrorReply>;

/// Longest a round waits for this node to confirm it leads.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// The handle reads wait on; the rounds' task ends when every handle is
/// dropped.
#[derive(Debug, Clone)]
pub struct ReadRounds {
    waiting: mpsc::UnboundedSender<oneshot::Sender<Confirmed>>,
}

impl ReadRounds {
    /// Starts the rounds' task on the current runtime; `fence`: confirm
    /// rounds with a read fence first.
    pub fn start(raft: Raft, fence: Option<ReadFence>) -> ReadRounds {
        let (waiting, queue) = mpsc::unbounded_channel();
        tokio::spawn(run_rounds(raft, queue, fence));
        ReadRounds { waiting }
    }

    /// Waits for a round (a fence, else ReadIndex) that started after this
    /// call.
    pub async fn confirm(&self) -> Confirmed {
        let (answer, answered) = oneshot::channel();
        let stopped = || ErrorReply::new(ErrorCode::Unavailable, "this node is shutting down");
        self.waiting.send(answer).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn run_rounds(
    raft: Raft,
    mut queue: mpsc::UnboundedReceiver<oneshot::Sender<Confirmed>>,
    mut fence: Option<ReadFence>,
) {
    let mut round = Vec::new();
    while let Some(first) = next_read(&mut queue, fence.as_mut()).await {
        round.push(first);
        while let Ok(next) = queue.try_recv() {
            round.push(next);
        }
        let fenced = match fence.as_mut() {
            Some(fence) => fence.confirm().await,
            None => false,
        };
        let confirmed = if fenced {
            Ok(Ok(()))
        } else {
            read_index(&raft).await
        };
        for answer in round.drain(..) {
            let _ = answer.send(confirmed.clone());
        }
    }
}

/// The next read to wait for a round; meanwhile the fence's late answers
/// are taken back, so their connections are free for the next round.
async fn next_read(
    queue: &mut mpsc::UnboundedReceiver<oneshot::Sender<Confirmed>>,
    mut fence: Option<&mut ReadFence>,
) -> Option<oneshot::Sender<Confirmed>> {
    loop {
        match fence.as_deref_mut() {
            // Only while calls are in flight: with none, taking back
            // returns at once and this would spin.
            Some(fence) if fence.is_busy() => tokio::select! {
                first = queue.recv() => return first,
                () = fence.take_back_late() => {}
            },
            _ => return queue.recv().await,
        }
    }
}

/// openraft's ReadIndex round: a heartbeat acknowledged by a quorum, then
/// the state machine applied up to the commit index.
async fn read_index(raft: &Raft) -> Confirmed {
    within(
        CONFIRM_TIMEOUT,
        ErrorCode::Unavailable,
        "leadership not confirmed",
        raft.ensure_linearizable(ReadPolicy::ReadIndex),
    )
    .await
    .map(|read| read.map(|_| ()))
}
