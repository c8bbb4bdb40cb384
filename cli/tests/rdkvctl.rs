//! Runs the `rdkvctl` binary against a fake in-process server speaking the real
//! wire frames: output on stdout, errors only on stderr, exit codes.

use std::net::SocketAddr;
use std::process::Output;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rdkv_proto::wire::{
    ErrorCode, ErrorReply, Health, MemberInfo, NodeStatus, ReplicationLag, Request, Response, Role,
    SnapshotChunk,
};
use rdkv_tests::fake_server::{Fake, FakeConn, Kv, accepted, node_status, serve};

const TOKEN: &str = "t0ken";
const SNAPSHOT: &[u8] = b"snapshot bytes, in several chunks";

fn status(addr: SocketAddr) -> NodeStatus {
    NodeStatus {
        client_addr: addr.to_string(),
        leader_client_addr: Some(addr.to_string()),
        replication: vec![ReplicationLag {
            id: 2,
            matched_index: Some(118),
            lag_entries: 2,
        }],
        ..node_status(1, Role::Leader)
    }
}

fn answer(kv: &Mutex<Kv>, addr: SocketAddr, request: Request) -> Response {
    match request {
        Request::Members => Response::Members(vec![MemberInfo {
            id: 1,
            peer_addr: "127.0.0.1:7380".into(),
            client_addr: addr.to_string(),
            voter: true,
        }]),
        Request::Status => Response::Status(Box::new(status(addr))),
        Request::Health => Response::Health(Health {
            healthy: true,
            reason: String::new(),
        }),
        Request::MoveLeader { to: 9 } => {
            Response::Error(ErrorReply::new(ErrorCode::NotFound, "no member 9"))
        }
        Request::SnapshotRead { offset, max_bytes } => {
            let start = (offset as usize).min(SNAPSHOT.len());
            let end = (start + (max_bytes as usize).min(5)).min(SNAPSHOT.len());
            Response::Snapshot(SnapshotChunk {
                last_log_index: 10,
                total_bytes: SNAPSHOT.len() as u64,
                offset,
                data: Bytes::copy_from_slice(&SNAPSHOT[start..end]),
            })
        }
        data => kv.lock().unwrap().apply(data),
    }
}

/// A fake node holding a key-value map, behind the token.
async fn fake() -> Fake {
    let kv = Arc::new(Mutex::new(Kv::default()));
    serve(accepted(4), Some(TOKEN), move |mut conn: FakeConn| {
        let kv = Arc::clone(&kv);
        async move {
            while let Some((id, request)) = conn.request().await {
                let response = answer(&kv, conn.local_addr, request);
                conn.respond(id, &response).await;
            }
        }
    })
    .await
}

async fn rdkvctl(addr: SocketAddr, token: &str, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rdkvctl"));
    cmd.env_remove("RDKV_ENDPOINTS")
        .env_remove("RDKV_TOKEN")
        .arg("--endpoints")
        .arg(addr.to_string())
        .arg("--token")
        .arg(token)
        .arg("--timeout")
        .arg("3s")
        .args(args);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_value_commands() {
    let fake = fake().await;
    let addr = fake.addr;
    let out = rdkvctl(addr, TOKEN, &["put", "greeting", "hello"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "OK\n");

    let out = rdkvctl(addr, TOKEN, &["get", "greeting"]).await;
    assert_eq!(stdout(&out), "hello\n");
    let out = rdkvctl(addr, TOKEN, &["-w", "json", "get", "greeting"]).await;
    assert_eq!(
        stdout(&out),
        "{\"key\":\"greeting\",\"value\":\"hello\",\"version\":1}\n"
    );

    // Absent key: nothing printed, exit 0 (like etcdctl).
    let out = rdkvctl(addr, TOKEN, &["get", "nope", "--consistency", "local"]).await;
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out), "");

    assert_eq!(
        stdout(&rdkvctl(addr, TOKEN, &["del", "greeting"]).await),
        "1\n"
    );
    assert_eq!(
        stdout(&rdkvctl(addr, TOKEN, &["del", "greeting"]).await),
        "0\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_print_only_on_stderr() {
    let fake = fake().await;
    let addr = fake.addr;
    let out = rdkvctl(addr, "wrong", &["get", "k"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    let err = stderr(&out);
    assert!(err.starts_with("Error: get failed:"), "{err}");
    assert!(err.contains("Unauthenticated"), "{err}");

    let out = rdkvctl(addr, TOKEN, &["move-leader", "9"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("NotFound"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands() {
    let fake = fake().await;
    let addr = fake.addr;
    let out = rdkvctl(addr, TOKEN, &["member", "list"]).await;
    assert_eq!(stdout(&out), format!("1, 127.0.0.1:7380, {addr}, false\n"));

    let out = rdkvctl(
        addr,
        TOKEN,
        &["endpoint", "status", "--cluster", "-w", "table"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains("| leader |"), "{table}");
    assert!(table.contains("| 12.5%       |"), "{table}");

    let out = rdkvctl(addr, TOKEN, &["endpoint", "health", "-w", "json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"health\":true"), "{}", stdout(&out));

    let dir = std::env::temp_dir().join(format!("rdkvctl-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("snap.db");
    let out = rdkvctl(addr, TOKEN, &["snapshot", "save", file.to_str().unwrap()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("Snapshot saved at"),
        "{}",
        stdout(&out)
    );
    assert_eq!(std::fs::read(&file).unwrap(), SNAPSHOT);
    assert!(!dir.join("snap.db.part").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
