//! Workspace binaries the tests run, and free ports for them to listen on.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Path of a workspace binary (`rdkv-server`, `rdkvctl`, `shm_reader`).
///
/// The first call builds every binary of the workspace once per test process,
/// with the profile and features this test was built with, and takes the
/// paths from cargo's own report: the test profile's dependencies are then
/// already compiled (a dev-profile build would compile all of them again,
/// minutes on a 2-core machine), and cargo does not copy test-profile
/// binaries to `target/debug`, so their path must come from cargo.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: Mutex<Option<Vec<(String, PathBuf)>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let built = built.get_or_insert_with(build_workspace_binaries);
    match built.iter().find(|(built_name, _)| built_name == name) {
        Some((_, path)) => path.clone(),
        None => panic!("the workspace has no binary named {name}"),
    }
}

/// `cargo build --workspace --bins` in this test's profile; the name and
/// path of every binary it reports.
fn build_workspace_binaries() -> Vec<(String, PathBuf)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let profile = if cfg!(debug_assertions) {
        "test"
    } else {
        "release"
    };
    let mut command = Command::new(cargo);
    command.args([
        "build",
        "--quiet",
        "--workspace",
        "--bins",
        "--profile",
        profile,
    ]);
    command.arg("--message-format=json-render-diagnostics");
    // Tests built with the rdma feature run servers built with it.
    if cfg!(feature = "rdma") {
        command.args(["--features", "rdma"]);
    }
    command.stderr(Stdio::inherit());
    let output = command.output().expect("running cargo build");
    assert!(
        output.status.success(),
        "cargo build --workspace --bins failed: {}",
        output.status
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(built_binary)
        .collect()
}

/// The binary a line of cargo's JSON report announces, if it announces one.
fn built_binary(line: &str) -> Option<(String, PathBuf)> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    let target = message.get("target")?;
    let is_bin = target
        .get("kind")?
        .as_array()?
        .iter()
        .any(|kind| kind == "bin");
    let executable = message.get("executable")?.as_str()?;
    let name = target.get("name")?.as_str()?;
    is_bin.then(|| (name.to_owned(), PathBuf::from(executable)))
}

/// A free TCP port on `ip` (bound then released; good enough for tests).
pub fn free_port(ip: &str) -> u16 {
    let [port] = free_ports(ip);
    port
}

/// `N` distinct free TCP ports on `ip`: all are held until all are chosen,
/// so the kernel cannot hand the same one out twice.
pub fn free_ports<const N: usize>(ip: &str) -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind((ip, 0)).expect("binding an ephemeral port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("local address").port())
}
