//! What the client knows of the shard map (docs/sharding.md, section 5):
//! the highest-versioned map it has seen, and the single-flight refresh a
//! `WrongShard` reply, or a node's hello announcing a newer map, asks for.
//! Until a map of several shards is held the cluster is taken as one group
//! (today's clusters, whose map is [`ShardMap::single_group`], and whose
//! nodes announce none) and requests are routed as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwapOption;
use rdkv_proto::shard::ShardMap;
use tokio::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct ShardRouting {
    /// The highest-versioned map seen; `None`: one group.
    map: ArcSwapOption<ShardMap>,
    /// Whether `map` has more than one shard: read on every one-sided GET,
    /// which must not read a region for a key of another shard.
    sharded: AtomicBool,
    /// Held by the one refresh under way: calls that waited on it find the
    /// map it installed and fetch nothing.
    refreshing: Mutex<()>,
}

impl ShardRouting {
    /// The version of the map held; 0 before any.
    pub(crate) fn version(&self) -> u64 {
        self.map.load().as_ref().map_or(0, |map| map.version())
    }

    /// The map held, if one was fetched.
    pub(crate) fn map(&self) -> Option<Arc<ShardMap>> {
        self.map.load_full()
    }

    /// Whether the map held has more than one shard.
    pub(crate) fn is_sharded(&self) -> bool {
        self.sharded.load(Ordering::Acquire)
    }

    /// Keeps `map` unless the one held is as new; says whether it was kept.
    /// Versions only grow, whatever order answers arrive in.
    pub(crate) fn install(&self, map: ShardMap) -> bool {
        let offered = Arc::new(map);
        let before = self.map.rcu(|held| match held {
            Some(held) if held.version() >= offered.version() => Some(Arc::clone(held)),
            _ => Some(Arc::clone(&offered)),
        });
        let kept = before
            .as_ref()
            .is_none_or(|held| held.version() < offered.version());
        if let Some(held) = self.map.load().as_ref() {
            // Once sharded, stays so: a cluster does not merge its shards.
            if held.shards().len() > 1 {
                self.sharded.store(true, Ordering::Release);
            }
        }
        kept
    }

    /// Waits for the refresh under way, if any, and holds off the others
    /// until the guard is dropped.
    pub(crate) async fn refresh_turn(&self) -> MutexGuard<'_, ()> {
        self.refreshing.lock().await
    }
}

#[cfg(test)]
mod tests {
    use rdkv_proto::shard::{NodeInfo, SLOT_COUNT, ShardId, ShardInfo, Slot, SlotRange, key_slot};

    use super::*;

    /// Two shards over nodes 1 and 2, split at slot 8192, at `version`.
    fn two_shards(version: u64) -> ShardMap {
        let node = |id| NodeInfo {
            id,
            client_addr: Some(format!("n{id}")),
            resp_addr: None,
        };
        let shard = |id, member| ShardInfo {
            id: ShardId(id),
            members: vec![member],
            leader: Some(member),
        };
        let range = |first, last, shard| SlotRange {
            first: Slot::new(first).unwrap(),
            last: Slot::new(last).unwrap(),
            shard: ShardId(shard),
        };
        ShardMap::new(
            version,
            vec![node(1), node(2)],
            vec![shard(0, 1), shard(1, 2)],
            vec![range(0, 8191, 0), range(8192, SLOT_COUNT - 1, 1)],
        )
        .unwrap()
    }

    #[test]
    fn before_any_map_there_is_none() {
        let routing = ShardRouting::default();
        assert_eq!(routing.version(), 0);
        assert!(routing.map().is_none());
    }

    #[test]
    fn only_a_newer_map_replaces_the_one_held() {
        let routing = ShardRouting::default();
        assert!(routing.install(two_shards(3)));
        assert_eq!(routing.version(), 3);
        assert!(!routing.install(two_shards(2)), "an older map");
        assert!(!routing.install(two_shards(3)), "the same version");
        assert_eq!(routing.version(), 3);
        assert!(routing.install(two_shards(4)));
        assert_eq!(routing.version(), 4);
    }

    #[test]
    fn the_map_held_routes_keys_by_slot() {
        let routing = ShardRouting::default();
        routing.install(two_shards(1));
        let map = routing.map().unwrap();
        // foo is slot 12182, bar 5061 (Redis's answers).
        assert_eq!(key_slot(b"foo").get(), 12182);
        assert_eq!(map.shard_of_key(b"foo"), ShardId(1));
        assert_eq!(map.shard_of_key(b"bar"), ShardId(0));
    }
}
