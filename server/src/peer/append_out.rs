//! The leader's half of pipelined replication: openraft's `stream_append`
//! over one peer connection. Up to [`MAX_APPENDS_IN_FLIGHT`] AppendEntries
//! are sent ahead of their answers, so a follower's fsync and the round
//! trip overlap the next appends instead of gating them. The follower
//! answers in order (`append_in`), so each answer belongs to the oldest
//! request in flight; its request id must say so.
//!
//! The stream ends after an answer that stops replication (a conflict, a
//! higher vote, a partial success), on any error, or when openraft's input
//! ends. Only a stream that ends with nothing in flight gives its
//! connection back for the next call: answers still on their way would
//! otherwise be read as the answers to later requests.
//!
//! A shard of a multi-shard cluster sends through its link to the target
//! instead (shared by every shard, `link`): each append waits for its own
//! answer there, and the stream takes them oldest first.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use openraft::base::{BoxFuture, BoxStream};
use rdkv_proto::wire::Frame;
use rdkv_storage::raft::LogId;
use rdkv_storage::raft::rpc::{
    AppendEntriesRequest, AppendEntriesResponse, RpcError, StreamAppendError, StreamAppendResult,
};
use tokio::time::Instant;

use super::link::{Pending, Purpose};
use super::network::{
    Conn, PeerConn, cut_off_error, decode_response, network, remote, send_request, unexpected,
};
use super::{PeerRequest, PeerResponse};

/// AppendEntries sent to one follower ahead of its answers.
pub const MAX_APPENDS_IN_FLIGHT: usize = 8;

type Answer = Result<StreamAppendResult, RpcError>;

/// An append sent and not yet answered.
#[derive(Debug)]
struct Sent {
    request_id: u64,
    prev: Option<LogId>,
    last: Option<LogId>,
    at: Instant,
    /// Its answer, when sent on a link.
    pending: Option<Pending>,
}

/// Where the appends go: the target's own connection (a single group;
/// taken back by the peer when the stream ends cleanly), or the shard's
/// link.
enum Pipe {
    Own(Option<Conn>),
    Link,
}

struct Outbound<'s, S> {
    peer: &'s mut PeerConn,
    pipe: Pipe,
    input: S,
    input_done: bool,
    in_flight: VecDeque<Sent>,
    /// Longest the oldest append waits for its answer.
    timeout: Duration,
    finished: bool,
    /// The commit index the last request sent carried (`None`: none sent).
    last_commit: Option<Option<LogId>>,
}

/// Opens the pipelined stream of `input`'s appends to `peer`'s node.
pub fn stream<'s, S>(
    peer: &'s mut PeerConn,
    input: S,
    timeout: Duration,
) -> BoxFuture<'s, Result<BoxStream<'s, Answer>, RpcError>>
where
    S: futures::Stream<Item = AppendEntriesRequest> + Send + Unpin + 'static,
{
    Box::pin(async move {
        let pipe = match peer.link(Purpose::Raft).await? {
            Some(_) => Pipe::Link,
            None => Pipe::Own(Some(peer.open().await?)),
        };
        let outbound = Outbound {
            peer,
            pipe,
            input,
            input_done: false,
            in_flight: VecDeque::new(),
            timeout,
            finished: false,
            last_commit: None,
        };
        let answers = futures::stream::unfold(outbound, |mut outbound| async move {
            let answer = outbound.next().await?;
            Some((answer, outbound))
        });
        Ok(Box::pin(answers) as BoxStream<'s, Answer>)
    })
}

impl<S> Outbound<'_, S>
where
    S: futures::Stream<Item = AppendEntriesRequest> + Unpin,
{
    /// The next answer, sending more appends while waiting for it.
    async fn next(&mut self) -> Option<Answer> {
        if self.finished {
            return None;
        }
        loop {
            let Some(oldest) = self.in_flight.front() else {
                if self.input_done {
                    return self.end_cleanly();
                }
                match self.input.next().await {
                    Some(rpc) => {
                        if let Err(e) = self.send(rpc).await {
                            return self.fail(e);
                        }
                    }
                    None => self.input_done = true,
                }
                continue;
            };
            let deadline = oldest.at + self.timeout;
            let may_send = !self.input_done && self.in_flight.len() < MAX_APPENDS_IN_FLIGHT;
            let target = self.peer.target;
            tokio::select! {
                biased;
                frame = oldest_answer(&mut self.pipe, &mut self.in_flight, target) => {
                    return match frame {
                        Ok(frame) => Some(self.answer(&frame)),
                        Err(e) => self.fail(e),
                    };
                }
                rpc = self.input.next(), if may_send => match rpc {
                    Some(rpc) => {
                        if let Err(e) = self.send(rpc).await {
                            return self.fail(e);
                        }
                    }
                    None => self.input_done = true,
                },
                () = tokio::time::sleep_until(deadline) => {
                    return self.fail(network(format!(
                        "node {} did not answer an append within {:?}",
                        self.peer.target, self.timeout
                    )));
                }
            }
        }
    }

    async fn send(&mut self, rpc: AppendEntriesRequest) -> Result<(), RpcError> {
        after_ready_tasks_if(only_advances_commit(self.last_commit, &rpc)).await;
        self.last_commit = Some(rpc.leader_commit);
        let target = self.peer.target;
        if self.peer.cut_off() {
            return Err(cut_off_error(target));
        }
        let prev = rpc.prev_log_id;
        let last = rpc.entries.last().map(|entry| entry.log_id).or(prev);
        let request = PeerRequest::Append(rpc);
        let (request_id, pending) = match &mut self.pipe {
            Pipe::Own(conn) => {
                let request_id = self.peer.next_request_id();
                let Some((_, writer)) = conn.as_mut() else {
                    return Err(network("the connection is gone".into()));
                };
                send_request(self.peer.shard(), writer, request_id, &request)
                    .await
                    .map_err(|e| network(format!("send to node {target}: {e}")))?;
                (request_id, None)
            }
            Pipe::Link => {
                let Some((shard, link)) = self.peer.link(Purpose::Raft).await? else {
                    return Err(network("the link is gone".into()));
                };
                let pending = link.send(&self.peer.ctx, shard, &request).await?;
                (pending.request_id, Some(pending))
            }
        };
        self.in_flight.push_back(Sent {
            request_id,
            prev,
            last,
            at: Instant::now(),
            pending,
        });
        Ok(())
    }

    /// The oldest append's answer; the stream ends after it unless
    /// replication goes on from exactly where that append ended.
    fn answer(&mut self, frame: &Frame) -> Answer {
        let target = self.peer.target;
        let Some(sent) = self.in_flight.pop_front() else {
            self.finished = true;
            return Err(network(format!("node {target} answered nothing asked")));
        };
        let answer = if frame.request_id != sent.request_id {
            Err(network(format!(
                "node {target} answered request {} out of turn",
                frame.request_id
            )))
        } else {
            match decode_response(self.peer.shard(), frame) {
                Ok(PeerResponse::Append(Ok(response))) => stream_result(target, response, &sent),
                Ok(PeerResponse::Append(Err(e))) => remote(target, Err(e)),
                Ok(other) => Err(unexpected(target, other)),
                Err(e) => Err(network(format!("decode from node {target}: {e}"))),
            }
        };
        self.peer
            .append_round_trip
            .record(sent.at.elapsed().as_secs_f64());
        let goes_on = matches!(&answer, Ok(Ok(matched)) if *matched == sent.last);
        self.finished = !goes_on;
        answer
    }

    fn fail(&mut self, error: RpcError) -> Option<Answer> {
        self.finished = true;
        Some(Err(error))
    }

    /// Nothing in flight and nothing more to send: the connection is clean
    /// and goes back to the peer for its next call.
    fn end_cleanly(&mut self) -> Option<Answer> {
        self.finished = true;
        if let Pipe::Own(conn) = &mut self.pipe {
            self.peer.conn = conn.take();
        }
        None
    }
}

/// Whether `rpc` only tells the follower a newer commit index, on a
/// stream whose last request carried `last_commit` (`None`: it has sent
/// nothing yet). openraft's replication stream sends such an append after
/// each commit; a heartbeat or a probe is the first request of its stream
/// (openraft opens a stream per heartbeat), and is not one.
fn only_advances_commit(last_commit: Option<Option<LogId>>, rpc: &AppendEntriesRequest) -> bool {
    rpc.entries.is_empty() && last_commit.is_some_and(|last| rpc.leader_commit > last)
}

/// Lets the tasks ready now run before an append that only advances the
/// commit index (`only_advances_commit`). RaftCore wakes this stream for it
/// in the same step in which it saves the committed index and hands the
/// entries to the state machine; sent first, its encoding and `send` (and
/// the other follower's) delayed the apply that answers the writes, by
/// about 35 µs a write measured one at a time (docs/benchmarks.md,
/// twenty-fifth round). tokio runs the yielded task once its worker has
/// nothing else ready (or at its next poll of the I/O driver): the
/// follower learns the index that much later, which no write waits on
/// (follower reads see it that much later).
async fn after_ready_tasks_if(only_advances_commit: bool) {
    if only_advances_commit {
        tokio::task::yield_now().await;
    }
}

/// The next answer on `pipe`: the oldest append's (an answer that is not
/// the oldest's is refused by `Outbound::answer`).
async fn oldest_answer(
    pipe: &mut Pipe,
    in_flight: &mut VecDeque<Sent>,
    target: u64,
) -> Result<Frame, RpcError> {
    match pipe {
        Pipe::Own(conn) => {
            let Some((reader, _)) = conn.as_mut() else {
                return Err(network("the connection is gone".into()));
            };
            match reader.next().await {
                Ok(Some(frame)) => Ok(frame),
                Ok(None) => Err(network(format!("node {target} closed the connection"))),
                Err(e) => Err(network(format!("receive from node {target}: {e}"))),
            }
        }
        Pipe::Link => match in_flight.front_mut().and_then(|sent| sent.pending.as_mut()) {
            Some(pending) => pending.answer(target).await,
            None => Err(network("an append without its answer".into())),
        },
    }
}

/// What a follower's answer to the append `sent` means for the stream.
/// (openraft's own conversion would panic on a conflict before the first
/// entry; a peer's answer must not be able to do that.)
fn stream_result(target: u64, response: AppendEntriesResponse, sent: &Sent) -> Answer {
    Ok(match response {
        AppendEntriesResponse::Success => Ok(sent.last),
        AppendEntriesResponse::PartialSuccess(matched) => Ok(matched),
        AppendEntriesResponse::Conflict => match sent.prev {
            Some(prev) => Err(StreamAppendError::Conflict(prev)),
            None => {
                return Err(network(format!(
                    "node {target} reported a conflict before the first entry"
                )));
            }
        },
        AppendEntriesResponse::HigherVote(vote) => Err(StreamAppendError::HigherVote(vote)),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use openraft::entry::RaftEntry;
    use rdkv_storage::raft::{Entry, TypeConfig, Vote};

    use super::*;

    fn log_id(index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(2, 1, index)
    }

    fn append(entries: Vec<Entry>, committed: u64) -> AppendEntriesRequest {
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(9)),
            entries,
            leader_commit: Some(log_id(committed)),
        }
    }

    #[test]
    fn only_a_later_commit_index_without_entries_on_a_used_stream_waits() {
        let entries = || vec![Entry::new_blank(log_id(10))];
        let sent = Some(Some(log_id(8)));
        assert!(only_advances_commit(sent, &append(Vec::new(), 9)));
        assert!(
            !only_advances_commit(None, &append(Vec::new(), 9)),
            "a heartbeat, or a probe: the first request of its stream"
        );
        assert!(
            !only_advances_commit(sent, &append(Vec::new(), 8)),
            "no newer commit index"
        );
        assert!(!only_advances_commit(sent, &append(entries(), 9)));
    }

    /// Whether a task spawned just before the yield decision has run by
    /// the time the append would be sent.
    fn spawned_task_ran_first(yields: bool) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let ran = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&ran);
            // Stands for the state machine's worker, woken by RaftCore in
            // the step that woke this stream.
            tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
            after_ready_tasks_if(yields).await;
            ran.load(Ordering::SeqCst)
        })
    }

    /// An append that only advances the commit index goes after the tasks
    /// ready with it (the apply that answers the writes); any other goes at
    /// once. (This tests the helper `Outbound::send` calls first.)
    #[test]
    fn a_commit_only_append_waits_for_the_tasks_ready_with_it() {
        assert!(spawned_task_ran_first(true));
        assert!(!spawned_task_ran_first(false));
    }
}
