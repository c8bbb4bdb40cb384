//! Workspace binaries the tests run, and free ports for them to listen on.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result};

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

/// `cargo build --workspace --bins` in this test's profile and feature
/// resolution; the name and path of every binary it reports.
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
    // One test target in the build makes cargo resolve features the way
    // `cargo test` does (dev-dependencies included: proptest and criterion
    // turn on features of regex and zerocopy that the servers' dependencies
    // share). Without it the workspace's crates were compiled a second time
    // with the other feature set, over the same files, and then once more
    // by the next `cargo test`: minutes per test run on 2 cores. `rdma` is
    // part of every feature set and of CI's feature step, so it is built
    // already.
    command.args(["--test", "rdma"]);
    // And none of the variables cargo set for this test's own crate: ring's
    // build script asks to rerun when CARGO_PKG_NAME or CARGO_MANIFEST_DIR
    // change, and cargo compares them with its own environment, which for
    // this nested cargo is the test's. Inherited, they rebuilt ring and
    // everything above it (rustls, the workspace) once per package whose
    // tests run servers: about 200 s each on 2 cores.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_the_crate) {
            command.env_remove(name);
        }
    }
    command.arg("--message-format=json-render-diagnostics");
    // Tests built with the rdma feature run servers built with it.
    if cfg!(feature = "rdma") {
        command.args(["--features", "rdma"]);
    }
    // And with the ofi feature, servers built with that one.
    if cfg!(feature = "ofi") {
        command.args(["--features", "ofi"]);
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

/// Whether cargo sets `name` for the crate it runs (a test), rather than
/// it being the caller's setting (CARGO_HOME, CARGO_TARGET_DIR, ...).
fn set_by_cargo_for_the_crate(name: &str) -> bool {
    const EXACT: [&str; 9] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    EXACT.contains(&name) || name.starts_with("CARGO_PKG_") || name.starts_with("CARGO_BIN_EXE_")
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

/// Runs `rdkvctl args...` with `env` (off the async runtime's threads; see
/// [`rdkvctl_blocking`]).
pub async fn rdkvctl(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        rdkvctl_blocking(&args, &env)
    })
    .await?
}

/// [`rdkvctl`] that must exit 0: its output.
pub async fn rdkvctl_ok(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let out = rdkvctl(args, env).await?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "rdkvctl {args:?} failed ({}): stdout {:?} stderr {:?}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    Ok(out)
}

/// Runs `rdkvctl args...` with `env`, without the caller's `RDKV_ENDPOINTS`
/// and `RDKV_TOKEN`, and waits for it.
pub fn rdkvctl_blocking(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    Command::new(binary("rdkvctl"))
        .args(args)
        .env_remove("RDKV_ENDPOINTS")
        .env_remove("RDKV_TOKEN")
        .envs(env.iter().copied())
        .output()
        .context("running rdkvctl")
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_for_the_crate;

    #[test]
    fn only_the_crates_own_variables_are_dropped() {
        for name in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_BIN_EXE_rdkv-bench",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_for_the_crate(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_TERM_COLOR",
            "RUSTFLAGS",
        ] {
            assert!(!set_by_cargo_for_the_crate(name), "{name}");
        }
    }
}
