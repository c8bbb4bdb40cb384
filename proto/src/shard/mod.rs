//! Sharding facts every process must agree on (`docs/sharding.md`): which
//! hash slot a key is in ([`slot`]), and which shard serves each slot on
//! which nodes ([`map`]). No I/O.

pub mod map;
pub mod rebalance;
pub mod replica_rebalance;
pub mod slot;

pub use map::{
    MAX_ADDR_BYTES, MAX_MEMBERS, MAX_NODES, MAX_RANGES, MAX_SHARDS, NodeId, NodeInfo,
    SINGLE_GROUP_VERSION, ShardId, ShardInfo, ShardMap, ShardMapError, SlotRange,
};
pub use rebalance::{LeaderMove, ShardLeadership, leader_bound, leader_moves};
pub use replica_rebalance::{
    ReplicaMove, after_replica_moves, replica_bounds, replica_moves, replicas_per_node,
};
pub use slot::{FIRST_SLOT, LAST_SLOT, SLOT_COUNT, Slot, crc16_xmodem, hashed_part, key_slot};
