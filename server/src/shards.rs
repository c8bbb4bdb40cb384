//! [`Shards`]: this node's shard replicas (docs/sharding.md, section 3),
//! and which of them serves a key.
//!
//! A single-group node (`--shards 1`, the default) holds one replica,
//! shard 0, and no placed map: its `ShardMap` is computed from the group's
//! membership as before, and every key is its one group's. A node of a
//! multi-shard cluster holds the replicas `placement::initial` put on it
//! and its part of the metadata group (`meta`), whose applied map it
//! serves; a key of a shard it does not host is answered `WrongShard`
//! with that map's version.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use rdkv_fabric::RegionMemory;
use rdkv_proto::shard::{FIRST_SLOT, LAST_SLOT, ShardId, ShardInfo, ShardMap, key_slot};
use rdkv_proto::wire::{ErrorCode, ErrorReply, ShmGrant, WrongShard};

use crate::meta::Meta;
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
    /// (shard 0 in a single group), or the metadata group's replica on a
    /// node that hosts no data shard (one added with `--join`, or one
    /// whose replicas all moved away).
    primary: Replica,
    /// Every data shard replica of this node, `primary` among them.
    replicas: BTreeMap<ShardId, Replica>,
}

/// This node's shard replicas. Cheap to clone and to read (one atomic load
/// of the current registry); opening or closing a replica installs a new
/// registry ([`Shards::insert`], [`Shards::remove`]).
#[derive(Debug, Clone)]
pub struct Shards {
    current: Arc<ArcSwap<Registry>>,
    /// Serializes the changes (readers never take it).
    changes: Arc<Mutex<()>>,
    /// The metadata group of a multi-shard cluster, and the map it
    /// applied; `None`: a single group.
    meta: Option<Meta>,
}

impl Shards {
    fn of(registry: Registry, meta: Option<Meta>) -> Shards {
        Shards {
            current: Arc::new(ArcSwap::from_pointee(registry)),
            changes: Arc::new(Mutex::new(())),
            meta,
        }
    }

    /// Today's node: one group, shard 0.
    pub fn single(replica: Replica) -> Shards {
        let registry = Registry {
            primary: replica.clone(),
            replicas: BTreeMap::from([(ShardId(0), replica)]),
        };
        Shards::of(registry, None)
    }

    /// A multi-shard node: `replicas` of the shards it hosts (placed here,
    /// or moved here since; none on a node that joined and was moved no
    /// replica yet), and its replica of the metadata group.
    pub fn sharded(meta: Meta, replicas: BTreeMap<ShardId, Replica>) -> Shards {
        let primary = replicas
            .values()
            .next()
            .unwrap_or_else(|| meta.replica())
            .clone();
        Shards::of(Registry { primary, replicas }, Some(meta))
    }

    /// Replaces the registry with `change` of it, one change at a time.
    fn change<T>(&self, change: impl FnOnce(&mut Registry) -> T) -> T {
        let _turn = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = Registry::clone(&self.current.load());
        let out = change(&mut next);
        match (next.replicas.values().next(), &self.meta) {
            (Some(lowest), _) => next.primary = lowest.clone(),
            (None, Some(meta)) => next.primary = meta.replica().clone(),
            (None, None) => {}
        }
        self.current.store(Arc::new(next));
        out
    }

    /// Hosts `replica` as shard `shard`'s from now on (an opened replica).
    pub fn insert(&self, shard: ShardId, replica: Replica) {
        self.change(|registry| registry.replicas.insert(shard, replica));
    }

    /// Stops hosting `shard` (its replica is being closed): its requests
    /// are answered `WrongShard` from now on. A single group's one replica
    /// is never removed (the node's own requests need one); a multi-shard
    /// node's last data replica may be (its metadata replica serves them).
    pub fn remove(&self, shard: ShardId) -> Option<Replica> {
        let sharded = self.is_sharded();
        self.change(|registry| {
            if registry.replicas.len() <= 1 && !sharded {
                return None;
            }
            registry.replicas.remove(&shard)
        })
    }

    /// The map of a multi-shard node, as its metadata group applied it
    /// (the placed version 1 before); `None` for a single group.
    pub fn map(&self) -> Option<Arc<ShardMap>> {
        self.meta.as_ref().map(Meta::map)
    }

    /// The metadata group of a multi-shard node.
    pub fn meta(&self) -> Option<&Meta> {
        self.meta.as_ref()
    }

    pub fn is_sharded(&self) -> bool {
        self.meta.is_some()
    }

    /// The replica of requests that name no shard (admin, status): shard 0,
    /// or the lowest shard hosted here, or the metadata group's when this
    /// node hosts no data shard.
    pub fn primary(&self) -> Replica {
        self.current.load().primary.clone()
    }

    pub fn get(&self, shard: ShardId) -> Option<Replica> {
        self.current.load().replicas.get(&shard).cloned()
    }

    /// This node's replica of `shard`, the metadata group's included (what
    /// a peer frame naming `shard` goes to).
    pub fn any(&self, shard: ShardId) -> Option<Replica> {
        match &self.meta {
            Some(meta) if shard == ShardId::META => Some(meta.replica().clone()),
            _ => self.get(shard),
        }
    }

    /// The data shard replicas hosted now (not the metadata group's).
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, Replica)> + use<> {
        let registry = self.current.load_full();
        let replicas: Vec<_> = registry
            .replicas
            .iter()
            .map(|(id, r)| (*id, r.clone()))
            .collect();
        replicas.into_iter()
    }

    /// Every replica of this node, the metadata group's last
    /// (`ShardId::META`): what stops, faults and peers reach.
    pub fn all(&self) -> impl Iterator<Item = (ShardId, Replica)> + use<> {
        let meta = self
            .meta
            .as_ref()
            .map(|meta| (ShardId::META, meta.replica().clone()));
        self.iter().chain(meta)
    }

    /// The slot ranges (first, last; inclusive) `shard` serves: a single
    /// group serves them all.
    pub fn slot_ranges(&self, shard: ShardId) -> Vec<(u16, u16)> {
        match self.map() {
            Some(map) => map
                .ranges_of(shard)
                .map(|range| (range.first.get(), range.last.get()))
                .collect(),
            None => vec![(FIRST_SLOT.get(), LAST_SLOT.get())],
        }
    }

    /// The replica serving `key`.
    pub fn for_key(&self, key: &[u8]) -> Result<Replica, NotHere> {
        let Some(map) = self.map() else {
            return Ok(self.primary());
        };
        let slot = key_slot(key);
        let shard = map.shard_of_slot(slot);
        self.get(shard).ok_or(NotHere::WrongShard(WrongShard {
            map_version: map.version(),
            slot,
            shard,
        }))
    }

    /// The replica of `shard`, named by a `Request::Sharded`: not hosted
    /// here (or not in this node's map), `WrongShard` with the shard's
    /// first slot. A single group hosts shard 0 only.
    pub fn hosted(&self, shard: ShardId) -> Result<Replica, NotHere> {
        if let Some(replica) = self.get(shard) {
            return Ok(replica);
        }
        // A single group's map is version 1 (docs/sharding.md, section 2).
        let Some(map) = self.map() else {
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
    ) -> Result<Replica, NotHere> {
        let Some(map) = self.map() else {
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
    /// membership, or the metadata group's applied map (nodes and their
    /// addresses as its directory has them, under its version) with each
    /// hosted shard's leader from its own Raft (leader hints change
    /// without a version).
    pub fn shard_map(&self, own_resp_addr: Option<String>) -> Result<ShardMap, ErrorReply> {
        let Some(map) = self.map() else {
            return self.primary().shard_map(own_resp_addr);
        };
        let registry = self.current.load();
        let shards = map
            .shards()
            .iter()
            .map(|shard| ShardInfo {
                leader: registry.leader_of(shard),
                ..shard.clone()
            })
            .collect();
        ShardMap::new(
            map.version(),
            map.nodes().to_vec(),
            shards,
            map.ranges().to_vec(),
        )
        .map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("this node's shard map: {e}")))
    }

    /// Node `id`'s client address: from the map's node directory, else as
    /// any of this node's replicas learned it from a peer hello.
    pub fn client_addr_of(&self, id: u64) -> Option<String> {
        self.map()
            .and_then(|map| map.node(id).and_then(|node| node.client_addr.clone()))
            .or_else(|| {
                self.current
                    .load()
                    .replicas
                    .values()
                    .find_map(|replica| replica.peers.client_addr_of(id))
            })
    }
}

impl Registry {
    /// A hosted shard's leader as its Raft knows it (when it is a member);
    /// the map's hint for the others.
    fn leader_of(&self, shard: &ShardInfo) -> Option<u64> {
        match self.replicas.get(&shard.id) {
            Some(replica) => replica
                .metrics()
                .current_leader
                .filter(|leader| shard.members.contains(leader)),
            None => shard.leader,
        }
    }
}
