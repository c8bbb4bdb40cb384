//! `--start-etcd N` (feature `etcd`): an N-member etcd cluster of local
//! `etcd` processes on free loopback ports, each in its own directory under
//! one temporary directory, removed on drop like the rdkv cluster.
//!
//! The members run with etcd's defaults otherwise: every write is in the
//! WAL and fsynced on a quorum before it is acknowledged, as rdkv's are. On
//! an architecture etcd does not support officially, set
//! `ETCD_UNSUPPORTED_ARCH` in the environment; the members inherit it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{EmbeddedError, Proc, find_on_path, free_port, spawn, temp_dir};
use crate::driver::etcd::{EtcdFactory, probe};

/// The lines of each member's log shown when the cluster does not start.
const LOG_TAIL_LINES: usize = 20;

/// An etcd cluster of local processes.
#[derive(Debug)]
pub struct LocalEtcd {
    // Declared before `dir` so the processes die before their directory goes.
    procs: Vec<Proc>,
    endpoints: Vec<String>,
    dir: tempfile::TempDir,
}

/// `ETCD_BIN`, else `etcd` on PATH.
fn etcd_binary() -> Result<PathBuf, EmbeddedError> {
    match std::env::var_os("ETCD_BIN") {
        Some(p) => Ok(PathBuf::from(p)),
        None => find_on_path("etcd").ok_or(EmbeddedError::EtcdMissing),
    }
}

/// One member's name and URLs.
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
}

impl LocalEtcd {
    /// Starts `members` members (at least 1) on 127.0.0.1 with free ports,
    /// forming one new cluster through `--initial-cluster`.
    pub fn start(members: u64) -> Result<LocalEtcd, EmbeddedError> {
        let binary = etcd_binary()?;
        let dir = temp_dir("rdkv-bench-etcd-")?;
        let mut planned = Vec::new();
        for i in 1..=members.max(1) {
            planned.push(Member {
                name: format!("m{i}"),
                client: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
                peer: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
            });
        }
        let initial_cluster = planned
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut procs = Vec::new();
        for member in &planned {
            let mut command = member_command(&binary, member, &dir, &initial_cluster);
            let log_path = dir.path().join(format!("{}.log", member.name));
            procs.push(spawn(
                &format!("etcd member {}", member.name),
                &mut command,
                &log_path,
            )?);
        }
        Ok(LocalEtcd {
            procs,
            endpoints: planned.iter().map(|m| m.client.to_string()).collect(),
            dir,
        })
    }

    /// The members' client addresses (`host:port`).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until a put and a get through the client succeed (which needs
    /// an elected leader and a quorum), or a member exits, or `timeout`.
    pub async fn wait_ready(
        &mut self,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<(), EmbeddedError> {
        let deadline = Instant::now() + timeout;
        // Short attempts, so one that hangs on a member still starting does
        // not use up the whole wait.
        let factory = EtcdFactory {
            endpoints: self.endpoints.clone(),
            request_timeout: Duration::from_secs(1),
        };
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(EmbeddedError::Interrupted);
            }
            for proc in &mut self.procs {
                proc.check_running()?;
            }
            let error = match probe(&factory).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(EmbeddedError::NotReady {
                    what: "the etcd cluster".into(),
                    timeout,
                    detail: format!(" (last error: {error}){}", self.log_tails()),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The end of every member's log, for an error message.
    fn log_tails(&self) -> String {
        let mut out = String::new();
        for proc in &self.procs {
            let log = proc.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            out.push_str(&format!("\n{} log (end):\n{}", proc.what, tail.join("\n")));
        }
        out
    }
}

/// The command line of one member, as etcd's clustering guide has it for a
/// static cluster.
fn member_command(
    binary: &Path,
    member: &Member,
    dir: &tempfile::TempDir,
    initial_cluster: &str,
) -> Command {
    let client_url = format!("http://{}", member.client);
    let peer_url = format!("http://{}", member.peer);
    let mut command = Command::new(binary);
    command
        .arg("--name")
        .arg(&member.name)
        .arg("--data-dir")
        .arg(dir.path().join(&member.name))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", initial_cluster])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", "rdkv-bench"])
        // etcd reads ETCD_* variables as flags; this one is ours.
        .env_remove("ETCD_BIN");
    command
}
