//! One RESP connection: reads commands while earlier ones run, runs those
//! on different keys at once (`order`), and writes the replies in request
//! order.
//!
//! Bounds: at most [`MAX_PIPELINED_COMMANDS`] commands, and
//! [`MAX_PIPELINED_BYTES`] of their arguments (one command may exceed it
//! alone), are in flight; past either the socket is not read, so a client
//! that pipelines without reading replies is held back by TCP. Replies are
//! written whenever the next one is not ready yet, or past [`FLUSH_BYTES`];
//! a client that never reads them stops the connection at its socket buffer.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::Result;
use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use futures::stream::{FuturesOrdered, StreamExt};
use rdkv_proto::wire::Op;
use rdkv_storage::state_machine::LocalReads;
use rdkv_tls::{Stream, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::clients::ClientInfo;
use super::parse::{Args, CommandReader, ParseLimits, ProtocolError, detached};
use super::reply::Reply;
use super::session::{Session, Step};
use super::table::{Spec, StoreRun};
use super::transaction;
use super::{FLUSH_BYTES, RespServer};
use crate::order::{KeyOrder, completion};
use crate::replica::Replica;
use crate::telemetry::Via;

/// Commands read ahead of their replies on one connection.
pub const MAX_PIPELINED_COMMANDS: usize = 128;
/// Argument bytes held by one connection's commands in flight.
pub const MAX_PIPELINED_BYTES: usize = 1024 * 1024;
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// What a connection may send before it has authenticated (AUTH, HELLO, PING).
const UNAUTHENTICATED_LIMITS: ParseLimits = ParseLimits {
    max_bulk_bytes: 4096,
    max_array_len: 16,
    max_inline_bytes: 4096,
    max_command_bytes: 16 * 1024,
};

/// A command's reply, whether the connection closes after it, and the
/// argument bytes it held.
type Outcome = (Reply, bool, usize);
type Running<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// Why a connection ends early.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

struct Pipeline<'a> {
    server: &'a RespServer,
    session: Session<'a>,
    order: KeyOrder,
    running: FuturesOrdered<Running<'a>>,
    /// Argument bytes of the commands in `running`.
    held_bytes: usize,
    /// QUIT was read: nothing after it is read or run.
    closing: bool,
    /// A reply that closes the connection has been encoded.
    closed: bool,
    write: WriteHalf,
    output: BytesMut,
    reader: CommandReader,
    /// The command being started when it is not answered at once: slices
    /// of the input buffer, emptied before the buffer is read into again.
    argv: Vec<Bytes>,
}

pub async fn serve(stream: Stream, peer: String, server: &RespServer) -> Result<()> {
    let local = stream
        .tcp()
        .local_addr()
        .map_or_else(|_| String::from("?"), |a| a.to_string());
    let (mut read, write) = stream.into_split();
    let _open = server.handler.stats().connection(Via::Resp);
    let mut input = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut pipeline = Pipeline {
        server,
        session: Session::new(server, ClientInfo::new(peer, local)),
        order: KeyOrder::default(),
        running: FuturesOrdered::new(),
        held_bytes: 0,
        closing: false,
        closed: false,
        write,
        output: BytesMut::new(),
        reader: CommandReader::default(),
        argv: Vec::new(),
    };
    let mut input_open = true;
    loop {
        let window_full = match pipeline.start_buffered(&mut input).await {
            Ok(full) => full,
            Err(Closed::Protocol(e)) => {
                // The stream cannot be resynchronised: answer what was
                // read, say why, then close.
                pipeline.finish_all().await?;
                let protocol = pipeline.session.protocol();
                Reply::err(format!("Protocol error: {e}")).encode(protocol, &mut pipeline.output);
                pipeline.flush().await?;
                anyhow::bail!("protocol error: {e}");
            }
            Err(Closed::Io(e)) => return Err(e.into()),
        };
        pipeline.take_ready().await?;
        if window_full && pipeline.has_room() && !pipeline.closed {
            // More commands may be buffered already: start them first.
            continue;
        }
        let idle = pipeline.running.is_empty() && (pipeline.closing || !input_open);
        // Nothing more is ready: what is buffered goes out before waiting.
        pipeline.flush().await?;
        if pipeline.closed || idle {
            return Ok(());
        }
        let may_read = input_open && !pipeline.closing && pipeline.has_room();
        input.reserve(READ_CHUNK_BYTES);
        tokio::select! {
            Some(outcome) = pipeline.running.next(), if !pipeline.running.is_empty() => {
                pipeline.take(outcome).await?;
            }
            read = read.read_buf(&mut input), if may_read => {
                if read? == 0 {
                    input_open = false;
                }
            }
        }
    }
}

/// The reads one batch of buffered commands answered at once: whether the
/// node may (asked at the batch's first such read: the lease's margin, or
/// one ReadIndex round started after every command of the batch arrived,
/// covers the batch), the reader they go through, and how many of each op,
/// for the request metrics.
#[derive(Debug)]
struct NowReads<'r> {
    /// When the node was asked (`None`: not yet in this batch).
    started: Option<Instant>,
    /// Once asked: the replica whose region the batch's reads may be
    /// answered from (`None`: not at once). Held by the batch's caller, so
    /// that the kept reader can borrow it; a `OnceLock`, not a `OnceCell`,
    /// as the connection's future, which holds a reference to it across
    /// waits, must be `Send`.
    replica: &'r OnceLock<Option<Replica>>,
    /// Its region's reader, kept from read to read while the batch runs
    /// without waiting ([`Self::release`]).
    kept: Option<LocalReads<'r>>,
    answered: Vec<(Op, u64)>,
}

impl<'r> NowReads<'r> {
    fn new(replica: &'r OnceLock<Option<Replica>>) -> NowReads<'r> {
        NowReads {
            started: None,
            replica,
            kept: None,
            answered: Vec::new(),
        }
    }

    /// The batch's reads (`None`: the node may not answer them at once).
    /// Only the batch's first call waits (for the node's answer).
    async fn local_reads(&mut self, server: &RespServer) -> Option<&mut LocalReads<'r>> {
        let cell = self.replica;
        if self.started.is_none() {
            self.started = Some(Instant::now());
            // Set only here, once per batch (`started` guards it).
            let set = cell.set(server.reads_now().await);
            debug_assert!(set.is_ok(), "the batch's replica is set once");
        }
        let replica = cell.get()?.as_ref()?;
        Some(self.kept.get_or_insert_with(|| replica.sm.local_reads()))
    }

    /// Lets the kept reader go before the batch waits (a flush to a slow
    /// client, an earlier command): it holds its region's memory, which a
    /// region replaced meanwhile must give back. The next read takes the
    /// current one.
    fn release(&mut self) {
        self.kept = None;
    }

    fn answered(&mut self, op: Op) {
        match self.answered.iter_mut().find(|(o, _)| *o == op) {
            Some((_, count)) => *count += 1,
            None => self.answered.push((op, 1)),
        }
    }

    /// Records the batch's reads, each charged an equal share of its time.
    fn account(self, server: &RespServer) {
        if let Some(started) = self.started {
            server
                .handler
                .stats()
                .finish_answered_at_once(started, Instant::now(), &self.answered);
        }
    }
}

impl<'a> Pipeline<'a> {
    fn has_room(&self) -> bool {
        self.running.len() < MAX_PIPELINED_COMMANDS && self.held_bytes < MAX_PIPELINED_BYTES
    }

    /// Starts every complete command in `input` that the window has room
    /// for; `true`: it stopped because the window is full. A command on
    /// the connection's state first lets every earlier one finish (their
    /// replies are encoded first).
    async fn start_buffered(&mut self, input: &mut BytesMut) -> Result<bool, Closed> {
        let replica = OnceLock::new();
        let mut now = NowReads::new(&replica);
        // The reader and the argument list are reused from command to
        // command (held apart from `self` while a command borrows them);
        // the list is empty again before the input buffer is read into.
        let mut reader = std::mem::take(&mut self.reader);
        let mut argv = std::mem::take(&mut self.argv);
        let started = self
            .start_commands(input, &mut reader, &mut argv, &mut now)
            .await;
        argv.clear();
        self.argv = argv;
        self.reader = reader;
        now.account(self.server);
        started
    }

    async fn start_commands(
        &mut self,
        input: &mut BytesMut,
        reader: &mut CommandReader,
        argv: &mut Vec<Bytes>,
        now: &mut NowReads<'_>,
    ) -> Result<bool, Closed> {
        while !self.closing && self.has_room() {
            // Before AUTH only small commands are read: nothing large is
            // buffered for a client that has not authenticated.
            let limits = if self.session.authenticated() {
                &self.server.limits
            } else {
                &UNAUTHENTICATED_LIMITS
            };
            if !reader.scan(input, limits)? {
                return Ok(false);
            }
            if self.answer_now(reader.args(input), now).await {
                reader.skip(input);
                if self.output.len() >= FLUSH_BYTES {
                    now.release();
                    self.flush().await?;
                }
                continue;
            }
            reader.take(input, argv);
            if argv.is_empty() {
                continue;
            }
            self.start_prepared(argv, now).await?;
        }
        Ok(!self.closing)
    }

    /// Starts a command taken off the input, as the session decides. A
    /// step that may wait (for earlier commands, or to flush its reply)
    /// lets the batch's kept reader go first; a store command only starts.
    async fn start_prepared(
        &mut self,
        argv: &[Bytes],
        now: &mut NowReads<'_>,
    ) -> std::io::Result<()> {
        let step = self.session.prepare(argv);
        if !matches!(step, Step::Store { .. }) {
            now.release();
        }
        match step {
            Step::Now { reply, close } => {
                self.closing |= close;
                self.push_ready(reply, close).await?;
            }
            Step::Session { run } => {
                self.finish_all().await?;
                let reply = self.session.run_session(run, argv);
                self.push_ready(reply, false).await?;
            }
            Step::Exec => {
                self.finish_all().await?;
                let reply = transaction::exec(&mut self.session).await;
                self.push_ready(reply, false).await?;
            }
            Step::Watch => {
                self.finish_all().await?;
                // The watched keys are kept: copies, not the input's.
                let keys = detached(&argv[1..]);
                let reply = transaction::watch(&mut self.session, &keys).await;
                self.push_ready(reply, false).await?;
            }
            Step::Store { spec, run } => {
                // It runs past this batch: its own copy of the arguments.
                self.start_store(spec, run, detached(argv));
            }
        }
        Ok(())
    }

    /// A reply known now: encoded at once when nothing earlier is still
    /// running (the common case of a pipeline of reads), else queued
    /// behind the earlier ones.
    async fn push_ready(&mut self, reply: Reply, close: bool) -> std::io::Result<()> {
        if self.running.is_empty() {
            return self.take((reply, close, 0)).await;
        }
        self.running
            .push_back(Box::pin(std::future::ready((reply, close, 0))));
        Ok(())
    }

    /// Answers a read at once from this node's region, from the view of
    /// its arguments in the input, when the session would hand it to the
    /// store as it is and its row allows it, nothing earlier on the
    /// connection may write its keys, and the node may serve reads without
    /// waiting (asked once per batch); `true` if it did (the caller then
    /// drops the command from the input). With nothing in flight its reply
    /// is encoded straight into the output (the common pipeline of reads: no
    /// reply value, no copy of the value); else encoded now and queued
    /// behind the earlier replies.
    async fn answer_now(&mut self, args: Args<'_>, now: &mut NowReads<'_>) -> bool {
        let Some((spec, op, run)) = self.session.now_row(args) else {
            return false;
        };
        // With nothing in flight no earlier command can write its keys (the
        // common pipeline of reads needs no key list).
        let after_writes = !self.running.is_empty();
        if after_writes && !self.order.read_may_run_now(&spec.keys_in_args(args)) {
            return false;
        }
        // Only the batch's first read waits here; after it, nothing waits
        // while the reader is kept (see `NowReads::release`).
        let Some(reads) = now.local_reads(self.server).await else {
            return false;
        };
        let protocol = self.session.protocol();
        let answered = if after_writes {
            let mut encoded = BytesMut::new();
            let answered = run(self.server, reads, args, protocol, &mut encoded);
            if answered {
                let reply = Reply::Encoded(encoded.freeze());
                self.running
                    .push_back(Box::pin(std::future::ready((reply, false, 0))));
            }
            answered
        } else {
            run(self.server, reads, args, protocol, &mut self.output)
        };
        if answered {
            now.answered(op);
        }
        answered
    }

    /// Starts a store command after the earlier commands on its keys: after
    /// the earlier writes of its keys are placed, for a write that is placed
    /// once proposed (`StoreRun::Placed`), else after they have finished.
    fn start_store(&mut self, spec: &'static Spec, run: StoreRun, argv: Vec<Bytes>) {
        let bytes: usize = argv.iter().map(Bytes::len).sum();
        let (finish, done) = completion();
        let (mut place, placed) = if run.is_placed() {
            let (place, placed) = completion();
            (Some(place), placed)
        } else {
            (None, done.clone())
        };
        let waits = self
            .order
            .admit(&spec.keys_in(&argv), spec.writes(), &done, &placed);
        self.held_bytes += bytes;
        let server = self.server;
        self.running.push_back(Box::pin(async move {
            waits.start().await;
            let reply = run.start(server, &argv[1..], &mut place).await;
            drop(place);
            waits.finish().await;
            drop(finish);
            (reply, false, bytes)
        }));
    }

    /// Encodes every reply that is ready now, in order.
    async fn take_ready(&mut self) -> std::io::Result<()> {
        while !self.closed {
            let Some(Some(outcome)) = self.running.next().now_or_never() else {
                break;
            };
            self.take(outcome).await?;
        }
        Ok(())
    }

    /// Waits for every command in flight and encodes their replies.
    async fn finish_all(&mut self) -> std::io::Result<()> {
        while let Some(outcome) = self.running.next().await {
            self.take(outcome).await?;
        }
        Ok(())
    }

    /// Encodes one reply, writing the buffer out once it is large.
    async fn take(&mut self, (reply, close, bytes): Outcome) -> std::io::Result<()> {
        self.held_bytes -= bytes;
        if self.closed {
            return Ok(());
        }
        reply.encode(self.session.protocol(), &mut self.output);
        self.closed = close;
        if self.output.len() >= FLUSH_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        if !self.output.is_empty() {
            self.write.write_all(&self.output).await?;
            self.output.clear();
        }
        Ok(())
    }
}
