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
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use rdkv_proto::shard::{FIRST_SLOT, LAST_SLOT, NodeInfo, ShardId, ShardInfo, ShardMap, key_slot};
use rdkv_proto::wire::{ErrorCode, ErrorReply, WrongShard};

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

/// What [`Shards`] holds at one moment: replaced whole when a replica is
/// opened or closed, so that a reader sees one consistent set.
#[derive(Debug, Clone)]
struct Registry {
    /// Serves the requests that name no shard: the lowest shard hosted
    /// (shard 0 in a single group).
    primary: Replica,
    /// Every replica of this node, `primary` among them.
    replicas: BTreeMap<ShardId, Replica>,
    /// The placed map of a multi-shard cluster; `None`: a single group.
    placed: Option<Arc<ShardMap>>,
}

/// This node's shard replicas. Cheap to clone and to read (one atomic load
/// of the current registry); opening or closing a replica installs a new
/// registry ([`Shards::insert`], [`Shards::remove`]).
#[derive(Debug, Clone)]
pub struct Shards {
    current: Arc<ArcSwap<Registry>>,
    /// Serializes the changes (readers never take it).
    changes: Arc<Mutex<()>>,
}

impl Shards {
    fn of(registry: Registry) -> Shards {
        Shards {
            current: Arc::new(ArcSwap::from_pointee(registry)),
            changes: Arc::new(Mutex::new(())),
        }
    }

    /// Today's node: one group, shard 0.
    pub fn single(replica: Replica) -> Shards {
        Shards::of(Registry {
            primary: replica.clone(),
            replicas: BTreeMap::from([(ShardId(0), replica)]),
            placed: None,
        })
    }

    /// A multi-shard node: `replicas` of the shards it hosts (`map`'s
    /// placement, or as moved since); `None` when there are none.
    pub fn placed(map: ShardMap, replicas: BTreeMap<ShardId, Replica>) -> Option<Shards> {
        let primary = replicas.values().next()?.clone();
        Some(Shards::of(Registry {
            primary,
            replicas,
            placed: Some(Arc::new(map)),
        }))
    }

    /// Replaces the registry with `change` of it, one change at a time.
    fn change<T>(&self, change: impl FnOnce(&mut Registry) -> T) -> T {
        let _turn = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = Registry::clone(&self.current.load());
        let out = change(&mut next);
        if let Some(lowest) = next.replicas.values().next() {
            next.primary = lowest.clone();
        }
        self.current.store(Arc::new(next));
        out
    }

    /// Hosts `replica` as shard `shard`'s from now on (an opened replica).
    pub fn insert(&self, shard: ShardId, replica: Replica) {
        self.change(|registry| registry.replicas.insert(shard, replica));
    }

    /// Stops hosting `shard` (its replica is being closed): its requests
    /// are answered `WrongShard` from now on. The last replica of a node
    /// is never removed (the node's own requests need one).
    pub fn remove(&self, shard: ShardId) -> Option<Replica> {
        self.change(|registry| {
            if registry.replicas.len() <= 1 {
                return None;
            }
            registry.replicas.remove(&shard)
        })
    }

    /// This node's view of `shard`'s members changes to `members`, as a
    /// map one version above the one it had.
    ///
    /// The hook of a replica move's map update (docs/sharding.md, section
    /// 8): it changes this node's view only, and the metadata group's map
    /// change replaces it. Refused for a single group (its map follows its
    /// membership) and for a member set the map cannot hold.
    pub fn publish_members(&self, shard: ShardId, members: Vec<u64>) -> Result<u64, ErrorReply> {
        self.change(|registry| {
            let Some(map) = &registry.placed else {
                return Err(ErrorReply::new(
                    ErrorCode::InvalidRequest,
                    "a single group's map follows its membership",
                ));
            };
            let shards = map
                .shards()
                .iter()
                .map(|info| match info.id == shard {
                    true => ShardInfo {
                        leader: info.leader.filter(|l| members.contains(l)),
                        members: members.clone(),
                        ..info.clone()
                    },
                    false => info.clone(),
                })
                .collect();
            let version = map.version() + 1;
            let next = ShardMap::new(version, map.nodes().to_vec(), shards, map.ranges().to_vec())
                .map_err(|e| {
                    ErrorReply::new(
                        ErrorCode::Internal,
                        format!("shard {shard}'s new members: {e}"),
                    )
                })?;
            registry.placed = Some(Arc::new(next));
            Ok(version)
        })
    }

    /// The placed map of a multi-shard node as this node knows it (members
    /// as moved since; no leader seen).
    pub fn placed_map(&self) -> Option<Arc<ShardMap>> {
        self.current.load().placed.clone()
    }

    pub fn is_sharded(&self) -> bool {
        self.current.load().placed.is_some()
    }

    /// The replica of requests that name no shard (admin, status): shard 0,
    /// or the lowest shard hosted here.
    pub fn primary(&self) -> Replica {
        self.current.load().primary.clone()
    }

    pub fn get(&self, shard: ShardId) -> Option<Replica> {
        self.current.load().replicas.get(&shard).cloned()
    }

    /// The replicas hosted now, by shard.
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, Replica)> + use<> {
        let registry = self.current.load_full();
        let replicas: Vec<_> = registry
            .replicas
            .iter()
            .map(|(id, r)| (*id, r.clone()))
            .collect();
        replicas.into_iter()
    }

    /// The slot ranges (first, last; inclusive) `shard` serves: a single
    /// group serves them all.
    pub fn slot_ranges(&self, shard: ShardId) -> Vec<(u16, u16)> {
        match &self.current.load().placed {
            Some(map) => map
                .ranges_of(shard)
                .map(|range| (range.first.get(), range.last.get()))
                .collect(),
            None => vec![(FIRST_SLOT.get(), LAST_SLOT.get())],
        }
    }

    /// The replica serving `key`.
    pub fn for_key(&self, key: &[u8]) -> Result<Replica, NotHere> {
        self.current.load().for_key(key)
    }

    /// The replica of `shard`, named by a `Request::Sharded`: not hosted
    /// here (or not in this node's map), `WrongShard` with the shard's
    /// first slot. A single group hosts shard 0 only.
    pub fn hosted(&self, shard: ShardId) -> Result<Replica, NotHere> {
        let registry = self.current.load();
        if let Some(replica) = registry.replicas.get(&shard) {
            return Ok(replica.clone());
        }
        // A single group's map is version 1 (docs/sharding.md, section 2).
        let Some(map) = &registry.placed else {
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

    /// The replica serving every one of `keys` (all in one shard); no keys:
    /// the primary.
    pub fn for_keys<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<Replica, NotHere> {
        let registry = self.current.load();
        let Some(map) = &registry.placed else {
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
        registry.for_key(first)
    }

    /// The map this node answers `ShardMap` with: a single group's from its
    /// membership, or the placed map with each hosted shard's leader from
    /// its own Raft and every node's client address this node knows.
    pub fn shard_map(&self, own_resp_addr: Option<String>) -> Result<ShardMap, ErrorReply> {
        let registry = self.current.load();
        let Some(map) = &registry.placed else {
            return self.primary().shard_map(own_resp_addr);
        };
        let own_id = self.primary().node_id();
        let nodes = map
            .nodes()
            .iter()
            .map(|node| NodeInfo {
                id: node.id,
                client_addr: registry
                    .client_addr_of(node.id)
                    .or(node.client_addr.clone()),
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
                leader: registry.leader_of(shard),
                ..shard.clone()
            })
            .collect();
        ShardMap::new(map.version(), nodes, shards, map.ranges().to_vec()).map_err(|e| {
            ErrorReply::new(ErrorCode::Internal, format!("this node's shard map: {e}"))
        })
    }

    /// Node `id`'s client address, as any of this node's replicas learned it.
    pub fn client_addr_of(&self, id: u64) -> Option<String> {
        self.current.load().client_addr_of(id)
    }
}

impl Registry {
    fn for_key(&self, key: &[u8]) -> Result<Replica, NotHere> {
        let Some(map) = &self.placed else {
            // A single group: its one replica serves every key.
            return Ok(self.primary.clone());
        };
        let slot = key_slot(key);
        let shard = map.shard_of_slot(slot);
        self.replicas
            .get(&shard)
            .cloned()
            .ok_or(NotHere::WrongShard(WrongShard {
                map_version: map.version(),
                slot,
                shard,
            }))
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

    fn client_addr_of(&self, id: u64) -> Option<String> {
        self.replicas
            .values()
            .find_map(|replica| replica.peers.client_addr_of(id))
    }
}
