//! Test harness: builds and starts real `rdkv-server` processes on loopback,
//! each with its own data directory, and kills, restarts and stops them.
//!
//! Every node gets its own loopback address, 127.0.k.x (k: one per cluster
//! of this test process, x = 10 + node id), with ports chosen per test run.
//! A cluster's addresses are its own, so a port a killed node frees cannot
//! be taken by another test's node before it restarts.

pub mod history;
pub mod linearizability;
pub mod netns;
pub mod prometheus;
pub mod stress_value;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkv_client::{Client, ClientOptions, Fault};

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
    fn new(id: u64, root: &Path, subnet: u8) -> NodeProc {
        let ip = format!("127.0.{subnet}.{}", 10 + id);
        let addr = |port: u16| SocketAddr::new(ip.parse().expect("loopback ip"), port);
        let [client, peer, http, resp] = free_ports(&ip);
        NodeProc {
            id,
            client_addr: addr(client),
            peer_addr: addr(peer),
            http_addr: addr(http),
            resp_addr: addr(resp),
            data_dir: root.join(format!("node-{id}")),
            log_path: root.join(format!("node-{id}.log")),
            extra_args: Vec::new(),
            netns: None,
            env: Vec::new(),
            child: None,
        }
    }

    /// A node in its own network namespace at `ip`: the address is its
    /// own, so the ports can be the defaults.
    fn in_namespace(id: u64, root: &Path, ip: std::net::Ipv4Addr, netns: String) -> NodeProc {
        let addr = |port: u16| SocketAddr::new(ip.into(), port);
        NodeProc {
            id,
            client_addr: addr(7379),
            peer_addr: addr(7380),
            http_addr: addr(9379),
            resp_addr: addr(6380),
            data_dir: root.join(format!("node-{id}")),
            log_path: root.join(format!("node-{id}.log")),
            extra_args: Vec::new(),
            netns: Some(netns),
            env: Vec::new(),
            child: None,
        }
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
        let child = command
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
            .arg(self.resp_addr.to_string())
            .args(["--heartbeat-ms", "50", "--region-mib", "64"])
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

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            Command::new("kill").args(["-TERM", &pid]).status()?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        bail!("node {} exited with {status}", self.id);
                    }
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    bail!("node {} did not stop within 10 s", self.id);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
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

/// A cluster of real processes with temporary data directories.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: BTreeMap<u64, NodeProc>,
    /// Dropped after the nodes (field order): namespaces go once the
    /// processes in them are gone.
    lab: Option<netns::Lab>,
    root: tempfile::TempDir,
    initial_cluster: String,
    extra_args: Vec<String>,
}

impl Cluster {
    /// Starts `n` nodes that form a cluster from `--initial-cluster`.
    pub fn start(n: u64) -> Result<Cluster> {
        Cluster::start_with(n, &[])
    }

    /// Like [`Cluster::start`], with extra `rdkv-server` flags for every node
    /// (also used when a node is restarted or joins).
    pub fn start_with(n: u64, extra_args: &[&str]) -> Result<Cluster> {
        Cluster::start_with_env(n, extra_args, &[])
    }

    /// Like [`Cluster::start_with`], with extra environment for every start
    /// of every node (e.g. `RDKV_DURABILITY_JOURNAL`).
    pub fn start_with_env(n: u64, extra_args: &[&str], env: &[(&str, &str)]) -> Result<Cluster> {
        static NEXT_SUBNET: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let subnet =
            u8::try_from(NEXT_SUBNET.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 250 + 1)
                .unwrap_or(1);
        let root = tempfile::tempdir()?;
        let extra: Vec<String> = extra_args.iter().map(|a| (*a).to_owned()).collect();
        let nodes: BTreeMap<u64, NodeProc> = (1..=n)
            .map(|id| {
                let mut node = NodeProc::new(id, root.path(), subnet);
                node.extra_args = extra.clone();
                node.env = env
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                (id, node)
            })
            .collect();
        Cluster::launch(nodes, None, root, extra)
    }

    /// Starts `nodes` with an `--initial-cluster` naming all of them.
    fn launch(
        nodes: BTreeMap<u64, NodeProc>,
        lab: Option<netns::Lab>,
        root: tempfile::TempDir,
        extra_args: Vec<String>,
    ) -> Result<Cluster> {
        let initial_cluster = nodes
            .values()
            .map(|node| format!("{}={}", node.id, node.peer_addr))
            .collect::<Vec<_>>()
            .join(",");
        let ids: Vec<u64> = nodes.keys().copied().collect();
        let mut cluster = Cluster {
            nodes,
            lab,
            root,
            initial_cluster,
            extra_args,
        };
        for id in ids {
            cluster.restart(id)?;
        }
        Ok(cluster)
    }

    /// A cluster for fault tests: nodes accept fault injection, and where
    /// this host allows it (root, iproute2) each runs in its own network
    /// namespace so that [`Cluster::partition`] cuts real links; otherwise
    /// they run on 127.0.0.x and partitions use the peer network's
    /// fault-injection hook. [`Cluster::network_kind`] says which.
    pub fn start_faulty(n: u64, extra_args: &[&str]) -> Result<Cluster> {
        let mut extra: Vec<&str> = vec!["--fault-injection"];
        extra.extend_from_slice(extra_args);
        if !netns::Lab::available() {
            return Cluster::start_with(n, &extra);
        }
        // The bridge is a private network, but not loopback: the server
        // wants a token or --insecure for that.
        extra.push("--insecure");
        let lab = netns::Lab::create(n)?;
        let root = tempfile::tempdir()?;
        let extra: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
        let nodes: BTreeMap<u64, NodeProc> = (1..=n)
            .map(|id| {
                let mut node =
                    NodeProc::in_namespace(id, root.path(), lab.node_ip(id), lab.namespace(id));
                node.extra_args = extra.clone();
                (id, node)
            })
            .collect();
        Cluster::launch(nodes, Some(lab), root, extra)
    }

    /// `"netns"` or `"loopback"`: how partitions are made in this cluster.
    pub fn network_kind(&self) -> &'static str {
        if self.lab.is_some() {
            "netns"
        } else {
            "loopback"
        }
    }

    /// Cuts Raft traffic between every pair of nodes in different groups
    /// (both directions); clients still reach every node. Replaces any
    /// previous partition.
    pub async fn partition(&self, groups: &[&[u64]]) -> Result<()> {
        if let Some(lab) = &self.lab {
            return lab.partition(groups);
        }
        for group in groups {
            let others: Vec<u64> = groups
                .iter()
                .filter(|g| !std::ptr::eq(**g, *group))
                .flat_map(|g| g.iter().copied())
                .collect();
            for &id in *group {
                self.inject(
                    id,
                    Fault::Isolate {
                        peers: others.clone(),
                    },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Removes partitions and slow disks.
    pub async fn heal(&self) -> Result<()> {
        if let Some(lab) = &self.lab {
            lab.heal()?;
        }
        for id in self.nodes.keys() {
            if self.nodes.get(id).is_some_and(|n| n.child.is_some()) {
                self.inject(*id, Fault::Heal).await?;
            }
        }
        Ok(())
    }

    /// Makes node `id`'s log fsyncs `delay_ms` slower (0: normal again).
    pub async fn slow_fsync(&self, id: u64, delay_ms: u64) -> Result<()> {
        self.inject(id, Fault::SlowFsync { delay_ms }).await
    }

    async fn inject(&self, id: u64, fault: Fault) -> Result<()> {
        let endpoint = self.node(id)?.client_addr.to_string();
        let client = Client::new(
            std::slice::from_ref(&endpoint),
            ClientOptions {
                request_timeout: Duration::from_secs(5),
                ..ClientOptions::default()
            },
        )?;
        client
            .inject_fault(&endpoint, fault)
            .await
            .with_context(|| format!("injecting a fault into node {id}"))
    }

    /// (Re)starts node `id` with the cluster's initial membership.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        let args = vec!["--initial-cluster".to_owned(), self.initial_cluster.clone()];
        self.node_mut(id)?.start(&args)
    }

    /// Starts a new node that joins through `seed`'s client address.
    pub fn join(&mut self, id: u64, seed: u64) -> Result<()> {
        self.join_with_env(id, seed, &[])
    }

    /// [`Cluster::join`] with extra environment for the new node's first start.
    pub fn join_with_env(&mut self, id: u64, seed: u64, env: &[(&str, &str)]) -> Result<()> {
        let seed_addr = self.node(seed)?.client_addr.to_string();
        let mut node = match &mut self.lab {
            Some(lab) => {
                lab.add_node(id)?;
                NodeProc::in_namespace(id, self.root.path(), lab.node_ip(id), lab.namespace(id))
            }
            None => {
                // Beside the cluster's other nodes (node 1's address, this id).
                let subnet = self
                    .nodes
                    .values()
                    .next()
                    .and_then(|n| match n.client_addr.ip() {
                        std::net::IpAddr::V4(ip) => Some(ip.octets()[2]),
                        std::net::IpAddr::V6(_) => None,
                    })
                    .unwrap_or(1);
                NodeProc::new(id, self.root.path(), subnet)
            }
        };
        node.extra_args = self.extra_args.clone();
        node.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        node.start(&["--join".to_owned(), seed_addr])?;
        self.nodes.insert(id, node);
        Ok(())
    }

    pub fn node(&self, id: u64) -> Result<&NodeProc> {
        self.nodes.get(&id).with_context(|| format!("no node {id}"))
    }

    pub fn node_mut(&mut self, id: u64) -> Result<&mut NodeProc> {
        self.nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id}"))
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .values()
            .map(|n| n.client_addr.to_string())
            .collect()
    }

    pub async fn client(&self) -> Result<Client> {
        let options = ClientOptions {
            request_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        };
        Ok(Client::new(&self.endpoints(), options)?)
    }

    pub async fn client_of(&self, id: u64) -> Result<Client> {
        let endpoint = self.node(id)?.client_addr.to_string();
        let options = ClientOptions {
            request_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        };
        // Lazy: connects on first use and retries reads while the node starts.
        Ok(Client::new(&[endpoint], options)?)
    }

    /// Waits until every running node reports the same leader; returns it.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut leaders = Vec::new();
            let running: Vec<u64> = self
                .nodes
                .iter_mut()
                .filter_map(|(id, n)| n.is_running().then_some(*id))
                .collect();
            for id in &running {
                let status = match self.client_of(*id).await {
                    Ok(client) => client.status().await.ok(),
                    Err(_) => None,
                };
                leaders.push(status.and_then(|s| s.leader_id));
            }
            if let Some(Some(leader)) = leaders.first().copied()
                && leaders.iter().all(|l| *l == Some(leader))
                && running.contains(&leader)
            {
                return Ok(leader);
            }
            if Instant::now() > deadline {
                bail!("no agreed leader within {timeout:?}: {leaders:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Dumps every node's log (for a failing test's output).
    pub fn logs(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("==== node {} ====\n{}", n.id, n.log()))
            .collect()
    }
}

// ---- helpers shared by the fault, membership, crash, CLI and bad-input tests ----

/// Client options the harness uses: a 10 s budget per call, optionally a token.
pub fn client_options(token: Option<&str>) -> ClientOptions {
    ClientOptions {
        token: token.map(str::to_owned),
        request_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    }
}

/// Retries `attempt` every 100 ms until it succeeds or `timeout` passes; then
/// fails with the last error, saying what was awaited.
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut attempt: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("{what}: not within {timeout:?}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Runs a test body against `cluster` with a time bound, then checks that no
/// node panicked; on any failure dumps every node's log.
pub async fn check(
    cluster: &mut Cluster,
    limit: Duration,
    body: impl AsyncFnOnce(&mut Cluster) -> Result<()>,
) -> Result<()> {
    let result = match tokio::time::timeout(limit, body(cluster)).await {
        Ok(result) => result,
        Err(_) => Err(anyhow::anyhow!("the test did not finish within {limit:?}")),
    };
    let result = result.and_then(|()| cluster.check_no_panics());
    if let Err(e) = &result {
        eprintln!("test failed: {e:#}\n{}", cluster.logs());
    }
    result
}

impl Cluster {
    /// A lazy client of node `id` alone, with the given options (e.g. a token).
    pub fn client_of_with(&self, id: u64, options: ClientOptions) -> Result<Client> {
        let endpoint = self.node(id)?.client_addr.to_string();
        Ok(Client::new(&[endpoint], options)?)
    }

    /// A lazy client of every node, with the given options.
    pub fn client_with(&self, options: ClientOptions) -> Result<Client> {
        Ok(Client::new(&self.endpoints(), options)?)
    }

    /// Node `id`'s own status, asked directly.
    pub async fn status_of(&self, id: u64) -> Result<rdkv_client::NodeStatus> {
        let endpoint = self.node(id)?.client_addr.to_string();
        let client = self.client_of(id).await?;
        Ok(client.status_of(&endpoint).await?)
    }

    /// Waits until node `id` has applied `index`, asking it directly (a node
    /// that is restarting and cannot answer yet is asked again).
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status_of(id).await;
            if status.as_ref().is_ok_and(|s| s.applied_index >= index) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("node {id} never applied {index} within {timeout:?}: {status:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Fails if any node's log shows a panic.
    pub fn check_no_panics(&self) -> Result<()> {
        for node in self.nodes.values() {
            let log = node.log();
            if let Some(line) = log.lines().find(|l| l.contains("panicked")) {
                bail!("node {} panicked: {line}", node.id);
            }
        }
        Ok(())
    }

    /// The temporary directory holding every node's data directory and log.
    pub fn root(&self) -> &Path {
        self.root.path()
    }
}

// ---- freezing a node: SIGSTOP / SIGCONT ----

impl NodeProc {
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
}
