//! Local servers a benchmark starts for itself and removes afterwards:
//! an N-node rdkv cluster of real `rdkv-server` processes on loopback
//! (`--embedded N`), a `redis-server` (`--start-redis`) and, with the
//! feature `etcd`, an N-member etcd cluster (`--start-etcd N`, module
//! `etcd`). Each lives in a temporary directory; dropping the handle kills
//! the processes and removes the directory, so an error or Ctrl-C (handled
//! by the binary, which then unwinds normally) leaves nothing behind.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkv_client::{Client, ClientOptions, ErrorCode};
use thiserror::Error;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub use etcd::LocalEtcd;

#[derive(Debug, Error)]
pub enum EmbeddedError {
    #[error(
        "rdkv-server not found at {0}: build it with `cargo build --release` \
         (it must sit next to rdkv-bench), or set RDKV_SERVER_BIN"
    )]
    ServerMissing(PathBuf),
    #[error(
        "redis-server not found on PATH: install it (Debian: apt-get install redis-server) \
         or set REDIS_SERVER_BIN"
    )]
    RedisMissing,
    #[cfg(feature = "etcd")]
    #[error(
        "etcd not found on PATH: install it (Debian: apt-get install etcd-server) \
         or set ETCD_BIN"
    )]
    EtcdMissing,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} exited early ({status}); its log:\n{log}")]
    Exited {
        what: String,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("{what} did not become ready within {timeout:?}{detail}")]
    NotReady {
        what: String,
        timeout: Duration,
        detail: String,
    },
    #[error("interrupted")]
    Interrupted,
}

/// A temporary directory for one run's servers, removed when dropped.
fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, EmbeddedError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(io("creating a temporary directory"))
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EmbeddedError {
    let what = what.into();
    move |source| EmbeddedError::Io { what, source }
}

/// A free TCP port on 127.0.0.1 (bound, then released for the child).
fn free_port() -> Result<u16, EmbeddedError> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// `RDKV_SERVER_BIN`, else `rdkv-server` next to this executable.
pub fn server_binary() -> Result<PathBuf, EmbeddedError> {
    let path = match std::env::var_os("RDKV_SERVER_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().map_err(io("locating rdkv-bench"))?;
            exe.parent()
                .unwrap_or_else(|| Path::new("."))
                .join("rdkv-server")
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(EmbeddedError::ServerMissing(path))
    }
}

#[derive(Debug)]
struct Proc {
    what: String,
    child: Option<Child>,
    log_path: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn check_running(&mut self) -> Result<(), EmbeddedError> {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            return Err(EmbeddedError::Exited {
                what: self.what.clone(),
                status,
                log: self.log(),
            });
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(what: &str, command: &mut Command, log_path: &Path) -> Result<Proc, EmbeddedError> {
    let log =
        std::fs::File::create(log_path).map_err(io(format!("creating {}", log_path.display())))?;
    let err = log.try_clone().map_err(io("opening the log"))?;
    let child = command
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(io(format!("starting {what}")))?;
    Ok(Proc {
        what: what.to_owned(),
        child: Some(child),
        log_path: log_path.to_owned(),
    })
}

#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nodes: u64,
    pub region_mib: u64,
    /// Extra `rdkv-server` flags for every node.
    pub extra_args: Vec<String>,
}

/// An rdkv cluster of local processes.
#[derive(Debug)]
pub struct EmbeddedCluster {
    // Declared before `dir` so the processes die before their directory goes.
    procs: Vec<Proc>,
    endpoints: Vec<String>,
    /// Each node's RESP port (`host:port`), by node id - 1.
    resp_endpoints: Vec<String>,
    dir: tempfile::TempDir,
}

impl EmbeddedCluster {
    /// Starts `options.nodes` nodes on 127.0.0.1 with free ports, forming one
    /// cluster through `--initial-cluster`.
    pub fn start(options: &ClusterOptions) -> Result<EmbeddedCluster, EmbeddedError> {
        let binary = server_binary()?;
        let dir = temp_dir("rdkv-bench-cluster-")?;
        let mut nodes = Vec::new();
        for id in 1..=options.nodes.max(1) {
            let client = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let peer = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let resp = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            nodes.push((id, client, peer, resp));
        }
        let initial_cluster = nodes
            .iter()
            .map(|(id, _, peer, _)| format!("{id}={peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut procs = Vec::new();
        for (id, client, peer, resp) in &nodes {
            let mut command = Command::new(&binary);
            command
                .arg("--id")
                .arg(id.to_string())
                .arg("--data-dir")
                .arg(dir.path().join(format!("node-{id}")))
                .arg("--listen")
                .arg(client.to_string())
                .arg("--peer-listen")
                .arg(peer.to_string())
                .args(["--http-listen", "off"])
                .arg("--resp-listen")
                .arg(resp.to_string())
                .arg("--region-mib")
                .arg(options.region_mib.to_string())
                .arg("--initial-cluster")
                .arg(&initial_cluster)
                .args(&options.extra_args)
                .env("RUST_LOG", "warn");
            let log_path = dir.path().join(format!("node-{id}.log"));
            procs.push(spawn(
                &format!("rdkv-server node {id}"),
                &mut command,
                &log_path,
            )?);
        }
        Ok(EmbeddedCluster {
            procs,
            endpoints: nodes.iter().map(|(_, c, _, _)| c.to_string()).collect(),
            resp_endpoints: nodes.iter().map(|(_, _, _, r)| r.to_string()).collect(),
            dir,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Node `id`'s RESP endpoint as a Redis URL.
    pub fn resp_url(&self, id: u64) -> Option<String> {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        Some(format!("redis://{}/", self.resp_endpoints.get(index)?))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until every node names the same leader.
    pub async fn wait_for_leader(
        &mut self,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<u64, EmbeddedError> {
        let deadline = Instant::now() + timeout;
        let options = ClientOptions {
            request_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        };
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(EmbeddedError::Interrupted);
            }
            for proc in &mut self.procs {
                proc.check_running()?;
            }
            let mut leaders = Vec::new();
            for endpoint in &self.endpoints {
                let leader = match Client::new(&[endpoint], options.clone()) {
                    Ok(client) => client
                        .status_of(endpoint)
                        .await
                        .ok()
                        .and_then(|s| s.leader_id),
                    Err(_) => None,
                };
                leaders.push(leader);
            }
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|l| *l == Some(*leader))
                && self.every_shard_led(&options).await
            {
                return Ok(*leader);
            }
            if Instant::now() > deadline {
                return Err(EmbeddedError::NotReady {
                    what: "the embedded rdkv cluster".into(),
                    timeout,
                    detail: format!(" (leaders seen per node: {leaders:?})"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl EmbeddedCluster {
    /// Whether every shard replica of every node knows its leader (a
    /// node older than shard status: its one group, checked by the caller).
    async fn every_shard_led(&self, options: &ClientOptions) -> bool {
        for endpoint in &self.endpoints {
            let Ok(client) = Client::new(&[endpoint], options.clone()) else {
                return false;
            };
            match client.shard_statuses_of(endpoint).await {
                Ok(shards) if shards.iter().all(|s| s.leader_id.is_some()) => {}
                Ok(_) => return false,
                Err(e) if e.code() == Some(ErrorCode::Malformed) => {}
                Err(_) => return false,
            }
        }
        true
    }
}

/// How the started redis-server persists writes (`--redis-fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisFsync {
    /// `--save '' --appendonly no`: nothing reaches the disk (Redis's
    /// cache configuration; rdkv fsyncs every write on a quorum).
    None,
    /// `--appendonly yes --appendfsync everysec` (Redis's default AOF mode).
    EverySec,
    /// `--appendonly yes --appendfsync always`: an fsync per write batch,
    /// the configuration comparable with rdkv's durability.
    Always,
}

impl RedisFsync {
    pub fn parse(s: &str) -> Option<RedisFsync> {
        match s {
            "none" | "no" => Some(RedisFsync::None),
            "everysec" => Some(RedisFsync::EverySec),
            "always" => Some(RedisFsync::Always),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            RedisFsync::None => "--save '' --appendonly no (no persistence, no fsync)",
            RedisFsync::EverySec => "--save '' --appendonly yes --appendfsync everysec",
            RedisFsync::Always => "--save '' --appendonly yes --appendfsync always",
        }
    }
}

/// A redis-server of our own.
#[derive(Debug)]
pub struct LocalRedis {
    proc: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl LocalRedis {
    pub fn start(fsync: RedisFsync) -> Result<LocalRedis, EmbeddedError> {
        let binary = match std::env::var_os("REDIS_SERVER_BIN") {
            Some(p) => PathBuf::from(p),
            None => find_on_path("redis-server").ok_or(EmbeddedError::RedisMissing)?,
        };
        let dir = temp_dir("rdkv-bench-redis-")?;
        let port = free_port()?;
        let mut command = Command::new(&binary);
        command
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(dir.path());
        match fsync {
            RedisFsync::None => command.args(["--appendonly", "no"]),
            RedisFsync::EverySec => {
                command.args(["--appendonly", "yes", "--appendfsync", "everysec"])
            }
            RedisFsync::Always => command.args(["--appendonly", "yes", "--appendfsync", "always"]),
        };
        let proc = spawn("redis-server", &mut command, &dir.path().join("redis.log"))?;
        let mut redis = LocalRedis {
            proc,
            port,
            _dir: dir,
        };
        redis.wait_ready(Duration::from_secs(10))?;
        Ok(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), EmbeddedError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.proc.check_running()?;
            if ping(self.port).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(EmbeddedError::NotReady {
                    what: "redis-server".into(),
                    timeout,
                    detail: format!("; its log:\n{}", self.proc.log()),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn ping(port: u16) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(std::io::Error::other("unexpected reply to PING"))
    }
}

pub fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}
