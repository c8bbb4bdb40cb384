//! Workspace binaries the tests run, and free ports for them to listen on.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Path of a workspace binary (`rdkv-server`, `rdkvctl`), built once per
/// test process with the profile this test was built with: cargo builds only
/// the binaries of the package under test, and these live in other packages.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !built.iter().any(|b| b == name) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut command = Command::new(cargo);
        let package = match name {
            "rdkvctl" => "rdkv-cli",
            // Helper processes of the tests themselves (`tests/src/bin`).
            "shm_reader" => "rdkv-tests",
            other => other,
        };
        command.args(["build", "--quiet", "-p", package, "--bin", name]);
        // Tests built with the rdma feature run servers built with it.
        if cfg!(feature = "rdma") {
            command.args(["--features", "rdma"]);
        }
        if !cfg!(debug_assertions) {
            command.arg("--release");
        }
        let status = command.status().expect("running cargo build");
        assert!(
            status.success(),
            "cargo build --bin {name} failed: {status}"
        );
        built.push(name.to_owned());
    }
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable inside target/<profile>/deps");
    dir.join(name)
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
