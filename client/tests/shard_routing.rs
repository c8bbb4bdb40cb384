//! The client against fake nodes that answer `WrongShard` (docs/sharding.md,
//! section 5): it refreshes its shard map, once for every call that waits
//! on it, keeps the newest, and sends the request again.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Error};
use rdkv_proto::shard::{
    NodeInfo, SLOT_COUNT, ShardId, ShardInfo, ShardMap, Slot, SlotRange, key_slot,
};
use rdkv_proto::wire::{ErrorCode, ErrorReply, KeyUse, Request, Response, WrongShard};
use rdkv_tests::fake_server::{FakeConn, Kv, accepted, accepted_sharded, serve};

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

    // Not `connect`: it would fetch the map first (shown below).
    let client = Client::new(&[fake.endpoint()], options(5_000)).unwrap();
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

    let client = Client::new(&[fake.endpoint()], options(5_000)).unwrap();
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

    let client = Client::new(&[fake.endpoint()], options(500)).unwrap();
    let err = client.put("k", "v").await.unwrap_err();
    assert!(
        matches!(err, Error::StaleShardMap { needed: 5, held: 2 }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(client.shard_map().map(|m| m.version()), Some(2));
}

/// A map of two shards at version 2: shard 0 (slots 0-8191) on node 1 at
/// `first`, shard 1 on node 2 at `second`, each its own leader.
fn two_nodes_two_shards(first: &str, second: &str) -> ShardMap {
    let node = |id, addr: &str| NodeInfo {
        id,
        client_addr: Some(addr.to_owned()),
        resp_addr: None,
    };
    let shard = |id, member| ShardInfo {
        id: ShardId(id),
        members: vec![member],
        leader: Some(member),
    };
    let range = |first, last, shard| SlotRange {
        first: Slot::new(first).unwrap(),
        last: Slot::new(last).unwrap(),
        shard: ShardId(shard),
    };
    ShardMap::new(
        2,
        vec![node(1, first), node(2, second)],
        vec![shard(0, 1), shard(1, 2)],
        vec![range(0, 8191, 0), range(8192, SLOT_COUNT - 1, 1)],
    )
    .unwrap()
}

/// A fake node serving shard `mine` of the map set in `map` once both
/// fakes listen: keys of the other shard are answered `WrongShard`, as is
/// a multi-key request with any of them; an `MPut` holding `refuse_mput`
/// is refused. Records what it was asked in `seen`.
async fn shard_node(
    mine: ShardId,
    map: Arc<OnceLock<ShardMap>>,
    seen: Seen,
    refuse_mput: Option<&'static [u8]>,
) -> rdkv_tests::fake_server::Fake {
    let kv: Arc<Mutex<Kv>> = Arc::default();
    // Its hello announces the map (version 2), as a sharded node's does.
    serve(accepted_sharded(64, 2), None, move |mut conn: FakeConn| {
        let (map, seen, kv) = (Arc::clone(&map), Arc::clone(&seen), Arc::clone(&kv));
        async move {
            while let Some((id, request)) = conn.request().await {
                seen.lock().unwrap().push(describe(&request));
                let map = map.get().expect("the map is set before any call");
                let foreign = keys_of(&request)
                    .find(|k| map.shard_of_key(k) != mine)
                    .map(key_slot);
                let response = match (request, foreign) {
                    (Request::ShardMap, _) => Response::ShardMap(Box::new(map.clone())),
                    (Request::Sharded { shard, .. }, _) if shard != mine => {
                        Response::WrongShard(WrongShard {
                            map_version: map.version(),
                            slot: Slot::new(0).unwrap(),
                            shard: mine,
                        })
                    }
                    (Request::Sharded { request, .. }, _) => {
                        kv.lock().unwrap().apply(request.to_request().unwrap())
                    }
                    (_, Some(slot)) => Response::WrongShard(WrongShard {
                        map_version: map.version(),
                        slot,
                        shard: mine,
                    }),
                    (request, None) if refused(&request, refuse_mput) => {
                        Response::Error(ErrorReply::new(ErrorCode::NoSpace, "full"))
                    }
                    (request, None) => kv.lock().unwrap().apply(request),
                };
                conn.respond(id, &response).await;
            }
        }
    })
    .await
}

fn refused(request: &Request, key: Option<&[u8]>) -> bool {
    matches!((request, key), (Request::MPut { pairs }, Some(key)) if pairs.iter().any(|(k, _)| k == key))
}

fn keys_of(request: &Request) -> impl Iterator<Item = &[u8]> {
    let keys: Vec<&[u8]> = match request.key_use() {
        KeyUse::Reads(keys) | KeyUse::Writes(keys) => keys.into_iter().map(|k| &k[..]).collect(),
        KeyUse::Nothing | KeyUse::Everything => Vec::new(),
    };
    keys.into_iter()
}

/// A request's kind and keys, e.g. `MGet foo,bar`.
fn describe(request: &Request) -> String {
    let kind = format!("{:?}", request.op());
    let keys: Vec<String> = keys_of(request)
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    if keys.is_empty() {
        kind
    } else {
        format!("{kind} {}", keys.join(","))
    }
}

/// Two fake nodes, one shard each (`two_nodes_two_shards`), recording into
/// `seen` (one list per node); node 1 refuses an `MPut` holding
/// `refuse_mput`. The client is given only node 0. The nodes stop when
/// dropped.
async fn two_shard_nodes(
    seen: [Seen; 2],
    refuse_mput: Option<&'static [u8]>,
) -> (Client, [rdkv_tests::fake_server::Fake; 2]) {
    let map: Arc<OnceLock<ShardMap>> = Arc::default();
    let [seen0, seen1] = seen;
    let node0 = shard_node(ShardId(0), Arc::clone(&map), seen0, None).await;
    let node1 = shard_node(ShardId(1), Arc::clone(&map), seen1, refuse_mput).await;
    map.set(two_nodes_two_shards(&node0.endpoint(), &node1.endpoint()))
        .unwrap();
    let client = Client::connect_with(&[node0.endpoint()], options(5_000))
        .await
        .unwrap();
    (client, [node0, node1])
}

#[tokio::test]
async fn the_map_is_fetched_at_connect_and_keys_go_straight_to_their_shards() {
    // foo is slot 12182 (shard 1), bar 5061 and {bar}x 5061 (shard 0).
    assert_eq!(key_slot(b"foo").get(), 12182);
    let (seen0, seen1): (Seen, Seen) = (Arc::default(), Arc::default());
    // The client knows only the first node.
    let (client, nodes) = two_shard_nodes([Arc::clone(&seen0), Arc::clone(&seen1)], None).await;
    // The hello announced the map: it was fetched before any request.
    assert_eq!(client.shard_map().map(|m| m.version()), Some(2));

    client.put("foo", "1").await.unwrap();
    client.put("bar", "2").await.unwrap();
    client.mput([("{bar}x", "3"), ("foo", "4")]).await.unwrap();
    let got = client.mget(["foo", "nope", "bar", "{bar}x"]).await.unwrap();
    let values: Vec<Option<Bytes>> = got.into_iter().map(|v| v.map(|v| v.value)).collect();
    assert_eq!(
        values,
        [Some("4".into()), None, Some("2".into()), Some("3".into())]
    );
    assert_eq!(
        *seen0.lock().unwrap(),
        ["ShardMap", "Put bar", "MPut {bar}x", "MGet bar,{bar}x"],
        "shard 0's node: the map at connect, then only its own keys"
    );
    // "nope" is slot 3616... whichever shard holds it, asked there once.
    let nope_in_1 = client.shard_map().unwrap().shard_of_key(b"nope") == ShardId(1);
    let mget1 = if nope_in_1 {
        "MGet foo,nope"
    } else {
        "MGet foo"
    };
    assert_eq!(*seen1.lock().unwrap(), ["Put foo", "MPut foo", mget1]);

    // A client made without connecting learns the map from the hello of
    // its first connection, before its first request is sent.
    let lazy = Client::new(&[nodes[0].endpoint()], options(5_000)).unwrap();
    seen0.lock().unwrap().clear();
    seen1.lock().unwrap().clear();
    lazy.put("foo", "5").await.unwrap();
    assert_eq!(*seen0.lock().unwrap(), ["ShardMap"]);
    assert_eq!(*seen1.lock().unwrap(), ["Put foo"]);
}

#[tokio::test]
async fn an_mput_written_in_one_shard_and_refused_in_another_says_which_keys() {
    let seen: Seen = Arc::default();
    let (client, _nodes) =
        two_shard_nodes([Arc::clone(&seen), Arc::clone(&seen)], Some(b"foo")).await;
    client.put("foo", "learn the map").await.unwrap();

    let err = client
        .mput([("bar", "1"), ("foo", "2"), ("{foo}y", "3")])
        .await
        .unwrap_err();
    let Error::PartialMPut(partial) = err else {
        panic!("{err:?}");
    };
    let keys = |part: &[Bytes]| {
        part.iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(partial.written.len(), 1);
    assert_eq!(keys(&partial.written[0].0), ["bar"]);
    assert_eq!(partial.failed.len(), 1);
    assert_eq!(keys(&partial.failed[0].0), ["foo", "{foo}y"]);
    assert_eq!(partial.failed[0].1.code(), Some(ErrorCode::NoSpace));
    assert_eq!(
        client.get("bar").await.unwrap().map(|v| v.value),
        Some(Bytes::from("1"))
    );
    assert_eq!(
        client.get("foo").await.unwrap().map(|v| v.value),
        Some(Bytes::from("learn the map"))
    );
}

#[tokio::test]
async fn a_scan_merges_every_shard_and_a_clear_empties_every_shard() {
    let (seen0, seen1): (Seen, Seen) = (Arc::default(), Arc::default());
    let (client, _nodes) = two_shard_nodes([Arc::clone(&seen0), Arc::clone(&seen1)], None).await;
    let map = client.shard_map().unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("key{i:02}")).collect();
    for key in &keys {
        client.put(key.clone(), "v").await.unwrap();
    }
    let in_shard1 = keys
        .iter()
        .filter(|k| map.shard_of_key(k.as_bytes()) == ShardId(1))
        .count();
    assert!(
        in_shard1 > 0 && in_shard1 < keys.len(),
        "both shards hold keys"
    );
    let scanned = |pairs: Vec<(Bytes, rdkv_proto::wire::Versioned)>| {
        pairs
            .into_iter()
            .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(scanned(client.scan("", 100).await.unwrap()), keys);
    assert_eq!(scanned(client.scan("key1", 5).await.unwrap()), keys[10..15]);
    let range = client
        .scan_range("key05", Some(Bytes::from("key25")), 100, Default::default())
        .await
        .unwrap();
    assert_eq!(scanned(range), keys[5..25]);
    let scans = |seen: &Seen| seen.lock().unwrap().iter().filter(|s| *s == "Scan").count();
    assert_eq!(
        (scans(&seen0), scans(&seen1)),
        (3, 3),
        "each shard asked once per scan"
    );

    let (removed, _) = client.clear().await.unwrap();
    assert_eq!(removed, 40);
    assert!(client.scan("", 100).await.unwrap().is_empty());
    for seen in [&seen0, &seen1] {
        let clears = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| *s == "Clear")
            .count();
        assert_eq!(clears, 1, "every shard cleared once");
    }
}
