//! A cluster of real `rdkv-server` processes with temporary data
//! directories: starting, restarting, joining, faults, clients by intent,
//! and waiting for leaders and applied indexes.
//!
//! Every node gets its own loopback address, 127.0.k.x (k: one per cluster
//! of this test process, x = 10 + node id), with ports chosen per test run.
//! A cluster's addresses are its own, so a port a killed node frees cannot
//! be taken by another test's node before it restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rdkv_client::{Client, ClientOptions, ClientTlsFiles, Fault, NodeStatus};

use crate::clients::{Intent, Replica, client_options};
use crate::netns;
use crate::node::NodeProc;
use crate::wait::eventually;

/// Budget of a fault-injection call.
const INJECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `rdkv-server` flags for a snapshot every 20 entries and no log kept
/// behind it: a node that misses a few dozen entries can only catch up by
/// snapshot, and the leader purges its log all the time.
pub const SNAPSHOT_OFTEN: [&str; 4] = ["--snapshot-entries", "20", "--snapshot-keep-entries", "0"];

#[derive(Debug)]
pub struct Cluster {
    pub nodes: BTreeMap<u64, NodeProc>,
    /// Dropped after the nodes (field order): namespaces go once the
    /// processes in them are gone.
    lab: Option<netns::Lab>,
    root: tempfile::TempDir,
    initial_cluster: String,
    /// Nodes started with `--join`, and the seed each joined through: they
    /// restart with `--join` again (a node that joined does not join twice).
    joined: BTreeMap<u64, String>,
    extra_args: Vec<String>,
    /// The token and TLS of the harness's own clients (status, leader
    /// waits, `client`).
    client_token: Option<String>,
    client_tls: Option<ClientTlsFiles>,
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
        Cluster::start_each(n, extra_args, |node| {
            node.env = env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            Ok(())
        })
    }

    /// Like [`Cluster::start_with`], after `prepare` has seen each node
    /// (its addresses are known by then) and set what is its own: flags
    /// (e.g. a certificate for its address), environment.
    pub fn start_each(
        n: u64,
        extra_args: &[&str],
        prepare: impl FnMut(&mut NodeProc) -> Result<()>,
    ) -> Result<Cluster> {
        Cluster::start_on_loopback(n, extra_args, prepare, &[])
    }

    /// Like [`Cluster::start_with`], but the nodes in `late` are not
    /// started: [`Cluster::restart`] starts one later, a member that comes
    /// up (with an empty data directory and the same `--initial-cluster`)
    /// after the others formed the cluster.
    pub fn start_late(n: u64, extra_args: &[&str], late: &[u64]) -> Result<Cluster> {
        Cluster::start_on_loopback(n, extra_args, |_| Ok(()), late)
    }

    fn start_on_loopback(
        n: u64,
        extra_args: &[&str],
        mut prepare: impl FnMut(&mut NodeProc) -> Result<()>,
        late: &[u64],
    ) -> Result<Cluster> {
        static NEXT_SUBNET: AtomicU32 = AtomicU32::new(0);
        let subnet =
            u8::try_from(NEXT_SUBNET.fetch_add(1, Ordering::Relaxed) % 250 + 1).unwrap_or(1);
        let root = tempfile::tempdir()?;
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            let mut node = NodeProc::on_loopback(id, root.path(), subnet);
            prepare(&mut node)?;
            nodes.insert(id, node);
        }
        Cluster::launch(nodes, None, root, extra_args, &mut |_, _| Ok(()), late)
    }

    /// Starts `n` nodes (on a subnet of their own, as [`Cluster::start`])
    /// whose data directories `prepare(node, initial_cluster)` fills before
    /// their first start, e.g. with `rdkvctl snapshot restore`.
    pub fn start_prepared(
        n: u64,
        extra_args: &[&str],
        mut prepare: impl FnMut(&NodeProc, &str) -> Result<()>,
    ) -> Result<Cluster> {
        static NEXT_SUBNET: AtomicU32 = AtomicU32::new(0);
        // Above the subnets `start_with_env` hands out from 1 (up to 250).
        let subnet =
            u8::try_from(NEXT_SUBNET.fetch_add(1, Ordering::Relaxed) % 4 + 251).unwrap_or(251);
        let root = tempfile::tempdir()?;
        let nodes = (1..=n)
            .map(|id| (id, NodeProc::on_loopback(id, root.path(), subnet)))
            .collect();
        Cluster::launch(nodes, None, root, extra_args, &mut prepare, &[])
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
        let nodes = (1..=n)
            .map(|id| {
                let node =
                    NodeProc::in_namespace(id, root.path(), lab.node_ip(id), lab.namespace(id));
                (id, node)
            })
            .collect();
        Cluster::launch(nodes, Some(lab), root, &extra, &mut |_, _| Ok(()), &[])
    }

    /// Starts `nodes` with `extra_args` (after their own) and an
    /// `--initial-cluster` naming all of them, each once `prepare` has seen
    /// it.
    fn launch(
        mut nodes: BTreeMap<u64, NodeProc>,
        lab: Option<netns::Lab>,
        root: tempfile::TempDir,
        extra_args: &[&str],
        prepare: &mut dyn FnMut(&NodeProc, &str) -> Result<()>,
        late: &[u64],
    ) -> Result<Cluster> {
        let extra_args: Vec<String> = extra_args.iter().map(|a| (*a).to_owned()).collect();
        for node in nodes.values_mut() {
            node.extra_args.extend(extra_args.iter().cloned());
        }
        let initial_cluster = nodes
            .values()
            .map(|node| format!("{}={}", node.id, node.peer_addr))
            .collect::<Vec<_>>()
            .join(",");
        for node in nodes.values() {
            prepare(node, &initial_cluster)?;
        }
        let ids: Vec<u64> = nodes.keys().copied().collect();
        let mut cluster = Cluster {
            nodes,
            lab,
            root,
            initial_cluster,
            joined: BTreeMap::new(),
            extra_args,
            client_token: None,
            client_tls: None,
        };
        for id in ids.into_iter().filter(|id| !late.contains(id)) {
            cluster.restart(id)?;
        }
        Ok(cluster)
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
        for node in self.nodes.values().filter(|n| n.was_started()) {
            self.inject(node.id, Fault::Heal).await?;
        }
        Ok(())
    }

    /// Makes node `id`'s log fsyncs `delay_ms` slower (0: normal again).
    pub async fn slow_fsync(&self, id: u64, delay_ms: u64) -> Result<()> {
        self.inject(id, Fault::SlowFsync { delay_ms }).await
    }

    /// Cuts node `id`'s Raft traffic with `peers` only, by the peer
    /// network's fault hook at `id`: both directions (it neither sends to
    /// them nor serves their frames), on any network kind, since unlike
    /// [`Cluster::partition`] the cut may be asymmetric (a peer that `id`
    /// cannot reach may still reach a third node). Calling it again
    /// replaces the set; [`Cluster::heal`] clears it.
    pub async fn isolate(&self, id: u64, peers: &[u64]) -> Result<()> {
        self.inject(
            id,
            Fault::Isolate {
                peers: peers.to_vec(),
            },
        )
        .await
    }

    async fn inject(&self, id: u64, fault: Fault) -> Result<()> {
        let endpoint = self.node(id)?.endpoint();
        let client = self.client_with(
            Intent::Via(&[id]),
            ClientOptions {
                request_timeout: INJECT_TIMEOUT,
                ..self.options(None)
            },
        )?;
        client
            .inject_fault(&endpoint, fault)
            .await
            .with_context(|| format!("injecting a fault into node {id}"))
    }

    /// (Re)starts node `id` with the cluster's initial membership, or, for
    /// a node that joined, with `--join` and its seed.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        let args = match self.joined.get(&id) {
            Some(seed) => vec!["--join".to_owned(), seed.clone()],
            None => vec!["--initial-cluster".to_owned(), self.initial_cluster.clone()],
        };
        self.node_mut(id)?.start(&args)
    }

    /// Starts a new node that joins through `seed`'s client address.
    pub fn join(&mut self, id: u64, seed: u64) -> Result<()> {
        self.join_with_env(id, seed, &[])
    }

    /// [`Cluster::join`] with extra environment for the new node's first start.
    pub fn join_with_env(&mut self, id: u64, seed: u64, env: &[(&str, &str)]) -> Result<()> {
        let extra_args = self.extra_args.clone();
        self.join_node(id, seed, extra_args, env)
    }

    /// [`Cluster::join`] with `extra_args` instead of the cluster's flags
    /// (e.g. another `--shards`, for a refused join).
    pub fn join_with_args(&mut self, id: u64, seed: u64, extra_args: &[&str]) -> Result<()> {
        let extra_args = extra_args.iter().map(|a| (*a).to_owned()).collect();
        self.join_node(id, seed, extra_args, &[])
    }

    fn join_node(
        &mut self,
        id: u64,
        seed: u64,
        extra_args: Vec<String>,
        env: &[(&str, &str)],
    ) -> Result<()> {
        let seed_addr = self.node(seed)?.endpoint();
        let mut node = match &mut self.lab {
            Some(lab) => {
                lab.add_node(id)?;
                NodeProc::in_namespace(id, self.root.path(), lab.node_ip(id), lab.namespace(id))
            }
            None => NodeProc::on_loopback(id, self.root.path(), self.subnet()),
        };
        node.extra_args = extra_args;
        node.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        node.start(&["--join".to_owned(), seed_addr.clone()])?;
        self.nodes.insert(id, node);
        self.joined.insert(id, seed_addr);
        Ok(())
    }

    /// The loopback subnet of this cluster's nodes (k of 127.0.k.x).
    fn subnet(&self) -> u8 {
        self.nodes
            .values()
            .next()
            .and_then(|n| match n.client_addr.ip() {
                std::net::IpAddr::V4(ip) => Some(ip.octets()[2]),
                std::net::IpAddr::V6(_) => None,
            })
            .unwrap_or(1)
    }

    pub fn node(&self, id: u64) -> Result<&NodeProc> {
        self.nodes.get(&id).with_context(|| format!("no node {id}"))
    }

    pub fn node_mut(&mut self, id: u64) -> Result<&mut NodeProc> {
        self.nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id}"))
    }

    /// The client endpoints of `intent`'s nodes.
    pub fn endpoints(&self, intent: Intent<'_>) -> Result<Vec<String>> {
        match intent {
            Intent::Any => Ok(self.nodes.values().map(NodeProc::endpoint).collect()),
            Intent::Via(ids) => ids
                .iter()
                .map(|id| Ok(self.node(*id)?.endpoint()))
                .collect(),
        }
    }

    /// From now on the harness's clients (status, leader waits, `client`,
    /// `replica`, `serving_client`) connect with `token` and `tls`: for
    /// clusters whose client ports need them.
    pub fn set_client_auth(&mut self, token: Option<&str>, tls: Option<ClientTlsFiles>) {
        self.client_token = token.map(str::to_owned);
        self.client_tls = tls;
    }

    /// The harness's client options with `token` (else the cluster's, see
    /// [`Cluster::set_client_auth`]) and the cluster's client TLS.
    pub fn options(&self, token: Option<&str>) -> ClientOptions {
        ClientOptions {
            tls: self.client_tls.clone(),
            ..client_options(token.or(self.client_token.as_deref()))
        }
    }

    /// A lazy client (it connects on first use) with the harness options.
    pub fn client(&self, intent: Intent<'_>) -> Result<Client> {
        self.client_with(intent, self.options(None))
    }

    /// [`Cluster::client`] with other options (a token, a transport, budgets).
    /// A client of any node with `token`, once the cluster answers it (a
    /// leader is known) and every node answers its own status: for clusters
    /// started with `--token`, whose tests then talk to each node's ports
    /// (a node still starting has not bound them: "connection refused").
    pub async fn serving_client(&self, token: &str) -> Result<Client> {
        let client = self.client_with(Intent::Any, self.options(Some(token)))?;
        eventually(LEADER_TIMEOUT, "a leader", async || {
            Ok(client.ping().await?)
        })
        .await?;
        for &id in self.nodes.keys() {
            let replica = self.replica_with(id, self.options(Some(token)))?;
            eventually(LEADER_TIMEOUT, &format!("node {id} serving"), async || {
                replica.status().await
            })
            .await?;
        }
        Ok(client)
    }

    /// A client over TCP (no one-sided reads) that talks to nodes `ids`
    /// only: what the partition tests read and write a cut side through.
    pub fn tcp_client_via(&self, ids: &[u64]) -> Result<Client> {
        self.client_with(
            Intent::Via(ids),
            ClientOptions {
                transport: rdkv_client::Transport::Tcp,
                ..client_options(None)
            },
        )
    }

    pub fn client_with(&self, intent: Intent<'_>, options: ClientOptions) -> Result<Client> {
        Ok(Client::new(&self.endpoints(intent)?, options)?)
    }

    /// Reads served by node `id` alone (see [`Replica`]).
    pub fn replica(&self, id: u64) -> Result<Replica> {
        self.replica_with(id, self.options(None))
    }

    /// [`Cluster::replica`] with other options (a token, budgets); the
    /// transport is always TCP.
    pub fn replica_with(&self, id: u64, options: ClientOptions) -> Result<Replica> {
        Replica::new(id, self.node(id)?.endpoint(), options)
    }

    /// Node `id`'s own status, asked directly.
    pub async fn status_of(&self, id: u64) -> Result<NodeStatus> {
        self.replica(id)?.status().await
    }

    /// Node `id`'s `/metrics`, parsed (refused unless valid exposition text).
    pub async fn metrics_of(&self, id: u64) -> Result<crate::prometheus::Exposition> {
        let addr = self.node(id)?.http_addr;
        let scrape = move || crate::prometheus::scrape(addr);
        tokio::task::spawn_blocking(scrape)
            .await?
            .with_context(|| format!("node {id}'s /metrics"))
    }

    /// GET and MGET requests the nodes have answered by RPC, all together:
    /// a one-sided read adds nothing to it.
    pub async fn served_gets(&self) -> Result<u64> {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.served_gets_of(&ids).await
    }

    /// [`Cluster::served_gets`] of nodes `ids` only (e.g. the survivors
    /// of a kill).
    pub async fn served_gets_of(&self, ids: &[u64]) -> Result<u64> {
        let mut total = 0;
        for id in ids {
            let status = self.status_of(*id).await?;
            total += status.served.get + status.served.mget;
        }
        Ok(total)
    }

    /// Waits until every running node reports the same leader; returns it.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> Result<u64> {
        eventually(timeout, "an agreed leader", async || {
            let running: Vec<u64> = self
                .nodes
                .iter_mut()
                .filter_map(|(id, n)| n.is_running().then_some(*id))
                .collect();
            let mut leaders = Vec::new();
            for id in &running {
                let status = self.status_of(*id).await.ok();
                leaders.push(status.and_then(|s| s.leader_id));
            }
            match leaders.first() {
                Some(Some(leader))
                    if leaders.iter().all(|l| *l == Some(*leader)) && running.contains(leader) =>
                {
                    Ok(*leader)
                }
                _ => bail!("the running nodes {running:?} see leaders {leaders:?}"),
            }
        })
        .await
    }

    /// Waits until one of `ids` reports a leader among `ids` other than
    /// `old` (the side of a partition without it has replaced it); returns it.
    pub async fn wait_for_leader_among(
        &self,
        ids: &[u64],
        old: u64,
        timeout: Duration,
    ) -> Result<u64> {
        eventually(
            timeout,
            &format!("a new leader among {ids:?}"),
            async || {
                for &id in ids {
                    if let Ok(status) = self.status_of(id).await
                        && let Some(leader) = status.leader_id
                        && leader != old
                        && ids.contains(&leader)
                    {
                        return Ok(leader);
                    }
                }
                bail!("none of {ids:?} reports a leader among them other than {old}")
            },
        )
        .await
    }

    /// Waits until node `id` has applied `index`, asking it directly (a node
    /// that is restarting and cannot answer yet is asked again).
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> Result<()> {
        eventually(timeout, &format!("node {id} applied {index}"), async || {
            let status = self.status_of(id).await?;
            ensure!(
                status.applied_index >= index,
                "node {id} has applied {}",
                status.applied_index
            );
            Ok(())
        })
        .await
    }

    /// Dumps every node's log (for a failing test's output).
    pub fn logs(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("==== node {} ====\n{}", n.id, n.log()))
            .collect()
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

    /// Node `id`'s region, mapped through its shm socket, for a test to look
    /// at directly (its header, a value the client path would not return).
    pub async fn map_region(&self, id: u64) -> Result<rdkv_fabric::RegionReader> {
        let socket = self
            .status_of(id)
            .await?
            .shm_socket
            .with_context(|| format!("node {id} has no shm socket"))?;
        let attached = rdkv_fabric::attach_shm(Path::new(&socket), None, "test-harness").await?;
        Ok(rdkv_fabric::RegionReader::attach(
            attached.memory,
            std::sync::Arc::new(rdkv_fabric::MonotonicClock::new()),
            rdkv_fabric::ReaderOptions {
                max_attempts: 8,
                abandon_after_us: None,
                expiry_margin_ms: rdkv_fabric::clock::DEFAULT_MAX_CLOCK_DRIFT_MS,
            },
        )?)
    }
}

/// How long the nodes of a new or restarted cluster get to agree on a
/// leader.
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// [`check`] (within `limit_secs` seconds) for a body that needs a leader:
/// waits (up to [`LEADER_TIMEOUT`]) until the nodes agree on one, then runs
/// `body` with its id.
pub async fn check_with_leader(
    cluster: &mut Cluster,
    limit_secs: u64,
    body: impl AsyncFnOnce(&mut Cluster, u64) -> Result<()>,
) -> Result<()> {
    check(cluster, Duration::from_secs(limit_secs), async |cluster| {
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await?;
        body(cluster, leader).await
    })
    .await
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
