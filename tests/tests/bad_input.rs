//! Hostile and broken input against a real node (started with a token), over
//! raw TCP: garbage frames, oversized length prefixes, wrong tokens and
//! protocol versions, strangers on the peer port, and a slowloris. Each gets
//! a clear error or a closed connection, and a normal client on the same
//! node keeps working after every one of them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bytes::{Buf, BufMut};
use rdkv_proto::wire::{
    ClientHello, Consistency, DEFAULT_MAX_FRAME_BYTES, ErrorCode, Frame, FrameKind, Request,
    Response, ServerHello, decode_payload, encoded_frame,
};
use rdkv_tests::raw_native::RawConnection as Raw;
use rdkv_tests::wait::calls_beside;
use rdkv_tests::{Cluster, Intent, check, client_options, garbage};

const TOKEN: &str = "s3cret";
const TEST_LIMIT: Duration = Duration::from_secs(60);

/// Connects and completes a valid handshake.
async fn handshaken(addr: SocketAddr) -> Result<Raw> {
    Raw::open(addr, "bad-input-test", Some(TOKEN))
        .await?
        .map_err(|refusal| anyhow::anyhow!("a valid hello was refused: {refusal}"))
}

fn hello(token: Option<&str>) -> ClientHello {
    ClientHello::new("bad-input-test", token.map(str::to_owned))
}

/// A frame with any kind byte and payload, valid framing otherwise.
fn raw_frame(kind: u8, request_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_u32_le(9 + payload.len() as u32);
    out.put_u8(kind);
    out.put_u64_le(request_id);
    out.put_slice(payload);
    out
}

/// The error codes of the error responses among `frames`.
fn error_codes(frames: &[Frame]) -> Vec<ErrorCode> {
    frames
        .iter()
        .filter_map(|f| match decode_payload::<Response>(f) {
            Ok(Response::Error(reply)) => Some(reply.code),
            _ => None,
        })
        .collect()
}

/// A normal client (with the token) still writes and reads on the node.
async fn still_serves(cluster: &Cluster, what: &str) -> Result<()> {
    let client = cluster.client_with(Intent::Any, client_options(Some(TOKEN)))?;
    let key = format!("after {what}");
    let version = client
        .put(key.clone(), what.to_owned())
        .await
        .with_context(|| format!("put after {what}"))?;
    let got = client
        .get_with(key, Consistency::Linearizable)
        .await
        .with_context(|| format!("get after {what}"))?;
    ensure!(
        got.as_ref().map(|v| v.version) == Some(version),
        "after {what}: {got:?}"
    );
    Ok(())
}

/// Runs `body` (under [`check`]) against one node started with the token,
/// given the node's client address once a normal client is served there.
async fn against_one_node(
    body: impl AsyncFnOnce(&mut Cluster, SocketAddr) -> Result<()>,
) -> Result<()> {
    let mut cluster = Cluster::start_with(1, &["--token", TOKEN])?;
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        let addr = cluster.node(1)?.client_addr;
        still_serves(cluster, "start").await?;
        body(cluster, addr).await
    })
    .await
}

/// Garbage and oversized frames, before and after the handshake: closed
/// connections (after an error reply when the stream was authenticated), a
/// malformed payload inside a well-framed request gets an error reply and
/// the connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_frames() -> Result<()> {
    against_one_node(async |cluster, addr| {
        // Garbage before any handshake: closed, nothing but perhaps a refusal.
        for (i, bytes) in [
            garbage(4096, 1),
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            vec![0u8; 64],
        ]
        .into_iter()
        .enumerate()
        {
            let mut raw = Raw::connect(addr).await?;
            raw.send(&bytes).await?;
            let frames = raw.until_closed().await?;
            for frame in &frames {
                match decode_payload::<ServerHello>(frame) {
                    Ok(ServerHello::Rejected { .. }) => {}
                    other => bail!("garbage #{i} before the hello got {other:?}"),
                }
            }
            still_serves(cluster, &format!("garbage #{i} before the hello")).await?;
        }

        // An oversized length prefix before the handshake: closed at once,
        // without waiting for (or allocating) 4 GiB.
        let mut raw = Raw::connect(addr).await?;
        raw.send(&[0xFF, 0xFF, 0xFF, 0xFF, 1]).await?;
        ensure!(raw.until_closed().await?.is_empty());
        still_serves(cluster, "an oversized hello").await?;

        // A well-framed hello whose payload is garbage: a Malformed refusal.
        let mut raw = Raw::connect(addr).await?;
        raw.send(&raw_frame(1, 0, &garbage(40, 2))).await?;
        match raw.server_hello().await? {
            ServerHello::Rejected { code, .. } => {
                ensure!(code == ErrorCode::Malformed, "hello of garbage: {code:?}")
            }
            other => bail!("hello of garbage accepted: {other:?}"),
        }
        ensure!(raw.until_closed().await?.is_empty());

        // A request instead of a hello: refused.
        let mut raw = Raw::connect(addr).await?;
        raw.send_request(1, &Request::Ping).await?;
        match raw.server_hello().await? {
            ServerHello::Rejected { code, .. } => ensure!(code == ErrorCode::Malformed),
            other => bail!("a request as hello was accepted: {other:?}"),
        }
        ensure!(raw.until_closed().await?.is_empty());
        still_serves(cluster, "bad hellos").await?;

        // After the handshake: garbage, an oversized length, an unknown kind.
        // Each is answered with an error (request id 0) and the connection closes.
        for (what, bytes) in [
            ("garbage", garbage(4096, 3)),
            ("an oversized length", vec![0xFF, 0xFF, 0xFF, 0xFF, 3, 0, 0]),
            ("an unknown frame kind", raw_frame(0x77, 5, b"hi")),
            ("a length below the minimum", vec![3, 0, 0, 0, 3, 0, 0]),
        ] {
            let mut raw = handshaken(addr).await?;
            raw.send(&bytes).await?;
            let frames = raw.until_closed().await?;
            let codes = error_codes(&frames);
            ensure!(
                frames.len() <= 1 && codes.len() == frames.len(),
                "{what}: unexpected frames {frames:?}"
            );
            ensure!(
                codes
                    .iter()
                    .all(|c| matches!(c, ErrorCode::Malformed | ErrorCode::FrameTooLarge)),
                "{what}: codes {codes:?}"
            );
            still_serves(cluster, what).await?;
        }

        // A request frame with a garbage payload is answered (same request
        // id, Malformed) and the connection goes on.
        let mut raw = handshaken(addr).await?;
        raw.send(&raw_frame(3, 42, &[0xFF; 32])).await?;
        match raw.response().await? {
            (42, Response::Error(reply)) => ensure!(reply.code == ErrorCode::Malformed),
            other => bail!("garbage request got {other:?}"),
        }
        // A payload with trailing bytes after a valid Ping, likewise.
        let ping = encoded_frame(
            FrameKind::Request,
            43,
            &Request::Ping,
            DEFAULT_MAX_FRAME_BYTES,
        )?;
        let mut with_trailer = ping.to_vec();
        with_trailer.extend_from_slice(&[0, 0]);
        let body_len = (with_trailer.len() - 4) as u32;
        with_trailer[..4].copy_from_slice(&body_len.to_le_bytes());
        raw.send(&with_trailer).await?;
        match raw.response().await? {
            (43, Response::Error(reply)) => ensure!(reply.code == ErrorCode::Malformed),
            other => bail!("ping with trailing bytes got {other:?}"),
        }
        raw.send_request(44, &Request::Ping).await?;
        ensure!(raw.response().await? == (44, Response::Pong));
        // An empty batch and a key over the limit get their typed errors.
        raw.send_request(
            45,
            &Request::MGet {
                keys: Vec::new(),
                consistency: Consistency::Linearizable,
            },
        )
        .await?;
        match raw.response().await? {
            (45, Response::Error(reply)) => ensure!(reply.code == ErrorCode::EmptyBatch),
            other => bail!("empty mget got {other:?}"),
        }
        raw.send_request(
            46,
            &Request::Get {
                key: vec![b'k'; 1 << 20].into(),
                consistency: Consistency::Linearizable,
            },
        )
        .await?;
        match raw.response().await? {
            (46, Response::Error(reply)) => ensure!(reply.code == ErrorCode::KeyTooLarge),
            other => bail!("huge key got {other:?}"),
        }
        raw.send_request(47, &Request::Ping).await?;
        ensure!(raw.response().await? == (47, Response::Pong));
        still_serves(cluster, "malformed requests").await
    })
    .await
}

/// Wrong, missing and right tokens; an unsupported protocol version; a
/// hello without the rdkv magic. Through raw frames and through the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_and_version_are_rejected() -> Result<()> {
    against_one_node(async |cluster, addr| {
        let cases: [(&str, ClientHello, ErrorCode); 4] = [
            (
                "a wrong token",
                hello(Some("wrong")),
                ErrorCode::Unauthenticated,
            ),
            ("no token", hello(None), ErrorCode::Unauthenticated),
            (
                "a token differing in length only",
                hello(Some("s3cret!")),
                ErrorCode::Unauthenticated,
            ),
            (
                "protocol version 99",
                ClientHello {
                    min_version: 99,
                    max_version: 99,
                    ..hello(Some(TOKEN))
                },
                ErrorCode::UnsupportedVersion,
            ),
        ];
        for (what, bad_hello, expected) in cases {
            let mut raw = Raw::connect(addr).await?;
            raw.send_hello(&bad_hello).await?;
            match raw.server_hello().await? {
                ServerHello::Rejected { code, message } => {
                    ensure!(code == expected, "{what}: {code:?} ({message})");
                    ensure!(!message.is_empty(), "{what}: no message");
                    ensure!(
                        !message.contains(TOKEN),
                        "{what}: the refusal leaks the token"
                    );
                }
                other => bail!("{what}: accepted {other:?}"),
            }
            // Nothing is served after a refusal: the connection is closed.
            let _ = raw.send_request(1, &Request::Ping).await;
            let frames = raw.until_closed().await?;
            ensure!(
                frames.is_empty(),
                "{what}: answered after refusal: {frames:?}"
            );
            still_serves(cluster, what).await?;
        }

        // Not an rdkv hello (wrong magic): refused too.
        let mut raw = Raw::connect(addr).await?;
        raw.send_hello(&ClientHello {
            magic: *b"HTTP",
            ..hello(Some(TOKEN))
        })
        .await?;
        ensure!(matches!(
            raw.server_hello().await?,
            ServerHello::Rejected { .. }
        ));
        ensure!(raw.until_closed().await?.is_empty());

        // The library reports the refusal as a typed handshake error.
        let wrong =
            rdkv_client::Client::connect_with(&[addr.to_string()], client_options(Some("wrong")))
                .await;
        match wrong {
            Err(e) if e.is_handshake_refusal() => {
                ensure!(e.code() == Some(ErrorCode::Unauthenticated), "{e}")
            }
            other => bail!("connect with a wrong token: {other:?}"),
        }
        let anonymous = cluster.client(Intent::Any)?;
        match anonymous.put("k", "v").await {
            Err(e) if e.code() == Some(ErrorCode::Unauthenticated) => {}
            other => bail!("put without a token: {other:?}"),
        }
        still_serves(cluster, "token and version refusals").await
    })
    .await
}

// ---- the peer port ---------------------------------------------------------

/// postcard's unsigned varint.
fn varint(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn postcard_str(s: &str, out: &mut Vec<u8>) {
    varint(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

/// The server's `PeerHello { magic: b"RDKP", version: 1, token, from_id,
/// from_client_addr }` in a ClientHello-kind frame, encoded by hand (the
/// peer types live in the server crate).
fn peer_hello(token: Option<&str>, from_id: u64) -> Vec<u8> {
    let mut payload = b"RDKP".to_vec();
    varint(1, &mut payload);
    match token {
        Some(t) => {
            payload.push(1);
            postcard_str(t, &mut payload);
        }
        None => payload.push(0),
    }
    varint(from_id, &mut payload);
    postcard_str("127.0.0.99:1", &mut payload);
    raw_frame(FrameKind::ClientHello.as_u8(), 0, &payload)
}

/// Reads a `PeerHelloReply`: `Ok(message)` for `Rejected { message }`.
fn peer_rejection(frame: &Frame) -> Result<String> {
    let mut payload = frame.payload.clone();
    ensure!(payload.has_remaining(), "empty peer hello reply");
    match payload.get_u8() {
        1 => {
            let len = payload.first().copied().unwrap_or(0) as usize;
            let text = payload.get(1..1 + len).unwrap_or_default();
            Ok(String::from_utf8_lossy(text).into_owned())
        }
        0 => bail!("the peer port accepted the connection"),
        other => bail!("unknown peer hello reply variant {other}"),
    }
}

/// The peer (Raft) port refuses a wrong or missing token and a non-member
/// presenting the right one, closes on garbage and oversized frames, and
/// none of this disturbs clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_refuses_strangers() -> Result<()> {
    against_one_node(async |cluster, _| {
        let addr = cluster.node(1)?.peer_addr;
        for (what, bytes, reason) in [
            ("a wrong token", peer_hello(Some("wrong"), 1), "token"),
            ("no token", peer_hello(None, 1), "token"),
            ("a non-member", peer_hello(Some(TOKEN), 99), "member"),
        ] {
            let mut raw = Raw::connect(addr).await?;
            raw.send(&bytes).await?;
            let frames = raw.until_closed().await?;
            let frame = frames
                .first()
                .with_context(|| format!("{what}: closed without a refusal"))?;
            let message = peer_rejection(frame).with_context(|| what.to_owned())?;
            ensure!(message.contains(reason), "{what}: refused with {message:?}");
            ensure!(frames.len() == 1, "{what}: more frames {frames:?}");
            still_serves(cluster, &format!("{what} on the peer port")).await?;
        }
        for (what, bytes) in [
            ("garbage", garbage(4096, 4)),
            ("an oversized length", vec![0xFF, 0xFF, 0xFF, 0xFF, 1]),
        ] {
            let mut raw = Raw::connect(addr).await?;
            raw.send(&bytes).await?;
            let frames = raw.until_closed().await?;
            ensure!(frames.is_empty(), "{what}: answered {frames:?}");
            still_serves(cluster, &format!("{what} on the peer port")).await?;
        }
        Ok(())
    })
    .await
}

/// Slow clients that dribble a hello one byte per 100 ms (and one that stops
/// half-way) do not hold up other clients; the slow ones are served once
/// their hello is complete, the stalled one is cut off by the handshake
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_does_not_block_other_clients() -> Result<()> {
    against_one_node(async |cluster, addr| {
        let hello_bytes = encoded_frame(
            FrameKind::ClientHello,
            0,
            &ClientHello::new("slow", Some(TOKEN.to_owned())),
            DEFAULT_MAX_FRAME_BYTES,
        )?
        .to_vec();
        println!("a hello is {} bytes", hello_bytes.len());

        let mut slow = Vec::new();
        for _ in 0..16 {
            let bytes = hello_bytes.clone();
            slow.push(tokio::spawn(async move {
                let mut raw = Raw::connect(addr).await?;
                for b in bytes {
                    raw.send(&[b]).await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                match raw.server_hello().await? {
                    ServerHello::Accepted(_) => {}
                    other => bail!("slow hello refused: {other:?}"),
                }
                raw.send_request(1, &Request::Ping).await?;
                ensure!(raw.response().await? == (1, Response::Pong));
                Ok(())
            }));
        }
        let stalled = {
            let bytes = hello_bytes[..6].to_vec();
            tokio::spawn(async move {
                let mut raw = Raw::connect(addr).await?;
                for b in bytes {
                    raw.send(&[b]).await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let started = std::time::Instant::now();
                let frames = raw.until_closed().await?;
                Ok::<_, anyhow::Error>((frames, started.elapsed()))
            })
        };

        // Meanwhile, a normal client gets its work done: its calls complete
        // while the slow clients are still dribbling their hellos (a server
        // that handled hellos one at a time would hold it up until every
        // slow hello was complete).
        let client = cluster.client_with(Intent::Any, client_options(Some(TOKEN)))?;
        let done = calls_beside(
            |i| i < 20,
            || slow.iter().any(|task| !task.is_finished()),
            async |i| {
                let key = format!("during-slowloris-{i}");
                client
                    .put(key.clone(), "v")
                    .await
                    .with_context(|| format!("call {i} beside the slow clients"))?;
                let got = client.get_with(key, Consistency::Linearizable).await?;
                ensure!(got.is_some_and(|v| v.value == "v"), "call {i}: wrong value");
                Ok(())
            },
        )
        .await?;
        ensure!(
            done.while_busy > 0,
            "no call completed before every slow hello was complete"
        );
        for task in slow {
            task.await??;
        }
        let (frames, waited) = stalled.await??;
        println!("the stalled hello was dropped after {waited:?}");
        for frame in &frames {
            ensure!(
                !matches!(
                    decode_payload::<ServerHello>(frame),
                    Ok(ServerHello::Accepted(_))
                ),
                "a half hello was accepted"
            );
        }
        still_serves(cluster, "slowloris").await
    })
    .await
}
