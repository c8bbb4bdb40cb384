//! The follower's half of pipelined replication: the AppendEntries one peer
//! connection carries go to openraft's `Raft::stream_append` as they arrive
//! (in order, without waiting for the earlier ones to be flushed), and are
//! answered in the order they came, as they complete.
//!
//! openraft ends its stream after an answer that stops replication (a
//! conflict, a higher vote) or when RaftCore stops; the appends queued
//! behind it are then answered `Failed` (the leader has stopped reading
//! them by then) and the next append opens a new stream. A waiting append
//! remembers which stream it went to, so it is never matched with another
//! stream's answer.

use std::collections::VecDeque;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use openraft::errors::RaftError;
use rdkv_storage::raft::rpc::{
    AppendEntriesRequest, AppendEntriesResponse, Fatal, StreamAppendResult,
};
use tokio::sync::mpsc;

use super::PeerResponse;
use crate::Raft;

/// Appends read from the connection ahead of RaftCore taking them: as many
/// as the leader keeps in flight, so its pipeline never waits for this one.
const QUEUED_APPENDS: usize = super::append_out::MAX_APPENDS_IN_FLIGHT;

type Answers = Pin<Box<dyn Stream<Item = Result<StreamAppendResult, Fatal>> + Send>>;

/// One openraft append stream.
struct Pipe {
    generation: u64,
    appends: mpsc::Sender<AppendEntriesRequest>,
    answers: Answers,
}

pub struct Inbound {
    raft: Raft,
    pipe: Option<Pipe>,
    /// Streams opened so far: the next one's generation.
    opened: u64,
    /// Request ids of the appends not yet answered, oldest first, with the
    /// generation of the stream each went to.
    waiting: VecDeque<(u64, u64)>,
}

impl Inbound {
    pub fn new(raft: Raft) -> Inbound {
        Inbound {
            raft,
            pipe: None,
            opened: 0,
            waiting: VecDeque::new(),
        }
    }

    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Whether as many appends wait as a leader may keep in flight: one
    /// must be answered before another is submitted.
    pub fn is_full(&self) -> bool {
        self.waiting.len() >= QUEUED_APPENDS
    }

    /// Hands an append to RaftCore's stream, behind the earlier ones.
    pub async fn submit(&mut self, request_id: u64, rpc: AppendEntriesRequest) {
        let pipe = match self.pipe.take() {
            Some(pipe) => pipe,
            None => self.open(),
        };
        let generation = pipe.generation;
        // A stream whose task has ended leaves this append unanswered by
        // it: `next_answer` then answers it `Failed`.
        if pipe.appends.send(rpc).await.is_ok() {
            self.pipe = Some(pipe);
        }
        self.waiting.push_back((request_id, generation));
    }

    fn open(&mut self) -> Pipe {
        let (appends, queue) = mpsc::channel(QUEUED_APPENDS);
        let input = futures::stream::unfold(queue, |mut queue| async move {
            queue.recv().await.map(|rpc| (rpc, queue))
        });
        self.opened += 1;
        Pipe {
            generation: self.opened,
            appends,
            answers: Box::pin(self.raft.stream_append(input)),
        }
    }

    /// The oldest waiting append's request id and answer; `None` when none
    /// waits. Cancel-safe: nothing is taken before the answer is in.
    pub async fn next_answer(&mut self) -> Option<(u64, PeerResponse)> {
        let &(request_id, generation) = self.waiting.front()?;
        let answer = match self.pipe.as_mut() {
            Some(pipe) if pipe.generation == generation => pipe.answers.next().await,
            _ => None,
        };
        self.waiting.pop_front();
        let response = match answer {
            Some(Ok(result)) => {
                if result.is_err() {
                    self.pipe = None;
                }
                PeerResponse::Append(Ok(AppendEntriesResponse::from(result)))
            }
            Some(Err(fatal)) => {
                self.pipe = None;
                PeerResponse::Append(Err(RaftError::Fatal(fatal)))
            }
            None => {
                if self
                    .pipe
                    .as_ref()
                    .is_some_and(|p| p.generation == generation)
                {
                    self.pipe = None;
                }
                PeerResponse::Failed("an earlier append in this pipeline failed".into())
            }
        };
        Some((request_id, response))
    }
}
