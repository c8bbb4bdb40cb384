//! A fake rdkv server speaking the real frames (rdkv_proto::wire) over TCP, so
//! the client and the CLI can be tested without Raft. Each test drives the
//! connections itself: [`serve`] hands every handshaken connection to a
//! handler that reads requests and writes responses.
//!
//! Test support: a frame the client sends that cannot be decoded panics the
//! connection's task, and the test sees its client fail.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use rdkv_proto::wire::{
    ClientHello, DEFAULT_MAX_FRAME_BYTES, ErrorCode, ErrorReply, Frame, FrameDecoder, FrameKind,
    NodeStatus, RegionFill, Request, Response, Role, ServerHello, ServerInfo, StateDigestAt,
    Versioned, decode_payload, encoded_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// The hello of a fake that accepts the client with `max_in_flight` credits.
pub fn accepted(max_in_flight: u32) -> ServerHello {
    ServerHello::Accepted(server_info(1, max_in_flight))
}

fn server_info(version: u16, max_in_flight: u32) -> ServerInfo {
    ServerInfo {
        version,
        node_id: 1,
        cluster_id: 42,
        max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        max_in_flight,
    }
}

/// The hello of a fake node of a multi-shard cluster: [`accepted`], at
/// version 3, announcing a shard map at `shard_map_version`.
pub fn accepted_sharded(max_in_flight: u32, shard_map_version: u64) -> ServerHello {
    ServerHello::AcceptedSharded {
        info: server_info(3, max_in_flight),
        shard_map_version,
    }
}

/// A status for tests that render one: node `id` (at 10.0.0.`id`) of a
/// cluster led by node 1 at term 4, with 118 of 120 entries applied and its
/// region 12.5 % full; no members, replication, sockets or counters.
pub fn node_status(id: u64, role: Role) -> NodeStatus {
    NodeStatus {
        id,
        client_addr: format!("10.0.0.{id}:7379"),
        peer_addr: format!("10.0.0.{id}:7380"),
        role,
        term: 4,
        leader_id: Some(1),
        leader_client_addr: Some("10.0.0.1:7379".into()),
        last_log_index: 120,
        commit_index: 120,
        applied_index: 118,
        snapshot_index: 100,
        purged_index: 90,
        region: RegionFill {
            capacity_bytes: 1000,
            used_bytes: 125,
            pending_reclaim_bytes: 0,
            live_keys: 7,
        },
        members: Vec::new(),
        replication: Vec::new(),
        shm_socket: None,
        served: Default::default(),
        rpc_socket: None,
        rdma: String::new(),
        ofi: String::new(),
        resp_addr: None,
        region_epoch: 1,
        ops: Vec::new(),
        open_connections: Default::default(),
        state_digest: StateDigestAt {
            applied_index: 118,
            digest: 0x5eed,
        },
        quota: Default::default(),
        alarms: Vec::new(),
    }
}

/// A listening fake. `serve` runs `handler` for every accepted connection after
/// the handshake (which answers `hello`, checking the token if one is set).
#[derive(Debug)]
pub struct Fake {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Listens on 127.0.0.1 (a free port) and serves every connection: the
/// handshake answers `hello` (or rejects a token other than `token`, if one
/// is set), then `handler` gets the connection.
pub async fn serve<F, Fut>(hello: ServerHello, token: Option<&str>, handler: F) -> Fake
where
    F: Fn(FakeConn) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&connections);
    let token = token.map(str::to_owned);
    let handler = Arc::new(handler);
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let hello = hello.clone();
            let token = token.clone();
            let handler = Arc::clone(&handler);
            tokio::spawn(async move {
                let Some(conn) = FakeConn::handshake(stream, hello, token).await else {
                    return;
                };
                handler(conn).await;
            });
        }
    });
    Fake {
        addr,
        connections,
        task,
    }
}

/// Reading side of a fake connection.
#[derive(Debug)]
pub struct FakeReader {
    rd: OwnedReadHalf,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl FakeReader {
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).expect("client frame") {
                return Some(frame);
            }
            if self.rd.read_buf(&mut self.buf).await.ok()? == 0 {
                return None;
            }
        }
    }

    /// The next request, or `None` when the client closed the connection.
    pub async fn request(&mut self) -> Option<(u64, Request)> {
        let frame = self.frame().await?;
        assert_eq!(frame.kind, FrameKind::Request);
        Some((frame.request_id, decode_payload(&frame).expect("request")))
    }
}

/// Writing side of a fake connection.
#[derive(Debug)]
pub struct FakeWriter {
    wr: OwnedWriteHalf,
}

impl FakeWriter {
    pub async fn respond(&mut self, request_id: u64, response: &Response) {
        let out = encoded_frame(
            FrameKind::Response,
            request_id,
            response,
            DEFAULT_MAX_FRAME_BYTES,
        )
        .expect("encode");
        // The client may have gone away; that is its business.
        let _ = self.wr.write_all(&out).await;
    }
}

#[derive(Debug)]
pub struct FakeConn {
    pub reader: FakeReader,
    pub writer: FakeWriter,
    pub hello: ClientHello,
    /// The fake's own address (what the client dialled).
    pub local_addr: SocketAddr,
}

impl FakeConn {
    async fn handshake(
        stream: TcpStream,
        hello: ServerHello,
        token: Option<String>,
    ) -> Option<FakeConn> {
        let local_addr = stream.local_addr().ok()?;
        let (rd, wr) = stream.into_split();
        let mut reader = FakeReader {
            rd,
            buf: BytesMut::new(),
            decoder: FrameDecoder::default(),
        };
        let mut writer = FakeWriter { wr };
        let frame = reader.frame().await?;
        assert_eq!(frame.kind, FrameKind::ClientHello);
        let client_hello: ClientHello = decode_payload(&frame).expect("hello");
        let reply = match (&token, &client_hello.token) {
            (Some(expected), presented) if presented.as_deref() != Some(expected.as_str()) => {
                ServerHello::Rejected {
                    code: ErrorCode::Unauthenticated,
                    message: "bad token".into(),
                }
            }
            _ => hello,
        };
        let out = encoded_frame(FrameKind::ServerHello, 0, &reply, DEFAULT_MAX_FRAME_BYTES)
            .expect("encode hello");
        writer.wr.write_all(&out).await.ok()?;
        if matches!(reply, ServerHello::Rejected { .. }) {
            return None;
        }
        Some(FakeConn {
            reader,
            writer,
            hello: client_hello,
            local_addr,
        })
    }

    pub async fn request(&mut self) -> Option<(u64, Request)> {
        self.reader.request().await
    }

    pub async fn respond(&mut self, request_id: u64, response: &Response) {
        self.writer.respond(request_id, response).await;
    }
}

/// A fake leader's data: a real map, answering the key-value requests as a
/// node would (each write a new version), anything else with
/// `InvalidRequest`.
#[derive(Debug, Default)]
pub struct Kv {
    map: HashMap<Bytes, Versioned>,
    index: u64,
}

impl Kv {
    pub fn apply(&mut self, request: Request) -> Response {
        match request {
            Request::Get { key, .. } => Response::Value(self.map.get(&key).cloned()),
            Request::MGet { keys, .. } => {
                Response::Values(keys.iter().map(|k| self.map.get(k).cloned()).collect())
            }
            Request::Put { key, value } => {
                self.index += 1;
                let version = self.index;
                self.map.insert(key, Versioned { value, version });
                Response::Written { version }
            }
            Request::MPut { pairs } => {
                self.index += 1;
                let version = self.index;
                for (key, value) in pairs {
                    self.map.insert(key, Versioned { value, version });
                }
                Response::MWritten { version }
            }
            Request::Delete { key } => {
                self.index += 1;
                let existed = self.map.remove(&key).is_some();
                Response::Deleted {
                    existed,
                    version: self.index,
                }
            }
            Request::Cas {
                key,
                expected_version,
                new_value,
            } => {
                let current = self.map.get(&key).cloned();
                if current.as_ref().map(|v| v.version) != expected_version {
                    return Response::CasDone {
                        succeeded: false,
                        version: self.index,
                        current,
                    };
                }
                self.index += 1;
                let version = self.index;
                match new_value {
                    Some(value) => {
                        self.map.insert(key, Versioned { value, version });
                    }
                    None => {
                        self.map.remove(&key);
                    }
                }
                Response::CasDone {
                    succeeded: true,
                    version,
                    current: None,
                }
            }
            Request::Scan {
                start_key,
                end_key,
                limit,
                ..
            } => {
                let mut pairs: Vec<(Bytes, Versioned)> = self
                    .map
                    .iter()
                    .filter(|(k, _)| **k >= start_key && end_key.as_ref().is_none_or(|e| *k < e))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
                pairs.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
                Response::Pairs { pairs, more: false }
            }
            Request::Clear => {
                self.index += 1;
                let removed = u64::try_from(self.map.len()).unwrap_or(u64::MAX);
                self.map.clear();
                Response::Cleared {
                    removed,
                    version: self.index,
                }
            }
            Request::Ping => Response::Pong,
            other => Response::Error(ErrorReply::new(
                ErrorCode::InvalidRequest,
                format!("fake does not do {other:?}"),
            )),
        }
    }
}
