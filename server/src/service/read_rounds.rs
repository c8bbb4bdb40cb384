//! Linearizable reads that wait at the same time share one ReadIndex round,
//! as etcd batches its ReadIndex requests: one task takes every read
//! waiting, confirms leadership once (a heartbeat acknowledged by a quorum,
//! then the state machine applied up to the commit index), and answers them
//! all. A read that arrives while a round runs joins the next one, so every
//! read's round starts after the read did: that is what makes it
//! linearizable. Per read, this replaces a message to RaftCore, a pending
//! read there and a timer with a channel send.

use std::time::Duration;

use openraft::ReadPolicy;
use openraft::errors::{LinearizableReadError, RaftError};
use rdkv_proto::wire::{ErrorCode, ErrorReply};
use rdkv_storage::raft::TypeConfig;
use tokio::sync::{mpsc, oneshot};

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
    /// Starts the rounds' task on the current runtime.
    pub fn start(raft: Raft) -> ReadRounds {
        let (waiting, queue) = mpsc::unbounded_channel();
        tokio::spawn(run_rounds(raft, queue));
        ReadRounds { waiting }
    }

    /// Waits for a ReadIndex round that started after this call.
    pub async fn confirm(&self) -> Confirmed {
        let (answer, answered) = oneshot::channel();
        let stopped = || ErrorReply::new(ErrorCode::Unavailable, "this node is shutting down");
        self.waiting.send(answer).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn run_rounds(raft: Raft, mut queue: mpsc::UnboundedReceiver<oneshot::Sender<Confirmed>>) {
    let mut round = Vec::new();
    while let Some(first) = queue.recv().await {
        round.push(first);
        while let Ok(next) = queue.try_recv() {
            round.push(next);
        }
        let confirmed = within(
            CONFIRM_TIMEOUT,
            ErrorCode::Unavailable,
            "leadership not confirmed",
            raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        .map(|read| read.map(|_| ()));
        for answer in round.drain(..) {
            let _ = answer.send(confirmed.clone());
        }
    }
}
