//! A new shard map version: [`propose_map_change`] applies an edit to the
//! map this node serves and has the metadata group's leader publish the
//! result as the next version (docs/sharding.md, section 2).
//!
//! The edit runs here, on this node's map; the leader only checks, in the
//! log's apply, that the result is exactly one version above the map it
//! applied (`Command::PublishShardMap`). A proposal built from a map that
//! is no longer the newest is refused there and built again here from the
//! newer one, so an edit is never lost and never applied to an old map.

use std::time::Duration;

use rdkv_proto::shard::{NodeInfo, ShardInfo, ShardMap, ShardMapError, SlotRange};
use rdkv_proto::wire::{ErrorCode, ErrorReply, Request, Response};
use rdkv_storage::raft::Command;
use rdkv_storage::state_machine::shard_map::STALE_MAP_PREFIX;

use super::Meta;
use crate::service::Reply;
use crate::service::write;

/// How long [`propose_map_change`] keeps trying (a leader being elected,
/// its own map catching up with a newer version).
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between two tries.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// A map's parts, for an edit to change: the version is not one of them
/// (the next version is always the served one plus one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEdit {
    pub nodes: Vec<NodeInfo>,
    pub shards: Vec<ShardInfo>,
    pub ranges: Vec<SlotRange>,
}

impl MapEdit {
    pub fn of(map: &ShardMap) -> MapEdit {
        MapEdit {
            nodes: map.nodes().to_vec(),
            shards: map.shards().to_vec(),
            ranges: map.ranges().to_vec(),
        }
    }

    /// The node entry of `id`, added (without addresses) if the map has
    /// none.
    pub fn node_mut(&mut self, id: u64) -> &mut NodeInfo {
        let at = match self.nodes.iter().position(|node| node.id == id) {
            Some(at) => at,
            None => {
                self.nodes.push(NodeInfo {
                    id,
                    client_addr: None,
                    resp_addr: None,
                });
                self.nodes.len() - 1
            }
        };
        &mut self.nodes[at]
    }

    /// Shard `id`'s entry, if the map has it.
    pub fn shard_mut(&mut self, id: rdkv_proto::shard::ShardId) -> Option<&mut ShardInfo> {
        self.shards.iter_mut().find(|shard| shard.id == id)
    }

    fn into_map(self, version: u64) -> Result<ShardMap, ShardMapError> {
        ShardMap::new(version, self.nodes, self.shards, self.ranges)
    }
}

/// Why no new map version was made.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("this node serves a single group: it has no metadata group")]
    NoMetaGroup,
    /// The edit's result is not a valid map (nothing was proposed).
    #[error("the edited shard map is invalid: {0}")]
    InvalidMap(#[from] ShardMapError),
    /// The leader refused the proposal for another reason than a stale
    /// version (which is retried).
    #[error("the metadata group's leader refused the map: {:?}: {}", .0.code, .0.message)]
    Refused(ErrorReply),
    /// No leader took it within [`PROPOSE_TIMEOUT`]: the last reason.
    #[error("no new shard map within {PROPOSE_TIMEOUT:?}: {0}")]
    Unavailable(String),
}

/// What one try came to.
enum Try {
    Published(ShardMap),
    /// Built from a map older than the leader's, or no leader now: try
    /// again (the reason).
    Again(String),
}

/// Makes the next map version: `edit` changes the parts of the map this
/// node serves; the result, one version above it, is published by the
/// metadata group's leader (here if this node leads, else forwarded to it).
/// Returns the version of the map that holds the edit: the new one, or
/// the served one when the edit changed nothing. `edit` may run several
/// times (once per try, each on the newest map this node has).
pub async fn propose_map_change(
    meta: &Meta,
    mut edit: impl FnMut(&mut MapEdit),
) -> Result<u64, MetaError> {
    let deadline = tokio::time::Instant::now() + PROPOSE_TIMEOUT;
    loop {
        let current = meta.map();
        let mut parts = MapEdit::of(&current);
        edit(&mut parts);
        if parts == MapEdit::of(&current) {
            return Ok(current.version());
        }
        let next = parts.into_map(current.version() + 1)?;
        let reason = match publish(meta, next).await? {
            Try::Published(map) => {
                let version = map.version();
                meta.install(map);
                return Ok(version);
            }
            Try::Again(reason) => reason,
        };
        if tokio::time::Instant::now() + RETRY_AFTER > deadline {
            return Err(MetaError::Unavailable(reason));
        }
        tracing::debug!("shard map proposal: {reason}; trying again");
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// One try at publishing `map`: here when this node leads the metadata
/// group, else at the leader it knows.
async fn publish(meta: &Meta, map: ShardMap) -> Result<Try, MetaError> {
    let replica = meta.replica();
    if replica.raft.is_leader() {
        return judge(publish_here(meta, map).await);
    }
    let Some(leader) = replica.metrics().current_leader else {
        return Ok(Try::Again("the metadata group has no leader".into()));
    };
    let Some(addr) = replica.client_addr_of(leader, None) else {
        return Ok(Try::Again(format!(
            "node {leader} leads the metadata group; its client address is not known yet"
        )));
    };
    let sent = match rdkv_client::Client::new(&[&addr], meta.forward_options().clone()) {
        Ok(client) => {
            client
                .send_to(&addr, Request::PublishShardMap { map })
                .await
        }
        Err(e) => Err(e),
    };
    match sent {
        Ok(response) => judge(Ok(response)),
        Err(rdkv_client::Error::Server(reply)) => judge(Err(reply)),
        Err(e) => Ok(Try::Again(format!(
            "forwarding to node {leader} at {addr}: {e}"
        ))),
    }
}

/// A leader's answer as the outcome of one try.
fn judge(reply: Reply) -> Result<Try, MetaError> {
    match reply {
        Ok(Response::ShardMap(map)) => Ok(Try::Published(*map)),
        Err(reply) | Ok(Response::Error(reply)) => match reply.code {
            ErrorCode::NotLeader | ErrorCode::Unavailable | ErrorCode::Timeout => {
                Ok(Try::Again(reply.message))
            }
            ErrorCode::InvalidRequest if reply.message.starts_with(STALE_MAP_PREFIX) => {
                Ok(Try::Again(reply.message))
            }
            _ => Err(MetaError::Refused(reply)),
        },
        Ok(other) => Err(MetaError::Refused(ErrorReply::new(
            ErrorCode::Internal,
            format!("unexpected answer {other:?}"),
        ))),
    }
}

/// `Request::PublishShardMap` on this node: proposed if this node leads
/// the metadata group (the log's apply refuses a stale version), else
/// `NotLeader` naming the leader. Answered with the map once applied.
pub async fn publish_here(meta: &Meta, map: ShardMap) -> Reply {
    let replica = meta.replica();
    replica.require_leader()?;
    match write::commit(
        replica,
        Command::PublishShardMap { map: map.clone() },
        &mut None,
    )
    .await?
    {
        Response::Written { .. } => {
            meta.install(map.clone());
            Ok(Response::ShardMap(Box::new(map)))
        }
        Response::Error(reply) => Err(reply),
        other => Err(ErrorReply::new(
            ErrorCode::Internal,
            format!("publishing a shard map gave {other:?}"),
        )),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use rdkv_proto::shard::ShardId;

    use super::*;

    /// Nodes 1-3 with no addresses, 3 shards of 2 replicas as placed at
    /// bootstrap: shard 0 on {1, 2}, 1 on {2, 3}, 2 on {3, 1}.
    pub(in crate::meta) fn placed() -> ShardMap {
        let nodes = [1, 2, 3]
            .map(|id| NodeInfo {
                id,
                client_addr: None,
                resp_addr: None,
            })
            .to_vec();
        crate::placement::initial(nodes, 3, 2).unwrap()
    }

    #[test]
    fn an_edit_that_breaks_the_map_is_a_typed_error() {
        let mut parts = MapEdit::of(&placed());
        parts.shard_mut(ShardId(1)).unwrap().members.clear();
        assert_eq!(parts.into_map(2), Err(ShardMapError::NoMembers(ShardId(1))));
        let mut parts = MapEdit::of(&placed());
        parts.shard_mut(ShardId(0)).unwrap().members.push(9);
        assert!(matches!(
            parts.into_map(2),
            Err(ShardMapError::UnknownMember { node: 9, .. })
        ));
    }

    #[test]
    fn a_node_entry_is_edited_in_place_or_added() {
        let mut parts = MapEdit::of(&placed());
        parts.node_mut(2).client_addr = Some("127.0.0.2:7000".into());
        parts.node_mut(4).resp_addr = Some("127.0.0.4:6379".into());
        let map = parts.into_map(2).unwrap();
        assert_eq!(map.version(), 2);
        assert_eq!(
            map.node(2).unwrap().client_addr.as_deref(),
            Some("127.0.0.2:7000")
        );
        assert_eq!(
            map.node(4).unwrap().resp_addr.as_deref(),
            Some("127.0.0.4:6379")
        );
        assert_eq!(map.nodes().len(), 4);
    }

    #[test]
    fn only_stale_versions_and_a_missing_leader_are_tried_again() {
        let again = |reply: ErrorReply| matches!(judge(Err(reply)), Ok(Try::Again(_)));
        assert!(again(ErrorReply::not_leader(None)));
        assert!(again(rdkv_storage::state_machine::shard_map::stale(3, 3)));
        assert!(!again(ErrorReply::new(ErrorCode::InvalidRequest, "no")));
        assert!(matches!(
            judge(Ok(Response::Done)),
            Err(MetaError::Refused(_))
        ));
    }
}
