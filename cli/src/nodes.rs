//! `node remove` (docs/sharding.md, section 8, "Removing a node"): a node
//! leaves a multi-shard cluster for good, through the metadata group's
//! leader (the request follows its `NotLeader` redirects).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use rdkv_client::{Client, ClientOptions};
use rdkv_proto::wire::{Request, Response};

use crate::output::Json;

/// Longest a removal may take: a leadership hand-off, a map version and
/// two membership changes of the metadata group.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Removes node `id` (`Request::RemoveNode`); the message and JSON to print.
pub async fn remove(client: &Client, id: u64) -> Result<(String, Json)> {
    let options = ClientOptions {
        request_timeout: client.options().request_timeout.max(REMOVE_TIMEOUT),
        ..client.options().clone()
    };
    let remover = Client::new(&client.endpoints(), options).context("a client for the removal")?;
    let map = match remover.send(Request::RemoveNode { id }).await {
        Ok(Response::ShardMap(map)) => map,
        Ok(other) => bail!("removing node {id} was answered {other:?}"),
        Err(e) => return Err(e).with_context(|| format!("removing node {id} failed")),
    };
    let nodes: Vec<u64> = map.nodes().iter().map(|n| n.id).collect();
    Ok((
        format!(
            "Node {id} is not in the cluster (map version {}, nodes {nodes:?})",
            map.version()
        ),
        Json::obj([
            ("removed", Json::U64(id)),
            ("version", Json::U64(map.version())),
            (
                "nodes",
                Json::Arr(nodes.into_iter().map(Json::U64).collect()),
            ),
        ]),
    ))
}
