//! The `mem` transport's RPC half: an in-process node answers requests sent
//! through a `MemChannel`, with no socket in between.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use rdkv_fabric::{MemChannel, RpcChannel};
use rdkv_proto::wire::{Consistency, ErrorCode, Request, Response};
use rdkv_server::config::{Args, Config};
use rdkv_server::node::Node;
use tokio::time::Instant;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("an ephemeral port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_node_answers_over_a_mem_channel() {
    let dir = tempfile::tempdir().unwrap();
    let addr = |port: u16| format!("127.0.0.1:{port}");
    let args = Args::parse_from([
        "rdkv-server".to_owned(),
        "--data-dir".into(),
        dir.path().join("data").display().to_string(),
        "--listen".into(),
        addr(free_port()),
        "--peer-listen".into(),
        addr(free_port()),
        "--http-listen".into(),
        "off".into(),
        "--resp-listen".into(),
        "off".into(),
        "--heartbeat-ms".into(),
        "50".into(),
        "--region-mib".into(),
        "16".into(),
    ]);
    let node = Node::start(Config::resolve(args).unwrap()).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    let deadline = || Instant::now() + Duration::from_secs(10);

    // A single node elects itself; writes succeed once it leads.
    let put = Request::Put {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
    };
    let started = Instant::now();
    let version = loop {
        match channel.call_boxed(&put, deadline()).await.unwrap() {
            Response::Written { version } => break version,
            other => {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "no leader: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
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

/// Arguments of member `id` of a cluster whose peers listen on `peers`.
fn member_args(dir: &std::path::Path, id: u64, peers: &[u16]) -> Args {
    let initial = peers
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    Args::parse_from([
        "rdkv-server".to_owned(),
        "--id".into(),
        id.to_string(),
        "--data-dir".into(),
        dir.join(format!("n{id}")).display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--peer-listen".into(),
        format!("127.0.0.1:{}", peers[(id - 1) as usize]),
        "--initial-cluster".into(),
        initial,
        "--http-listen".into(),
        "off".into(),
        "--resp-listen".into(),
        "off".into(),
        "--heartbeat-ms".into(),
        "50".into(),
        "--region-mib".into(),
        "16".into(),
    ])
}

/// A write Raft accepted but never committed has an unknown outcome when
/// Raft stops: the reply must say so with `Timeout` (never retried by a
/// client), not `Unavailable` (retried: a write that did apply would be
/// applied twice). A slow fsync holds the write between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_by_raft_stopping_has_an_unknown_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::resolve(member_args(dir.path(), 1, &[free_port()])).unwrap();
    let node = Node::start(config).await.unwrap();
    let channel = MemChannel::new(Arc::clone(&node.handler) as Arc<dyn rdkv_fabric::RpcHandler>);
    let deadline = || Instant::now() + Duration::from_secs(30);
    let put = |value: &'static [u8]| Request::Put {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(value),
    };
    // Leading and serving writes first.
    let started = Instant::now();
    while !matches!(
        channel
            .call_boxed(&put(b"first"), deadline())
            .await
            .unwrap(),
        Response::Written { .. }
    ) {
        assert!(started.elapsed() < Duration::from_secs(20), "no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.handler
        .replica()
        .log
        .set_fsync_delay(Duration::from_secs(1));
    let write = tokio::spawn(async move { channel.call_boxed(&put(b"second"), deadline()).await });
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
