//! Failpoints for crash tests: `RDKV_FAILPOINTS=name,name` in a node's
//! environment makes it abort (as kill -9 would stop it, with no cleanup)
//! the first time it reaches a named crash point, or turns on a named
//! planted bug. Unset, a point costs one load of a cached empty list.

use std::sync::OnceLock;

/// After the purge point is durable, before any purged segment is removed.
pub const LOG_PURGE_AFTER_META: &str = "log-purge-after-meta";
/// After an installed snapshot is persisted, before the region is swapped.
pub const SNAPSHOT_INSTALL_AFTER_PERSIST: &str = "snapshot-install-after-persist";
/// A replica move's leader, after the target was promoted, before the
/// source is demoted (the shard has one voter more than its map names).
pub const MOVE_AFTER_PROMOTION: &str = "move-after-promotion";
/// A replica move's leader, after the source was removed, before the new
/// members are published (the map still names the source).
pub const MOVE_AFTER_REMOVAL: &str = "move-after-removal";
/// Planted bug: the Raft log acknowledges appends without their fsync (see
/// `LogStore::set_skip_append_fsync`), for the power-loss tests to catch.
pub const LOG_SKIP_APPEND_FSYNC: &str = "log-skip-append-fsync";

fn armed_names() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("RDKV_FAILPOINTS")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Whether `name` is armed.
pub fn armed(name: &str) -> bool {
    armed_names().iter().any(|armed| armed == name)
}

/// Aborts the process if `name` is armed.
pub fn hit(name: &str) {
    if armed(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}
