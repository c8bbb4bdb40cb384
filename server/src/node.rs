//! A running node: the data directory, the Raft instance with its log store,
//! state machine and network, the listeners, and the tasks around them.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use openraft::SnapshotPolicy;
use openraft::errors::{InitializeError, RaftError};
use rdkv_proto::shard::{NodeInfo, ShardId, ShardMap};
use rdkv_proto::wire::{Limits, SINGLE_ENTRY_OVERHEAD_BYTES};
use rdkv_storage::RegionConfig;
use rdkv_storage::raft::NodeAddr;
use rdkv_storage::raft_log::{LogOptions, LogStore};
use rdkv_storage::state_machine::{RegionStateMachine, StateMachineConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::Raft;
use crate::accept::TcpFront;
use crate::config::Config;
use crate::hosting::{Hosting, HostingParts};
use crate::layout::Layout;
use crate::meta::Meta;
use crate::peer::{
    FenceClients, PeerContext, PeerLinks, PeerNetwork, PeerShards, SNAPSHOT_CHUNK_BYTES,
    serve_peers,
};
use crate::placement;
use crate::replica::{Replica, ReplicaParts};
use crate::service::proposals::Proposals;
use crate::service::read_fence::{FenceOutcomes, ReadFence};
use crate::service::read_rounds::ReadRounds;
use crate::service::{Endpoints, Handler, HandlerSettings, serve_clients, serve_unix_clients};
use crate::shards::Shards;
use crate::tls::NodeTls;

/// Background tasks of a node, aborted when dropped: a start that fails
/// half-way leaves nothing running.
#[derive(Debug, Default)]
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Tasks {
    fn push(&mut self, task: tokio::task::JoinHandle<()>) {
        self.0.push(task);
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What a started node exposes to its owner (main, or a test).
#[derive(Debug)]
pub struct Node {
    /// Every shard replica of this node (one in a single group).
    shards: Shards,
    pub handler: Arc<Handler>,
    shutdown: watch::Sender<bool>,
    tasks: Tasks,
    /// Held for the node's lifetime: a second process on the same data
    /// directory would corrupt it.
    _lock: File,
}

fn lock_data_dir(config: &Config) -> Result<File> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
    let path = config.data_dir.join("LOCK");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    if file.try_lock().is_err() {
        bail!(
            "data directory {} is in use by another rdkv-server",
            config.data_dir.display()
        );
    }
    Ok(file)
}

fn raft_config(config: &Config) -> Result<openraft::Config> {
    let heartbeat = config.heartbeat_ms;
    let raft = openraft::Config {
        cluster_name: "rdkv".into(),
        heartbeat_interval: heartbeat,
        election_timeout_min: heartbeat * 5,
        election_timeout_max: heartbeat * 10,
        // Appends carry values up to 1 MiB: keep one append frame bounded.
        max_payload_entries: 64,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_entries),
        max_in_snapshot_log_to_keep: config.snapshot_keep_entries,
        // A purge is scheduled only after a snapshot, so the snapshot
        // interval already batches purges; a larger batch kept the log a
        // dead follower needed for hundreds of entries past every snapshot,
        // and whether it caught up by snapshot or by log was luck.
        purge_batch_size: 1,
        install_snapshot_timeout: 60_000,
        // After failed requests a replication stream sleeps this long before
        // each next one until one succeeds: one heartbeat (a single anchor
        // capped at itself: constant), as etcd's leader probes a follower
        // once per heartbeat. openraft's default doubles it from 200 ms to
        // 1 s, which a follower back from down waited before its first
        // entries. (While the follower refuses connections the dials are
        // paced by `peer::redial`; snapshot sends after unreachable errors
        // are paced by this wait too.)
        backoff: format!("{heartbeat}ms ...{heartbeat}ms"),
        // Replicate entries as soon as they are written to the log (readable
        // at once from the page cache), so the leader's fsync overlaps the
        // followers' (Raft thesis 10.2.1): the leader's own append counts
        // toward the quorum only once flushed, so nothing is committed on
        // fewer durable copies than before.
        broadcast_submitted_on_append: Some(true),
        // A follower whose disk lost acknowledged entries (a torn or
        // corrupted tail cut off on restart) is repaired by resending them,
        // instead of the leader treating it as impossible.
        allow_log_reversion: Some(true),
        // A restarted leader must not resume leading at once: the region of
        // its previous incarnation may still be mapped by clients with a lease
        // that has not run out. Winning an election takes at least the minimum
        // election timeout, which is exactly the lease's length.
        enable_leader_restore: Some(false),
        ..openraft::Config::default()
    };
    raft.validate().context("raft configuration")
}

/// The sockets a node listens on, bound before anything starts: a port in
/// use fails the start before Raft runs.
#[derive(Debug)]
struct Listeners {
    peer: TcpListener,
    front: FrontEnds,
}

/// The listeners clients reach: the native protocol, RESP and HTTP.
#[derive(Debug)]
struct FrontEnds {
    native: TcpListener,
    resp: Option<TcpListener>,
    http: Option<TcpListener>,
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} address {addr}"))
}

async fn bind_optional(addr: Option<SocketAddr>, what: &str) -> Result<Option<TcpListener>> {
    match addr {
        Some(addr) => bind(addr, what).await.map(Some),
        None => Ok(None),
    }
}

impl Listeners {
    async fn bind(config: &Config) -> Result<Listeners> {
        let native = bind(config.listen, "client").await?;
        let peer = bind(config.peer_listen, "peer").await?;
        let resp = bind_optional(config.resp_listen, "resp").await?;
        let http = bind_optional(config.http_listen, "http").await?;
        Ok(Listeners {
            peer,
            front: FrontEnds { native, resp, http },
        })
    }
}

fn local_addr(listener: Option<&TcpListener>) -> Option<String> {
    listener
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
}

impl FrontEnds {
    fn endpoints(&self, config: &Config) -> Endpoints {
        Endpoints {
            client: config.listen.to_string(),
            rpc_socket: config.rpc_socket.as_ref().map(|p| p.display().to_string()),
            shm_socket: config.shm_socket.as_ref().map(|p| p.display().to_string()),
            resp: local_addr(self.resp.as_ref()),
            http: local_addr(self.http.as_ref()),
        }
    }

    /// Serves every front end (and the Unix sockets the config names) until
    /// shutdown.
    fn spawn(
        self,
        config: &Config,
        tls: &NodeTls,
        handler: &Arc<Handler>,
        shutdown: &watch::Receiver<bool>,
        tasks: &mut Tasks,
    ) -> Result<()> {
        let front = |listener| TcpFront::new(listener, tls.front.clone());
        if let Some(path) = &config.rpc_socket {
            let listener = bind_unix(path)?;
            let handler = Arc::clone(handler);
            tasks.push(tokio::spawn(serve_unix_clients(
                listener,
                handler,
                shutdown.clone(),
            )));
        }
        let handler_for_native = Arc::clone(handler);
        tasks.push(tokio::spawn(serve_clients(
            front(self.native),
            handler_for_native,
            shutdown.clone(),
        )));
        if let Some(path) = &config.shm_socket {
            let listener = bind_unix(path)?;
            let shards = handler.shards().clone();
            tasks.push(tokio::spawn(rdkv_fabric::serve_shm(
                listener,
                config.token.clone(),
                config.id,
                move |shard| shards.shm_region(shard),
                shutdown.clone(),
            )));
        }
        if let Some(listener) = self.resp {
            let port = listener.local_addr().map_or(0, |a| a.port());
            let resp = Arc::new(crate::resp::RespServer::new(
                Arc::clone(handler),
                config.resp_read_consistency,
                config.resp_cluster_mode,
                own_client_options(config, tls),
                port,
            ));
            tasks.push(tokio::spawn(crate::resp::serve_resp(
                front(listener),
                resp,
                shutdown.clone(),
            )));
        }
        if let Some(listener) = self.http {
            let handler = Arc::clone(handler);
            tasks.push(tokio::spawn(crate::http::serve_http(
                front(listener),
                handler,
                shutdown.clone(),
            )));
        }
        Ok(())
    }
}

pub(crate) fn region_config(config: &Config) -> RegionConfig {
    RegionConfig {
        region_bytes: config.region_bytes,
        bytes_per_slot: config.bytes_per_slot,
        max_value_bytes: config.max_value_bytes,
        grace_period_us: config.grace_period_ms * 1000,
        node_id: config.id,
        ..RegionConfig::default()
    }
}

/// Says which pages this node's regions will sit on
/// (`rdkv_fabric::pages`): an operator who left shared memory's huge
/// pages off is told what that costs and how to turn them on, as Redis
/// warns about the kernel settings it cares about.
fn log_region_pages(region: &RegionConfig) {
    use rdkv_fabric::pages::{SHMEM_SETTING_PATH, ThpSetting};
    if !region.shared_memory {
        return;
    }
    match ThpSetting::shmem() {
        Ok(setting) if setting.allows_advised_mappings() => tracing::info!(
            "regions ask for 2 MiB pages, which {SHMEM_SETTING_PATH} ({}) allows",
            setting.0
        ),
        Ok(setting) => tracing::warn!(
            "regions stay on 4 KiB pages ({SHMEM_SETTING_PATH}: {}): a one-sided GET \
             that misses the caches waits for two page walks too (docs/operations.md, \
             \"Huge pages\"); `echo advise > {SHMEM_SETTING_PATH}` lets regions have 2 MiB pages",
            setting.0
        ),
        Err(e) => tracing::info!("regions ask for 2 MiB pages; which they get is unknown: {e}"),
    }
}

/// The quota this node proposes when it leads (`RegionConfig::quota_bytes`).
fn quota_bytes(config: &Config, region: &RegionConfig) -> Result<u64> {
    region.quota_bytes(config.quota_bytes).context("the quota")
}

/// The protocol limits this node's region implies: the default frame
/// limit, raised when a largest key and value would not fit in it.
fn protocol_limits(region: &RegionConfig) -> Result<Limits> {
    let defaults = Limits::default();
    let largest_entry = u64::from(region.max_key_bytes)
        + u64::from(region.max_value_bytes)
        + u64::from(SINGLE_ENTRY_OVERHEAD_BYTES);
    let limits = Limits {
        max_key_bytes: region.max_key_bytes,
        max_value_bytes: region.max_value_bytes,
        max_frame_bytes: u32::try_from(largest_entry)
            .context("--max-value-bytes: a value must fit in a 4 GiB frame")?
            .max(defaults.max_frame_bytes),
        ..defaults
    };
    limits.validate_self().context("protocol limits")?;
    Ok(limits)
}

/// What this node's own clients of other members (RESP forwarding,
/// `--join`) start from: the token and TLS.
pub(crate) fn own_client_options(config: &Config, tls: &NodeTls) -> rdkv_client::ClientOptions {
    rdkv_client::ClientOptions {
        token: config.token.clone(),
        tls: tls.own_client.clone(),
        ..rdkv_client::ClientOptions::default()
    }
}

/// A shard's log and region, opened where `layout` keeps them.
pub(crate) struct Stores {
    shard: ShardId,
    log: LogStore,
    sm: RegionStateMachine,
}

impl Stores {
    pub(crate) fn open(
        config: &Config,
        layout: &Layout,
        shard: ShardId,
        region: RegionConfig,
    ) -> Result<Stores> {
        let started = std::time::Instant::now();
        let log = LogStore::open(
            layout.log_dir(&config.data_dir, shard),
            LogOptions {
                shard,
                ..LogOptions::default()
            },
        )
        .with_context(|| format!("opening shard {}'s raft log", shard.0))?;
        let log_opened = started.elapsed();
        let sm = RegionStateMachine::open(StateMachineConfig {
            region,
            snapshot_dir: layout.snapshot_dir(&config.data_dir, shard),
            shard,
        })
        .with_context(|| format!("opening shard {}'s state machine", shard.0))?;
        tracing::info!(
            shard = shard.0,
            log_ms = log_opened.as_millis(),
            region_ms = (started.elapsed() - log_opened).as_millis(),
            live_keys = sm.region_stats().live_keys,
            "opened the log and the region"
        );
        Ok(Stores { shard, log, sm })
    }

    /// Whether a previous incarnation wrote here.
    fn has_state(&self) -> bool {
        self.log.stats().last_index.is_some() || self.sm.applied_index() > 0
    }
}

/// Starts Raft on a shard's stores; `tag`: the shard its peer frames name
/// (`None`: a single group's untagged connections).
pub(crate) async fn start_raft(
    config: &Config,
    stores: Stores,
    tag: Option<ShardId>,
    tls: &NodeTls,
    links: &Arc<PeerLinks>,
) -> Result<Replica> {
    let Stores { shard, log, sm } = stores;
    if tag == Some(ShardId::META) {
        links.set_identity(sm.clone());
    }
    // A snapshot holds at most the region's live pairs plus framing.
    let max_snapshot_bytes = config.region_bytes * 2 + SNAPSHOT_CHUNK_BYTES as u64;
    let peers = Arc::new(
        PeerContext::new(
            config.id,
            tag,
            config.listen.to_string(),
            config.token.clone(),
            sm.clone(),
            max_snapshot_bytes,
            tls.peer_client.clone(),
            log.persisted_vote(),
        )
        .with_heartbeat(Duration::from_millis(config.heartbeat_ms)),
    );
    let raft = Raft::new(
        config.id,
        Arc::new(raft_config(config)?),
        PeerNetwork::new(Arc::clone(&peers), Arc::clone(links)),
        log.clone(),
        sm.clone(),
    )
    .await
    .with_context(|| format!("starting shard {}'s raft", shard.0))?;
    let fence = config.read_fence.then(|| {
        ReadFence::new(
            FenceClients::new(PeerNetwork::new(Arc::clone(&peers), Arc::clone(links))),
            log.persisted_vote(),
            &raft,
            config.id,
            Duration::from_millis(config.heartbeat_ms),
            FenceOutcomes::new(&tag.unwrap_or(ShardId(0)).to_string()),
        )
    });
    Ok(Replica::new(ReplicaParts {
        reads: ReadRounds::start(raft.clone(), fence),
        proposals: Proposals::start(raft.clone(), shard),
        raft,
        sm,
        log,
        peers,
    }))
}

/// Where a node's shard map comes from before its metadata replica
/// applies one.
#[derive(Debug)]
enum Origin {
    /// A single group: no map (it is computed from the membership).
    Single,
    /// `--initial-cluster`: the placed map, version 1 (`placed_map`), which
    /// the metadata group's first leader publishes.
    Placed(ShardMap),
    /// `--join` of a multi-shard cluster: the cluster's map (the seed's, or
    /// the one `JOINED` records) and whether the join is done.
    Joined {
        seed: String,
        map: ShardMap,
        joined: bool,
    },
}

impl Origin {
    fn of(config: &Config, joining: crate::join::Joining) -> Result<Origin> {
        Ok(match joining {
            crate::join::Joining::Sharded { seed, map, joined } => {
                Origin::Joined { seed, map, joined }
            }
            _ => placed_map(config)?.map_or(Origin::Single, Origin::Placed),
        })
    }

    /// The map served until the metadata replica applies one; `None`: a
    /// single group.
    fn map(&self) -> Option<&ShardMap> {
        match self {
            Origin::Single => None,
            Origin::Placed(map) | Origin::Joined { map, .. } => Some(map),
        }
    }

    /// The placed map of a node of `--initial-cluster`.
    fn placed(&self) -> Option<&ShardMap> {
        match self {
            Origin::Placed(map) => Some(map),
            _ => None,
        }
    }
}

/// The placed map of a multi-shard cluster (`placement::initial` of
/// `--initial-cluster`, the same on every node, byte for byte: no node's
/// addresses yet, each node publishes its own as a later version); `None`
/// for a single group. The metadata group's version 1.
fn placed_map(config: &Config) -> Result<Option<ShardMap>> {
    if config.shards <= 1 {
        return Ok(None);
    }
    let nodes = config
        .initial_cluster
        .keys()
        .map(|&id| NodeInfo {
            id,
            client_addr: None,
            resp_addr: None,
        })
        .collect();
    let map =
        placement::initial(nodes, config.shards, config.replicas).context("placing the shards")?;
    Ok(Some(map))
}

/// The shards this node hosts and whether its data directory is new (no
/// `HOSTED` yet): a single group hosts shard 0; a multi-shard node the
/// shards `HOSTED` records (replicas moved since placement included), or
/// on its first start the placed ones (none for a node that joins).
/// Directories of shards it does not host are removed
/// (`Layout::remove_strays`).
fn hosted_shards(
    config: &Config,
    layout: &Layout,
    origin: &Origin,
) -> Result<(Vec<ShardId>, bool)> {
    if origin.map().is_none() {
        return Ok((vec![ShardId(0)], true));
    }
    let recorded = layout
        .recorded_hosted(&config.data_dir)
        .context("reading the hosted shards")?;
    match recorded {
        None => Ok((
            origin
                .placed()
                .map_or_else(Vec::new, |map| placed_here(map, config.id)),
            true,
        )),
        Some(hosted) => {
            for stray in layout.remove_strays(&config.data_dir, &hosted)? {
                tracing::info!(
                    shard = stray.0,
                    "removed the files of a shard not hosted here"
                );
            }
            Ok((hosted.into_iter().collect(), false))
        }
    }
}

fn placed_here(map: &ShardMap, id: u64) -> Vec<ShardId> {
    map.shards()
        .iter()
        .filter(|shard| shard.members.contains(&id))
        .map(|shard| shard.id)
        .collect()
}

/// Drops the replicas that were opened for a move but never joined their
/// shard (a crash before the leader added them: nothing in them, and not
/// placed here); `HOSTED` is rewritten without them.
fn drop_unjoined(
    config: &Config,
    layout: &Layout,
    map: &ShardMap,
    stores: Vec<Stores>,
) -> Result<Vec<Stores>> {
    let placed = placed_here(map, config.id);
    let (kept, unjoined): (Vec<Stores>, Vec<Stores>) = stores
        .into_iter()
        .partition(|s| s.shard == ShardId::META || s.has_state() || placed.contains(&s.shard));
    if unjoined.is_empty() {
        return Ok(kept);
    }
    // The metadata group is not a hosted data shard: `HOSTED` never names it.
    let hosted = kept
        .iter()
        .map(|s| s.shard)
        .filter(|&shard| shard != ShardId::META)
        .collect();
    layout.record_hosted(&config.data_dir, &hosted)?;
    for stores in unjoined {
        let shard = stores.shard;
        drop(stores);
        layout.remove_shard_dir(&config.data_dir, shard)?;
        tracing::info!(
            shard = shard.0,
            "dropped a replica that never joined its shard"
        );
    }
    Ok(kept)
}

/// A new data directory's groups: bootstrapped (with `--initial-cluster`),
/// then, on a multi-shard node, `HOSTED` recorded. After the bootstrap: a
/// restart before this forms the same groups again (initializing is
/// idempotent), one after it never re-initializes a shard moved away from
/// or onto this node.
async fn form_groups(
    shards: &Shards,
    origin: &Origin,
    config: &Config,
    layout: &Layout,
    client_addr: &str,
) -> Result<()> {
    if !config.initial_cluster.is_empty() {
        bootstrap(shards, origin.placed(), config, client_addr).await?;
    }
    if shards.is_sharded() {
        let hosted = shards.iter().map(|(shard, _)| shard).collect();
        layout.record_hosted(&config.data_dir, &hosted)?;
    }
    Ok(())
}

/// The shards this node started, and whether the data directory is new.
struct Started {
    shards: Shards,
    fresh: bool,
}

/// Opens and starts the replicas of the shards this node hosts (shard 0
/// alone for a single group; with the metadata group's otherwise, which
/// every node of a multi-shard cluster runs).
async fn start_shards(
    config: &Config,
    layout: &Layout,
    region: RegionConfig,
    tls: &NodeTls,
    links: &Arc<PeerLinks>,
    origin: &Origin,
) -> Result<Started> {
    let started = std::time::Instant::now();
    let (mut hosted, fresh) = hosted_shards(config, layout, origin)?;
    // A node that joins (or whose replicas all moved away) hosts no data
    // shard: only one bootstrapped from `--initial-cluster` must be placed
    // some.
    if fresh && hosted.is_empty() && origin.placed().is_some() {
        bail!(
            "--shards {} --replicas {} places no shard on node {}: \
             raise --shards or --replicas",
            config.shards,
            config.replicas,
            config.id
        );
    }
    if origin.map().is_some() {
        hosted.push(ShardId::META);
    }
    let stores = hosted
        .iter()
        .map(|&shard| {
            let region = match shard == ShardId::META {
                true => crate::meta::region_config(&region),
                false => region.clone(),
            };
            Stores::open(config, layout, shard, region)
        })
        .collect::<Result<Vec<_>>>()?;
    let stores = match origin.map() {
        Some(map) if !fresh => drop_unjoined(config, layout, map, stores)?,
        _ => stores,
    };
    // A previous incarnation may have led and published a lease (at most
    // one minimum election timeout long) into a region clients still map.
    // Nothing this incarnation commits may become visible before that
    // lease has run out: in a cluster the other voters guarantee it (they
    // vote for no one that soon), but a sole voter elects itself at once.
    // So a restarted node waits the lease out before it starts Raft: from
    // its own start, which came after the previous incarnation's last
    // publication, so that opening the logs and the regions counts towards
    // it (once for all shards: they were opened together).
    if stores.iter().any(Stores::has_state) {
        let lease_out = started + Duration::from_millis(raft_config(config)?.election_timeout_min);
        tokio::time::sleep_until(lease_out.into()).await;
    }
    let tagged = origin.map().is_some();
    let mut replicas = BTreeMap::new();
    for stores in stores {
        let shard = stores.shard;
        match start_raft(config, stores, tagged.then_some(shard), tls, links).await {
            Ok(replica) => {
                replicas.insert(shard, replica);
            }
            Err(e) => {
                // The ones started own their logs: stop them first.
                for replica in replicas.values() {
                    let _ = replica.raft.shutdown().await;
                }
                return Err(e);
            }
        }
    }
    let shards = match origin.map() {
        Some(map) => {
            let meta = replicas
                .remove(&ShardId::META)
                .context("the metadata group was not started")?;
            let meta = meta_of(meta, map, own_client_options(config, tls));
            Shards::sharded(meta, replicas)
        }
        None => replicas
            .remove(&ShardId(0))
            .map(Shards::single)
            .context("shard 0 was not started")?,
    };
    Ok(Started { shards, fresh })
}

/// The metadata group's part on this node, serving the map its replica
/// applied before a restart, or else the one it starts from (placed, or
/// the cluster's for a node that joins).
fn meta_of(replica: Replica, placed: &ShardMap, forward: rdkv_client::ClientOptions) -> Meta {
    let applied = replica.sm.applied_shard_map().unwrap_or_else(|e| {
        tracing::warn!("reading the applied shard map: {e}");
        None
    });
    let map = match applied {
        Some(applied) if applied.version() >= placed.version() => applied,
        _ => placed.clone(),
    };
    Meta::new(replica, map, forward)
}

/// What a node settles before it serves: its protocol limits, the quota it
/// proposes, and the lock on its data directory.
struct Fixed {
    limits: Limits,
    quota_bytes: u64,
    lock: File,
    tls: Arc<NodeTls>,
    /// The node's shared peer connections (multi-shard clusters).
    links: Arc<PeerLinks>,
    layout: Layout,
    /// Each shard replica's region (`--region-mib`).
    region: RegionConfig,
    /// The data directory records no hosted shards yet (a first start).
    fresh: bool,
}

impl Node {
    pub async fn start(mut config: Config) -> Result<Node> {
        // Before anything records a metric.
        crate::telemetry::prometheus();
        // A bad certificate file stops the start before anything runs.
        let tls = Arc::new(NodeTls::load(&config).context("TLS settings")?);
        let lock = lock_data_dir(&config)?;
        let listeners = Listeners::bind(&config).await?;
        let own = own_client_options(&config, &tls);
        let joining = crate::join::settle_shards(&mut config, &own).await?;
        let origin = Origin::of(&config, joining)?;
        let region = region_config(&config);
        log_region_pages(&region);
        let limits = protocol_limits(&region)?;
        let quota_bytes = quota_bytes(&config, &region)?;
        let layout = Layout::open(&config.data_dir, config.shards)?;
        let links = Arc::new(PeerLinks::new());
        let Started { shards, fresh } =
            start_shards(&config, &layout, region.clone(), &tls, &links, &origin).await?;
        let fixed = Fixed {
            limits,
            quota_bytes,
            lock,
            tls,
            links,
            layout,
            region,
            fresh,
        };
        match Self::serve(config, (shards.clone(), origin), fixed, listeners).await {
            Ok(node) => Ok(node),
            Err(e) => {
                // Raft is running and owns the logs: stop it before giving up.
                for (_, replica) in shards.all() {
                    let _ = replica.raft.shutdown().await;
                }
                Err(e)
            }
        }
    }

    async fn serve(
        config: Config,
        (shards, origin): (Shards, Origin),
        fixed: Fixed,
        listeners: Listeners,
    ) -> Result<Node> {
        let Fixed {
            limits,
            quota_bytes,
            lock,
            tls,
            links,
            layout,
            region,
            fresh,
        } = fixed;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Tasks::default();
        let replica = shards.primary().clone();
        let raft = replica.raft.clone();
        tasks.push(tokio::spawn(
            Arc::clone(&tls).reload_on_change(shutdown_rx.clone()),
        ));
        let peer_shards = PeerShards::new(shards.clone());
        tasks.push(tokio::spawn(serve_peers(
            TcpFront::new(listeners.peer, tls.peer_server.clone()),
            peer_shards,
            shutdown_rx.clone(),
        )));
        let client_addr = config.listen.to_string();
        if fresh {
            form_groups(&shards, &origin, &config, &layout, &client_addr).await?;
        }
        let own = NodeInfo {
            id: config.id,
            client_addr: Some(client_addr.clone()),
            resp_addr: local_addr(listeners.front.resp.as_ref()),
        };
        join_sharded(&shards, &origin, &own, &config, &layout, &tls).await?;
        let hosting = shards.is_sharded().then(|| {
            Arc::new(Hosting::new(HostingParts {
                config: config.clone(),
                layout,
                region,
                tls: Arc::clone(&tls),
                links: Arc::clone(&links),
                quota_bytes,
                shards: shards.clone(),
                shutdown: shutdown_rx.clone(),
            }))
        });
        let (rdma, ofi) = one_sided_transports(&config, &shards, &shutdown_rx, &mut tasks);
        let settings = HandlerSettings {
            limits,
            quota_bytes,
            endpoints: listeners.front.endpoints(&config),
            fault_injection: config.fault_injection,
            max_client_connections: config.max_client_connections,
            max_in_flight_bytes: u64::from(config.max_in_flight_mib) * 1024 * 1024,
            hosting,
        };
        let handler = Arc::new(Handler::new(shards.clone(), settings, rdma, ofi));
        tasks.push(tokio::spawn(crate::telemetry::raft_events::watch_raft(
            raft.clone(),
            shutdown_rx.clone(),
        )));
        listeners
            .front
            .spawn(&config, &tls, &handler, &shutdown_rx, &mut tasks)?;
        for (_, replica) in shards.iter() {
            for task in spawn_leader_tasks(&replica, &config, quota_bytes, &shutdown_rx) {
                tasks.push(task);
            }
        }
        if let Some(meta) = shards.meta() {
            let placed = origin.placed().cloned();
            spawn_meta_tasks(meta, placed, own, &config, &shutdown_rx, &mut tasks)?;
        }
        if !shards.is_sharded() && !raft.is_initialized().await.context("reading raft state")? {
            spawn_single_join(&config, &tls, client_addr, shutdown_rx, &mut tasks);
        }
        tracing::info!(
            id = config.id,
            listen = %config.listen,
            peer_listen = %config.peer_listen,
            data_dir = %config.data_dir.display(),
            "rdkv-server serving"
        );
        Ok(Node {
            shards,
            handler,
            shutdown,
            tasks,
            _lock: lock,
        })
    }

    /// Saves a snapshot (`stop_snapshot`), stops serving and shuts Raft
    /// down (its log is already durable).
    pub async fn stop(self) -> Result<()> {
        for (_, replica) in self.shards.all() {
            crate::stop_snapshot::snapshot_before_stop(&replica.raft).await;
            // Clients mapping the region stop trusting it before anything else.
            if let Err(e) = replica.sm.retire() {
                tracing::warn!("retiring the region: {e}");
            }
        }
        let _ = self.shutdown.send(true);
        drop(self.tasks);
        for (shard, replica) in self.shards.all() {
            replica
                .raft
                .shutdown()
                .await
                .map_err(|e| anyhow::anyhow!("shard {}'s raft shutdown: {e}", shard.0))?;
            // Best effort: a log left with its preallocated tail is recovered
            // alike (the tail is cut at the next open).
            if let Err(e) = replica.log.trim_preallocation() {
                tracing::warn!("cutting the raft log's preallocated tail: {e}");
            }
        }
        Ok(())
    }

    /// The Raft of the replica serving requests that name no shard.
    pub fn raft(&self) -> Raft {
        self.shards.primary().raft.clone()
    }
}

/// Binds the shm socket, replacing a stale socket file left by a previous
/// run (the data-directory lock guarantees no live server owns it).
fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the shm socket {}", path.display()))
}

/// The leader's own tasks of one shard replica: publishing its lease, the
/// cluster settings, the active expire cycle.
pub(crate) fn spawn_leader_tasks(
    replica: &Replica,
    config: &Config,
    quota_bytes: u64,
    shutdown_rx: &watch::Receiver<bool>,
) -> [tokio::task::JoinHandle<()>; 3] {
    let raft = &replica.raft;
    let shard = replica.peers.shard.unwrap_or(ShardId(0)).to_string();
    [
        tokio::spawn(crate::lease::publish_leadership(
            raft.clone(),
            replica.sm.clone(),
            config.heartbeat_ms,
            metrics::counter!("rdkv_lease_publishes_total", "shard" => shard),
            shutdown_rx.clone(),
        )),
        tokio::spawn(crate::settings::propose_while_leading(
            raft.clone(),
            replica.sm.clone(),
            quota_bytes,
            shutdown_rx.clone(),
        )),
        tokio::spawn(crate::expiry::expire_while_leading(
            raft.clone(),
            replica.sm.clone(),
            Duration::from_millis(config.expire_cycle_ms),
            shutdown_rx.clone(),
        )),
    ]
}

/// Forms the groups of `--initial-cluster`: a single group on every
/// member (each initializes it alike, unless it starts after the group has
/// a leader: then it waits to be replicated to); in a multi-shard cluster, each
/// shard's first placed member initializes that shard with its members,
/// and the first node the metadata group with its voters (its leader adds
/// the other nodes as learners, `meta::tasks::lead`).
async fn bootstrap(
    shards: &Shards,
    placed: Option<&ShardMap>,
    config: &Config,
    client_addr: &str,
) -> Result<()> {
    let (Some(map), Some(meta)) = (placed, shards.meta()) else {
        let primary = shards.primary();
        let members: Vec<u64> = config.initial_cluster.keys().copied().collect();
        let ask_first = Some(&primary.peers);
        return initialize(&primary.raft, config, client_addr, &members, ask_first).await;
    };
    for (shard, replica) in shards.iter() {
        let Some(info) = map.shard(shard) else {
            continue;
        };
        if info.members.first() == Some(&config.id) {
            initialize(&replica.raft, config, client_addr, &info.members, None)
                .await
                .with_context(|| format!("shard {}", shard.0))?;
        }
    }
    let voters = crate::meta::voters(config.initial_cluster.keys().copied());
    if voters.first() == Some(&config.id) {
        initialize(&meta.replica().raft, config, client_addr, &voters, None)
            .await
            .context("the metadata group")?;
    }
    Ok(())
}

/// A single group's `--join`, if given (`join::join_cluster`), in the
/// background until this node's Raft is initialized.
fn spawn_single_join(
    config: &Config,
    tls: &NodeTls,
    client_addr: String,
    shutdown_rx: watch::Receiver<bool>,
    tasks: &mut Tasks,
) {
    if let Some(seed) = config.join.clone() {
        tasks.push(tokio::spawn(crate::join::join_cluster(
            seed,
            config.id,
            config.peer_listen.to_string(),
            client_addr,
            own_client_options(config, tls),
            shutdown_rx,
        )));
    }
}

/// Joins the multi-shard cluster of `origin` (`join::join_sharded`) unless
/// `JOINED` records the join: a learner of its metadata group and a node
/// of its map with `own` addresses. Then serves the map the join was
/// answered with (until the replica applies a newer one) and records it
/// in `JOINED`. Before clients are served: a refusal stops the start.
async fn join_sharded(
    shards: &Shards,
    origin: &Origin,
    own: &NodeInfo,
    config: &Config,
    layout: &Layout,
    tls: &NodeTls,
) -> Result<()> {
    let (
        Origin::Joined {
            seed,
            joined: false,
            ..
        },
        Some(meta),
    ) = (origin, shards.meta())
    else {
        return Ok(());
    };
    tracing::info!(%seed, "joining the multi-shard cluster");
    let request = rdkv_proto::wire::Request::AddNode {
        id: config.id,
        peer_addr: config.peer_listen.to_string(),
        client_addr: own.client_addr.clone().unwrap_or_default(),
        resp_addr: own.resp_addr.clone(),
    };
    let map = crate::join::join_sharded(seed, request, &own_client_options(config, tls)).await?;
    meta.install(map.clone());
    layout
        .record_joined(&config.data_dir, &map)
        .context("recording the join")?;
    Ok(())
}

/// The metadata group's tasks on this node: its leader's bootstrap (a
/// node of `--initial-cluster`), settings and voter upkeep, the watch
/// serving each applied map, and the publication of this node's addresses
/// (`own`).
fn spawn_meta_tasks(
    meta: &Meta,
    placed: Option<ShardMap>,
    own: NodeInfo,
    config: &Config,
    shutdown_rx: &watch::Receiver<bool>,
    tasks: &mut Tasks,
) -> Result<()> {
    use crate::meta::tasks;
    let replica = meta.replica();
    // Its own region's default: `--quota-bytes` sizes the data shards.
    let quota_bytes = crate::meta::region_config(&region_config(config))
        .quota_bytes(None)
        .context("the metadata group's quota")?;
    tasks.push(tokio::spawn(crate::settings::propose_while_leading(
        replica.raft.clone(),
        replica.sm.clone(),
        quota_bytes,
        shutdown_rx.clone(),
    )));
    // A node that joined bootstraps nothing: the cluster it joined has.
    if let Some(placed) = placed {
        let bootstrap = tasks::Bootstrap {
            placed,
            nodes: config.initial_cluster.clone(),
        };
        tasks.push(tokio::spawn(tasks::lead(
            meta.clone(),
            bootstrap,
            shutdown_rx.clone(),
        )));
    }
    tasks.push(tokio::spawn(tasks::keep_voters(
        meta.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(tasks::follow_applied(
        meta.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(tasks::publish_own_addresses(
        meta.clone(),
        own,
        shutdown_rx.clone(),
    )));
    Ok(())
}

/// Initializes a group of `members` (ids of `--initial-cluster`) unless
/// this replica already belongs to one (its data directory has state):
/// restarts never re-initialize. A single group, which every member
/// initializes, passes `ask_first`: the peers to ask first whether it has a
/// leader already (`formed::by_peers`); if one says so, this member waits
/// for the leader's entries instead. They are asked for up to the longest
/// election timeout, so that a restarting peer's wait for its old lease
/// (the shortest one) ends within it.
async fn initialize(
    raft: &Raft,
    config: &Config,
    client_addr: &str,
    members: &[u64],
    ask_first: Option<&Arc<PeerContext>>,
) -> Result<()> {
    if raft.is_initialized().await.context("reading raft state")? {
        tracing::info!("resuming the cluster recorded in the data directory");
        return Ok(());
    }
    if let Some(peers) = ask_first {
        let wait = Duration::from_millis(raft_config(config)?.election_timeout_max);
        if crate::formed::by_peers(peers, &config.initial_cluster, wait).await {
            tracing::info!(
                "the cluster has a leader already: not initializing, waiting for it to replicate here"
            );
            return Ok(());
        }
    }
    let members: BTreeMap<u64, NodeAddr> = config
        .initial_cluster
        .iter()
        .filter(|(id, _)| members.contains(id))
        .map(|(id, peer_addr)| {
            let client_addr = if *id == config.id {
                client_addr.to_owned()
            } else {
                // Learned from the peer handshake once that node is reached.
                String::new()
            };
            (
                *id,
                NodeAddr {
                    peer_addr: peer_addr.clone(),
                    client_addr,
                },
            )
        })
        .collect();
    tracing::info!(members = ?members.keys().collect::<Vec<_>>(), "initializing the cluster");
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        // Another member's identical initialization reached us first.
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("initializing the cluster: {e}")),
    }
}

/// The remote one-sided transports (verbs RDMA, libfabric): each on or off
/// with its reason logged, and its region registrations kept current.
fn one_sided_transports(
    config: &Config,
    shards: &Shards,
    shutdown_rx: &tokio::sync::watch::Receiver<bool>,
    tasks: &mut Tasks,
) -> (Arc<crate::rdma::RdmaState>, Arc<crate::ofi::OfiState>) {
    let rdma = Arc::new(crate::rdma::RdmaState::start(
        config.rdma_device.as_deref(),
        config.grace_period_ms,
    ));
    let ofi = Arc::new(crate::ofi::OfiState::start(
        config.ofi_provider.as_deref(),
        config.listen.ip(),
        config.grace_period_ms,
    ));
    // Every hosted shard's region (a single group: shard 0's), as hosted
    // at each turn of the upkeep.
    let (id, stop) = (config.id, shutdown_rx.clone());
    tasks.push(tokio::spawn(Arc::clone(&rdma).maintain(
        shards.clone(),
        id,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(Arc::clone(&ofi).maintain(
        shards.clone(),
        id,
        stop,
    )));
    (rdma, ofi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region_with(max_value_bytes: u32) -> RegionConfig {
        RegionConfig {
            max_value_bytes,
            ..RegionConfig::default()
        }
    }

    /// The wait openraft's replication stream sleeps before its next
    /// request after failed ones (`raft_config`'s `backoff`) is one
    /// heartbeat, however many failed; openraft's default doubles it from
    /// 200 ms to 1 s.
    #[test]
    fn the_replication_backoff_is_one_heartbeat() {
        use clap::Parser;
        for heartbeat_ms in ["100", "10", "250"] {
            let argv = ["rdkv-server", "--heartbeat-ms", heartbeat_ms];
            let config = Config::resolve(crate::config::Args::parse_from(argv)).unwrap();
            let raft = raft_config(&config).unwrap();
            let heartbeat = Duration::from_millis(raft.heartbeat_interval);
            let waits: Vec<Duration> = raft.build_backoff().take(12).collect();
            assert!(
                waits.iter().all(|&wait| wait == heartbeat),
                "heartbeat {heartbeat:?}: waits {waits:?}"
            );
        }
    }

    #[test]
    fn the_frame_limit_stays_the_default_while_a_largest_entry_fits_it() {
        let limits = protocol_limits(&region_with(1024 * 1024)).unwrap();
        assert_eq!(limits.max_value_bytes, 1024 * 1024);
        assert_eq!(limits.max_frame_bytes, Limits::default().max_frame_bytes);
    }

    #[test]
    fn a_larger_value_limit_raises_the_frame_limit_so_that_it_can_be_sent() {
        let max_value_bytes = 16 * 1024 * 1024;
        let limits = protocol_limits(&region_with(max_value_bytes)).unwrap();
        assert_eq!(limits.max_value_bytes, max_value_bytes);
        assert_eq!(
            limits.max_frame_bytes,
            1024 + max_value_bytes + SINGLE_ENTRY_OVERHEAD_BYTES
        );
        limits.validate_self().unwrap();
    }
}
