//! The `shm` attach protocol end to end over a real Unix socket: who gets the
//! region's fd, what the mapping allows, and how the server survives bad
//! clients (and the client bad servers).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use rdkv_fabric::{
    MemoryError, MonotonicClock, ReaderOptions, RegionMemory, RegionReader, ShmError, attach_shm,
    request_shm_grant, serve_shm,
};
use rdkv_proto::region::{HashSeed, LayoutParams, RegionLayout};
use rdkv_proto::wire::{
    ClientHello, ErrorCode, FrameKind, PROTOCOL_VERSION, Request, ShmGrant, encode_frame,
};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const REGION_BYTES: usize = 1 << 20;
const NODE_ID: u64 = 42;
const EPOCH: u64 = 9;
const TOKEN: &str = "s3cret-cluster-token";
const CHILD_ENV: &str = "RDKV_CHILD";
const CHILD_SOCKET_ENV: &str = "RDKV_CHILD_SHM_SOCKET";

fn layout() -> RegionLayout {
    RegionLayout::plan(LayoutParams {
        region_bytes: REGION_BYTES as u64,
        bucket_count: 64,
        neighbourhood_buckets: 2,
        region_epoch: EPOCH,
        node_id: NODE_ID,
        hash_seed: HashSeed(1, 2),
        max_key_bytes: 256,
        max_value_bytes: 4096,
        grace_period_us: 1_000_000,
    })
    .unwrap()
}

/// A shared region with a valid header, as the storage engine would make it.
fn shared_region() -> Arc<RegionMemory> {
    let memory = RegionMemory::shared(REGION_BYTES, "rdkv-shm-test").unwrap();
    memory.write_bytes(0, &layout().encode_static()).unwrap();
    Arc::new(memory)
}

struct Server {
    _dir: TempDir,
    path: PathBuf,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn start(token: Option<&str>, region: Option<Arc<RegionMemory>>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(serve_shm(
        listener,
        token.map(str::to_owned),
        NODE_ID,
        move |_| region.clone().ok_or_else(rdkv_fabric::no_region_yet),
        shutdown,
    ));
    Server {
        _dir: dir,
        path,
        stop,
        task,
    }
}

async fn raw_request(path: &Path, hello: &ClientHello) -> rdkv_fabric::ReceivedGrant {
    let mut stream = UnixStream::connect(path).await.unwrap();
    request_shm_grant(&mut stream, hello).await.unwrap()
}

fn refused_code(result: Result<rdkv_fabric::ShmAttachment, ShmError>) -> ErrorCode {
    match result {
        Err(ShmError::Refused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_right_token_maps_the_owners_bytes_live() {
    let region = shared_region();
    let data_offset = layout().data_offset;
    region
        .write_bytes(data_offset, b"written before attach")
        .unwrap();
    let server = start(Some(TOKEN), Some(Arc::clone(&region)));

    let attached = attach_shm(&server.path, Some(TOKEN), "test-client")
        .await
        .unwrap();
    assert_eq!(attached.node_id, NODE_ID);
    assert_eq!(attached.region_epoch, EPOCH);
    assert_eq!(attached.memory.len_bytes(), REGION_BYTES);
    assert!(!attached.memory.is_shared());
    let mut out = [0u8; 21];
    attached.memory.read_bytes(data_offset, &mut out).unwrap();
    assert_eq!(&out, b"written before attach");

    // The same memory, not a copy: later writes by the owner are visible.
    region
        .write_bytes(data_offset, b"WRITTEN AFTER  attach")
        .unwrap();
    region
        .store_u64(data_offset + 4096, 0xfeed_beef, Ordering::Release)
        .unwrap();
    attached.memory.read_bytes(data_offset, &mut out).unwrap();
    assert_eq!(&out, b"WRITTEN AFTER  attach");
    assert_eq!(
        attached
            .memory
            .load_u64(data_offset + 4096, Ordering::Acquire)
            .unwrap(),
        0xfeed_beef
    );

    // The one-sided reader accepts the mapping's header.
    let layout = layout();
    let reader = RegionReader::attach(
        Arc::clone(&attached.memory),
        Arc::new(MonotonicClock::new()),
        ReaderOptions::for_layout(&layout),
    );
    assert!(reader.is_ok(), "{reader:?}");

    // A raw exchange shows exactly one fd and nothing extra.
    let raw = raw_request(&server.path, &ClientHello::new("raw", Some(TOKEN.into()))).await;
    assert!(matches!(raw.grant, ShmGrant::Granted { .. }));
    let fd = raw.fd.expect("a granted attach carries the region fd");
    assert_eq!(raw.extra_fds, 0);
    // Received close-on-exec (MSG_CMSG_CLOEXEC), and opened read-only.
    let fd_flags = rustix::io::fcntl_getfd(&fd).unwrap();
    assert!(fd_flags.contains(rustix::io::FdFlags::CLOEXEC));
    let mode = rustix::fs::fcntl_getfl(&fd).unwrap() & rustix::fs::OFlags::ACCMODE;
    assert_eq!(mode, rustix::fs::OFlags::RDONLY);

    server.stop.send(true).unwrap();
    server.task.await.unwrap();
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_refused_without_an_fd() {
    let server = start(Some(TOKEN), Some(shared_region()));
    for token in [
        Some("wrong-token"),
        Some(""),
        Some("s3cret-cluster-tokeN"),
        None,
    ] {
        let result = attach_shm(&server.path, token, "intruder").await;
        assert_eq!(
            refused_code(result),
            ErrorCode::Unauthenticated,
            "{token:?}"
        );

        let raw = raw_request(
            &server.path,
            &ClientHello::new("intruder", token.map(str::to_owned)),
        )
        .await;
        assert!(
            matches!(
                raw.grant,
                ShmGrant::Refused {
                    code: ErrorCode::Unauthenticated,
                    ..
                }
            ),
            "{:?}",
            raw.grant
        );
        assert!(raw.fd.is_none(), "a refused client received an fd");
        assert_eq!(raw.extra_fds, 0);
    }
    // The right token still works afterwards.
    attach_shm(&server.path, Some(TOKEN), "owner")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_server_without_a_token_accepts_any_hello() {
    let server = start(None, Some(shared_region()));
    attach_shm(&server.path, None, "open").await.unwrap();
    attach_shm(&server.path, Some("anything"), "open")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_bad_version_or_magic_is_refused() {
    let server = start(Some(TOKEN), Some(shared_region()));
    let mut hello = ClientHello::new("future-client", Some(TOKEN.into()));
    hello.min_version = PROTOCOL_VERSION + 1;
    hello.max_version = PROTOCOL_VERSION + 5;
    let raw = raw_request(&server.path, &hello).await;
    assert!(
        matches!(
            raw.grant,
            ShmGrant::Refused {
                code: ErrorCode::UnsupportedVersion,
                ..
            }
        ),
        "{:?}",
        raw.grant
    );
    assert!(raw.fd.is_none());

    let mut hello = ClientHello::new("not-rdkv", Some(TOKEN.into()));
    hello.magic = *b"HTTP";
    let raw = raw_request(&server.path, &hello).await;
    assert!(matches!(
        raw.grant,
        ShmGrant::Refused {
            code: ErrorCode::Malformed,
            ..
        }
    ));
    assert!(raw.fd.is_none());
}

#[tokio::test]
async fn no_region_or_an_unshareable_region_is_unavailable() {
    let server = start(Some(TOKEN), None);
    let result = attach_shm(&server.path, Some(TOKEN), "early").await;
    assert_eq!(refused_code(result), ErrorCode::Unavailable);

    // A region whose header is not written yet is not handed out.
    let blank = Arc::new(RegionMemory::shared(REGION_BYTES, "blank").unwrap());
    let server = start(Some(TOKEN), Some(blank));
    let result = attach_shm(&server.path, Some(TOKEN), "early").await;
    assert_eq!(refused_code(result), ErrorCode::Unavailable);

    // Anonymous memory has no fd to hand out.
    let anon = RegionMemory::anonymous(REGION_BYTES).unwrap();
    anon.write_bytes(0, &layout().encode_static()).unwrap();
    let server = start(Some(TOKEN), Some(Arc::new(anon)));
    let result = attach_shm(&server.path, Some(TOKEN), "early").await;
    assert_eq!(refused_code(result), ErrorCode::Unavailable);
}

async fn read_until_closed(stream: &mut UnixStream) -> Vec<u8> {
    let mut got = Vec::new();
    // A reset (the server closed with our garbage unread) also ends the stream.
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .expect("the server must close a garbage connection");
    got
}

#[tokio::test]
async fn garbage_closes_the_connection_and_the_server_serves_the_next_client() {
    let server = start(Some(TOKEN), Some(shared_region()));

    // A silent client holds a connection open meanwhile; it must not block others.
    let _silent = UnixStream::connect(&server.path).await.unwrap();

    // HTTP on the socket: "GET " announces a ~540 MB frame, refused before allocating.
    let mut http = UnixStream::connect(&server.path).await.unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(read_until_closed(&mut http).await.is_empty());

    // A frame too short to hold its header, and an unknown frame kind.
    for garbage in [
        &[3u8, 0, 0, 0, 1, 2, 3][..],
        &[9u8, 0, 0, 0, 0xee, 0, 0, 0, 0, 0, 0, 0, 0][..],
    ] {
        let mut stream = UnixStream::connect(&server.path).await.unwrap();
        stream.write_all(garbage).await.unwrap();
        assert!(read_until_closed(&mut stream).await.is_empty());
    }

    // A peer that hangs up mid-frame.
    let mut stream = UnixStream::connect(&server.path).await.unwrap();
    stream.write_all(&[200, 0, 0, 0, 1, 0]).await.unwrap();
    drop(stream);

    // A well-formed frame of the wrong kind gets a refusal, not an fd.
    let mut stream = UnixStream::connect(&server.path).await.unwrap();
    let mut frame = BytesMut::new();
    encode_frame(FrameKind::Request, 0, &Request::Ping, 1 << 16, &mut frame).unwrap();
    stream.write_all(&frame).await.unwrap();
    let mut reply = read_until_closed(&mut stream).await;
    let body = reply.split_off(4);
    assert!(matches!(
        ShmGrant::decode(&body).unwrap(),
        ShmGrant::Refused {
            code: ErrorCode::Malformed,
            ..
        }
    ));

    let attached = attach_shm(&server.path, Some(TOKEN), "after-garbage")
        .await
        .unwrap();
    assert_eq!(attached.region_epoch, EPOCH);
}

#[tokio::test]
async fn reads_past_the_region_end_are_rejected() {
    let server = start(Some(TOKEN), Some(shared_region()));
    let attached = attach_shm(&server.path, Some(TOKEN), "bounds")
        .await
        .unwrap();
    let end = REGION_BYTES as u64;
    let mut out = [0u8; 16];
    for offset in [end, end - 8, end + 4096, u64::MAX - 7] {
        assert!(
            matches!(
                attached.memory.read_bytes(offset, &mut out),
                Err(MemoryError::OutOfBounds { .. })
            ),
            "offset {offset}"
        );
    }
    assert!(matches!(
        attached.memory.load_u64(end, Ordering::Relaxed),
        Err(MemoryError::OutOfBounds { .. })
    ));
    // The last word is readable.
    attached.memory.read_bytes(end - 8, &mut out[..8]).unwrap();
}

/// Runs only when re-executed by `a_write_through_the_mapping_kills_the_client`:
/// attaches, then writes through the read-only mapping, which must fault.
#[test]
fn child_write_through_mapping() {
    let Some(socket) = std::env::var_os(CHILD_SOCKET_ENV) else {
        return;
    };
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let attached = runtime
        .block_on(attach_shm(Path::new(&socket), Some(TOKEN), "child"))
        .unwrap();
    let target = attached.memory.base_ptr().cast_mut().cast::<u64>();
    // SAFETY: this is the deliberate fault under test. The pointer is the
    // start of a live, page-aligned mapping (so aligned and in bounds), but the
    // mapping is PROT_READ: the store must raise SIGSEGV and kill this process.
    // No reference to the memory exists, and nothing runs after a fault.
    unsafe { std::ptr::write_volatile(target, 0xdead_beef) };
    // Reaching this line means the write went through: report it distinctly.
    eprintln!("child: write through the read-only mapping succeeded");
    std::process::exit(3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_the_mapping_kills_the_client() {
    let region = shared_region();
    let server = start(Some(TOKEN), Some(Arc::clone(&region)));

    // In this process: the typed API refuses writes.
    let attached = attach_shm(&server.path, Some(TOKEN), "parent")
        .await
        .unwrap();
    assert!(matches!(
        attached.memory.store_u64(0, 1, Ordering::Relaxed),
        Err(MemoryError::ReadOnly)
    ));
    assert!(matches!(
        attached.memory.write_bytes(4096, b"x"),
        Err(MemoryError::ReadOnly)
    ));
    assert!(matches!(
        attached.memory.inject_bit_flip(0, 1),
        Err(MemoryError::ReadOnly)
    ));

    // In a child: a raw store through the pointer faults.
    let exe = std::env::current_exe().unwrap();
    let path = server.path.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(exe)
            .args(["--exact", "child_write_through_mapping", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, "1")
            .env(CHILD_SOCKET_ENV, path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        output.status.signal(),
        Some(11),
        "child should die of SIGSEGV; status {:?}, stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // The owner's memory is untouched.
    let magic = region.load_u64(0, Ordering::Relaxed).unwrap();
    assert_eq!(magic, u64::from_le_bytes(*b"RDKVREGN"));
}

/// A fake server that answers any connection with `reply` (no fd) and closes.
fn fake_server(reply: Vec<u8>) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut hello = [0u8; 64];
            let _ = stream.read(&mut hello).await;
            let _ = stream.write_all(&reply).await;
        }
    });
    (dir, path)
}

#[tokio::test]
async fn the_client_survives_a_hostile_server() {
    // An enormous announced grant is refused before anything is allocated.
    let (_dir, path) = fake_server(u32::MAX.to_le_bytes().to_vec());
    assert!(matches!(
        attach_shm(&path, Some(TOKEN), "c").await,
        Err(ShmError::GrantTooLarge { .. })
    ));

    // A grant without an fd.
    let granted = ShmGrant::Granted {
        node_id: NODE_ID,
        region_epoch: EPOCH,
        region_bytes: REGION_BYTES as u64,
    };
    let (_dir, path) = fake_server(granted.encode().unwrap());
    assert!(matches!(
        attach_shm(&path, Some(TOKEN), "c").await,
        Err(ShmError::MissingFd)
    ));

    // A truncated grant, and a garbage body.
    let mut short = granted.encode().unwrap();
    short.pop();
    let (_dir, path) = fake_server(short);
    assert!(matches!(
        attach_shm(&path, Some(TOKEN), "c").await,
        Err(ShmError::Closed)
    ));
    let (_dir, path) = fake_server(vec![3, 0, 0, 0, 0xff, 0xff, 0xff]);
    assert!(matches!(
        attach_shm(&path, Some(TOKEN), "c").await,
        Err(ShmError::Decode(_))
    ));

    // Nobody listening.
    assert!(matches!(
        attach_shm(Path::new("/nonexistent/rdkv.sock"), None, "c").await,
        Err(ShmError::Connect { .. })
    ));
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let server = start(Some(TOKEN), Some(shared_region()));
    let _idle = UnixStream::connect(&server.path).await.unwrap();
    server.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("serve_shm must return on shutdown")
        .unwrap();
}
