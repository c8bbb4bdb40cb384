//! One `rdkv-server` process: its addresses, data directory and log, and
//! starting, killing, stopping, freezing and thawing it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::binary::{binary, free_ports};

/// How long a SIGTERMed node may take to exit.
const STOP_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct NodeProc {
    pub id: u64,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The RESP (Redis protocol) port.
    pub resp_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    pub extra_args: Vec<String>,
    /// The network namespace the node runs in (fault tests), if any.
    pub netns: Option<String>,
    /// Extra environment for the next start (e.g. `RDKV_FAILPOINTS`).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
}

impl NodeProc {
    /// A node on loopback at 127.0.`subnet`.(10 + id), with free ports.
    pub(crate) fn on_loopback(id: u64, root: &Path, subnet: u8) -> NodeProc {
        let ip = format!("127.0.{subnet}.{}", 10 + id);
        let addr = |port: u16| SocketAddr::new(ip.parse().expect("loopback ip"), port);
        let [client, peer, http, resp] = free_ports(&ip);
        NodeProc::at(
            id,
            root,
            [addr(client), addr(peer), addr(http), addr(resp)],
            None,
        )
    }

    /// A node in its own network namespace at `ip`: the address is its
    /// own, so the ports can be the defaults.
    pub(crate) fn in_namespace(
        id: u64,
        root: &Path,
        ip: std::net::Ipv4Addr,
        netns: String,
    ) -> NodeProc {
        let addr = |port: u16| SocketAddr::new(ip.into(), port);
        NodeProc::at(
            id,
            root,
            [addr(7379), addr(7380), addr(9379), addr(6380)],
            Some(netns),
        )
    }

    /// `addrs`: client, peer, HTTP and RESP addresses, in that order.
    fn at(id: u64, root: &Path, addrs: [SocketAddr; 4], netns: Option<String>) -> NodeProc {
        let [client_addr, peer_addr, http_addr, resp_addr] = addrs;
        NodeProc {
            id,
            client_addr,
            peer_addr,
            http_addr,
            resp_addr,
            data_dir: root.join(format!("node-{id}")),
            log_path: root.join(format!("node-{id}.log")),
            extra_args: Vec::new(),
            netns,
            env: Vec::new(),
            child: None,
        }
    }

    /// The client endpoint, as clients are given it.
    pub fn endpoint(&self) -> String {
        self.client_addr.to_string()
    }

    pub fn start(&mut self, cluster_args: &[String]) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                bail!("node {} is already running", self.id);
            }
            // It exited on its own (a crash, a failpoint): start afresh.
            self.child = None;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .context("opening the node log")?;
        let child = self
            .command()
            .args(cluster_args)
            .args(&self.extra_args)
            .env("RUST_LOG", "info,openraft=warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning rdkv-server")?;
        self.child = Some(child);
        Ok(())
    }

    /// `rdkv-server` (in the node's namespace, if any) with its identity,
    /// directories and addresses.
    fn command(&self) -> Command {
        let mut command = match &self.netns {
            // `ip netns exec` execs the server: the child's pid is the server's.
            Some(ns) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", ns])
                    .arg(binary("rdkv-server"));
                command
            }
            None => Command::new(binary("rdkv-server")),
        };
        command
            .arg("--id")
            .arg(self.id.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(self.client_addr.to_string())
            .arg("--peer-listen")
            .arg(self.peer_addr.to_string())
            .arg("--http-listen")
            .arg(self.http_addr.to_string())
            .arg("--resp-listen")
            .arg(self.resp_addr.to_string());
        // The harness's heartbeat and region size unless the test sets its
        // own (a flag given twice is refused).
        for (flag, value) in [("--heartbeat-ms", "50"), ("--region-mib", "64")] {
            if !self.extra_args.iter().any(|a| a == flag) {
                command.args([flag, value]);
            }
        }
        command
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + STOP_WITHIN;
        // A blocking wait on the child, polled: `Child::wait` has no timeout.
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("node {} exited with {status}", self.id);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("node {} did not stop within {STOP_WITHIN:?}", self.id);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Whether a process was started and not yet killed or stopped (it
    /// may have exited on its own since).
    pub fn was_started(&self) -> bool {
        self.child.is_some()
    }

    /// The running child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: the process freezes where it is (no shutdown path runs, its
    /// sockets stay open, its region keeps the last state it published)
    /// until [`NodeProc::resume`]. A paused node is still killed by `kill`
    /// and on drop (SIGKILL ends a stopped process too).
    pub fn pause(&mut self) -> Result<()> {
        self.signal("STOP")
    }

    /// SIGCONT: undoes [`NodeProc::pause`]; harmless on a running node.
    pub fn resume(&mut self) -> Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, name: &str) -> Result<()> {
        let pid = self
            .pid()
            .with_context(|| format!("node {} is not running", self.id))?;
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{name} {pid} (node {}) failed: {status}", self.id);
        }
        Ok(())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The segment files of the Raft log in a node's `data_dir`, by first index.
pub fn log_segments(data_dir: &Path) -> Result<BTreeMap<u64, PathBuf>> {
    let dir = data_dir.join("raft-log");
    rdkv_storage::raft_log::segment::segment_files(&dir)
        .with_context(|| format!("listing the log segments in {}", dir.display()))
}
