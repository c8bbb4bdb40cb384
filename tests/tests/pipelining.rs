//! Deep RESP pipelines keep their order: 10,000 mixed SET/GET/GETEX/MGET/INCR/DEL over
//! 40 keys are written on one connection without waiting for any reply
//! (through the leader, and through a follower, which forwards), and every
//! reply is checked against a model that applies the commands one at a time
//! in request order. So replies come back in request order, and every read
//! sees every earlier write of its key on its connection, while the server
//! runs the commands on different keys at once. The leader answers GETs at
//! once from its region when it may (with `lease` reads under its lease;
//! with linearizable reads after one confirmation round per batch of
//! buffered commands); the same script checks them.
//!
//! The same script on one native connection to the leader (answers carry
//! their request's id and may come in any order): every answer is the
//! model's, the writes of each key are applied in request order (their
//! versions rise), and every read returns the version of the write before
//! it, at linearizable and at lease consistency.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::{Bytes, BytesMut};
use rdkv_proto::wire::{
    Consistency, DEFAULT_MAX_FRAME_BYTES, FrameDecoder, FrameKind, Request, Response, Update,
    UpdateOutcome, Versioned, decode_payload, encoded_frame,
};
use rdkv_tests::prometheus::scrape;
use rdkv_tests::raw_native::RawConnection;
use rdkv_tests::raw_resp::raw_exchange;
use rdkv_tests::stress_value::splitmix64;
use rdkv_tests::{Cluster, Intent, check_with_leader};

const COMMANDS: usize = 10_000;
const KEYS: u64 = 40;
const TEST_LIMIT_SECS: u64 = 180;
/// Longest the test waits for the whole pipeline's replies.
const REPLIES_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy)]
enum Op {
    Set(u64, i64),
    Get(u64),
    /// GETEX without options, over RESP: a read the RESP front end runs as
    /// a command of several steps flagged as a write (a plain GET natively).
    GetEx(u64),
    MGet(u64, u64),
    Incr(u64),
    Del(u64),
}

/// What the model says a command answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    Ok,
    Value(Option<i64>),
    Values(Option<i64>, Option<i64>),
    Integer(i64),
    Deleted(bool),
}

/// A deterministic mix: three in seven reads (GET, GETEX, MGET of two
/// keys), the rest writes of three kinds.
fn script(seed: u64) -> Vec<Op> {
    let mut state = seed;
    (0..COMMANDS)
        .map(|_| {
            state = splitmix64(state);
            let key = (state >> 8) % KEYS;
            let value = ((state >> 32) % 1000) as i64;
            let other = (state >> 16) % KEYS;
            match state % 7 {
                0 => Op::Get(key),
                1 => Op::GetEx(key),
                2 => Op::MGet(key, other),
                3 => Op::Set(key, value),
                4 | 5 => Op::Incr(key),
                _ => Op::Del(key),
            }
        })
        .collect()
}

/// Applies the script one command at a time, in order.
fn expected(ops: &[Op]) -> Vec<Expected> {
    let mut state: HashMap<u64, i64> = HashMap::new();
    ops.iter()
        .map(|op| match *op {
            Op::Set(k, v) => {
                state.insert(k, v);
                Expected::Ok
            }
            Op::Get(k) | Op::GetEx(k) => Expected::Value(state.get(&k).copied()),
            Op::MGet(a, b) => Expected::Values(state.get(&a).copied(), state.get(&b).copied()),
            Op::Incr(k) => {
                let n = state.get(&k).copied().unwrap_or(0) + 1;
                state.insert(k, n);
                Expected::Integer(n)
            }
            Op::Del(k) => Expected::Deleted(state.remove(&k).is_some()),
        })
        .collect()
}

fn key_name(prefix: &str, k: u64) -> String {
    format!("{prefix}/{k}")
}

fn resp_command(prefix: &str, op: Op) -> Vec<u8> {
    let args: Vec<String> = match op {
        Op::Set(k, v) => vec!["SET".into(), key_name(prefix, k), v.to_string()],
        Op::Get(k) => vec!["GET".into(), key_name(prefix, k)],
        Op::GetEx(k) => vec!["GETEX".into(), key_name(prefix, k)],
        Op::MGet(a, b) => vec!["MGET".into(), key_name(prefix, a), key_name(prefix, b)],
        Op::Incr(k) => vec!["INCR".into(), key_name(prefix, k)],
        Op::Del(k) => vec!["DEL".into(), key_name(prefix, k)],
    };
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

fn bulk_reply(value: Option<i64>) -> Vec<u8> {
    match value {
        None => b"$-1\r\n".to_vec(),
        Some(v) => {
            let v = v.to_string();
            format!("${}\r\n{v}\r\n", v.len()).into_bytes()
        }
    }
}

fn resp_reply(expected: Expected) -> Vec<u8> {
    match expected {
        Expected::Ok => b"+OK\r\n".to_vec(),
        Expected::Value(value) => bulk_reply(value),
        Expected::Values(a, b) => [b"*2\r\n".to_vec(), bulk_reply(a), bulk_reply(b)].concat(),
        Expected::Integer(n) => format!(":{n}\r\n").into_bytes(),
        Expected::Deleted(existed) => format!(":{}\r\n", u8::from(existed)).into_bytes(),
    }
}

/// Writes the whole script (then QUIT) on one RESP connection from another
/// thread while this one reads every reply.
fn resp_pipeline(addr: SocketAddr, prefix: &str) -> Result<()> {
    let ops = script(0x5eed ^ prefix.len() as u64);
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(REPLIES_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut requests: Vec<u8> = ops
        .iter()
        .flat_map(|&op| resp_command(prefix, op))
        .collect();
    requests.extend_from_slice(b"QUIT\r\n");
    let sender = std::thread::spawn(move || writer.write_all(&requests));
    let mut out = Vec::new();
    stream
        .read_to_end(&mut out)
        .context("reading the replies")?;
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    let mut rest = out.as_slice();
    for (i, want) in expected(&ops).into_iter().enumerate() {
        let want = resp_reply(want);
        ensure!(
            rest.starts_with(&want),
            "{prefix}: reply {i} to {:?}: expected {:?}, got {:?}",
            ops[i],
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&rest[..rest.len().min(want.len() + 16)])
        );
        rest = &rest[want.len()..];
    }
    ensure!(rest == b"+OK\r\n", "{prefix}: after the replies: {rest:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pipelined_commands_keep_their_order() -> Result<()> {
    pipelines_through_leader_and_follower(&[]).await
}

/// With `lease` RESP reads the leader answers a GET at once from its region
/// when nothing earlier on the connection writes its key and it holds the
/// lease: the same script must still see every earlier write, and some GETs
/// must have been answered that way (else this checks nothing new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answered_at_once_still_see_earlier_writes() -> Result<()> {
    pipelines_through_leader_and_follower(&["--resp-read-consistency", "lease"]).await
}

async fn pipelines_through_leader_and_follower(extra_args: &[&str]) -> Result<()> {
    let mut cluster = Cluster::start_with(3, extra_args)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let follower = (1..=3).find(|&id| id != leader).context("a follower")?;
        let leader_resp = cluster.node(leader)?.resp_addr;
        let follower_resp = cluster.node(follower)?.resp_addr;
        tokio::task::spawn_blocking(move || -> Result<()> {
            resp_pipeline(leader_resp, "resp-leader")?;
            resp_pipeline(follower_resp, "resp-follower")
        })
        .await??;
        let native = cluster.node(leader)?.client_addr;
        native_pipeline(native, "native-leader").await?;
        let answered = reads_answered_at_once(cluster, leader).await?;
        println!("the leader answered {answered} GETs at once");
        // Linearizable reads too: after one confirmation round per batch.
        ensure!(answered > 0.0, "no GET was answered at once");
        Ok(())
    })
    .await
}

/// Inline commands (what a terminal sends, as `GET k` lines) are answered
/// at once as array commands are: their arguments are unquoted copies, shown
/// through the same view. Exactly the two reads are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_reads_are_answered_at_once_too() -> Result<()> {
    let mut cluster = Cluster::start_with(1, &[])?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let resp = cluster.node(leader)?.resp_addr;
        let exchange = async |bytes: &'static [u8]| {
            tokio::task::spawn_blocking(move || raw_exchange(resp, bytes)).await?
        };
        let set = exchange(b"SET k v\r\nQUIT\r\n").await?;
        ensure!(
            set == b"+OK\r\n+OK\r\n",
            "{:?}",
            String::from_utf8_lossy(&set)
        );
        let before = reads_answered_at_once(cluster, leader).await?;
        let reads = exchange(b"GET k\r\nMGET k none\r\nQUIT\r\n").await?;
        let expected = b"$1\r\nv\r\n*2\r\n$1\r\nv\r\n$-1\r\n+OK\r\n";
        ensure!(reads == expected, "{:?}", String::from_utf8_lossy(&reads));
        let answered = reads_answered_at_once(cluster, leader).await? - before;
        ensure!(
            answered == 2.0,
            "{answered} of the two inline reads answered at once"
        );
        Ok(())
    })
    .await
}

/// A region replaced within a batch (FLUSHALL clears by swapping in an
/// empty region) is the one the batch's later reads answered at once read.
/// CLIENT ID waits for the FLUSHALL before it (it runs on the connection's
/// state), so the second GET is answered at once after it, in the same
/// batch. The batch lets its kept reader go before that wait, and a kept
/// reader is checked against the current one on every read; either keeps
/// this test passing (the storage test
/// `a_kept_reader_reads_the_region_that_replaced_it` checks the second
/// alone), and it failed with neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answered_at_once_after_a_flush_in_its_batch_sees_the_flush() -> Result<()> {
    let mut cluster = Cluster::start_with(1, &[])?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let resp = cluster.node(leader)?.resp_addr;
        let exchange = async |bytes: &'static [u8]| {
            tokio::task::spawn_blocking(move || raw_exchange(resp, bytes)).await?
        };
        let set = exchange(b"SET k old\r\nQUIT\r\n").await?;
        ensure!(
            set == b"+OK\r\n+OK\r\n",
            "{:?}",
            String::from_utf8_lossy(&set)
        );
        let before = reads_answered_at_once(cluster, leader).await?;
        let batch = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$8\r\nFLUSHALL\r\n\
            *2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nQUIT\r\n";
        let replies = exchange(batch).await?;
        let text = String::from_utf8_lossy(&replies);
        let rest = text
            .strip_prefix("$3\r\nold\r\n+OK\r\n:")
            .with_context(|| format!("the first GET and FLUSHALL: {text:?}"))?;
        let (_, rest) = rest
            .split_once("\r\n")
            .with_context(|| format!("CLIENT ID: {text:?}"))?;
        ensure!(rest == "$-1\r\n+OK\r\n", "the GET after FLUSHALL: {text:?}");
        let answered = reads_answered_at_once(cluster, leader).await? - before;
        ensure!(
            answered == 2.0,
            "{answered} of the two GETs answered at once"
        );
        Ok(())
    })
    .await
}

/// Writes of one key pipelined on one RESP connection are proposed together:
/// each waits for the one before it to be queued for Raft, not to be
/// committed (`StoreRun::Placed`). With the node's fsync slowed, every INCR
/// of the pipeline is proposed (`rdkv_write_batch_commands`) before the
/// first is answered; when each waited for the one before it to finish,
/// one was proposed until the slow fsync ended. The replies count up in
/// request order, and the GET after them sees the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_of_one_key_are_proposed_together() -> Result<()> {
    const INCRS: usize = 20;
    const SLOW_FSYNC_MS: u64 = 3_000;
    let mut cluster = Cluster::start_with(1, &["--fault-injection"])?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, leader| {
        let node = cluster.node(leader)?;
        let (resp, http) = (node.resp_addr, node.http_addr);
        cluster.slow_fsync(leader, SLOW_FSYNC_MS).await?;
        let before = proposed_commands(http)?;
        let mut pipeline = b"INCR counter\r\n".repeat(INCRS);
        pipeline.extend_from_slice(b"GET counter\r\nQUIT\r\n");
        let replies = tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
            let mut stream = TcpStream::connect(resp)?;
            stream.write_all(&pipeline)?;
            wait_until_proposed(&stream, http, before, INCRS as f64)?;
            stream.set_read_timeout(Some(REPLIES_TIMEOUT))?;
            let mut replies = Vec::new();
            stream.read_to_end(&mut replies)?;
            Ok(replies)
        })
        .await??;
        cluster.slow_fsync(leader, 0).await?;
        let mut expected: Vec<u8> = (1..=INCRS)
            .flat_map(|n| format!(":{n}\r\n").into_bytes())
            .collect();
        let last = INCRS.to_string();
        expected.extend_from_slice(format!("${}\r\n{last}\r\n+OK\r\n", last.len()).as_bytes());
        ensure!(
            replies == expected,
            "replies {:?}",
            String::from_utf8_lossy(&replies)
        );
        Ok(())
    })
    .await
}

/// Pipelined INCRs of one key on one RESP connection, while the leadership
/// moves to each node in turn: writes Raft refuses mid-move are tried again
/// behind the leader's back (forwarded) or, when a later INCR of the key
/// went ahead of a refused one, answered TRYAGAIN; never applied out of
/// order. So the integer replies, in request order, rise strictly, and
/// every other reply is a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_keep_their_order_while_the_leader_moves() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, first| {
        let resp = cluster.node(first)?.resp_addr;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::task::spawn_blocking({
            let stop = stop.clone();
            move || incr_rounds(resp, &stop)
        });
        let client = cluster.client(Intent::Any)?;
        let mut targets: Vec<u64> = (1..=3).filter(|id| *id != first).collect();
        targets.push(first);
        for target in targets {
            tokio::time::sleep(Duration::from_millis(300)).await;
            client.move_leader(target).await?;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let replies = writer.await??;
        let mut last = 0;
        let (mut counted, mut refused) = (0, 0);
        for (i, reply) in replies.iter().enumerate() {
            match reply.strip_prefix(':').map(str::parse::<i64>) {
                Some(Ok(n)) => {
                    ensure!(n > last, "reply {i}: INCR answered {n} after {last}");
                    (last, counted) = (n, counted + 1);
                }
                _ if reply.starts_with("-TRYAGAIN") || reply.contains("may or may not") => {
                    refused += 1
                }
                _ => bail!("reply {i}: {reply:?}"),
            }
        }
        println!(
            "{} INCRs: {counted} applied in order, {refused} refused",
            replies.len()
        );
        ensure!(counted > 0, "no INCR was applied");
        Ok(())
    })
    .await
}

/// Rounds of 64 pipelined `INCR hot` on one connection until `stop`; every
/// reply line, in request order.
fn incr_rounds(resp: SocketAddr, stop: &AtomicBool) -> Result<Vec<String>> {
    const ROUND: usize = 64;
    let mut stream = TcpStream::connect(resp)?;
    stream.set_read_timeout(Some(REPLIES_TIMEOUT))?;
    let mut lines = BufReader::new(stream.try_clone()?);
    let round = b"INCR hot\r\n".repeat(ROUND);
    let mut replies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        stream.write_all(&round)?;
        for _ in 0..ROUND {
            let mut line = String::new();
            lines.read_line(&mut line).context("reading a reply")?;
            replies.push(line.trim_end().to_owned());
        }
    }
    Ok(replies)
}

/// Polls the node's count of proposed commands until `writes` more than
/// `before` were proposed; fails if a reply arrives on `stream` first (or
/// neither happens within [`REPLIES_TIMEOUT`]).
fn wait_until_proposed(
    stream: &TcpStream,
    http: SocketAddr,
    before: f64,
    writes: f64,
) -> Result<()> {
    stream.set_nonblocking(true)?;
    let deadline = Instant::now() + REPLIES_TIMEOUT;
    while Instant::now() < deadline {
        let proposed = proposed_commands(http)? - before;
        if proposed >= writes {
            return Ok(stream.set_nonblocking(false)?);
        }
        match stream.peek(&mut [0u8; 1]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
            Ok(_) => bail!("a reply came when {proposed} of the {writes} writes were proposed"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("neither a reply nor the {writes} proposals within {REPLIES_TIMEOUT:?}")
}

/// Commands the node has proposed to Raft, over all its write batches.
fn proposed_commands(http: SocketAddr) -> Result<f64> {
    let metrics = scrape(http)?;
    Ok(metrics.sum("rdkv_write_batch_commands_sum", &[]))
}

async fn reads_answered_at_once(cluster: &Cluster, id: u64) -> Result<f64> {
    let metrics = cluster.metrics_of(id).await?;
    Ok(metrics.sum("rdkv_resp_reads_answered_at_once_total", &[]))
}

fn native_request(prefix: &str, i: usize, op: Op) -> Request {
    let key = |k| Bytes::from(key_name(prefix, k));
    // Half the reads at each level: lease reads may be answered from the
    // region without a round, and must still follow the writes before them.
    let consistency = if i.is_multiple_of(2) {
        Consistency::Linearizable
    } else {
        Consistency::Lease
    };
    match op {
        Op::Set(k, v) => Request::Put {
            key: key(k),
            value: Bytes::from(v.to_string()),
        },
        Op::Get(k) | Op::GetEx(k) => Request::Get {
            key: key(k),
            consistency,
        },
        Op::MGet(a, b) => Request::MGet {
            keys: vec![key(a), key(b)],
            consistency,
        },
        Op::Incr(k) => Request::Update {
            key: key(k),
            update: Update::Incr { delta: 1 },
        },
        Op::Del(k) => Request::Delete { key: key(k) },
    }
}

/// What the model expects of each answer, and the versions: every key's
/// writes get rising versions in request order, and a read returns the
/// version of the last write of its key before it.
#[derive(Default)]
struct NativeCheck {
    /// The version of each key's last write so far, in request order.
    last_write: HashMap<u64, u64>,
}

fn value_of(versioned: &Option<Versioned>) -> Result<Option<(i64, u64)>> {
    versioned
        .as_ref()
        .map(|v| -> Result<(i64, u64)> {
            let text = std::str::from_utf8(&v.value)?;
            Ok((text.parse()?, v.version))
        })
        .transpose()
}

/// Checks one answer against the model's and returns the version a write
/// produced.
fn check_native(op: Op, want: Expected, got: &Response) -> Result<Option<u64>> {
    Ok(match (want, got) {
        (Expected::Ok, Response::Written { version }) => Some(*version),
        (Expected::Integer(n), Response::Updated(UpdateOutcome::Integer { value, version }))
            if *value == n =>
        {
            Some(*version)
        }
        (
            Expected::Deleted(existed),
            Response::Deleted {
                existed: got,
                version,
            },
        ) if existed == *got => existed.then_some(*version),
        (Expected::Value(value), Response::Value(versioned))
            if value_of(versioned)?.map(|(v, _)| v) == value =>
        {
            None
        }
        (Expected::Values(a, b), Response::Values(values))
            if values.len() == 2
                && value_of(&values[0])?.map(|(v, _)| v) == a
                && value_of(&values[1])?.map(|(v, _)| v) == b =>
        {
            None
        }
        _ => bail!("{op:?}: expected {want:?}, got {got:?}"),
    })
}

impl NativeCheck {
    /// The versions a read saw must be those of the last earlier writes
    /// of its keys (a deleted key reads as absent, checked by value).
    fn read(&self, op: Op, got: &Response) -> Result<()> {
        let seen: Vec<(u64, Option<u64>)> = match (op, got) {
            (Op::Get(k) | Op::GetEx(k), Response::Value(v)) => {
                vec![(k, v.as_ref().map(|v| v.version))]
            }
            (Op::MGet(a, b), Response::Values(values)) => vec![
                (a, values[0].as_ref().map(|v| v.version)),
                (b, values[1].as_ref().map(|v| v.version)),
            ],
            _ => return Ok(()),
        };
        for (key, version) in seen {
            if let Some(version) = version {
                let want = self.last_write.get(&key).copied();
                ensure!(
                    Some(version) == want,
                    "{op:?} read version {version} of key {key}, its last write was {want:?}"
                );
            }
        }
        Ok(())
    }

    fn wrote(&mut self, op: Op, version: Option<u64>) -> Result<()> {
        let key = match op {
            Op::Set(k, _) | Op::Incr(k) | Op::Del(k) => k,
            Op::Get(_) | Op::GetEx(_) | Op::MGet(..) => return Ok(()),
        };
        let Some(version) = version else {
            return Ok(());
        };
        if let Some(&before) = self.last_write.get(&key) {
            ensure!(
                version > before,
                "{op:?} applied at {version}, before the earlier write of its key at {before}"
            );
        }
        self.last_write.insert(key, version);
        Ok(())
    }
}

/// Sends the whole script on one native connection from another thread
/// while this one reads every answer, then checks them in request order.
async fn native_pipeline(addr: SocketAddr, prefix: &str) -> Result<()> {
    let ops = script(0x5eed ^ prefix.len() as u64);
    let raw = RawConnection::open(addr, "pipelining", None)
        .await?
        .map_err(|refused| anyhow::anyhow!("refused: {refused}"))?;
    let mut stream = raw.into_std()?;
    stream.set_read_timeout(Some(REPLIES_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut frames = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let request = native_request(prefix, i, op);
        frames.extend_from_slice(&encoded_frame(
            FrameKind::Request,
            i as u64,
            &request,
            DEFAULT_MAX_FRAME_BYTES,
        )?);
    }
    let count = ops.len();
    let answers = tokio::task::spawn_blocking(move || -> Result<Vec<Option<Response>>> {
        let sender = std::thread::spawn(move || writer.write_all(&frames));
        let mut answers: Vec<Option<Response>> = vec![None; count];
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES);
        let mut buf = BytesMut::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut received = 0;
        while received < count {
            while let Some(frame) = decoder.decode(&mut buf)? {
                let slot = answers
                    .get_mut(frame.request_id as usize)
                    .context("an answer to an unknown request id")?;
                ensure!(slot.is_none(), "two answers to {}", frame.request_id);
                *slot = Some(decode_payload(&frame)?);
                received += 1;
            }
            if received == count {
                break;
            }
            let read = stream.read(&mut chunk).context("reading the answers")?;
            ensure!(read > 0, "closed after {received} answers");
            buf.extend_from_slice(&chunk[..read]);
        }
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
        Ok(answers)
    })
    .await??;
    let mut check = NativeCheck::default();
    for (i, (want, answer)) in expected(&ops).into_iter().zip(answers).enumerate() {
        let got = answer.context("no answer")?;
        let version =
            check_native(ops[i], want, &got).with_context(|| format!("{prefix}: request {i}"))?;
        check
            .read(ops[i], &got)
            .with_context(|| format!("{prefix}: request {i}"))?;
        check
            .wrote(ops[i], version)
            .with_context(|| format!("{prefix}: request {i}"))?;
    }
    Ok(())
}
