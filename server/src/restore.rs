//! `rdkv-server --restore FILE`: the node's data directory built from a
//! backup before the node starts (etcd's and Redis's way), by the same
//! `rdkv_storage::backup::restore` as `rdkvctl snapshot restore`, with this
//! node's `--data-dir`, `--id`, `--initial-cluster`, `--cluster-name` and
//! region settings. The node then starts from it as after a restart.

use anyhow::{Context, Result};
use rdkv_storage::backup::{self, RestoreTarget};

use crate::config::Config;
use crate::node::region_config;

/// Restores `config.restore`, if given, into the (absent or empty) data
/// directory; a backup that is damaged or does not fit the node's region
/// leaves the directory as it was and stops the start.
pub fn restore_before_start(config: &Config) -> Result<()> {
    let Some(file) = &config.restore else {
        return Ok(());
    };
    let region = region_config(config);
    let target = RestoreTarget {
        data_dir: &config.data_dir,
        node_id: config.id,
        members: &config.initial_cluster,
        cluster_name: &config.cluster_name,
        region: &region,
        quota_bytes: config.quota_bytes,
    };
    let restored = backup::restore(file, &target)
        .with_context(|| format!("--restore {} failed", file.display()))?;
    tracing::info!(
        keys = restored.keys,
        last_log_index = restored.last_log_index,
        cluster_id = %restored.cluster_id,
        "restored the data directory from {}",
        file.display()
    );
    Ok(())
}
