//! `--join SEED`: a fresh node asks a member of a running cluster to add it.
//!
//! What it joins is the seed's: [`settle_shards`] asks the seed for its
//! shard map at the first start (a data directory without state) and takes
//! the cluster's shard count from it, as a TiKV store takes everything
//! from PD; `--shards`, when given as well (an etcd operator's habit of
//! giving every member the same flags), must match it, and a data
//! directory keeps its count for life (`layout`).
//!
//! - A single group: a member adds the node as a learner, waits until it
//!   caught up, makes it a voter (`AddMember`), in the background while
//!   the node serves ([`join_cluster`]); it stops once Raft is initialized.
//! - A multi-shard cluster: the node starts with no data shard and its
//!   empty replica of the metadata group, serving the seed's map; before
//!   it serves clients it asks the metadata group's leader to add it
//!   ([`join_sharded`], `Request::AddNode`): a learner of the group, caught
//!   up, listed in a new map version with its addresses. `JOINED` then
//!   records the join: a restart does not join again. Replicas are moved
//!   onto it with `rdkvctl shard move-replica` (docs/sharding.md, section
//!   8).

use std::time::Duration;

use anyhow::{Result, bail};
use rdkv_proto::shard::ShardMap;
use rdkv_proto::wire::{ErrorCode, Request, Response};
use tokio::sync::watch;

use crate::config::Config;
use crate::layout::Layout;

const RETRY: Duration = Duration::from_secs(1);
/// Adding a member or a node waits for it to catch up, snapshot included.
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What `--join` comes to for this start.
#[derive(Debug)]
pub enum Joining {
    /// Not started with `--join`.
    No,
    /// A single group: joined in the background ([`join_cluster`]) unless
    /// this node's Raft is initialized.
    Single,
    /// A multi-shard cluster: the map this node starts from (the seed's on
    /// a first start, the one `JOINED` records on a restart), and whether
    /// `JOINED` records the join done.
    Sharded {
        seed: String,
        map: ShardMap,
        joined: bool,
    },
}

/// Settles `config.shards` for a node started with `--join` (the
/// cluster's: the data directory's on a restart, else the seed's map's)
/// and what the join is. Refuses a `--shards` the cluster does not have,
/// and a data directory of a joined node started without `--join`. Waits
/// (retrying every second) until the seed answers when it must be asked.
pub async fn settle_shards(
    config: &mut Config,
    own: &rdkv_client::ClientOptions,
) -> Result<Joining> {
    let recorded = Layout::recorded_count(&config.data_dir)?;
    let joined = match recorded {
        Some(count) if count > 1 => Layout::recorded_joined(&config.data_dir)?,
        _ => None,
    };
    let Some(seed) = config.join.clone() else {
        if joined.is_some() {
            bail!(
                "{} is the data directory of a node added with --join: start it with \
                 --join again (it does not join twice)",
                config.data_dir.display()
            );
        }
        return Ok(Joining::No);
    };
    if let (Some(map), Some(count)) = (joined, recorded) {
        // A restart; `Layout::open` refuses a --shards other than the count.
        if !config.shards_given {
            config.shards = count;
        }
        return Ok(Joining::Sharded {
            seed,
            map,
            joined: true,
        });
    }
    if recorded == Some(1) {
        // A single group's member (joined before, or half-way): as before.
        return Ok(Joining::Single);
    }
    let map = seed_map(&seed, own).await;
    let count = map.as_ref().map_or(1, |m| m.shards().len() as u32);
    if config.shards_given && config.shards != count {
        bail!(
            "the cluster at {seed} has {count} shard(s), not --shards {}: start this node \
             with --shards {count}, or without --shards to take the cluster's",
            config.shards
        );
    }
    if let Some(made) = recorded.filter(|&made| made != count) {
        bail!(
            "{} was made for {made} shards, but the cluster at {seed} has {count}: \
             give this node a new data directory",
            config.data_dir.display()
        );
    }
    config.shards = count;
    Ok(match map {
        Some(map) if count > 1 => Joining::Sharded {
            seed,
            map,
            joined: false,
        },
        _ => Joining::Single,
    })
}

/// The seed's shard map, asked until it answers one; `None`: the seed is
/// older than the request (`Malformed`), so a single group.
async fn seed_map(seed: &str, own: &rdkv_client::ClientOptions) -> Option<ShardMap> {
    loop {
        let answer = match rdkv_client::Client::new(&[seed], own.clone()) {
            Ok(client) => client.send_to(seed, Request::ShardMap).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Response::ShardMap(map)) => return Some(*map),
            Err(rdkv_client::Error::Server(reply)) if reply.code == ErrorCode::Malformed => {
                return None;
            }
            Ok(other) => {
                tracing::warn!(%seed, "the seed answered ShardMap with {other:?}; retrying")
            }
            Err(e) => tracing::warn!(%seed, "asking the seed for its shard map: {e}; retrying"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Joins a single group through `seed`: `AddMember` until it succeeds or
/// the node shuts down.
pub async fn join_cluster(
    seed: String,
    id: u64,
    peer_addr: String,
    client_addr: String,
    own_client: rdkv_client::ClientOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let attempt = async {
            let options = rdkv_client::ClientOptions {
                request_timeout: JOIN_TIMEOUT,
                ..own_client.clone()
            };
            let client = rdkv_client::Client::connect_with(&[seed.as_str()], options).await?;
            client
                .add_member(id, peer_addr.clone(), client_addr.clone(), false)
                .await
        };
        tokio::select! {
            result = attempt => match result {
                Ok(_) => {
                    tracing::info!(%seed, "joined the cluster");
                    return;
                }
                Err(e) => tracing::warn!(%seed, "joining the cluster: {e}; retrying"),
            },
            _ = shutdown.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Joins a multi-shard cluster through `seed`: `Request::AddNode` for
/// `node`, to the seed and then wherever its `NotLeader` points (the
/// metadata group's leader), until the node is in; the map that lists it.
/// Retries what may pass (no leader, a node unreachable, a catch-up that
/// took too long); fails on a refusal (an id the cluster has, a seed that
/// does not know the request).
pub async fn join_sharded(
    seed: &str,
    node: Request,
    own: &rdkv_client::ClientOptions,
) -> Result<ShardMap> {
    let options = rdkv_client::ClientOptions {
        request_timeout: JOIN_TIMEOUT,
        ..own.clone()
    };
    let mut target = seed.to_owned();
    loop {
        let answer = match rdkv_client::Client::new(&[target.as_str()], options.clone()) {
            Ok(client) => client.send_to(&target, node.clone()).await,
            Err(e) => Err(e),
        };
        let redirect = match answer {
            Ok(Response::ShardMap(map)) => {
                tracing::info!(%target, version = map.version(), "joined the cluster");
                return Ok(*map);
            }
            Err(rdkv_client::Error::Server(reply)) => match reply.code {
                ErrorCode::NotLeader => reply.leader_hint.map(|hint| hint.client_addr),
                ErrorCode::Malformed => bail!(
                    "the node at {target} does not know `AddNode` (it is older than this \
                     node): upgrade the cluster's nodes before adding one ({})",
                    reply.message
                ),
                ErrorCode::InvalidRequest | ErrorCode::NotFound => bail!(
                    "the cluster at {target} refused this node: {:?}: {}",
                    reply.code,
                    reply.message
                ),
                _ => {
                    tracing::warn!(%target, "joining the cluster: {}; retrying", reply.message);
                    None
                }
            },
            Err(e) if e.is_handshake_refusal() && !e.is_retryable() => {
                bail!("the cluster at {target} refused this node's connection: {e}")
            }
            Ok(other) => {
                tracing::warn!(%target, "joining the cluster: answered {other:?}; retrying");
                None
            }
            Err(e) => {
                tracing::warn!(%target, "joining the cluster: {e}; retrying");
                None
            }
        };
        match redirect {
            Some(leader) if leader != target => {
                tracing::info!(%leader, "joining through the metadata group's leader");
                target = leader;
                // Two nodes naming each other while a leader is elected.
                tokio::time::sleep(RETRY / 10).await;
            }
            _ => {
                target = seed.to_owned();
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
