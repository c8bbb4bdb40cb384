//! The client against fake in-process servers that speak the real wire frames.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{
    Client, ClientOptions, ConnectError, Consistency, Error, ErrorCode, ErrorReply, LeaderHint,
};
use rdkv_proto::wire::{Request, Response, SnapshotChunk, Versioned};
use rdkv_tests::fake_server::{Fake, FakeConn, Kv, accepted, serve};
use tokio::sync::mpsc;

/// These tests pin the RPC path's behaviour request by request, so GETs must
/// not try the one-sided path (whose topology refresh adds Status requests).
fn options(timeout_ms: u64) -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(timeout_ms),
        transport: rdkv_client::Transport::Tcp,
        ..ClientOptions::default()
    }
}

fn value(bytes: &str, version: u64) -> Option<Versioned> {
    Some(Versioned {
        value: Bytes::copy_from_slice(bytes.as_bytes()),
        version,
    })
}

/// Answers every request with `response`, one at a time.
async fn answer_all(mut conn: FakeConn, response: Response, seen: Arc<AtomicUsize>) {
    while let Some((id, _)) = conn.request().await {
        seen.fetch_add(1, Ordering::SeqCst);
        conn.respond(id, &response).await;
    }
}

#[tokio::test]
async fn pipelined_gets_complete_out_of_order_on_one_connection() {
    const N: usize = 32;
    let fake = serve(accepted(64), None, |mut conn: FakeConn| async move {
        loop {
            // Collect a full batch, then answer it backwards.
            let mut batch = Vec::new();
            while batch.len() < N {
                let Some((id, request)) = conn.request().await else {
                    return;
                };
                let Request::Get { key, .. } = request else {
                    panic!("expected Get, got {request:?}");
                };
                batch.push((id, key));
            }
            for (id, key) in batch.into_iter().rev() {
                let response = Response::Value(Some(Versioned {
                    value: key,
                    version: id,
                }));
                conn.respond(id, &response).await;
            }
        }
    })
    .await;

    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let client = client.clone();
        tasks.spawn(async move {
            let key = format!("key-{i}");
            let got = client.get(key.clone()).await.unwrap().unwrap();
            assert_eq!(got.value, Bytes::from(key));
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(fake.connections(), 1, "all gets share one connection");
}

#[tokio::test]
async fn not_leader_with_hint_redirects_and_remembers_the_leader() {
    let leader_seen = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&leader_seen);
    let leader = serve(accepted(8), None, move |conn| {
        answer_all(conn, Response::Written { version: 7 }, Arc::clone(&seen))
    })
    .await;
    let hint = LeaderHint {
        node_id: 2,
        client_addr: leader.endpoint(),
    };
    let follower_seen = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&follower_seen);
    let follower = serve(accepted(8), None, move |conn| {
        let reply = Response::Error(ErrorReply::not_leader(Some(hint.clone())));
        answer_all(conn, reply, Arc::clone(&seen))
    })
    .await;

    let client = Client::connect_with(&[follower.endpoint()], options(5_000))
        .await
        .unwrap();
    assert_eq!(client.put("k", "v").await.unwrap(), 7);
    assert_eq!(client.leader(), Some(leader.endpoint()));
    assert!(client.endpoints().contains(&leader.endpoint()));
    // The next write goes straight to the leader.
    assert_eq!(client.put("k", "v2").await.unwrap(), 7);
    assert_eq!(follower_seen.load(Ordering::SeqCst), 1);
    assert_eq!(leader_seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn not_leader_without_hint_backs_off_and_tries_other_endpoints() {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&seen);
    let electing = serve(accepted(8), None, move |conn| {
        answer_all(
            conn,
            Response::Error(ErrorReply::not_leader(None)),
            Arc::clone(&s),
        )
    })
    .await;
    let s = Arc::clone(&seen);
    let leader = serve(accepted(8), None, move |conn| {
        answer_all(conn, Response::Written { version: 3 }, Arc::clone(&s))
    })
    .await;

    let client = Client::connect_with(&[electing.endpoint(), leader.endpoint()], options(5_000))
        .await
        .unwrap();
    let start = std::time::Instant::now();
    assert_eq!(client.put("k", "v").await.unwrap(), 3);
    assert!(start.elapsed() >= Duration::from_millis(40), "backed off");
    assert_eq!(client.leader(), Some(leader.endpoint()));

    // With only the electing node, the budget runs out as NoLeader.
    let client = Client::connect_with(&[electing.endpoint()], options(400))
        .await
        .unwrap();
    let err = client.put("k", "v").await.unwrap_err();
    assert!(matches!(err, Error::NoLeader), "{err:?}");
}

#[tokio::test]
async fn stale_follower_read_is_retried_on_another_replica() {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&seen);
    let stale = serve(accepted(8), None, move |conn| {
        let reply = Response::Error(ErrorReply::new(ErrorCode::StaleFollower, "behind"));
        answer_all(conn, reply, Arc::clone(&s))
    })
    .await;
    let s = Arc::clone(&seen);
    let fresh = serve(accepted(8), None, move |conn| {
        answer_all(conn, Response::Value(value("v", 9)), Arc::clone(&s))
    })
    .await;
    let client = Client::new(&[stale.endpoint(), fresh.endpoint()], options(2000)).unwrap();
    let follower = Consistency::Follower { max_lag_entries: 5 };
    for _ in 0..3 {
        let got = client.get_with("k", follower).await.unwrap();
        assert_eq!(got, value("v", 9));
    }
}

#[tokio::test]
async fn handshake_rejection_is_a_typed_error() {
    let fake = serve(accepted(8), Some("secret"), |conn| async move {
        drop(conn);
    })
    .await;

    let err = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Connect(ConnectError::Handshake {
                code: ErrorCode::Unauthenticated,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(ErrorCode::Unauthenticated));

    let wrong = ClientOptions {
        token: Some("guess".into()),
        ..ClientOptions::default()
    };
    let err = Client::connect_with(&[fake.endpoint()], wrong)
        .await
        .unwrap_err();
    assert!(err.is_handshake_refusal(), "{err:?}");

    let right = ClientOptions {
        token: Some("secret".into()),
        ..ClientOptions::default()
    };
    Client::connect_with(&[fake.endpoint()], right)
        .await
        .unwrap();
}

#[tokio::test]
async fn unreachable_endpoint_is_a_connect_error() {
    // Bind then drop to get a port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = Client::connect_with(&[format!("127.0.0.1:{port}")], options(500))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(matches!(
        Client::new(&[" "], ClientOptions::default()),
        Err(Error::NoEndpoints)
    ));
}

#[tokio::test]
async fn silent_server_times_out_reads_and_makes_writes_unknown() {
    let fake = serve(accepted(8), None, |mut conn: FakeConn| async move {
        // Read everything, answer nothing.
        while conn.request().await.is_some() {}
    })
    .await;
    let client = Client::connect_with(&[fake.endpoint()], options(300))
        .await
        .unwrap();

    let start = std::time::Instant::now();
    let err = client.get("k").await.unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    assert!(start.elapsed() >= Duration::from_millis(290));
    assert!(start.elapsed() < Duration::from_secs(3));

    let err = client.put("k", "v").await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn server_timeout_reply_on_a_write_is_outcome_unknown() {
    let seen = Arc::new(AtomicUsize::new(0));
    let fake = serve(accepted(8), None, move |conn| {
        let reply = Response::Error(ErrorReply::new(ErrorCode::Timeout, "commit timed out"));
        answer_all(conn, reply, Arc::clone(&seen))
    })
    .await;
    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    let err = client.delete("k").await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
}

#[tokio::test]
async fn broken_connection_retries_reads_but_not_writes() {
    // Every connection dies on its first request; later requests on a fresh
    // connection are answered only if `healthy` is set.
    let healthy = Arc::new(AtomicBool::new(false));
    let h = Arc::clone(&healthy);
    let fake = serve(accepted(8), None, move |mut conn: FakeConn| {
        let healthy = Arc::clone(&h);
        async move {
            while let Some((id, request)) = conn.request().await {
                if !healthy.swap(true, Ordering::SeqCst) {
                    return; // drop the connection with the request unanswered
                }
                let response = match request {
                    Request::Get { .. } => Response::Value(value("v", 1)),
                    _ => Response::Written { version: 2 },
                };
                conn.respond(id, &response).await;
            }
        }
    })
    .await;
    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    assert_eq!(client.get("k").await.unwrap(), value("v", 1));

    healthy.store(false, Ordering::SeqCst);
    let err = client.put("k", "v").await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
    // The client reconnects lazily afterwards.
    assert_eq!(client.put("k", "v").await.unwrap(), 2);
}

#[tokio::test]
async fn credits_bound_outstanding_requests() {
    let outstanding = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let (o, m) = (Arc::clone(&outstanding), Arc::clone(&max_seen));
    let fake = serve(accepted(2), None, move |conn: FakeConn| {
        let (outstanding, max_seen) = (Arc::clone(&o), Arc::clone(&m));
        async move {
            let FakeConn {
                mut reader,
                mut writer,
                ..
            } = conn;
            let (tx, mut rx) = mpsc::unbounded_channel::<u64>();
            let out = Arc::clone(&outstanding);
            let responder = tokio::spawn(async move {
                while let Some(id) = rx.recv().await {
                    out.fetch_sub(1, Ordering::SeqCst);
                    writer.respond(id, &Response::Written { version: id }).await;
                }
            });
            while let Some((id, _)) = reader.request().await {
                let now = outstanding.fetch_add(1, Ordering::SeqCst) + 1;
                max_seen.fetch_max(now, Ordering::SeqCst);
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let _ = tx.send(id);
                });
            }
            drop(tx);
            let _ = responder.await;
        }
    })
    .await;

    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let client = client.clone();
        tasks.spawn(async move { client.put(format!("k{i}"), "v").await });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let max = max_seen.load(Ordering::SeqCst);
    assert!(max <= 2, "server saw {max} outstanding requests");
    assert_eq!(max, 2, "requests were pipelined up to the limit");
}

#[tokio::test]
async fn key_value_calls_map_onto_the_protocol() {
    let kv = Arc::new(Mutex::new(Kv::default()));
    let fake = serve(accepted(16), None, move |mut conn: FakeConn| {
        let kv = Arc::clone(&kv);
        async move {
            while let Some((id, request)) = conn.request().await {
                let response = kv.lock().unwrap().apply(request);
                conn.respond(id, &response).await;
            }
        }
    })
    .await;
    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();

    client.ping().await.unwrap();
    let v1 = client.put("a", "1").await.unwrap();
    assert_eq!(client.get("a").await.unwrap(), value("1", v1));
    assert_eq!(client.get(Bytes::from_static(b"zz")).await.unwrap(), None);

    let lost = client
        .cas("a", Some(v1 + 100), Some("x".into()))
        .await
        .unwrap();
    assert!(!lost.succeeded);
    assert_eq!(lost.current, value("1", v1));
    let won = client.cas("a", Some(v1), Some("2".into())).await.unwrap();
    assert!(won.succeeded);
    let created = client.cas("b", None, Some("new".into())).await.unwrap();
    assert!(created.succeeded);

    let vm = client.mput([("c", "3"), ("d", "4")]).await.unwrap();
    let got = client.mget(["a", "b", "c", "d", "e"]).await.unwrap();
    assert_eq!(
        got,
        vec![
            value("2", won.version),
            value("new", created.version),
            value("3", vm),
            value("4", vm),
            None
        ]
    );

    let del = client.delete("a").await.unwrap();
    assert!(del.existed);
    assert!(!client.delete("a").await.unwrap().existed);

    // A non-retryable server error comes back as is.
    let err = client.members().await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidRequest));
}

/// Serves `versions` in turn: the first `SnapshotRead` at offset > 0 after a
/// switch sees the next snapshot, as if the node had rebuilt it.
async fn snapshot_fake(versions: Vec<(u64, Vec<u8>)>, switch_after_first: bool) -> Fake {
    let current = Arc::new(AtomicU64::new(0));
    let versions = Arc::new(versions);
    serve(accepted(4), None, move |mut conn: FakeConn| {
        let (current, versions) = (Arc::clone(&current), Arc::clone(&versions));
        async move {
            while let Some((id, request)) = conn.request().await {
                let Request::SnapshotRead { offset, max_bytes } = request else {
                    panic!("unexpected {request:?}");
                };
                let mut which = current.load(Ordering::SeqCst) as usize;
                if switch_after_first && offset > 0 && which + 1 < versions.len() {
                    which = current.fetch_add(1, Ordering::SeqCst) as usize + 1;
                }
                let (index, data) = &versions[which];
                let start = offset as usize;
                let end = (start + (max_bytes as usize).min(3)).min(data.len());
                let chunk = SnapshotChunk {
                    last_log_index: *index,
                    total_bytes: data.len() as u64,
                    offset,
                    data: Bytes::copy_from_slice(&data[start..end]),
                };
                conn.respond(id, &Response::Snapshot(chunk)).await;
            }
        }
    })
    .await
}

#[tokio::test]
async fn snapshot_streams_all_chunks() {
    let data = b"0123456789".to_vec();
    let fake = snapshot_fake(vec![(12, data.clone())], false).await;
    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    let mut out = Vec::new();
    let info = client.snapshot_to(&mut out).await.unwrap();
    assert_eq!(info.last_log_index, 12);
    assert_eq!(info.total_bytes, 10);
    assert_eq!(out, data);
}

#[tokio::test]
async fn snapshot_to_file_restarts_when_the_snapshot_changes() {
    let old = b"old-snapshot".to_vec();
    let new = b"the newer snapshot".to_vec();
    let fake = snapshot_fake(vec![(5, old), (9, new.clone())], true).await;
    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();

    let dir = std::env::temp_dir().join(format!("rdkv-client-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("snap.db");
    let info = client.snapshot_to_file(&path).await.unwrap();
    assert_eq!(info.last_log_index, 9);
    assert_eq!(std::fs::read(&path).unwrap(), new);
    assert!(!dir.join("snap.db.part").exists());
    std::fs::remove_dir_all(&dir).unwrap();

    // A plain writer cannot be rewound: the change is reported.
    let fake = snapshot_fake(vec![(5, b"aaaaaa".to_vec()), (6, b"bbbbbb".to_vec())], true).await;
    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    let err = client.snapshot_to(&mut Vec::new()).await.unwrap_err();
    assert!(
        matches!(err, Error::SnapshotChanged { from: 5, to: 6 }),
        "{err:?}"
    );
}

#[test]
fn client_is_send_sync_and_options_redact_the_token() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Client>();
    let options = ClientOptions {
        token: Some("hunter2".into()),
        ..ClientOptions::default()
    };
    let shown = format!("{options:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test]
async fn unanswered_requests_keep_their_credits_until_the_connection_is_replaced() {
    // The first connection never answers; later ones answer at once.
    let first = Arc::new(AtomicBool::new(true));
    let fake = serve(accepted(1), None, move |mut conn: FakeConn| {
        let silent = first.swap(false, Ordering::SeqCst);
        async move {
            while let Some((id, _)) = conn.request().await {
                if !silent {
                    conn.respond(id, &Response::Value(value("v", 1))).await;
                }
            }
        }
    })
    .await;
    let client = Client::connect_with(&[fake.endpoint()], options(200))
        .await
        .unwrap();
    // Times out; its credit (the only one) stays taken: the server may still answer.
    assert!(matches!(client.get("k").await, Err(Error::Timeout(_))));
    // No credit frees up in time, so the wedged connection is closed ...
    assert!(matches!(client.get("k").await, Err(Error::Timeout(_))));
    // ... and the next call reconnects.
    assert_eq!(client.get("k").await.unwrap(), value("v", 1));
    assert_eq!(fake.connections(), 2);
}
