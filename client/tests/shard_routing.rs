//! The client against fake nodes that answer `WrongShard` (docs/sharding.md,
//! section 5): it refreshes its shard map, once for every call that waits
//! on it, keeps the newest, and sends the request again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Error};
use rdkv_proto::shard::{NodeInfo, ShardId, ShardMap, key_slot};
use rdkv_proto::wire::{Request, Response, WrongShard};
use rdkv_tests::fake_server::{FakeConn, Kv, accepted, serve};

fn options(timeout_ms: u64) -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(timeout_ms),
        transport: rdkv_client::Transport::Tcp,
        ..ClientOptions::default()
    }
}

/// A one-node map at `version` (only the version matters to these tests).
fn map_at(version: u64) -> ShardMap {
    let one = ShardMap::single_group(
        vec![NodeInfo {
            id: 1,
            client_addr: Some("fake".into()),
            resp_addr: None,
        }],
        Some(1),
    )
    .unwrap();
    ShardMap::new(
        version,
        one.nodes().to_vec(),
        one.shards().to_vec(),
        one.ranges().to_vec(),
    )
    .unwrap()
}

fn wrong_shard(map_version: u64, key: &[u8]) -> Response {
    Response::WrongShard(WrongShard {
        map_version,
        slot: key_slot(key),
        shard: ShardId(0),
    })
}

/// What a fake saw, in order: the request's kind and, for a Put, its key.
type Seen = Arc<Mutex<Vec<String>>>;

fn record(seen: &Seen, request: &Request) {
    let entry = match request {
        Request::Put { key, .. } => format!("Put {}", String::from_utf8_lossy(key)),
        Request::ShardMap => "ShardMap".to_owned(),
        other => format!("{other:?}"),
    };
    seen.lock().unwrap().push(entry);
}

#[tokio::test]
async fn a_write_answered_wrong_shard_is_sent_again_under_the_new_map() {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let fake = serve(accepted(64), None, move |mut conn: FakeConn| {
        let log = Arc::clone(&log);
        async move {
            let mut kv = Kv::default();
            let mut refused = false;
            while let Some((id, request)) = conn.request().await {
                record(&log, &request);
                let response = match request {
                    Request::ShardMap => Response::ShardMap(Box::new(map_at(2))),
                    Request::Put { ref key, .. } if !refused => {
                        refused = true;
                        wrong_shard(2, key)
                    }
                    other => kv.apply(other),
                };
                conn.respond(id, &response).await;
            }
        }
    })
    .await;

    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    assert!(client.shard_map().is_none(), "no map before a WrongShard");
    client.put("k", "v").await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ["Put k", "ShardMap", "Put k"],
        "the write went again after the map"
    );
    assert_eq!(client.shard_map().map(|m| m.version()), Some(2));
    assert_eq!(
        client.get("k").await.unwrap().map(|v| v.value),
        Some(Bytes::from("v"))
    );
}

#[tokio::test]
async fn calls_refused_together_share_one_map_refresh() {
    const CALLS: usize = 8;
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let fake = serve(accepted(64), None, move |mut conn: FakeConn| {
        let log = Arc::clone(&log);
        async move {
            // Every call is in flight before any is refused, so all of them
            // want a refresh at the same time.
            let mut first = Vec::new();
            while first.len() < CALLS {
                let Some((id, request)) = conn.request().await else {
                    return;
                };
                record(&log, &request);
                let Request::Put { key, .. } = request else {
                    panic!("expected Put, got {request:?}");
                };
                first.push((id, key));
            }
            for (id, key) in first {
                conn.respond(id, &wrong_shard(3, &key)).await;
            }
            let mut kv = Kv::default();
            while let Some((id, request)) = conn.request().await {
                record(&log, &request);
                let response = match request {
                    Request::ShardMap => Response::ShardMap(Box::new(map_at(3))),
                    other => kv.apply(other),
                };
                conn.respond(id, &response).await;
            }
        }
    })
    .await;

    let client = Client::connect_with(&[fake.endpoint()], options(5_000))
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CALLS {
        let client = client.clone();
        tasks.spawn(async move { client.put(format!("k{i}"), "v").await });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let seen = seen.lock().unwrap();
    let refreshes = seen.iter().filter(|s| *s == "ShardMap").count();
    assert_eq!(refreshes, 1, "{seen:?}");
    assert_eq!(seen.len(), 2 * CALLS + 1, "every write twice: {seen:?}");
    assert_eq!(client.shard_map().map(|m| m.version()), Some(3));
}

#[tokio::test]
async fn a_node_newer_than_any_map_it_serves_fails_the_call_in_its_budget() {
    // The node says version 5 exists but only ever serves version 2: the
    // client must neither spin nor hang, and must keep the newest it got.
    let fake = serve(accepted(64), None, |mut conn: FakeConn| async move {
        while let Some((id, request)) = conn.request().await {
            let response = match request {
                Request::ShardMap => Response::ShardMap(Box::new(map_at(2))),
                Request::Put { ref key, .. } => wrong_shard(5, key),
                other => panic!("unexpected {other:?}"),
            };
            conn.respond(id, &response).await;
        }
    })
    .await;

    let client = Client::connect_with(&[fake.endpoint()], options(500))
        .await
        .unwrap();
    let err = client.put("k", "v").await.unwrap_err();
    assert!(
        matches!(err, Error::StaleShardMap { needed: 5, held: 2 }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(client.shard_map().map(|m| m.version()), Some(2));
}
