//! Tests that cannot run here say so where the output shows it.
//!
//! `cargo test` captures `println!`/`eprintln!` of a passing test, so a
//! skip printed that way is invisible; these write to the process's stderr
//! directly, which the harness does not capture. Under CI (`CI` set, as
//! `.ci/run` does) a test that CI is supposed to run must not skip: [`skip`]
//! fails it instead. Only a test that needs hardware CI does not have uses
//! [`skip_without_hardware`], which never fails.

use std::io::Write;

/// Whether this run is CI's: `CI` set to anything but empty, `0` or `false`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// `test` cannot do what it promises on this host, because of `reason`:
/// under CI this panics (CI is set up to run it); elsewhere it prints a
/// visible `skipped:` line and the caller returns (or runs what it can).
pub fn skip(test: &str, reason: &str) {
    assert!(
        !in_ci(),
        "{test}: would be skipped, but CI must run it: {reason}"
    );
    announce(test, reason);
}

/// `test` needs hardware this host lacks (an RDMA device): a visible
/// `skipped:` line, never a failure, CI included.
pub fn skip_without_hardware(test: &str, reason: &str) {
    announce(test, reason);
}

/// The name of the running test: libtest runs each test on a thread named
/// after it (a `#[tokio::test]` body runs on that thread too).
pub fn this_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned()
}

fn announce(test: &str, reason: &str) {
    // Uncaptured on purpose (see the module comment); a closed stderr leaves
    // nothing to tell.
    let _ = writeln!(std::io::stderr(), "{test}: skipped: {reason}");
}

/// Fault tests promise partitions that cut real links (network namespaces,
/// which need root and iproute2). A cluster that fell back to the peer
/// network's in-process fault hook does not keep that promise: under CI
/// that fails `test`; elsewhere it says so visibly and the test goes on
/// with the hook.
pub fn require_real_partitions(cluster: &crate::Cluster, test: &str) {
    if cluster.network_kind() != "netns" {
        skip(
            test,
            "real partitions need root and iproute2 (network namespaces); \
             partitions here are the peer network's in-process fault hook",
        );
    }
}
