//! [`Shards`]: this node's shard replicas (docs/sharding.md, section 3),
//! and which of them serves a key.
//!
//! A single-group node (`--shards 1`, the default) holds one replica,
//! shard 0, and no placed map: its `ShardMap` is computed from the group's
//! membership as before, and every key is its one group's. A node of a
//! multi-shard cluster holds the replicas `placement::initial` put on it
//! and the placed map (static until the metadata group exists); a key of a
//! shard it does not host is answered `WrongShard`.

use std::collections::BTreeMap;
use std::sync::Arc;

use rdkv_fabric::RegionMemory;
use rdkv_proto::shard::{FIRST_SLOT, LAST_SLOT, NodeInfo, ShardId, ShardInfo, ShardMap, key_slot};
use rdkv_proto::wire::{ErrorCode, ErrorReply, ShmGrant, WrongShard};

use crate::replica::Replica;

/// Why a set of keys is not served by one of this node's replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotHere {
    /// Their shard is not hosted here: the client's map is stale.
    WrongShard(WrongShard),
    /// They belong to several shards (split by shard: not built yet).
    CrossShard,
}

impl NotHere {
    /// The refusal as an error reply, for callers that cannot answer
    /// `WrongShard` (RESP, a version-1 connection gets it replaced).
    pub fn to_error(&self) -> ErrorReply {
        match self {
            NotHere::WrongShard(w) => ErrorReply::new(
                ErrorCode::InvalidRequest,
                format!(
                    "slot {} is served by shard {}, which this node does not host",
                    w.slot.get(),
                    w.shard.0
                ),
            ),
            NotHere::CrossShard => cross_shard(),
        }
    }
}

/// The refusal of a request whose keys are in several shards.
pub fn cross_shard() -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        "the keys of this request belong to several shards \
         (only keys of one shard may be combined; use a common {hash tag})",
    )
}

/// The refusal of a request that would span every shard (scan, clear) on a
/// multi-shard node: built with the client's split (docs/sharding.md,
/// section 11, step 5).
pub fn not_across_shards(what: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::InvalidRequest,
        format!("{what} across shards is not served yet (docs/sharding.md, section 11)"),
    )
}

#[derive(Debug, Clone)]
pub struct Shards {
    /// Serves the requests that name no shard: shard 0, or the lowest
    /// shard hosted here.
    primary: Replica,
    /// Every replica of this node, `primary` among them.
    replicas: Arc<BTreeMap<ShardId, Replica>>,
    /// The placed map of a multi-shard cluster; `None`: a single group.
    placed: Option<Arc<ShardMap>>,
}

impl Shards {
    /// Today's node: one group, shard 0.
    pub fn single(replica: Replica) -> Shards {
        Shards {
            primary: replica.clone(),
            replicas: Arc::new(BTreeMap::from([(ShardId(0), replica)])),
            placed: None,
        }
    }

    /// A multi-shard node: `replicas` of the shards `map` put here; `None`
    /// when there are none.
    pub fn placed(map: ShardMap, replicas: BTreeMap<ShardId, Replica>) -> Option<Shards> {
        let primary = replicas.values().next()?.clone();
        Some(Shards {
            primary,
            replicas: Arc::new(replicas),
            placed: Some(Arc::new(map)),
        })
    }

    /// The placed map of a multi-shard node, as placed (no leader seen yet).
    pub fn placed_map(&self) -> Option<&ShardMap> {
        self.placed.as_deref()
    }

    pub fn is_sharded(&self) -> bool {
        self.placed.is_some()
    }

    /// The replica of requests that name no shard (admin, status): shard 0,
    /// or the lowest shard hosted here.
    pub fn primary(&self) -> &Replica {
        &self.primary
    }

    pub fn get(&self, shard: ShardId) -> Option<&Replica> {
        self.replicas.get(&shard)
    }

    pub fn iter(&self) -> impl Iterator<Item = (ShardId, &Replica)> {
        self.replicas.iter().map(|(id, r)| (*id, r))
    }

    /// The slot ranges (first, last; inclusive) `shard` serves: a single
    /// group serves them all.
    pub fn slot_ranges(&self, shard: ShardId) -> Vec<(u16, u16)> {
        match &self.placed {
            Some(map) => map
                .ranges_of(shard)
                .map(|range| (range.first.get(), range.last.get()))
                .collect(),
            None => vec![(FIRST_SLOT.get(), LAST_SLOT.get())],
        }
    }

    /// The replica serving `key`.
    pub fn for_key(&self, key: &[u8]) -> Result<&Replica, NotHere> {
        let Some(map) = &self.placed else {
            return Ok(self.primary());
        };
        let slot = key_slot(key);
        let shard = map.shard_of_slot(slot);
        self.replicas
            .get(&shard)
            .ok_or(NotHere::WrongShard(WrongShard {
                map_version: map.version(),
                slot,
                shard,
            }))
    }

    /// The replica of `shard`, named by a `Request::Sharded`: not hosted
    /// here (or not in this node's map), `WrongShard` with the shard's
    /// first slot. A single group hosts shard 0 only.
    pub fn hosted(&self, shard: ShardId) -> Result<&Replica, NotHere> {
        if let Some(replica) = self.replicas.get(&shard) {
            return Ok(replica);
        }
        // A single group's map is version 1 (docs/sharding.md, section 2).
        let Some(map) = &self.placed else {
            return Err(NotHere::WrongShard(WrongShard {
                map_version: 1,
                slot: FIRST_SLOT,
                shard,
            }));
        };
        let slot = map.ranges_of(shard).next().map(|range| range.first);
        Err(NotHere::WrongShard(WrongShard {
            map_version: map.version(),
            slot: slot.unwrap_or(FIRST_SLOT),
            shard,
        }))
    }

    /// The region an shm attach asks for (docs/sharding.md, section 5):
    /// the named shard's, `WrongShard` for one not hosted here; a plain
    /// attach (`None`) gets the single group's region, and is refused on a
    /// multi-shard node (it names no shard: its reader would take another
    /// shard's keys for absent).
    pub fn shm_region(&self, shard: Option<ShardId>) -> Result<Arc<RegionMemory>, ShmGrant> {
        let replica = match shard {
            Some(shard) => self.hosted(shard).map_err(|refusal| match refusal {
                NotHere::WrongShard(wrong) => ShmGrant::WrongShard(wrong),
                cross => ShmGrant::Refused {
                    code: ErrorCode::InvalidRequest,
                    message: cross.to_error().message,
                },
            })?,
            None if self.is_sharded() => {
                return Err(ShmGrant::Refused {
                    code: ErrorCode::InvalidRequest,
                    message: "this node hosts several shards: an attach must name its \
                              shard (protocol version 3)"
                        .to_owned(),
                });
            }
            None => self.primary(),
        };
        Ok(replica.sm.region_memory())
    }

    /// The replica serving every one of `keys` (all in one shard); no keys:
    /// the primary.
    pub fn for_keys<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<&Replica, NotHere> {
        let Some(map) = &self.placed else {
            return Ok(self.primary());
        };
        let mut keys = keys.into_iter();
        let Some(first) = keys.next() else {
            return Ok(self.primary());
        };
        let shard = map.shard_of_key(first);
        if keys.any(|key| map.shard_of_key(key) != shard) {
            return Err(NotHere::CrossShard);
        }
        self.for_key(first)
    }

    /// The map this node answers `ShardMap` with: a single group's from its
    /// membership, or the placed map with each hosted shard's leader from
    /// its own Raft and every node's client address this node knows.
    pub fn shard_map(&self, own_resp_addr: Option<String>) -> Result<ShardMap, ErrorReply> {
        let Some(map) = &self.placed else {
            return self.primary().shard_map(own_resp_addr);
        };
        let own_id = self.primary().node_id();
        let nodes = map
            .nodes()
            .iter()
            .map(|node| NodeInfo {
                id: node.id,
                client_addr: self.client_addr_of(node.id).or(node.client_addr.clone()),
                resp_addr: match node.id == own_id {
                    true => own_resp_addr.clone(),
                    false => node.resp_addr.clone(),
                },
            })
            .collect();
        let shards = map
            .shards()
            .iter()
            .map(|shard| ShardInfo {
                leader: self.leader_of(shard),
                ..shard.clone()
            })
            .collect();
        ShardMap::new(map.version(), nodes, shards, map.ranges().to_vec()).map_err(|e| {
            ErrorReply::new(ErrorCode::Internal, format!("this node's shard map: {e}"))
        })
    }

    /// A hosted shard's leader as its Raft knows it (when it is a member);
    /// the placed hint for the others.
    fn leader_of(&self, shard: &ShardInfo) -> Option<u64> {
        match self.replicas.get(&shard.id) {
            Some(replica) => replica
                .metrics()
                .current_leader
                .filter(|leader| shard.members.contains(leader)),
            None => shard.leader,
        }
    }

    /// Node `id`'s client address, as any of this node's replicas learned it.
    fn client_addr_of(&self, id: u64) -> Option<String> {
        self.replicas
            .values()
            .find_map(|replica| replica.peers.client_addr_of(id))
    }
}
