//! Helpers shared by the integration tests that run the built `rdkv-bench`
//! (each file under tests/ is its own crate and includes this module).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bench_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rdkv-bench"))
}

/// A workload file of bench/workloads.
pub fn workload(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(name)
        .display()
        .to_string()
}

/// Runs `rdkv-bench args`, echoing its output (shown when a test fails).
pub fn run(args: &[&str]) -> (Output, String) {
    let output = Command::new(bench_binary())
        .args(args)
        .env_remove("RDKV_SERVER_BIN")
        .output()
        .expect("running rdkv-bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!(
        "---- stdout ----\n{stdout}\n---- stderr ----\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (output, stdout)
}

/// The value of `[section], name, value` lines, in order.
pub fn values(stdout: &str, section: &str, name: &str) -> Vec<f64> {
    let prefix = format!("[{section}], {name}, ");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse::<f64>().expect("a number"))
        .collect()
}
