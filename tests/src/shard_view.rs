//! What the nodes of a sharded cluster (`--shards N`) say about its shards:
//! each node's own shard map, and the leader of every shard as its members
//! report it from their own Raft groups.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{Request, Response};

use crate::{Cluster, Intent};

/// Node `id`'s own shard map, asked directly.
pub async fn map_of(cluster: &Cluster, id: u64) -> Result<ShardMap> {
    let client = cluster.client(Intent::Via(&[id]))?;
    let endpoint = cluster.node(id)?.endpoint();
    match client.send_to(&endpoint, Request::ShardMap).await? {
        Response::ShardMap(map) => Ok(*map),
        other => bail!("node {id} answered ShardMap with {other:?}"),
    }
}

/// Every shard's leader as the nodes `asked` report it: each shard must
/// have a leader among `asked` that every asked member of the shard names
/// (a node reports the placed hint for shards it does not host, so only
/// members count). Fails while any shard has none, or its members disagree.
pub async fn agreed_leaders(cluster: &Cluster, asked: &[u64]) -> Result<BTreeMap<ShardId, u64>> {
    let mut reports: BTreeMap<ShardId, Vec<Option<u64>>> = BTreeMap::new();
    let mut map = None;
    for &id in asked {
        let node_map = map_of(cluster, id).await?;
        for shard in node_map.shards() {
            if shard.members.contains(&id) {
                reports.entry(shard.id).or_default().push(shard.leader);
            }
        }
        map = Some(node_map);
    }
    let Some(map) = map else {
        bail!("no node asked");
    };
    let mut agreed = BTreeMap::new();
    for shard in map.shards() {
        let named = reports.remove(&shard.id).unwrap_or_default();
        match named.first() {
            Some(Some(leader))
                if named.iter().all(|l| *l == Some(*leader)) && asked.contains(leader) =>
            {
                agreed.insert(shard.id, *leader);
            }
            _ => bail!(
                "shard {}: its members among {asked:?} report leaders {named:?}",
                shard.id.0
            ),
        }
    }
    Ok(agreed)
}

/// Keys named `name(0)`, `name(1)`, ... taken in that order until each
/// shard of `map` has `per_shard` of them; each with its shard.
pub fn keys_per_shard(
    map: &ShardMap,
    per_shard: usize,
    name: impl Fn(usize) -> String,
) -> Vec<(ShardId, String)> {
    let mut keys = Vec::new();
    let mut counts: BTreeMap<ShardId, usize> = BTreeMap::new();
    let wanted = per_shard * map.shards().len();
    for i in 0.. {
        if keys.len() == wanted {
            break;
        }
        let key = name(i);
        let shard = map.shard_of_key(key.as_bytes());
        let count = counts.entry(shard).or_default();
        if *count < per_shard {
            *count += 1;
            keys.push((shard, key));
        }
    }
    keys
}

/// The ids of `cluster`'s nodes now.
pub fn node_ids(cluster: &Cluster) -> Vec<u64> {
    cluster.nodes.keys().copied().collect()
}

/// The map every node of `ids` serves, once they all serve the same one
/// (leader hints aside: they change without a version) naming each of
/// `ids` with its client and RESP addresses. Fails while they differ.
pub async fn agreed_map(cluster: &Cluster, ids: &[u64]) -> Result<ShardMap> {
    let mut agreed: Option<ShardMap> = None;
    for &id in ids {
        let map = map_of(cluster, id).await?;
        for &named in ids {
            let node = cluster.node(named)?;
            let listed = map.node(named);
            let complete = listed.is_some_and(|n| {
                n.client_addr.as_deref() == Some(&node.endpoint()[..])
                    && n.resp_addr == Some(node.resp_addr.to_string())
            });
            if !complete {
                bail!(
                    "node {id}'s map (version {}) lists node {named} as {listed:?}",
                    map.version()
                );
            }
        }
        if let Some(first) = &agreed {
            let same = first.version() == map.version()
                && first.nodes() == map.nodes()
                && first.ranges() == map.ranges()
                && members(first) == members(&map);
            if !same {
                bail!("nodes serve different maps: {first:?} and node {id}'s {map:?}");
            }
        }
        agreed = Some(map);
    }
    agreed.ok_or_else(|| anyhow::anyhow!("no node asked"))
}

/// Each shard's members, without the leader hints.
fn members(map: &ShardMap) -> Vec<(ShardId, Vec<u64>)> {
    map.shards()
        .iter()
        .map(|s| (s.id, s.members.clone()))
        .collect()
}

/// Publishes `map` (the next version) through `Request::PublishShardMap`
/// at whichever node of `ids` leads the metadata group; returns that
/// node's id and the map it applied. Fails if none took it.
pub async fn publish_map(
    cluster: &Cluster,
    ids: &[u64],
    map: &ShardMap,
) -> Result<(u64, ShardMap)> {
    let mut refusals = Vec::new();
    for &id in ids {
        let client = cluster.client(Intent::Via(&[id]))?;
        let endpoint = cluster.node(id)?.endpoint();
        let request = Request::PublishShardMap { map: map.clone() };
        match client.send_to(&endpoint, request).await {
            Ok(Response::ShardMap(applied)) => return Ok((id, *applied)),
            other => refusals.push(format!("node {id}: {other:?}")),
        }
    }
    bail!(
        "no node published map version {}: {refusals:?}",
        map.version()
    )
}

/// Waits up to `timeout` until `shards` shards each have a leader among
/// `ids` that their members there agree on ([`agreed_leaders`]); returns
/// the leaders.
pub async fn every_shard_led(
    cluster: &Cluster,
    ids: &[u64],
    shards: usize,
    timeout: Duration,
) -> Result<BTreeMap<ShardId, u64>> {
    crate::eventually(
        timeout,
        &format!("a leader of every shard among {ids:?}"),
        async || {
            let leaders = agreed_leaders(cluster, ids).await?;
            ensure!(leaders.len() == shards, "leaders {leaders:?}");
            Ok(leaders)
        },
    )
    .await
}
