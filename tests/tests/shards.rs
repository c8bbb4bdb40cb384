//! A cluster of several Raft groups (docs/sharding.md): real `rdkv-server`
//! processes bootstrapped with `--shards 3 --replicas 2`, so that each node
//! hosts two of the three shards and a key of the third is answered
//! `WrongShard` there. Every shard elects a leader, the client writes and
//! reads keys of every shard through any node, and a restart of the whole
//! cluster keeps every shard's data.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use rdkv_proto::shard::ShardId;
use rdkv_tests::shard_view::{agreed_leaders, keys_per_shard, map_of, node_ids};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually};

const SHARDS: u32 = 3;
const FLAGS: [&str; 6] = ["--shards", "3", "--replicas", "2", "--region-mib", "16"];

/// Every shard's leader, agreed by all of its members.
async fn leaders(cluster: &Cluster) -> Result<BTreeMap<ShardId, u64>> {
    agreed_leaders(cluster, &node_ids(cluster)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_serve_every_shard_and_keep_it_over_a_restart() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let led = eventually(LEADER_TIMEOUT, "a leader in every shard", async || {
            leaders(cluster).await
        })
        .await?;
        ensure!(led.len() == SHARDS as usize, "{led:?}");
        let map = map_of(cluster, 1).await?;
        // Each node hosts two shards: a third of the keys are not its own.
        for shard in map.shards() {
            ensure!(shard.members.len() == 2, "{map:?}");
        }
        let keys = keys_per_shard(&map, 4, |i| format!("key-{i}"));

        // Through node 1 alone: keys of the shard it does not host are
        // answered WrongShard there, and the client follows the map.
        let client = cluster.client(Intent::Via(&[1]))?;
        for (shard, key) in &keys {
            client
                .put(key.clone(), format!("{key}@{}", shard.0))
                .await
                .map_err(|e| anyhow::anyhow!("writing {key} (shard {}): {e}", shard.0))?;
        }
        let fetched = client.shard_map();
        ensure!(
            fetched
                .as_ref()
                .is_some_and(|m| m.version() >= map.version()),
            "the client never took the cluster's map: {fetched:?}"
        );
        let anywhere = cluster.client(Intent::Any)?;
        for (shard, key) in &keys {
            let got = anywhere.get(key.clone()).await?;
            let expected = format!("{key}@{}", shard.0);
            ensure!(
                got.as_ref().map(|v| &v.value[..]) == Some(expected.as_bytes()),
                "{key} (shard {}) reads {got:?}",
                shard.0
            );
        }

        // SIGKILL every node, then start them again: each shard's log and
        // snapshots come back from its own directory.
        let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
        for &id in &ids {
            cluster.node_mut(id)?.kill();
        }
        for &id in &ids {
            cluster.restart(id)?;
        }
        eventually(
            LEADER_TIMEOUT,
            "a leader in every shard again",
            async || leaders(cluster).await,
        )
        .await?;
        let after = cluster.client(Intent::Via(&[2]))?;
        for (shard, key) in &keys {
            let got = after.get(key.clone()).await?;
            let expected = format!("{key}@{}", shard.0);
            ensure!(
                got.as_ref().map(|v| &v.value[..]) == Some(expected.as_bytes()),
                "after the restart {key} (shard {}) reads {got:?}",
                shard.0
            );
        }
        Ok(())
    })
    .await
}

/// `pairs`' keys as strings.
fn key_names(pairs: &[(bytes::Bytes, rdkv_proto::wire::Versioned)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(key, _)| String::from_utf8_lossy(key).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_covers_every_shard_in_key_order_and_a_clear_empties_them_all() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &FLAGS)?;
    check(&mut cluster, Duration::from_secs(60), async |cluster| {
        eventually(LEADER_TIMEOUT, "a leader in every shard", async || {
            leaders(cluster).await
        })
        .await?;
        // Node 1 (the client's only endpoint) serves the others' client
        // addresses once each published them in the map's node directory
        // (a version each): the client then gets them all.
        let map = eventually(LEADER_TIMEOUT, "node 1 knows every address", async || {
            let map = map_of(cluster, 1).await?;
            ensure!(
                map.nodes().iter().all(|n| n.client_addr.is_some()),
                "{map:?}"
            );
            Ok(map)
        })
        .await?;
        // Ten keys per shard; the key names interleave the shards.
        let mut keys: Vec<String> = keys_per_shard(&map, 10, |i| format!("key-{i:03}"))
            .into_iter()
            .map(|(_, key)| key)
            .collect();
        keys.sort();
        let client = cluster.client(Intent::Via(&[1]))?;
        client.mput(keys.iter().map(|k| (k.clone(), "v"))).await?;

        let all = client.scan("", 1_000).await?;
        ensure!(
            key_names(&all) == keys,
            "a full scan: {:?}",
            key_names(&all)
        );

        // Paged with a small limit, each page after the last key of the
        // one before, as a caller pages.
        let mut paged: Vec<String> = Vec::new();
        let mut from = bytes::Bytes::new();
        loop {
            let page = client.scan(from.clone(), 7).await?;
            let Some((last, _)) = page.last() else { break };
            let mut next = last.to_vec();
            next.push(0);
            from = next.into();
            paged.extend(key_names(&page));
        }
        ensure!(paged == keys, "paged by 7: {paged:?}");

        // A range that crosses shards, from a key of one to a key of another.
        let range = client
            .scan_range(
                keys[3].clone(),
                Some(keys[22].clone().into()),
                1_000,
                rdkv_proto::wire::Consistency::Linearizable,
            )
            .await?;
        ensure!(
            key_names(&range) == keys[3..22],
            "a range: {:?}",
            key_names(&range)
        );

        // Clear: every shard emptied, each through its leader.
        let (removed, _) = client.clear().await?;
        ensure!(removed == keys.len() as u64, "clear removed {removed}");
        ensure!(
            client.scan("", 1_000).await?.is_empty(),
            "a scan after clear"
        );
        let anywhere = cluster.client(Intent::Any)?;
        for key in &keys {
            let got = anywhere.get(key.clone()).await?;
            ensure!(got.is_none(), "{key} after clear: {got:?}");
        }
        Ok(())
    })
    .await
}

/// Docs/sharding.md, section 3: between two nodes, one Raft connection
/// carries every shard's frames (and one more carries snapshots), not a
/// connection per shard. Six shards on three nodes, each hosting all six
/// (and the metadata group): after writes to every shard, each node has at
/// most two peer connections from each other node (counted among the
/// sockets of this machine, and by each sender's `rdkv_peer_links`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_connections_are_shared_between_shards() -> Result<()> {
    let flags = ["--shards", "6", "--replicas", "3", "--region-mib", "16"];
    let mut cluster = Cluster::start_with(3, &flags)?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let led = eventually(LEADER_TIMEOUT, "a leader in every shard", async || {
            leaders(cluster).await
        })
        .await?;
        ensure!(led.len() == 6, "{led:?}");
        let map = map_of(cluster, 1).await?;
        let client = cluster.client(Intent::Any)?;
        for (shard, key) in keys_per_shard(&map, 2, |i| format!("key-{i}")) {
            client
                .put(key.clone(), "v")
                .await
                .map_err(|e| anyhow::anyhow!("writing {key} (shard {}): {e}", shard.0))?;
        }
        let ids = node_ids(cluster);
        let others = ids.len() - 1;
        eventually(
            LEADER_TIMEOUT,
            "two peer connections per node pair",
            async || {
                for &id in &ids {
                    let peer_addr = cluster.node(id)?.peer_addr;
                    let accepted = established_to(peer_addr)?;
                    ensure!(
                        accepted <= 2 * others,
                        "node {id} has {accepted} peer connections from {others} nodes"
                    );
                    let links = peer_links(cluster, id).await?;
                    for (peer, open) in &links {
                        ensure!(*open <= 2.0, "node {id} has {open} links to node {peer}");
                    }
                    // A leader replicates to both of its followers.
                    if led.values().any(|&leader| leader == id) {
                        ensure!(links.len() == others, "leader {id}'s links: {links:?}");
                    }
                }
                Ok(())
            },
        )
        .await
    })
    .await
}

/// ESTABLISHED TCP connections whose local end is `addr` (the accepted
/// side of connections to it), from this machine's `/proc/net/tcp`.
fn established_to(addr: std::net::SocketAddr) -> Result<usize> {
    let std::net::SocketAddr::V4(addr) = addr else {
        anyhow::bail!("{addr} is not IPv4");
    };
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let mut count = 0;
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
            continue;
        };
        let Some((ip, port)) = local.split_once(':') else {
            continue;
        };
        // The address as the kernel's u32 in host order, the port in hex.
        let ip = std::net::Ipv4Addr::from(u32::from_str_radix(ip, 16)?.to_le_bytes());
        let port = u16::from_str_radix(port, 16)?;
        if *state == "01" && ip == *addr.ip() && port == addr.port() {
            count += 1;
        }
    }
    Ok(count)
}

/// Node `id`'s open peer links by peer (`rdkv_peer_links`, both purposes).
async fn peer_links(cluster: &Cluster, id: u64) -> Result<BTreeMap<String, f64>> {
    let addr = cluster.node(id)?.http_addr;
    let (_, text) =
        tokio::task::spawn_blocking(move || rdkv_tests::prometheus::http_get(addr, "/metrics"))
            .await??;
    let metrics = rdkv_tests::prometheus::parse(&text)?;
    let mut links = BTreeMap::new();
    for peer in 1..=3u64 {
        let peer = peer.to_string();
        let open = metrics.sum("rdkv_peer_links", &[("peer", &peer)]);
        if open > 0.0 {
            links.insert(peer, open);
        }
    }
    Ok(links)
}
