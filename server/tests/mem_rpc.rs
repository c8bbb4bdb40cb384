//! The `mem` transport's RPC half: an in-process node answers requests sent
//! through a `MemChannel`, with no socket in between.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use rdkv_fabric::{MemChannel, RpcChannel};
use rdkv_proto::wire::{Consistency, Request, Response};
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
