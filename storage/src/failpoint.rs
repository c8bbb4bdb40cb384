//! Crash failpoints for crash tests: `RDKV_FAILPOINTS=name,name` in a
//! node's environment makes it abort (as kill -9 would stop it, with no
//! cleanup) the first time it reaches a named point. Unset, a point costs
//! one load of a cached empty list.

use std::sync::OnceLock;

/// After the purge point is durable, before any purged segment is removed.
pub const LOG_PURGE_AFTER_META: &str = "log-purge-after-meta";
/// After an installed snapshot is persisted, before the region is swapped.
pub const SNAPSHOT_INSTALL_AFTER_PERSIST: &str = "snapshot-install-after-persist";

fn armed() -> &'static [String] {
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

/// Aborts the process if `name` is armed.
pub fn hit(name: &str) {
    if armed().iter().any(|armed| armed == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}
