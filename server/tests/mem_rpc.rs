//! The `mem` transport's RPC half: an in-process node answers requests sent
//! through a `MemChannel`, with no socket in between.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use clap::Parser;
use rdkv_fabric::{MemChannel, RpcChannel};
use rdkv_proto::shard::{SINGLE_GROUP_VERSION, ShardId};
use rdkv_proto::wire::{
    ClientHello, Consistency, DEFAULT_MAX_FRAME_BYTES, ErrorCode, FrameDecoder, FrameKind,
    PROTOCOL_VERSION, Request, Response, ServerHello, decode_payload, encoded_frame,
};
use rdkv_server::config::{Args, Config};
use rdkv_server::node::Node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("an ephemeral port")
}

/// A single node that elects itself, with a 16 MiB region, no HTTP port,
/// RESP on `resp_listen` (`off`: none), its data under `dir`; and a channel
/// straight to its handler.
async fn start_single_node(dir: &Path, resp_listen: &str) -> (Node, MemChannel) {
    let peer_listen = format!("127.0.0.1:{}", free_port());
    let args = node_args(
        dir,
        ["--peer-listen", &peer_listen, "--resp-listen", resp_listen],
    );
    let node = Node::start(Config::resolve(args).unwrap()).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    (node, channel)
}

/// A node's arguments in `dir`: its own client port, no HTTP, fast
/// heartbeats, a 16 MiB region, and `extra` (the peer port at least).
fn node_args<'a>(dir: &Path, extra: impl IntoIterator<Item = &'a str>) -> Args {
    let listen = format!("127.0.0.1:{}", free_port());
    let data_dir = dir.join("data").display().to_string();
    let common = [
        "rdkv-server",
        "--data-dir",
        &data_dir,
        "--listen",
        &listen,
        "--http-listen",
        "off",
        "--heartbeat-ms",
        "50",
        "--region-mib",
        "16",
    ];
    let mut args: Vec<String> = common.iter().map(|arg| (*arg).to_owned()).collect();
    args.extend(extra.into_iter().map(str::to_owned));
    Args::parse_from(args)
}

/// Sends `put` until the node, once it leads, writes it; its version.
async fn put_once_leading(channel: &MemChannel, put: &Request) -> u64 {
    let started = Instant::now();
    loop {
        match channel
            .call_boxed(put, Instant::now() + Duration::from_secs(10))
            .await
            .unwrap()
        {
            Response::Written { version } => return version,
            other => {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "no leader: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_node_answers_over_a_mem_channel() {
    let dir = tempfile::tempdir().unwrap();
    let (node, channel) = start_single_node(dir.path(), "off").await;
    let deadline = || Instant::now() + Duration::from_secs(10);

    // A single node elects itself; writes succeed once it leads.
    let put = Request::Put {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
    };
    let version = put_once_leading(&channel, &put).await;
    let get = Request::Get {
        key: Bytes::from_static(b"k"),
        consistency: Consistency::Linearizable,
    };
    match channel.call_boxed(&get, deadline()).await.unwrap() {
        Response::Value(Some(v)) => {
            assert_eq!(&v.value[..], b"v");
            assert_eq!(v.version, version);
        }
        other => panic!("get answered {other:?}"),
    }
    // Limits apply as on a socket.
    let too_big = Request::Put {
        key: Bytes::from(vec![b'k'; 4096]),
        value: Bytes::from_static(b"v"),
    };
    assert!(matches!(
        channel.call_boxed(&too_big, deadline()).await.unwrap(),
        Response::Error(_)
    ));
    assert!(!channel.is_closed());
    node.stop().await.unwrap();
}

/// A node whose Raft stopped (a storage or apply error, or a shutdown)
/// serves no lease read from its region: its lease task clears the lease
/// words as Raft's metrics close, rather than leaving the last deadline to
/// run out (an election timeout: 10 s with these heartbeats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_raft_stopped_serves_no_lease_reads() {
    let dir = tempfile::tempdir().unwrap();
    let peer_listen = format!("127.0.0.1:{}", free_port());
    let mut args = node_args(dir.path(), ["--peer-listen", &peer_listen]);
    // A lease of 10 s (five heartbeats), renewed every 2 s.
    args.heartbeat_ms = Some(2000);
    let node = Node::start(Config::resolve(args).unwrap()).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    let put = Request::Put {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
    };
    put_once_leading(&channel, &put).await;
    let get = Request::Get {
        key: Bytes::from_static(b"k"),
        consistency: Consistency::Lease,
    };
    let deadline = || Instant::now() + Duration::from_secs(10);
    assert!(matches!(
        channel.call_boxed(&get, deadline()).await.unwrap(),
        Response::Value(Some(_))
    ));

    node.raft().shutdown().await.unwrap();
    // With Raft stopped, only the region's lease could serve the read.
    let stopped = Instant::now();
    loop {
        match channel.call_boxed(&get, deadline()).await.unwrap() {
            Response::Error(_) => break,
            other => assert!(
                stopped.elapsed() < Duration::from_secs(4),
                "still answered {other:?} {:?} after Raft stopped",
                stopped.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_group_node_answers_its_shard_map() {
    let dir = tempfile::tempdir().unwrap();
    let resp_addr = format!("127.0.0.1:{}", free_port());
    let (node, channel) = start_single_node(dir.path(), &resp_addr).await;
    let deadline = || Instant::now() + Duration::from_secs(10);

    // The map names the leader once the node has elected itself.
    let started = Instant::now();
    let map = loop {
        match channel
            .call_boxed(&Request::ShardMap, deadline())
            .await
            .unwrap()
        {
            Response::ShardMap(map) if map.shards()[0].leader.is_some() => break map,
            other => {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "no leader in the map: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let Response::Members(members) = channel
        .call_boxed(&Request::Members, deadline())
        .await
        .unwrap()
    else {
        panic!("no members");
    };
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(map.version(), SINGLE_GROUP_VERSION);
    assert_eq!(map.nodes().iter().map(|n| n.id).collect::<Vec<_>>(), ids);
    assert_eq!(
        map.nodes()[0].client_addr.as_deref(),
        Some(members[0].client_addr.as_str())
    );
    assert_eq!(
        map.nodes()[0].resp_addr.as_deref(),
        Some(resp_addr.as_str())
    );
    let shards = map.shards();
    assert_eq!(shards.len(), 1);
    assert_eq!((shards[0].id, &shards[0].members), (ShardId(0), &ids));
    assert_eq!(shards[0].leader, Some(ids[0]));
    for key in [&b"foo"[..], b"bar", b"{user1000}.following", b""] {
        assert_eq!(map.shard_of_key(key), ShardId(0));
    }

    // Over TCP, a connection that negotiated version 2 gets the map, one
    // that negotiated 1 (an older client) an error it can decode instead.
    let client_addr = &members[0].client_addr;
    let answer = ask_over_tcp(client_addr, PROTOCOL_VERSION, &Request::ShardMap).await;
    assert!(
        matches!(&answer, Response::ShardMap(got) if got.version() == map.version()),
        "{answer:?}"
    );
    let answer = ask_over_tcp(client_addr, 1, &Request::ShardMap).await;
    assert!(
        matches!(&answer, Response::Error(e) if e.code == ErrorCode::InvalidRequest),
        "{answer:?}"
    );
    node.stop().await.unwrap();
}

/// One request over a new TCP connection whose hello offers exactly
/// `version`, and its answer.
async fn ask_over_tcp(addr: &str, version: u16, request: &Request) -> Response {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let hello = ClientHello {
        min_version: version,
        max_version: version,
        ..ClientHello::new("mem_rpc test", None)
    };
    let max = DEFAULT_MAX_FRAME_BYTES;
    let mut out = encoded_frame(FrameKind::ClientHello, 0, &hello, max).unwrap();
    out.extend_from_slice(&encoded_frame(FrameKind::Request, 1, request, max).unwrap());
    stream.write_all(&out).await.unwrap();
    let mut decoder = FrameDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    while frames.len() < 2 {
        if let Some(frame) = decoder.decode(&mut buf).unwrap() {
            frames.push(frame);
            continue;
        }
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(read > 0, "closed after {frames:?}");
    }
    let info = match decode_payload::<ServerHello>(&frames[0]) {
        Ok(ServerHello::Accepted(info) | ServerHello::AcceptedSharded { info, .. }) => info,
        other => panic!("not accepted: {other:?}"),
    };
    assert_eq!(info.version, version);
    assert_eq!(frames[1].kind, FrameKind::Response);
    decode_payload(&frames[1]).unwrap()
}

/// A write Raft accepted but never committed has an unknown outcome when
/// Raft stops: the reply must say so with `Timeout` (never retried by a
/// client), not `Unavailable` (retried: a write that did apply would be
/// applied twice). A slow fsync holds the write between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_by_raft_stopping_has_an_unknown_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let (node, channel) = start_single_node(dir.path(), "off").await;
    let put = |value: &'static [u8]| Request::Put {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(value),
    };
    // Leading and serving writes first.
    put_once_leading(&channel, &put(b"first")).await;
    node.handler
        .replica()
        .log
        .set_fsync_delay(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(30);
    let write = tokio::spawn(async move { channel.call_boxed(&put(b"second"), deadline).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    if write.is_finished() {
        panic!("the write answered before its fsync: {:?}", write.await);
    }
    node.stop().await.unwrap();
    match write.await.unwrap().unwrap() {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::Timeout, "{e:?}"),
        other => panic!("a write cut off by Raft stopping answered {other:?}"),
    }
}

/// Node 1 of a two-shard cluster with one replica per shard hosts shard 0
/// only (placement puts shard 1 on node 2, not started here): it serves
/// keys of shard 0, answers `WrongShard` for keys of shard 1 without
/// touching a log, refuses requests spanning both, answers the placed map
/// with shard 0's leader from its Raft, and keeps shard 0's data over a
/// restart; its data directory is refused to another shard count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_node_serves_its_shard_and_answers_wrong_shard_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let args = shard_node_args(dir.path());
    let node = Node::start(args("2")).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    let deadline = || Instant::now() + Duration::from_secs(10);
    let started = Instant::now();
    let map = loop {
        match channel
            .call_boxed(&Request::ShardMap, deadline())
            .await
            .unwrap()
        {
            Response::ShardMap(map) if map.shards()[0].leader == Some(1) => break map,
            other => {
                assert!(started.elapsed() < Duration::from_secs(20), "{other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(map.version(), 1);
    let members: Vec<Vec<u64>> = map.shards().iter().map(|s| s.members.clone()).collect();
    assert_eq!(members, [vec![1], vec![2]]);
    let key_of = |shard: u32| {
        (0..)
            .map(|i| Bytes::from(format!("key-{i}")))
            .find(|k| map.shard_of_key(k) == ShardId(shard))
            .unwrap()
    };
    let (ours, theirs) = (key_of(0), key_of(1));
    let put = |key: &Bytes| Request::Put {
        key: key.clone(),
        value: Bytes::from_static(b"v"),
    };
    let get = |key: &Bytes| Request::Get {
        key: key.clone(),
        consistency: Consistency::Linearizable,
    };
    let written = channel.call_boxed(&put(&ours), deadline()).await.unwrap();
    assert!(matches!(written, Response::Written { .. }), "{written:?}");
    let wrong = rdkv_proto::wire::WrongShard {
        map_version: 1,
        slot: rdkv_proto::shard::key_slot(&theirs),
        shard: ShardId(1),
    };
    for request in [put(&theirs), get(&theirs)] {
        let answer = channel.call_boxed(&request, deadline()).await.unwrap();
        assert_eq!(answer, Response::WrongShard(wrong), "{request:?}");
    }
    let both = Request::MGet {
        keys: vec![ours.clone(), theirs.clone()],
        consistency: Consistency::Linearizable,
    };
    let scan = Request::Scan {
        start_key: Bytes::new(),
        end_key: None,
        limit: 10,
        consistency: Consistency::Linearizable,
    };
    for refused in [both, scan, Request::RdmaRegion, Request::OfiRegion] {
        let answer = channel.call_boxed(&refused, deadline()).await.unwrap();
        assert!(
            matches!(&answer, Response::Error(e) if e.code == ErrorCode::InvalidRequest),
            "{refused:?}: {answer:?}"
        );
    }
    node.stop().await.unwrap();
    // The channel holds the handler, and with it the shard's log.
    drop(channel);

    let error = Node::start(args("3")).await.unwrap_err();
    assert!(
        format!("{error:#}").contains("--shards 2, not 3"),
        "{error:#}"
    );
    let node = Node::start(args("2")).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    let started = Instant::now();
    loop {
        match channel.call_boxed(&get(&ours), deadline()).await.unwrap() {
            Response::Value(Some(v)) => break assert_eq!(&v.value[..], b"v"),
            other => {
                assert!(started.elapsed() < Duration::from_secs(20), "{other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    node.stop().await.unwrap();
}

/// Node 1 of a 2-node cluster of `--replicas 1` in `dir`: its config for a
/// shard count (the same ports each time, so that it can restart).
fn shard_node_args(dir: &Path) -> impl Fn(&str) -> Config + '_ {
    let peers = [free_port(), free_port()];
    let initial = format!("1=127.0.0.1:{},2=127.0.0.1:{}", peers[0], peers[1]);
    let peer_listen = format!("127.0.0.1:{}", peers[0]);
    move |shards: &str| {
        let mut args = node_args(
            dir,
            [
                "--id",
                "1",
                "--peer-listen",
                &peer_listen,
                "--initial-cluster",
                &initial,
                "--resp-listen",
                "off",
            ],
        );
        args.shards = Some(shards.parse().unwrap());
        args.replicas = Some(1);
        Config::resolve(args).unwrap()
    }
}

/// One node of a 2-shard cluster hosting shard 0 only (docs/sharding.md,
/// section 5): a grant request naming shard 1 (verbs, libfabric, shm) is
/// answered `WrongShard`; one naming shard 0 reaches its grant (the shm
/// attach maps shard 0's region, which holds the key written to it), and
/// so does a verbs session request naming it over TCP; an
/// unnamed one (versions 1-2, a plain shm hello) is refused, never given
/// the primary's region: its reader would take shard 1's keys for absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_node_grants_the_regions_of_the_shards_it_hosts_only() {
    use rdkv_fabric::{MonotonicClock, ReaderOptions, RegionReader, ShmError, attach_shm_shard};
    use rdkv_proto::wire::{ShardRequest, WrongShard};

    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(shard_node_args(dir.path())("2")).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    let deadline = || Instant::now() + Duration::from_secs(10);
    let map = node.handler.shards().map().unwrap();
    let ours = (0..)
        .map(|i| Bytes::from(format!("key-{i}")))
        .find(|k| map.shard_of_key(k) == ShardId(0))
        .unwrap();
    let put = Request::Put {
        key: ours.clone(),
        value: Bytes::from_static(b"shard zero"),
    };
    put_once_leading(&channel, &put).await;

    let wrong = WrongShard {
        map_version: 1,
        slot: map.ranges_of(ShardId(1)).next().unwrap().first,
        shard: ShardId(1),
    };
    for request in [ShardRequest::RdmaRegion, ShardRequest::OfiRegion] {
        let named = |shard| Request::Sharded {
            shard: ShardId(shard),
            request: request.clone(),
        };
        // The version is the metadata group's, which rises as the node
        // publishes its addresses: any will do.
        let answer = channel.call_boxed(&named(1), deadline()).await.unwrap();
        assert!(
            matches!(&answer, Response::WrongShard(w)
                if w.shard == wrong.shard && w.slot == wrong.slot && w.map_version >= 1),
            "{request:?}: {answer:?}"
        );
        // Shard 0 is hosted: the answer is its transport's (off in this
        // build), not a shard refusal.
        let answer = channel.call_boxed(&named(0), deadline()).await.unwrap();
        assert!(
            matches!(&answer, Response::Error(e) if e.message.contains("is off on this node")),
            "{request:?}: {answer:?}"
        );
        let unnamed = request.to_request().unwrap();
        let answer = channel.call_boxed(&unnamed, deadline()).await.unwrap();
        assert!(
            matches!(&answer, Response::Error(e) if e.code == ErrorCode::InvalidRequest
                && e.message.contains("must name its shard")),
            "{unnamed:?}: {answer:?}"
        );
    }

    // A verbs session is opened on the client's connection (the handler
    // alone cannot): the same three answers over TCP.
    let endpoint = rdkv_proto::wire::QpEndpoint {
        qp_num: 0x12,
        psn: 0x34,
        lid: 0,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
        gid_index: 0,
        port: 1,
        mtu_bytes: 1024,
        recv_credits: 16,
        recv_buffer_bytes: 64 * 1024,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
    };
    let connect = |shard| Request::Sharded {
        shard: ShardId(shard),
        request: ShardRequest::RdmaConnect { endpoint },
    };
    let addr = node.handler.endpoints().client.clone();
    let answer = ask_over_tcp(&addr, PROTOCOL_VERSION, &connect(1)).await;
    assert!(
        matches!(&answer, Response::WrongShard(w) if (w.shard, w.slot) == (wrong.shard, wrong.slot)),
        "{answer:?}"
    );
    let answer = ask_over_tcp(&addr, PROTOCOL_VERSION, &connect(0)).await;
    assert!(
        matches!(&answer, Response::Error(e) if e.message.contains("is off on this node")),
        "{answer:?}"
    );
    let unnamed = Request::RdmaConnect { endpoint };
    let answer = ask_over_tcp(&addr, PROTOCOL_VERSION, &unnamed).await;
    assert!(
        matches!(&answer, Response::Error(e) if e.message.contains("must name its shard")),
        "{answer:?}"
    );

    let socket = node.handler.endpoints().shm_socket.clone().unwrap();
    let socket = Path::new(&socket);
    let attached = attach_shm_shard(socket, None, "test", Some(ShardId(0)))
        .await
        .unwrap();
    let shard0 = &node.handler.shards().get(ShardId(0)).unwrap().sm;
    assert_eq!(attached.region_epoch, shard0.region_epoch());
    let reader = RegionReader::attach(
        attached.memory,
        Arc::new(MonotonicClock::new()),
        ReaderOptions {
            max_attempts: ReaderOptions::DEFAULT_MAX_ATTEMPTS,
            abandon_after_us: None,
            expiry_margin_ms: 0,
        },
    )
    .unwrap();
    let started = Instant::now();
    while reader.get(&ours).unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        &reader.get(&ours).unwrap().unwrap().value[..],
        b"shard zero"
    );
    match attach_shm_shard(socket, None, "test", Some(ShardId(1))).await {
        Err(ShmError::WrongShard(got)) => {
            assert_eq!((got.shard, got.slot), (wrong.shard, wrong.slot));
        }
        other => panic!("{other:?}"),
    }
    match attach_shm_shard(socket, None, "test", None).await {
        Err(ShmError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::InvalidRequest, "{message}");
        }
        other => panic!("{other:?}"),
    }
    node.stop().await.unwrap();
}
