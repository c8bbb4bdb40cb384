//! The shard map: which shard serves each slot, which nodes host each
//! shard and which of them leads, under a version that orders maps
//! (`docs/sharding.md`, section 2).
//!
//! A [`ShardMap`] is always valid: [`ShardMap::new`] and the decoder are
//! the only ways to get one, and both check every rule, answering a typed
//! [`ShardMapError`]. Decoding caps every sequence while it reads
//! ([`MAX_NODES`], [`MAX_SHARDS`], [`MAX_MEMBERS`], [`SLOT_COUNT`] ranges),
//! so whatever a peer sends, a decoder allocates a bounded amount.

use core::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::slot::{FIRST_SLOT, LAST_SLOT, SLOT_COUNT, Slot, key_slot};
use crate::wire::batch::capped_vec;

/// Shards a map may list.
pub const MAX_SHARDS: usize = 4096;
/// Nodes a map may list.
pub const MAX_NODES: usize = 1024;
/// Replicas of one shard.
pub const MAX_MEMBERS: usize = 16;
/// Slot ranges a map may hold: one per slot at most.
pub const MAX_RANGES: usize = SLOT_COUNT as usize;
/// Bytes of a node's address (`host:port`).
pub const MAX_ADDR_BYTES: usize = 255;

/// The version of [`ShardMap::single_group`]'s map.
pub const SINGLE_GROUP_VERSION: u64 = 1;

/// What [`ShardMap::range_of`] could answer for a map without ranges, if
/// one existed (a valid map has at least one).
const WHOLE_RANGE: SlotRange = SlotRange {
    first: FIRST_SLOT,
    last: LAST_SLOT,
    shard: ShardId(0),
};

/// A node's id, as in the Raft membership.
pub type NodeId = u64;

/// A shard: one Raft group serving the slots the map gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardId(pub u32);

impl ShardId {
    /// The metadata group's id (it holds the map, no keys); no data shard
    /// may have it.
    pub const META: ShardId = ShardId(u32::MAX);
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == ShardId::META {
            f.write_str("meta")
        } else {
            self.0.fmt(f)
        }
    }
}

/// A node the map names, and where clients reach it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// The native protocol's `host:port` (`None`: not known yet).
    pub client_addr: Option<String>,
    /// The RESP port's `host:port` (`None`: none, or not known yet).
    pub resp_addr: Option<String>,
}

/// One shard: the nodes holding a replica of it, and which one leads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShardInfo {
    pub id: ShardId,
    /// Node ids, each once; never empty in a valid map.
    #[serde(deserialize_with = "capped_vec::<_, _, MAX_MEMBERS>")]
    pub members: Vec<NodeId>,
    /// The member believed to lead (a hint: `NotLeader` corrects it).
    pub leader: Option<NodeId>,
}

/// Slots `first..=last`, served by `shard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlotRange {
    pub first: Slot,
    pub last: Slot,
    pub shard: ShardId,
}

impl SlotRange {
    pub fn contains(&self, slot: Slot) -> bool {
        self.first <= slot && slot <= self.last
    }

    /// Slots in the range (0 when `first > last`, which a map refuses).
    pub fn len(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            usize::from(self.last.get() - self.first.get()) + 1
        }
    }

    pub fn is_empty(&self) -> bool {
        self.first > self.last
    }
}

/// Why a map is not valid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShardMapError {
    #[error("map version 0: versions start at 1")]
    VersionZero,
    #[error("the map lists {count} {what}, at most {max}")]
    TooMany {
        what: &'static str,
        count: usize,
        max: usize,
    },
    #[error("slot range {first}..={last} is empty")]
    EmptyRange { first: Slot, last: Slot },
    #[error("slot {slot} is in no range")]
    Uncovered { slot: Slot },
    #[error("slot {slot} is in two ranges")]
    Overlap { slot: Slot },
    #[error("slots {first}..={last} go to shard {shard}, which the map does not list")]
    UnknownShard {
        shard: ShardId,
        first: Slot,
        last: Slot,
    },
    #[error("shard {0} is listed twice")]
    DuplicateShard(ShardId),
    #[error("shard id {0} is reserved for the metadata group")]
    ReservedShard(ShardId),
    #[error("shard {0} has no members")]
    NoMembers(ShardId),
    #[error("shard {shard} has {count} members, at most {max}")]
    TooManyMembers {
        shard: ShardId,
        count: usize,
        max: usize,
    },
    #[error("shard {shard} names node {node} twice")]
    DuplicateMember { shard: ShardId, node: NodeId },
    #[error("shard {shard} names node {node}, which the map does not list")]
    UnknownMember { shard: ShardId, node: NodeId },
    #[error("shard {shard}'s leader hint, node {node}, is not one of its members")]
    LeaderNotMember { shard: ShardId, node: NodeId },
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    #[error("node {node}'s {what} is {len} bytes long, at most {max}")]
    AddressTooLong {
        node: NodeId,
        what: &'static str,
        len: usize,
        max: usize,
    },
}

/// Slot ranges -> shard, shard -> members and leader hint, under a version.
/// Parts are kept sorted (nodes and shards by id, ranges by slot), so equal
/// maps encode to equal bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ShardMapWire")]
pub struct ShardMap {
    version: u64,
    nodes: Vec<NodeInfo>,
    shards: Vec<ShardInfo>,
    ranges: Vec<SlotRange>,
}

/// A map as decoded, before it is checked: the same fields in the same
/// order (so [`ShardMap`]'s derived encoding is this layout), each
/// sequence capped while it is read.
#[derive(Debug, Deserialize)]
struct ShardMapWire {
    version: u64,
    #[serde(deserialize_with = "capped_vec::<_, _, MAX_NODES>")]
    nodes: Vec<NodeInfo>,
    #[serde(deserialize_with = "capped_vec::<_, _, MAX_SHARDS>")]
    shards: Vec<ShardInfo>,
    #[serde(deserialize_with = "capped_vec::<_, _, MAX_RANGES>")]
    ranges: Vec<SlotRange>,
}

impl TryFrom<ShardMapWire> for ShardMap {
    type Error = ShardMapError;

    fn try_from(wire: ShardMapWire) -> Result<ShardMap, ShardMapError> {
        ShardMap::new(wire.version, wire.nodes, wire.shards, wire.ranges)
    }
}

impl ShardMap {
    /// A map of these parts, in any order, if they are valid: every slot in
    /// exactly one range, every range's shard listed, every shard with
    /// members (listed nodes, each once) and a leader hint among them, ids
    /// unique, counts and addresses within the protocol's bounds.
    pub fn new(
        version: u64,
        mut nodes: Vec<NodeInfo>,
        mut shards: Vec<ShardInfo>,
        mut ranges: Vec<SlotRange>,
    ) -> Result<ShardMap, ShardMapError> {
        if version == 0 {
            return Err(ShardMapError::VersionZero);
        }
        within("nodes", nodes.len(), MAX_NODES)?;
        within("shards", shards.len(), MAX_SHARDS)?;
        within("slot ranges", ranges.len(), MAX_RANGES)?;
        nodes.sort_by_key(|n| n.id);
        shards.sort_by_key(|s| s.id);
        ranges.sort_by_key(|r| (r.first, r.last));
        check_nodes(&nodes)?;
        check_shards(&shards, &nodes)?;
        check_ranges(&ranges, &shards)?;
        Ok(ShardMap {
            version,
            nodes,
            shards,
            ranges,
        })
    }

    /// Today's cluster as a map: one group (shard 0) serving every slot,
    /// hosted by every node, version [`SINGLE_GROUP_VERSION`].
    pub fn single_group(
        nodes: Vec<NodeInfo>,
        leader: Option<NodeId>,
    ) -> Result<ShardMap, ShardMapError> {
        let shard = ShardId(0);
        let members = nodes.iter().map(|n| n.id).collect();
        ShardMap::new(
            SINGLE_GROUP_VERSION,
            nodes,
            vec![ShardInfo {
                id: shard,
                members,
                leader,
            }],
            vec![SlotRange {
                first: FIRST_SLOT,
                last: LAST_SLOT,
                shard,
            }],
        )
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// By id.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// By id.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    /// By slot; together they cover every slot once.
    pub fn ranges(&self) -> &[SlotRange] {
        &self.ranges
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeInfo> {
        self.nodes
            .binary_search_by_key(&id, |n| n.id)
            .ok()
            .and_then(|i| self.nodes.get(i))
    }

    pub fn shard(&self, id: ShardId) -> Option<&ShardInfo> {
        self.shards
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .and_then(|i| self.shards.get(i))
    }

    /// The range holding `slot` (a binary search over the ranges).
    pub fn range_of(&self, slot: Slot) -> &SlotRange {
        let i = self.ranges.partition_point(|r| r.last < slot);
        // Every slot is in a range of a valid map, so `i` is in bounds (and
        // `ranges` has at least one range to fall back on).
        self.ranges
            .get(i)
            .or(self.ranges.last())
            .unwrap_or(&WHOLE_RANGE)
    }

    /// The shard serving `slot`.
    pub fn shard_of_slot(&self, slot: Slot) -> ShardId {
        self.range_of(slot).shard
    }

    /// The shard serving `key` (by [`key_slot`]).
    pub fn shard_of_key(&self, key: &[u8]) -> ShardId {
        self.shard_of_slot(key_slot(key))
    }

    /// The positions of `keys` grouped by the shard of each: shards in
    /// order of first appearance, positions in the caller's order (a
    /// multi-key request split per shard and reassembled).
    pub fn positions_by_shard<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Vec<(ShardId, Vec<usize>)> {
        let mut groups: Vec<(ShardId, Vec<usize>)> = Vec::new();
        for (at, key) in keys.into_iter().enumerate() {
            let shard = self.shard_of_key(key);
            match groups.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, positions)) => positions.push(at),
                None => groups.push((shard, vec![at])),
            }
        }
        groups
    }

    /// The ranges `shard` serves, in slot order.
    pub fn ranges_of(&self, shard: ShardId) -> impl Iterator<Item = &SlotRange> {
        self.ranges.iter().filter(move |r| r.shard == shard)
    }
}

fn within(what: &'static str, count: usize, max: usize) -> Result<(), ShardMapError> {
    if count > max {
        return Err(ShardMapError::TooMany { what, count, max });
    }
    Ok(())
}

/// `nodes` sorted by id.
fn check_nodes(nodes: &[NodeInfo]) -> Result<(), ShardMapError> {
    if let Some(pair) = nodes.windows(2).find(|w| w[0].id == w[1].id) {
        return Err(ShardMapError::DuplicateNode(pair[0].id));
    }
    for node in nodes {
        for (what, addr) in [
            ("client address", &node.client_addr),
            ("RESP address", &node.resp_addr),
        ] {
            let len = addr.as_ref().map_or(0, String::len);
            if len > MAX_ADDR_BYTES {
                return Err(ShardMapError::AddressTooLong {
                    node: node.id,
                    what,
                    len,
                    max: MAX_ADDR_BYTES,
                });
            }
        }
    }
    Ok(())
}

/// `shards` sorted by id, `nodes` by id.
fn check_shards(shards: &[ShardInfo], nodes: &[NodeInfo]) -> Result<(), ShardMapError> {
    if let Some(pair) = shards.windows(2).find(|w| w[0].id == w[1].id) {
        return Err(ShardMapError::DuplicateShard(pair[0].id));
    }
    for shard in shards {
        check_shard(shard, nodes)?;
    }
    Ok(())
}

fn check_shard(shard: &ShardInfo, nodes: &[NodeInfo]) -> Result<(), ShardMapError> {
    let id = shard.id;
    if id == ShardId::META {
        return Err(ShardMapError::ReservedShard(id));
    }
    if shard.members.is_empty() {
        return Err(ShardMapError::NoMembers(id));
    }
    if shard.members.len() > MAX_MEMBERS {
        return Err(ShardMapError::TooManyMembers {
            shard: id,
            count: shard.members.len(),
            max: MAX_MEMBERS,
        });
    }
    for (i, &node) in shard.members.iter().enumerate() {
        if shard.members[..i].contains(&node) {
            return Err(ShardMapError::DuplicateMember { shard: id, node });
        }
        if nodes.binary_search_by_key(&node, |n| n.id).is_err() {
            return Err(ShardMapError::UnknownMember { shard: id, node });
        }
    }
    match shard.leader {
        Some(node) if !shard.members.contains(&node) => {
            Err(ShardMapError::LeaderNotMember { shard: id, node })
        }
        _ => Ok(()),
    }
}

/// `ranges` sorted by first slot, `shards` by id: each range non-empty and
/// of a listed shard, and from slot 0 to the last each range starting
/// right after the one before.
fn check_ranges(ranges: &[SlotRange], shards: &[ShardInfo]) -> Result<(), ShardMapError> {
    // The next slot no range has covered yet (`None`: past the last slot).
    let mut next = Slot::new(0);
    for range in ranges {
        if range.is_empty() {
            return Err(ShardMapError::EmptyRange {
                first: range.first,
                last: range.last,
            });
        }
        if shards.binary_search_by_key(&range.shard, |s| s.id).is_err() {
            return Err(ShardMapError::UnknownShard {
                shard: range.shard,
                first: range.first,
                last: range.last,
            });
        }
        match next {
            Some(slot) if range.first == slot => {}
            Some(slot) if range.first > slot => return Err(ShardMapError::Uncovered { slot }),
            // Starts inside (or past the end of) what earlier ranges covered.
            _ => return Err(ShardMapError::Overlap { slot: range.first }),
        }
        next = Slot::new(range.last.get() + 1);
    }
    match next {
        Some(slot) => Err(ShardMapError::Uncovered { slot }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::{btree_set, vec};
    use proptest::prelude::*;

    use super::*;
    use crate::wire::{WireError, decode_exact};

    /// Node ids the generator never uses.
    const UNLISTED_NODE: NodeId = 2_000_000;
    /// A shard id the generator never uses.
    const UNLISTED_SHARD: ShardId = ShardId(5_000);

    /// A map's parts, before `ShardMap::new` sees them.
    #[derive(Debug, Clone)]
    struct Parts {
        version: u64,
        nodes: Vec<NodeInfo>,
        shards: Vec<ShardInfo>,
        ranges: Vec<SlotRange>,
    }

    impl Parts {
        fn build(self) -> Result<ShardMap, ShardMapError> {
            ShardMap::new(self.version, self.nodes, self.shards, self.ranges)
        }
    }

    fn slot(n: u16) -> Slot {
        Slot::new(n).unwrap()
    }

    fn node(id: NodeId, choice: u64) -> NodeInfo {
        NodeInfo {
            id,
            client_addr: (choice & 1 == 0).then(|| format!("10.0.0.{}:7000", id % 256)),
            resp_addr: (choice & 2 == 0).then(|| format!("10.0.0.{}:6379", id % 256)),
        }
    }

    /// Members of a shard: the nodes `mask`'s bits pick, or the one
    /// `mask` points at when it picks none.
    fn members(node_ids: &[NodeId], mask: u64) -> Vec<NodeId> {
        let picked: Vec<NodeId> = node_ids
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, id)| *id)
            .collect();
        if picked.is_empty() {
            vec![node_ids[(mask % node_ids.len() as u64) as usize]]
        } else {
            picked
        }
    }

    /// Ranges cut at `cuts`, each given to the shard its choice points at.
    fn ranges(cuts: &[u16], shard_ids: &[ShardId], choices: &[u64]) -> Vec<SlotRange> {
        let starts: Vec<u16> = std::iter::once(0).chain(cuts.iter().copied()).collect();
        starts
            .iter()
            .enumerate()
            .map(|(i, &first)| {
                let last = starts.get(i + 1).map_or(SLOT_COUNT - 1, |next| next - 1);
                let pick = choices[i % choices.len()] % shard_ids.len() as u64;
                SlotRange {
                    first: slot(first),
                    last: slot(last),
                    shard: shard_ids[pick as usize],
                }
            })
            .collect()
    }

    /// Valid parts, in sorted order.
    fn parts() -> impl Strategy<Value = Parts> {
        (
            1u64..=u64::MAX,
            btree_set(0u64..1_000_000, 1..7),
            btree_set(0u32..1_000, 1..6),
            btree_set(1u16..SLOT_COUNT, 0..9),
            vec(any::<u64>(), 16),
        )
            .prop_map(|(version, node_ids, shard_ids, cuts, choices)| {
                let node_ids: Vec<NodeId> = node_ids.into_iter().collect();
                let shard_ids: Vec<ShardId> = shard_ids.into_iter().map(ShardId).collect();
                let cuts: Vec<u16> = cuts.into_iter().collect();
                let nodes = node_ids
                    .iter()
                    .zip(&choices)
                    .map(|(&id, &c)| node(id, c))
                    .collect();
                let shards = shard_ids
                    .iter()
                    .zip(choices.iter().rev())
                    .map(|(&id, &mask)| {
                        let members = members(&node_ids, mask);
                        let leader = (mask & (1 << 40) != 0)
                            .then(|| members[(mask >> 41) as usize % members.len()]);
                        ShardInfo {
                            id,
                            members,
                            leader,
                        }
                    })
                    .collect();
                Parts {
                    version,
                    nodes,
                    shards,
                    ranges: ranges(&cuts, &shard_ids, &choices),
                }
            })
    }

    /// Ways to break valid parts, each with the error it must give.
    #[derive(Debug, Clone, Copy)]
    enum Breakage {
        VersionZero,
        DropRange(usize),
        RepeatRange(usize),
        EmptyRange(usize),
        RangeOfUnlistedShard(usize),
        NoMembers(usize),
        UnlistedMember(usize),
        RepeatedMember(usize),
        LeaderOutside(usize),
        RepeatedShard(usize),
        ReservedShard,
        RepeatedNode(usize),
        LongAddress(usize),
    }

    fn breakage() -> impl Strategy<Value = Breakage> {
        let i = any::<usize>();
        prop_oneof![
            Just(Breakage::VersionZero),
            i.prop_map(Breakage::DropRange),
            i.prop_map(Breakage::RepeatRange),
            i.prop_map(Breakage::EmptyRange),
            i.prop_map(Breakage::RangeOfUnlistedShard),
            i.prop_map(Breakage::NoMembers),
            i.prop_map(Breakage::UnlistedMember),
            i.prop_map(Breakage::RepeatedMember),
            i.prop_map(Breakage::LeaderOutside),
            i.prop_map(Breakage::RepeatedShard),
            Just(Breakage::ReservedShard),
            i.prop_map(Breakage::RepeatedNode),
            i.prop_map(Breakage::LongAddress),
        ]
    }

    /// Adds range `at` turned around (last before first). It sorts after
    /// the range it came from, which covers its first slot, so nothing
    /// before it fails.
    fn turn_range_around(parts: &mut Parts, at: usize) -> ShardMapError {
        let range = &parts.ranges[at];
        let (first, last) = (range.last, range.first);
        if first == last {
            // A one-slot range cannot be turned around: add an empty one
            // at the last slot instead.
            parts.ranges.push(SlotRange {
                first: LAST_SLOT,
                last: slot(SLOT_COUNT - 2),
                shard: range.shard,
            });
            return ShardMapError::EmptyRange {
                first: LAST_SLOT,
                last: slot(SLOT_COUNT - 2),
            };
        }
        let shard = range.shard;
        parts.ranges.push(SlotRange { first, last, shard });
        ShardMapError::EmptyRange { first, last }
    }

    /// Breaks `parts` as `how` says; returns the error that must follow.
    fn break_parts(parts: &mut Parts, how: Breakage) -> ShardMapError {
        let pick = |i: usize, len: usize| i % len;
        match how {
            Breakage::VersionZero => {
                parts.version = 0;
                ShardMapError::VersionZero
            }
            Breakage::DropRange(i) => {
                let gone = parts.ranges.remove(pick(i, parts.ranges.len()));
                ShardMapError::Uncovered { slot: gone.first }
            }
            Breakage::RepeatRange(i) => {
                let again = parts.ranges[pick(i, parts.ranges.len())];
                parts.ranges.push(again);
                ShardMapError::Overlap { slot: again.first }
            }
            Breakage::EmptyRange(i) => turn_range_around(parts, pick(i, parts.ranges.len())),
            Breakage::RangeOfUnlistedShard(i) => {
                let at = pick(i, parts.ranges.len());
                let range = &mut parts.ranges[at];
                range.shard = UNLISTED_SHARD;
                ShardMapError::UnknownShard {
                    shard: UNLISTED_SHARD,
                    first: range.first,
                    last: range.last,
                }
            }
            Breakage::NoMembers(i) => {
                let at = pick(i, parts.shards.len());
                let shard = &mut parts.shards[at];
                shard.members.clear();
                shard.leader = None;
                ShardMapError::NoMembers(shard.id)
            }
            Breakage::UnlistedMember(i) => {
                let at = pick(i, parts.shards.len());
                let shard = &mut parts.shards[at];
                shard.members.push(UNLISTED_NODE);
                ShardMapError::UnknownMember {
                    shard: shard.id,
                    node: UNLISTED_NODE,
                }
            }
            Breakage::RepeatedMember(i) => {
                let at = pick(i, parts.shards.len());
                let shard = &mut parts.shards[at];
                let node = shard.members[0];
                shard.members.push(node);
                ShardMapError::DuplicateMember {
                    shard: shard.id,
                    node,
                }
            }
            Breakage::LeaderOutside(i) => {
                let at = pick(i, parts.shards.len());
                let shard = &mut parts.shards[at];
                shard.leader = Some(UNLISTED_NODE);
                ShardMapError::LeaderNotMember {
                    shard: shard.id,
                    node: UNLISTED_NODE,
                }
            }
            Breakage::RepeatedShard(i) => {
                let again = parts.shards[pick(i, parts.shards.len())].clone();
                let id = again.id;
                parts.shards.push(again);
                ShardMapError::DuplicateShard(id)
            }
            Breakage::ReservedShard => {
                parts.shards.push(ShardInfo {
                    id: ShardId::META,
                    members: vec![parts.nodes[0].id],
                    leader: None,
                });
                ShardMapError::ReservedShard(ShardId::META)
            }
            Breakage::RepeatedNode(i) => {
                let again = parts.nodes[pick(i, parts.nodes.len())].clone();
                let id = again.id;
                parts.nodes.push(again);
                ShardMapError::DuplicateNode(id)
            }
            Breakage::LongAddress(i) => {
                let at = pick(i, parts.nodes.len());
                let node = &mut parts.nodes[at];
                node.resp_addr = Some("x".repeat(MAX_ADDR_BYTES + 1));
                ShardMapError::AddressTooLong {
                    node: node.id,
                    what: "RESP address",
                    len: MAX_ADDR_BYTES + 1,
                    max: MAX_ADDR_BYTES,
                }
            }
        }
    }

    fn encode(map: &ShardMap) -> Vec<u8> {
        postcard::to_allocvec(map).unwrap()
    }

    proptest! {
        #[test]
        fn valid_parts_make_a_map_that_round_trips(parts in parts()) {
            let map = parts.clone().build().unwrap();
            prop_assert_eq!(decode_exact::<ShardMap>(&encode(&map)).unwrap(), map.clone());
            // The order parts come in does not matter.
            let mut reversed = parts;
            reversed.nodes.reverse();
            reversed.shards.reverse();
            reversed.ranges.reverse();
            let again = reversed.build().unwrap();
            prop_assert_eq!(encode(&again), encode(&map));
        }

        #[test]
        fn every_slot_maps_to_the_range_that_holds_it(parts in parts()) {
            let map = parts.build().unwrap();
            for n in 0..SLOT_COUNT {
                let slot = slot(n);
                let holding: Vec<&SlotRange> =
                    map.ranges().iter().filter(|r| r.contains(slot)).collect();
                prop_assert_eq!(holding.len(), 1, "slot {}", n);
                prop_assert_eq!(map.range_of(slot), holding[0]);
                prop_assert_eq!(map.shard_of_slot(slot), holding[0].shard);
            }
            let covered: usize = map.ranges().iter().map(SlotRange::len).sum();
            prop_assert_eq!(covered, usize::from(SLOT_COUNT));
        }

        #[test]
        fn a_broken_map_is_refused_with_its_error(mut parts in parts(), how in breakage()) {
            let expected = break_parts(&mut parts, how);
            prop_assert_eq!(parts.clone().build(), Err(expected.clone()));
            // A peer sending the same parts is refused too (postcard keeps
            // no message: the reply is a decode error).
            let wire = (parts.version, &parts.nodes, &parts.shards, &parts.ranges);
            let bytes = postcard::to_allocvec(&wire).unwrap();
            prop_assert!(decode_exact::<ShardMap>(&bytes).is_err());
        }

        #[test]
        fn any_bytes_decode_or_fail_without_panicking(bytes in vec(any::<u8>(), 0..512)) {
            let _ = decode_exact::<ShardMap>(&bytes);
        }
    }

    #[test]
    fn the_single_group_map_gives_every_slot_to_shard_0_on_every_node() {
        let nodes: Vec<NodeInfo> = [3, 1, 2].map(|id| node(id, 0)).into();
        let map = ShardMap::single_group(nodes, Some(2)).unwrap();
        assert_eq!(map.version(), SINGLE_GROUP_VERSION);
        assert_eq!(map.shards().len(), 1);
        let shard = &map.shards()[0];
        assert_eq!(shard.id, ShardId(0));
        assert_eq!(shard.members, [3, 1, 2]);
        assert_eq!(shard.leader, Some(2));
        assert_eq!(map.ranges().len(), 1);
        assert_eq!(map.ranges()[0].len(), usize::from(SLOT_COUNT));
        for key in [&b"foo"[..], b"bar", b"", b"{user1000}.following"] {
            assert_eq!(map.shard_of_key(key), ShardId(0));
        }
        assert_eq!(map.node(1).map(|n| n.id), Some(1));
        assert_eq!(map.node(4), None);
        assert_eq!(
            ShardMap::single_group(Vec::new(), None),
            Err(ShardMapError::NoMembers(ShardId(0)))
        );
    }

    #[test]
    fn a_map_may_use_every_bound_and_round_trip() {
        let nodes: Vec<NodeInfo> = (0..MAX_NODES as u64)
            .map(|id| NodeInfo {
                id,
                client_addr: Some("a".repeat(MAX_ADDR_BYTES)),
                resp_addr: Some("b".repeat(MAX_ADDR_BYTES)),
            })
            .collect();
        let shards: Vec<ShardInfo> = (0..MAX_SHARDS as u32)
            .map(|id| ShardInfo {
                id: ShardId(id),
                members: (0..MAX_MEMBERS as u64).collect(),
                leader: Some(0),
            })
            .collect();
        // One range per slot, round robin over the shards.
        let ranges: Vec<SlotRange> = (0..SLOT_COUNT)
            .map(|n| SlotRange {
                first: slot(n),
                last: slot(n),
                shard: ShardId(u32::from(n) % MAX_SHARDS as u32),
            })
            .collect();
        let map = ShardMap::new(7, nodes, shards, ranges).unwrap();
        assert_eq!(decode_exact::<ShardMap>(&encode(&map)).unwrap(), map);
        assert_eq!(map.shard_of_slot(slot(4097)), ShardId(1));
        assert_eq!(map.ranges_of(ShardId(1)).count(), 4);
    }

    /// Bytes every part's smallest entry takes: a node (id 0, no
    /// addresses), a shard (id 0, no members, no leader), a member (id 0).
    const SMALLEST_ENTRY_BYTES: usize = 3;

    /// The start of a map whose part `which` (0: nodes, 1: shards)
    /// announces `len` entries and holds that many of the smallest, and
    /// nothing after them: a decoder that believes the length reads them
    /// all, then runs out of bytes; one that checks the cap stops first.
    fn announcing(which: usize, len: usize) -> Vec<u8> {
        let mut bytes = vec![1]; // version 1
        if which == 1 {
            bytes.push(0); // no nodes
        }
        bytes.extend(postcard::to_allocvec(&(len as u32)).unwrap());
        bytes.resize(bytes.len() + len * SMALLEST_ENTRY_BYTES, 0);
        bytes
    }

    /// Whether decoding stopped at a cap (serde's `invalid_length`, which
    /// postcard reports as a custom error) rather than running out of bytes.
    fn capped(bytes: &[u8]) -> bool {
        matches!(
            decode_exact::<ShardMap>(bytes),
            Err(WireError::Decode(postcard::Error::SerdeDeCustom))
        )
    }

    fn out_of_bytes(bytes: &[u8]) -> bool {
        matches!(
            decode_exact::<ShardMap>(bytes),
            Err(WireError::Decode(postcard::Error::DeserializeUnexpectedEnd))
        )
    }

    #[test]
    fn announced_lengths_past_the_caps_are_refused_before_anything_is_read() {
        for (which, max) in [(0, MAX_NODES), (1, MAX_SHARDS)] {
            assert!(out_of_bytes(&announcing(which, max)), "{which}");
            assert!(capped(&announcing(which, max + 1)), "{which}");
            // Without the entries behind it, a huge length fails too.
            let mut huge = announcing(which, 0);
            huge.truncate(huge.len() - 1);
            huge.extend(postcard::to_allocvec(&u32::MAX).unwrap());
            assert!(decode_exact::<ShardMap>(&huge).is_err(), "{which}");
        }
        // A shard's members: one shard (id 0) announcing `len` of them.
        let members = |len: usize| {
            let mut bytes = announcing(1, 0);
            bytes.pop();
            bytes.extend([1, 0, len as u8]);
            bytes.resize(bytes.len() + len, 0);
            bytes
        };
        assert!(out_of_bytes(&members(MAX_MEMBERS)));
        assert!(capped(&members(MAX_MEMBERS + 1)));
    }
}
