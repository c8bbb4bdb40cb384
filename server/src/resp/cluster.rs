//! Redis Cluster's view of the shard map (docs/sharding.md, section 7), so
//! that cluster-aware clients (redis-py's `RedisCluster`, `redis-cli -c`,
//! `redis-benchmark --cluster`) route themselves: `CLUSTER KEYSLOT`,
//! `MYID`, `INFO`, `SLOTS`, `SHARDS`, `NODES`, built from this node's shard
//! map with every node's RESP address; and the rules of a connection that
//! opted in to cluster mode (`CLUSTER SLOTS|SHARDS|NODES` or `READONLY` on
//! it): `MOVED` to the key's shard leader instead of forwarding, and
//! `CROSSSLOT` for a command whose keys are in different slots.
//!
//! A shard's leader is its "master", its other members "replicas". A node's
//! Redis id is its node id as 40 hex digits. A node whose RESP address is
//! not known (it has none, or did not answer) is left out; where the master
//! would be left out, this node stands in (it forwards what it does not
//! lead), so every slot is always covered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use rdkv_proto::shard::{
    NodeId, NodeInfo, SLOT_COUNT, ShardId, ShardInfo, ShardMap, Slot, key_slot,
};
use rdkv_proto::wire::{Request, Response};

use super::RespServer;
use super::commands::upper;
use super::forward::error_reply;
use super::reply::Reply;
use super::table::Spec;

/// Longest `CLUSTER` waits for a node to say its RESP address.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// Every node's RESP address, and the leader of each shard this node
/// does not host, as learnt from the other nodes' shard maps.
#[derive(Debug, Default)]
pub struct RespDirectory {
    addrs: Mutex<HashMap<NodeId, String>>,
    leaders: Mutex<HashMap<ShardId, NodeId>>,
}

impl RespDirectory {
    fn get(&self, id: NodeId) -> Option<String> {
        lock(&self.addrs).get(&id).cloned()
    }

    fn learn(&self, id: NodeId, addr: String) {
        lock(&self.addrs).insert(id, addr);
    }

    fn leader(&self, shard: ShardId) -> Option<NodeId> {
        lock(&self.leaders).get(&shard).copied()
    }

    fn learn_leader(&self, shard: ShardId, leader: NodeId) {
        lock(&self.leaders).insert(shard, leader);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A node's Redis Cluster id.
fn redis_id(id: NodeId) -> String {
    format!("{id:040x}")
}

/// `host` and `port` of a RESP address.
fn host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']), port.parse().ok()?))
}

/// `CLUSTER <subcommand>`: answered from the map with RESP addresses.
pub async fn cluster(server: &RespServer, args: &[Bytes]) -> Reply {
    let sub = upper(&args[0]);
    match (sub.as_str(), &args[1..]) {
        ("KEYSLOT", [key]) => Reply::Integer(i64::from(key_slot(key).get())),
        ("MYID", []) => Reply::bulk(redis_id(server.handler.replica().node_id())),
        ("INFO" | "SLOTS" | "SHARDS" | "NODES", []) => match server.cluster_map().await {
            Ok(map) => {
                let view = View::new(server, &map);
                match sub.as_str() {
                    "INFO" => view.info(),
                    "SLOTS" => view.slots(),
                    "SHARDS" => view.shards(),
                    _ => view.nodes(),
                }
            }
            Err(reply) => reply,
        },
        ("KEYSLOT" | "MYID" | "INFO" | "SLOTS" | "SHARDS" | "NODES", _) => Reply::err(format!(
            "wrong number of arguments for 'cluster|{}' command",
            sub.to_lowercase()
        )),
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try CLUSTER HELP.",
            String::from_utf8_lossy(&args[0])
        )),
    }
}

/// Whether `CLUSTER <args>` opts the connection in to cluster mode: what
/// cluster-aware clients ask first.
pub fn opts_in(args: &[Bytes]) -> bool {
    args.first()
        .is_some_and(|sub| matches!(upper(sub).as_str(), "SLOTS" | "SHARDS" | "NODES"))
}

/// On a connection in cluster mode, the reply that replaces running
/// command `spec` on `keys` (its keys, `Spec::keys_in`) here: `CROSSSLOT`
/// when its keys are in different slots, `MOVED` when another node leads
/// its shard and its RESP address is known. `None`: run it (this node
/// leads, or the leader is not known: forwarded as on any connection).
/// `readonly`: the connection sent `READONLY`, and reads are served by
/// whichever node it reached, as in Redis.
pub fn redirect(
    server: &RespServer,
    spec: &Spec,
    keys: &[impl AsRef<[u8]>],
    readonly: bool,
) -> Option<Reply> {
    let slot = key_slot(keys.first()?.as_ref());
    if keys.iter().any(|key| key_slot(key.as_ref()) != slot) {
        return Some(Reply::Error(CROSSSLOT.to_owned()));
    }
    if readonly && spec.is_read() {
        return None;
    }
    let leader = server.leader_of(slot)?;
    if leader == server.handler.replica().node_id() {
        return None;
    }
    let addr = server.resp_directory.get(leader)?;
    Some(Reply::Error(format!("MOVED {} {addr}", slot.get())))
}

impl RespServer {
    /// The leader of `slot`'s shard as this node knows it: from the
    /// shard's own Raft when it is hosted here, else as learnt from its
    /// members (`cluster_map`), else the placed hint.
    fn leader_of(&self, slot: Slot) -> Option<NodeId> {
        let shards = self.handler.shards();
        let Some(map) = shards.map() else {
            return shards.primary().metrics().current_leader;
        };
        let shard = map.shard_of_slot(slot);
        match shards.get(shard) {
            Some(replica) => replica.metrics().current_leader,
            None => self
                .resp_directory
                .leader(shard)
                .or_else(|| map.shard(shard)?.leader),
        }
    }

    /// This node's shard map with every node's RESP address filled in and,
    /// for the shards this node does not host, the leader their members
    /// report: asks the other nodes their maps (on a multi-shard node every
    /// time, for the leaders; else only while a RESP address is unknown).
    async fn cluster_map(&self) -> Result<ShardMap, Reply> {
        let shards = self.handler.shards();
        let own_id = shards.primary().node_id();
        let map = shards
            .shard_map(self.handler.endpoints().resp.clone())
            .map_err(|e| error_reply(&e))?;
        let asked: Vec<&NodeInfo> = map
            .nodes()
            .iter()
            .filter(|node| node.id != own_id)
            .filter(|node| {
                shards.is_sharded()
                    || (node.resp_addr.is_none() && self.resp_directory.get(node.id).is_none())
            })
            .collect();
        let mut client_addrs: HashMap<NodeId, String> = asked
            .iter()
            .filter_map(|node| Some((node.id, node.client_addr.clone()?)))
            .collect();
        if client_addrs.len() < asked.len() {
            // A follower knows the client address of the nodes it talked
            // to only; another node may know more (a leader knows every
            // member's).
            self.learn_client_addrs(&map, own_id, &mut client_addrs)
                .await;
        }
        let asked = asked
            .iter()
            .filter_map(|node| Some((node.id, client_addrs.get(&node.id)?.clone())));
        join_all(asked.map(|(id, addr)| self.learn_from(id, addr))).await;
        self.filled_in(&map)
    }

    /// `map` with the RESP addresses and leaders learnt.
    fn filled_in(&self, map: &ShardMap) -> Result<ShardMap, Reply> {
        let shards = self.handler.shards();
        let nodes = map
            .nodes()
            .iter()
            .map(|node| NodeInfo {
                resp_addr: node
                    .resp_addr
                    .clone()
                    .or_else(|| self.resp_directory.get(node.id)),
                ..node.clone()
            })
            .collect();
        let led = map
            .shards()
            .iter()
            .map(|shard| match shards.get(shard.id) {
                Some(_) => shard.clone(),
                None => ShardInfo {
                    leader: self.resp_directory.leader(shard.id).or(shard.leader),
                    ..shard.clone()
                },
            })
            .collect();
        ShardMap::new(map.version(), nodes, led, map.ranges().to_vec())
            .map_err(|e| Reply::err(format!("this node's shard map: {e}")))
    }

    /// Adds the client addresses the first other node with a known one
    /// knows.
    async fn learn_client_addrs(
        &self,
        map: &ShardMap,
        own_id: NodeId,
        into: &mut HashMap<NodeId, String>,
    ) {
        let known = map.nodes().iter().filter(|node| node.id != own_id);
        let Some((id, addr)) = known
            .filter_map(|node| Some((node.id, node.client_addr.clone()?)))
            .next()
        else {
            return;
        };
        if let Some(their) = self.map_of(id, addr).await {
            for node in their.nodes() {
                if let Some(addr) = &node.client_addr {
                    into.entry(node.id).or_insert_with(|| addr.clone());
                }
            }
        }
    }

    /// Asks node `id` (native address `addr`) its shard map: its own RESP
    /// address, and the leaders of the shards it is a member of.
    async fn learn_from(&self, id: NodeId, addr: String) {
        let Some(their) = self.map_of(id, addr).await else {
            return;
        };
        if let Some(resp) = their.node(id).and_then(|node| node.resp_addr.clone()) {
            self.resp_directory.learn(id, resp);
        }
        let hosted_here = self.handler.shards();
        for shard in their.shards() {
            if let Some(leader) = shard.leader
                && shard.members.contains(&id)
                && hosted_here.get(shard.id).is_none()
            {
                self.resp_directory.learn_leader(shard.id, leader);
            }
        }
    }

    /// Node `id`'s shard map, asked at `addr`; `None` when it does not
    /// answer in time.
    async fn map_of(&self, id: NodeId, addr: String) -> Option<ShardMap> {
        let asked = self
            .forwarder
            .send_to(vec![addr.clone()], &addr, Request::ShardMap);
        match tokio::time::timeout(ASK_TIMEOUT, asked).await {
            Ok(Ok(Response::ShardMap(map))) => Some(*map),
            other => {
                tracing::debug!(id, %addr, ?other, "no shard map learnt");
                None
            }
        }
    }
}

/// One answer's view of the map: each node's RESP address and role.
struct View<'a> {
    map: &'a ShardMap,
    own: NodeInfo,
}

/// One node as a cluster reply shows it.
struct Shown {
    id: String,
    host: String,
    port: u16,
    master: bool,
}

impl<'a> View<'a> {
    fn new(server: &RespServer, map: &'a ShardMap) -> View<'a> {
        let own_id = server.handler.replica().node_id();
        let own = map.node(own_id).cloned().unwrap_or(NodeInfo {
            id: own_id,
            client_addr: None,
            resp_addr: server.handler.endpoints().resp.clone(),
        });
        View { map, own }
    }

    /// The nodes serving `shard`, master first: its leader if its address
    /// is known, else this node; then the other members with addresses.
    fn serving(&self, shard: rdkv_proto::shard::ShardId) -> Vec<Shown> {
        let Some(info) = self.map.shard(shard) else {
            return Vec::new();
        };
        let shown = |node: &NodeInfo, master| {
            let (host, port) = host_port(node.resp_addr.as_deref()?)?;
            Some(Shown {
                id: redis_id(node.id),
                host: host.to_owned(),
                port,
                master,
            })
        };
        let leader = info.leader.and_then(|id| self.map.node(id));
        let master = leader
            .and_then(|node| shown(node, true))
            .or_else(|| shown(&self.own, true));
        let master_id = master.as_ref().map(|m| m.id.clone());
        let replicas = info
            .members
            .iter()
            .filter_map(|&id| self.map.node(id))
            .filter_map(|node| shown(node, false))
            .filter(|node| Some(&node.id) != master_id.as_ref());
        master.into_iter().chain(replicas).collect()
    }

    fn info(&self) -> Reply {
        let shards = self.map.shards().len();
        let text = format!(
            "cluster_enabled:1\r\ncluster_state:ok\r\ncluster_slots_assigned:{SLOT_COUNT}\r\n\
             cluster_slots_ok:{SLOT_COUNT}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
             cluster_known_nodes:{}\r\ncluster_size:{shards}\r\ncluster_current_epoch:{}\r\n\
             cluster_my_epoch:{}\r\n",
            self.map.nodes().len(),
            self.map.version(),
            self.map.version()
        );
        Reply::bulk(text)
    }

    /// `CLUSTER SLOTS`: per slot range, its first and last slot, then the
    /// master and the replicas as `[host, port, id]`.
    fn slots(&self) -> Reply {
        let ranges = self.map.ranges().iter().map(|range| {
            let nodes = self.serving(range.shard).into_iter().map(|node| {
                Reply::Array(vec![
                    Reply::bulk(node.host),
                    Reply::Integer(i64::from(node.port)),
                    Reply::bulk(node.id),
                ])
            });
            let bounds =
                [range.first.get(), range.last.get()].map(|s| Reply::Integer(i64::from(s)));
            Reply::Array(bounds.into_iter().chain(nodes).collect())
        });
        Reply::Array(ranges.collect())
    }

    /// `CLUSTER SHARDS`: per shard, its slot ranges and its nodes.
    fn shards(&self) -> Reply {
        let shards = self.map.shards().iter().map(|shard| {
            let slots = self
                .map
                .ranges_of(shard.id)
                .flat_map(|r| [r.first.get(), r.last.get()])
                .map(|s| Reply::Integer(i64::from(s)))
                .collect();
            let nodes = self.serving(shard.id).into_iter().map(|node| {
                let field = |name: &'static str, value| (Reply::bulk(name), value);
                Reply::Map(vec![
                    field("id", Reply::bulk(node.id)),
                    field("port", Reply::Integer(i64::from(node.port))),
                    field("ip", Reply::bulk(node.host.clone())),
                    field("endpoint", Reply::bulk(node.host)),
                    field(
                        "role",
                        Reply::bulk(if node.master { "master" } else { "replica" }),
                    ),
                    field("replication-offset", Reply::Integer(0)),
                    field("health", Reply::bulk("online")),
                ])
            });
            Reply::Map(vec![
                (Reply::bulk("slots"), Reply::Array(slots)),
                (Reply::bulk("nodes"), Reply::Array(nodes.collect())),
            ])
        });
        Reply::Array(shards.collect())
    }

    /// `CLUSTER NODES`: one line per node, in Redis's format (`<id>
    /// <ip:port@cport> <flags> <master> 0 0 <epoch> connected <slots>`): a
    /// node shown as master of some shards lists their slots; any other, a
    /// replica of the first shard it serves. (A node of a sharded cluster
    /// may lead one shard and follow another, which Redis cannot say: it
    /// is shown as a master.) The cluster bus port shown is the RESP port
    /// plus 10000, as Redis's default, and is not served.
    fn nodes(&self) -> Reply {
        // Per node id in order of appearance: address, slots led, and the
        // master of the first shard it replicates.
        let mut shown: Vec<(Shown, Vec<String>, Option<String>)> = Vec::new();
        for shard in self.map.shards() {
            let serving = self.serving(shard.id);
            let master_id = serving.first().map(|m| m.id.clone());
            let slots = self
                .map
                .ranges_of(shard.id)
                .map(|r| match (r.first.get(), r.last.get()) {
                    (first, last) if first == last => first.to_string(),
                    (first, last) => format!("{first}-{last}"),
                });
            let slots: Vec<String> = slots.collect();
            for node in serving {
                let at = match shown.iter().position(|(n, _, _)| n.id == node.id) {
                    Some(at) => at,
                    None => {
                        shown.push((node, Vec::new(), None));
                        shown.len() - 1
                    }
                };
                let entry = &mut shown[at];
                if entry.0.id == *master_id.as_deref().unwrap_or_default() {
                    entry.1.extend(slots.iter().cloned());
                } else if entry.2.is_none() {
                    entry.2 = master_id.clone();
                }
            }
        }
        let own_id = redis_id(self.own.id);
        let mut lines = String::new();
        for (node, slots, master) in shown {
            let myself = if node.id == own_id { "myself," } else { "" };
            let (role, master) = match (slots.is_empty(), master) {
                (true, Some(master)) => ("slave", master),
                _ => ("master", "-".to_owned()),
            };
            lines.push_str(&format!(
                "{} {}:{}@{} {myself}{role} {master} 0 0 {} connected {}\n",
                node.id,
                node.host,
                node.port,
                u32::from(node.port) + 10_000,
                self.map.version(),
                slots.join(" ")
            ));
        }
        Reply::bulk(lines)
    }
}
