//! The receiving side of a shared (version-3) connection: its frames name
//! their shard, and each shard gets a queue and a worker of its own on the
//! connection, so that one shard's slow request (an fsync, a snapshot being
//! installed) does not hold another shard's heartbeat (docs/sharding.md,
//! section 3). A worker serves its shard's requests in arrival order; the
//! answers of every worker go to one writer task, which sends together
//! those that are ready together.
//!
//! A read fence is the exception: it is answered by the reader itself
//! ([`AtOnce`]), because a shard's worker serves it only after the appends
//! queued ahead of it, one of which may be waiting for this node's fsync,
//! and a fence that waits so long makes the leader's read round fall back.
//!
//! A shard's queue holds [`SHARD_QUEUE_FRAMES`] frames: a well-behaved
//! leader keeps at most `MAX_APPENDS_IN_FLIGHT` appends and a call or two
//! in flight per shard. When a queue is full anyway the reader waits for
//! it (nothing a peer sends is queued without bound), and the connection's
//! other shards wait with it.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use futures::future::BoxFuture;
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{FrameKind, WireError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{PEER_PROTOCOL_VERSION_SHARDS, PeerRequest, PeerResponse, decode_for_shard};
use crate::framed::{FrameReader, FrameWriter};

/// Frames of one shard read from a connection ahead of its worker.
pub const SHARD_QUEUE_FRAMES: usize = 32;
/// Answers waiting for the connection's writer.
const ANSWER_QUEUE: usize = 64;

/// A request for a shard's worker (or why it could not be decoded).
pub struct Incoming {
    pub request_id: u64,
    pub request: Result<PeerRequest, WireError>,
}

/// An answer for the connection's writer.
pub struct Outgoing {
    pub shard: ShardId,
    pub request_id: u64,
    pub response: PeerResponse,
}

/// Starts shard `shard`'s worker on a connection (`Err`: why the shard's
/// frames are refused): it serves what `Receiver` brings and answers
/// into `Sender`, and ends when its queue closes. `A`: what the peer was
/// admitted to (for [`AtOnce`]).
pub type StartWorker<'a, A> = dyn FnMut(
        ShardId,
        mpsc::Receiver<Incoming>,
        mpsc::Sender<Outgoing>,
    ) -> Result<(A, BoxFuture<'static, ()>), String>
    + Send
    + 'a;

/// Answers a request of a shard on the reader, ahead of the shard's
/// queue, if it is one that must not wait for the shard's worker (`None`:
/// the worker serves it). Asked only once the shard's worker runs, with
/// what [`StartWorker`] admitted the peer to.
pub type AtOnce<'a, A> =
    dyn Fn(ShardId, &A, &PeerRequest) -> Option<PeerResponse> + Send + Sync + 'a;

/// Serves a version-3 connection whose hello has been accepted, until it
/// ends or `cut_off` says to drop it (fault injection). Its workers and
/// writer end with it.
pub async fn serve<R, W, A: Send>(
    mut reader: FrameReader<R>,
    writer: FrameWriter<W>,
    start: &mut StartWorker<'_, A>,
    at_once: &AtOnce<'_, A>,
    cut_off: impl Fn() -> bool,
) -> Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (answers, outgoing) = mpsc::channel(ANSWER_QUEUE);
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        if let Err(e) = write_answers(writer, outgoing).await {
            tracing::debug!("writing peer answers: {e:#}");
        }
    });
    let mut queues: HashMap<ShardId, (mpsc::Sender<Incoming>, A)> = HashMap::new();
    loop {
        let frame = tokio::select! {
            frame = reader.next() => frame?,
            // Only the writer ends on its own: the connection is broken.
            Some(_) = tasks.join_next() => bail!("the peer connection's writer ended"),
        };
        let Some(frame) = frame else {
            return Ok(());
        };
        if cut_off() {
            bail!("the peer is cut off by fault injection");
        }
        let request_id = frame.request_id;
        let (shard, request) = match decode_for_shard(PEER_PROTOCOL_VERSION_SHARDS, &frame) {
            Ok((shard, request)) => (shard, Ok(request)),
            // Undecodable: answered by the shard it names, if it names one.
            Err(e) => match postcard::take_from_bytes::<ShardId>(&frame.payload) {
                Ok((shard, _)) => (shard, Err(e)),
                Err(_) => (ShardId(0), Err(e)),
            },
        };
        if let Some((queue, admitted)) = queues.get(&shard) {
            let decoded = request.as_ref().ok();
            match decoded.and_then(|r| at_once(shard, admitted, r)) {
                Some(response) => send_answer(&answers, shard, request_id, response).await?,
                None => queue
                    .send(Incoming {
                        request_id,
                        request,
                    })
                    .await
                    .map_err(|_| anyhow::anyhow!("shard {}'s worker ended", shard.0))?,
            }
            continue;
        }
        let (queue, worker_queue) = mpsc::channel(SHARD_QUEUE_FRAMES);
        match start(shard, worker_queue, answers.clone()) {
            Ok((admitted, worker)) => {
                tasks.spawn(worker);
                let incoming = Incoming {
                    request_id,
                    request,
                };
                // A new queue has room.
                let _ = queue.send(incoming).await;
                queues.insert(shard, (queue, admitted));
            }
            Err(message) => {
                let refused = PeerResponse::Failed(message);
                send_answer(&answers, shard, request_id, refused).await?;
            }
        }
    }
}

/// Hands an answer to a shared connection's writer (one the reader made
/// itself, or a worker's).
pub async fn send_answer(
    answers: &mpsc::Sender<Outgoing>,
    shard: ShardId,
    request_id: u64,
    response: PeerResponse,
) -> Result<()> {
    let answer = Outgoing {
        shard,
        request_id,
        response,
    };
    answers
        .send(answer)
        .await
        .context("the peer connection's writer ended")
}

/// Sends the workers' answers, those ready together in one write; ends
/// when every worker has ended, or on a write error.
async fn write_answers<W: AsyncWrite + Unpin>(
    mut writer: FrameWriter<W>,
    mut outgoing: mpsc::Receiver<Outgoing>,
) -> Result<()> {
    while let Some(first) = outgoing.recv().await {
        queue_answer(&mut writer, &first)?;
        for _ in 1..ANSWER_QUEUE {
            let Ok(next) = outgoing.try_recv() else {
                break;
            };
            queue_answer(&mut writer, &next)?;
        }
        writer.flush().await?;
    }
    Ok(())
}

fn queue_answer<W: AsyncWrite + Unpin>(
    writer: &mut FrameWriter<W>,
    answer: &Outgoing,
) -> Result<()> {
    let payload = (answer.shard, &answer.response);
    writer.queue(FrameKind::Response, answer.request_id, &payload)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkv_storage::raft::Vote;

    use super::*;
    use crate::peer::PEER_MAX_FRAME_BYTES;

    /// Shard 1's worker takes its first request and never answers (a
    /// request stuck in its Raft); shard 2's answers each at once; shard 3
    /// is not hosted.
    fn start_workers(
        shard: ShardId,
        mut queue: mpsc::Receiver<Incoming>,
        answers: mpsc::Sender<Outgoing>,
    ) -> Result<((), BoxFuture<'static, ()>), String> {
        match shard.0 {
            1 => Ok((
                (),
                Box::pin(async move {
                    let _stuck = queue.recv().await;
                    std::future::pending::<()>().await;
                }),
            )),
            2 => Ok((
                (),
                Box::pin(async move {
                    while let Some(incoming) = queue.recv().await {
                        let answer = Outgoing {
                            shard,
                            request_id: incoming.request_id,
                            response: PeerResponse::Failed("served".into()),
                        };
                        if answers.send(answer).await.is_err() {
                            return;
                        }
                    }
                }),
            )),
            _ => Err("not hosted".into()),
        }
    }

    /// Answers every admitted shard's fences with term 7's vote of node 1.
    fn fence_at_once(_: ShardId, _: &(), request: &PeerRequest) -> Option<PeerResponse> {
        let vote = Vote::new_committed(7, 1);
        matches!(request, PeerRequest::ReadFence).then_some(PeerResponse::ReadFence(Some(vote)))
    }

    /// Connects a peer to `serve` over an in-memory pipe.
    fn connect() -> (
        FrameReader<impl AsyncRead + Unpin>,
        FrameWriter<impl AsyncWrite + Unpin>,
        tokio::task::JoinHandle<Result<()>>,
    ) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let (read, write) = tokio::io::split(ours);
        let serving = tokio::spawn(async move {
            let mut start = start_workers;
            serve(
                FrameReader::new(read, PEER_MAX_FRAME_BYTES),
                FrameWriter::new(write, PEER_MAX_FRAME_BYTES),
                &mut start,
                &fence_at_once,
                || false,
            )
            .await
        });
        let (read, write) = tokio::io::split(theirs);
        let reader = FrameReader::new(read, PEER_MAX_FRAME_BYTES);
        let writer = FrameWriter::new(write, PEER_MAX_FRAME_BYTES);
        (reader, writer, serving)
    }

    /// The next `n` answers on `reader`, sorted by request id: (request id,
    /// shard, response).
    async fn next_answers(
        reader: &mut FrameReader<impl AsyncRead + Unpin>,
        n: usize,
        what: &str,
    ) -> Vec<(u64, u32, PeerResponse)> {
        let mut answered = Vec::new();
        while answered.len() < n {
            // Bounds the test only: a held frame is never answered.
            let frame = tokio::time::timeout(Duration::from_secs(20), reader.next())
                .await
                .unwrap_or_else(|_| panic!("not answered in time: {what}"))
                .unwrap()
                .unwrap();
            let (shard, response): (ShardId, PeerResponse) =
                decode_for_shard(PEER_PROTOCOL_VERSION_SHARDS, &frame).unwrap();
            answered.push((frame.request_id, shard.0, response));
        }
        answered.sort_by_key(|(id, _, _)| *id);
        answered
    }

    #[tokio::test]
    async fn a_fence_is_answered_past_its_stuck_shard_once_the_shard_is_admitted() {
        let (mut peer_reader, mut peer_writer, serving) = connect();
        let garbage = (ShardId(1), 255u8);
        peer_writer.queue(FrameKind::Request, 1, &garbage).unwrap();
        let fence = |shard| (ShardId(shard), PeerRequest::ReadFence);
        // Shard 1's worker is stuck on request 1; shard 3 is not hosted.
        for (request_id, shard) in [(2, 1), (3, 3)] {
            peer_writer
                .queue(FrameKind::Request, request_id, &fence(shard))
                .unwrap();
        }
        peer_writer.flush().await.unwrap();
        let answered = next_answers(&mut peer_reader, 2, "both fences despite shard 1's worker")
            .await
            .into_iter()
            .map(|(id, shard, response)| (id, shard, format!("{response:?}")))
            .collect::<Vec<_>>();
        let fenced = PeerResponse::ReadFence(Some(Vote::new_committed(7, 1)));
        let refused = PeerResponse::Failed("not hosted".into());
        let expected = vec![
            (2, 1, format!("{fenced:?}")),
            // A shard the peer was not admitted to is refused, fence or not.
            (3, 3, format!("{refused:?}")),
        ];
        assert_eq!(answered, expected);
        drop((peer_reader, peer_writer));
        serving.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_stuck_shard_does_not_hold_another_shards_frames() {
        let (mut peer_reader, mut peer_writer, serving) = connect();
        // Requests no Raft would decode: each goes to its shard's worker
        // all the same (the shard id before it decodes).
        for (request_id, shard) in [(1, 1), (2, 1), (3, 2), (4, 3), (5, 2)] {
            let payload = (ShardId(shard), 255u8);
            peer_writer
                .queue(FrameKind::Request, request_id, &payload)
                .unwrap();
        }
        peer_writer.flush().await.unwrap();
        let what = "shard 2's and shard 3's answers despite shard 1";
        let answered = next_answers(&mut peer_reader, 3, what).await;
        let answered: Vec<_> = answered
            .into_iter()
            .map(|(id, shard, response)| match response {
                PeerResponse::Failed(message) => (id, shard, message),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected = [(3, 2, "served"), (4, 3, "not hosted"), (5, 2, "served")];
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(id, shard, message)| (id, shard, message.to_owned()))
            .collect();
        assert_eq!(answered, expected);
        drop((peer_reader, peer_writer));
        // The peer closed: the connection ends cleanly.
        serving.await.unwrap().unwrap();
    }
}
