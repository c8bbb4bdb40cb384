//! The metadata group (docs/sharding.md, section 2): real `rdkv-server`
//! processes, `--shards 3 --replicas 2`. Every node serves the same
//! versioned map naming every node's addresses (each node publishes its
//! own); a map edit raises the version by exactly one on every node, and
//! a client holding the old map is routed by the new one after a
//! `WrongShard`; the metadata group survives the SIGKILL of its leader
//! and a restart of every node.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use rdkv_proto::shard::{ShardId, ShardInfo, ShardMap};
use rdkv_proto::wire::{Consistency, Request, Response};
use rdkv_tests::shard_view::{agreed_map, keys_per_shard, node_ids, publish_map};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually, rdkvctl_ok};

const FLAGS: [&str; 6] = ["--shards", "3", "--replicas", "2", "--region-mib", "16"];

/// `map`'s parts with shard `shard` changed by `edit`, one version up.
fn next_map(map: &ShardMap, shard: ShardId, edit: impl Fn(&mut ShardInfo)) -> Result<ShardMap> {
    let mut shards = map.shards().to_vec();
    for info in shards.iter_mut().filter(|info| info.id == shard) {
        edit(info);
    }
    Ok(ShardMap::new(
        map.version() + 1,
        map.nodes().to_vec(),
        shards,
        map.ranges().to_vec(),
    )?)
}

/// The map all of `ids` serve, once they agree on it at `version`.
async fn every_node_at(cluster: &Cluster, ids: &[u64], version: u64) -> Result<ShardMap> {
    let what = format!("every node serving map version {version}");
    eventually(LEADER_TIMEOUT, &what, async || {
        let map = agreed_map(cluster, ids).await?;
        ensure!(map.version() == version, "version {}", map.version());
        Ok(map)
    })
    .await
}

/// The cluster's node ids and the map they all serve once it names every
/// node's addresses.
async fn every_node_listed(cluster: &Cluster) -> Result<(Vec<u64>, ShardMap)> {
    let ids = node_ids(cluster);
    let what = "every node serving one map with every node's addresses";
    let map = eventually(LEADER_TIMEOUT, what, async || {
        agreed_map(cluster, &ids).await
    })
    .await?;
    Ok((ids, map))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_the_versioned_map_and_a_stale_client_follows_an_edit() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(120), async |cluster| {
        let (ids, map) = every_node_listed(cluster).await?;
        // Version 1 is the placed map; each node then published its
        // addresses, one version each.
        ensure!(map.version() >= 4, "{map:?}");
        let placed = map.shard(ShardId(0)).map(|s| s.members.clone());
        ensure!(placed == Some(vec![1, 2]), "{map:?}");

        // An edit naming node 3 alone for shard 0 (which it does not host):
        // one version up on every node.
        let wrong = next_map(&map, ShardId(0), |s| {
            s.members = vec![3];
            s.leader = Some(3);
        })?;
        let (_, applied) = publish_map(cluster, &ids, &wrong).await?;
        ensure!(applied.version() == map.version() + 1, "{applied:?}");
        every_node_at(cluster, &ids, wrong.version()).await?;
        // The same version again is stale: refused by every node.
        ensure!(publish_map(cluster, &ids, &wrong).await.is_err());

        // A client through node 3 takes that map at its first request.
        let stale = cluster.client(Intent::Via(&[3]))?;
        let keys = keys_per_shard(&wrong, 1, |i| format!("meta-{i}"));
        let key_of = |shard| {
            keys.iter()
                .find(|(s, _)| *s == shard)
                .map(|(_, k)| k.clone())
        };
        let (Some(shard0_key), Some(shard1_key)) = (key_of(ShardId(0)), key_of(ShardId(1))) else {
            bail!("no key of shards 0 and 1: {keys:?}");
        };
        stale.put(shard1_key.clone(), "one").await?;
        let held = stale.shard_map().map(|m| m.version());
        ensure!(held == Some(wrong.version()), "the client holds {held:?}");

        // The right members again, one more version up.
        let right = next_map(&wrong, ShardId(0), |s| {
            s.members = vec![1, 2];
            s.leader = Some(1);
        })?;
        publish_map(cluster, &ids, &right).await?;
        every_node_at(cluster, &ids, right.version()).await?;
        let endpoint = cluster.node(3)?.endpoint();
        let get = Request::Get {
            key: shard0_key.clone().into(),
            consistency: Consistency::Linearizable,
        };
        match stale.send_to(&endpoint, get).await? {
            Response::WrongShard(w) if w.map_version == right.version() => {}
            other => bail!("node 3 answered a key of shard 0 with {other:?}"),
        }
        // The client sends the key to node 3 by its map, is answered
        // WrongShard with the new version, and follows it.
        stale.put(shard0_key.clone(), "zero").await?;
        let held = stale.shard_map().map(|m| m.version());
        ensure!(held == Some(right.version()), "the client holds {held:?}");
        let got = cluster.client(Intent::Any)?.get(shard0_key.clone()).await?;
        ensure!(got.is_some_and(|v| &v.value[..] == b"zero"));

        // `rdkvctl shard list` prints the version it got.
        let endpoints = cluster.endpoints(Intent::Any)?.join(",");
        let args = ["--endpoints", &endpoints, "shard", "list", "-w", "json"];
        let out = rdkvctl_ok(&args, &[]).await?;
        let listed = String::from_utf8_lossy(&out.stdout).into_owned();
        let expected = format!("\"version\":{}", right.version());
        ensure!(listed.contains(&expected), "shard list: {listed}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_map_survives_its_leaders_kill_and_a_restart_of_every_node() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(150), async |cluster| {
        let (ids, map) = every_node_listed(cluster).await?;
        let edited = next_map(&map, ShardId(1), |s| s.leader = s.members.last().copied())?;
        let (meta_leader, _) = publish_map(cluster, &ids, &edited).await?;
        every_node_at(cluster, &ids, edited.version()).await?;

        // SIGKILL the metadata group's leader: the others elect one and
        // take a further edit.
        cluster.node_mut(meta_leader)?.kill();
        let survivors: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|&id| id != meta_leader)
            .collect();
        let further = next_map(&edited, ShardId(2), |s| {
            s.leader = s.members.last().copied()
        })?;
        let (new_leader, _) = eventually(LEADER_TIMEOUT, "a new metadata leader", async || {
            publish_map(cluster, &survivors, &further).await
        })
        .await?;
        ensure!(new_leader != meta_leader);
        cluster.restart(meta_leader)?;
        let version = further.version();
        let before = every_node_at(cluster, &ids, version).await?;

        // Every node killed and started again: the map comes back from
        // each node's metadata replica (no address changed: no new version).
        for &id in &ids {
            cluster.node_mut(id)?.kill();
        }
        for &id in &ids {
            cluster.restart(id)?;
        }
        let after = every_node_at(cluster, &ids, version).await?;
        ensure!(after.nodes() == before.nodes() && after.ranges() == before.ranges());
        Ok(())
    })
    .await
}
