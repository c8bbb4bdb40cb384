//! `shard list`, `shard move-leader` and `shard move-replica`
//! (docs/sharding.md, section 8), and the state `rebalance` plans from:
//! the shard map from any node, each shard's leader as the shards' own
//! replicas report it (`Request::ShardStatus` of every node in the map),
//! leader moves sent to the shard's current leader, replica moves routed
//! to it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkv_client::{Client, ClientOptions, MemberInfo};
use rdkv_proto::shard::{ShardId, ShardLeadership, ShardMap};
use rdkv_proto::wire::{Request, Response, Role, ShardStatus};

use crate::output::{Json, Table, View, lines};

/// The cluster's shards as `rdkvctl` sees them: the map, and each shard's
/// leader from its replicas (the map's hint when none answered).
pub struct ShardsState {
    pub map: ShardMap,
    /// Shard -> (term, leader) reported by a replica leading it, highest term.
    leaders: BTreeMap<ShardId, (u64, u64)>,
}

impl ShardsState {
    /// Asks any node for the map, then every node of the map for the
    /// shards it hosts; nodes that do not answer are skipped.
    pub async fn gather(client: &Client) -> Result<ShardsState> {
        let map = fetch_map(client).await?;
        let mut statuses = Vec::new();
        for node in map.nodes() {
            let Some(addr) = &node.client_addr else {
                continue;
            };
            let Ok(hosted) = client.shard_statuses_of(addr).await else {
                continue;
            };
            statuses.extend(hosted.into_iter().map(|s| (node.id, s)));
        }
        let leaders = leaders_of(statuses.iter().map(|(node, s)| (*node, s)));
        Ok(ShardsState { map, leaders })
    }

    /// Shard `shard`'s leader: as a leading replica reports it, else the
    /// map's hint.
    pub fn leader_of(&self, shard: ShardId) -> Option<u64> {
        self.leaders
            .get(&shard)
            .map(|&(_, leader)| leader)
            .or_else(|| self.map.shard(shard).and_then(|s| s.leader))
    }

    /// Each shard's members and leader, as the rebalance plan takes them.
    pub fn leaderships(&self) -> Vec<ShardLeadership> {
        self.map
            .shards()
            .iter()
            .map(|s| ShardLeadership {
                shard: s.id,
                members: s.members.clone(),
                leader: self.leader_of(s.id),
            })
            .collect()
    }

    pub fn node_ids(&self) -> Vec<u64> {
        self.map.nodes().iter().map(|n| n.id).collect()
    }

    fn client_addr(&self, node: u64) -> Option<&str> {
        self.map.node(node).and_then(|n| n.client_addr.as_deref())
    }
}

/// The shard map, as any node answers it.
pub async fn fetch_map(client: &Client) -> Result<ShardMap> {
    match client.send(Request::ShardMap).await {
        Ok(Response::ShardMap(map)) => Ok(*map),
        Ok(other) => bail!("the shard map request was answered {other:?}"),
        Err(e) => Err(e).context("reading the shard map failed"),
    }
}

/// Shard -> (term, node) of the replica reporting itself leader with the
/// highest term, from `(node, status)` pairs.
pub fn leaders_of<'a>(
    statuses: impl IntoIterator<Item = (u64, &'a ShardStatus)>,
) -> BTreeMap<ShardId, (u64, u64)> {
    let mut leaders = BTreeMap::new();
    for (node, status) in statuses {
        let newer = status.role == Role::Leader
            && leaders
                .get(&status.shard)
                .is_none_or(|&(term, _)| status.term > term);
        if newer {
            leaders.insert(status.shard, (status.term, node));
        }
    }
    leaders
}

/// Moves `shard`'s leadership to `to`, asking the shard's current leader.
pub async fn move_leader(
    client: &Client,
    state: &ShardsState,
    shard: ShardId,
    to: u64,
) -> Result<()> {
    let info = state
        .map
        .shard(shard)
        .with_context(|| format!("shard {shard} is not in the map"))?;
    if !info.members.contains(&to) {
        bail!(
            "node {to} is not a member of shard {shard} ({:?})",
            info.members
        );
    }
    let leader = state
        .leader_of(shard)
        .with_context(|| format!("shard {shard} has no known leader"))?;
    if leader == to {
        return Ok(());
    }
    let addr = state
        .client_addr(leader)
        .with_context(|| format!("no client address known for node {leader}"))?;
    client
        .move_shard_leader_at(addr, shard, to)
        .await
        .with_context(|| format!("moving shard {shard}'s leadership from {leader} to {to} failed"))
}

/// Longest a replica move may take: the new replica catches up first (a
/// snapshot of a full region, at worst).
const MOVE_REPLICA_TIMEOUT: Duration = Duration::from_secs(180);

/// Moves `shard`'s replica `from` -> `to`, asking the shard's leader (its
/// redirects followed: a leader that is `from` hands its leadership on
/// first). Says on stderr what it does, since it takes a while.
pub async fn move_replica(
    client: &Client,
    state: &ShardsState,
    shard: ShardId,
    (from, to): (u64, u64),
) -> Result<Vec<MemberInfo>> {
    let info = state
        .map
        .shard(shard)
        .with_context(|| format!("shard {shard} is not in the map"))?;
    if state.map.node(to).is_none() {
        bail!("node {to} is not in the map");
    }
    eprintln!(
        "moving shard {shard}'s replica from node {from} to node {to} \
         (members {:?}; learner, catch up, promote, remove)...",
        info.members
    );
    let options = ClientOptions {
        request_timeout: client.options().request_timeout.max(MOVE_REPLICA_TIMEOUT),
        ..client.options().clone()
    };
    let mover = Client::new(&client.endpoints(), options).context("a client for the move")?;
    mover
        .move_shard_replica(shard, from, to)
        .await
        .with_context(|| {
            format!("moving shard {shard}'s replica from node {from} to node {to} failed")
        })
}

/// `shard list`: one row per shard.
pub struct ShardListView {
    pub state: ShardsState,
}

impl ShardListView {
    fn rows(&self) -> Vec<[String; 5]> {
        let version = self.state.map.version().to_string();
        self.state
            .map
            .shards()
            .iter()
            .map(|s| {
                [
                    s.id.to_string(),
                    slot_ranges(&self.state.map, s.id).join(" "),
                    join_ids(&s.members),
                    self.state
                        .leader_of(s.id)
                        .map_or_else(|| "-".to_owned(), |l| l.to_string()),
                    version.clone(),
                ]
            })
            .collect()
    }
}

fn slot_ranges(map: &ShardMap, shard: ShardId) -> Vec<String> {
    map.ranges_of(shard)
        .map(|r| format!("{}-{}", r.first.get(), r.last.get()))
        .collect()
}

fn join_ids(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

impl View for ShardListView {
    fn simple(&self) -> String {
        lines(self.rows().into_iter().map(|r| r.join(", ")))
    }

    fn table(&self) -> String {
        let headers = ["SHARD", "SLOTS", "MEMBERS", "LEADER", "MAP VERSION"];
        Table::of(headers, self.rows())
    }

    fn json(&self) -> Json {
        let map = &self.state.map;
        Json::obj([
            ("version", Json::U64(map.version())),
            (
                "shards",
                Json::Arr(
                    map.shards()
                        .iter()
                        .map(|s| {
                            Json::obj([
                                ("shard", Json::U64(u64::from(s.id.0))),
                                (
                                    "slots",
                                    Json::Arr(
                                        slot_ranges(map, s.id).into_iter().map(Json::str).collect(),
                                    ),
                                ),
                                (
                                    "members",
                                    Json::Arr(s.members.iter().map(|&m| Json::U64(m)).collect()),
                                ),
                                ("leader", Json::opt_u64(self.state.leader_of(s.id))),
                            ])
                        })
                        .collect(),
                ),
            ),
        ])
    }
}
