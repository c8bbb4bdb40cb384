//! openraft's own storage conformance suite against the durable log store,
//! paired with rdkv's region state machine. Every sub-test gets fresh
//! directories (the TempDir is the suite's guard).

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use rdkv_proto::region::HashSeed;
use rdkv_storage::RegionConfig;
use rdkv_storage::raft::TypeConfig;
use rdkv_storage::raft_log::{LogOptions, LogStore};
use rdkv_storage::state_machine::{RegionStateMachine, StateMachineConfig};
use tempfile::TempDir;

struct Builder {
    options: LogOptions,
}

impl StoreBuilder<TypeConfig, LogStore, RegionStateMachine, TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, RegionStateMachine), StorageError<TypeConfig>> {
        let dir =
            tempfile::tempdir().map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
        let log = LogStore::open(dir.path().join("log"), self.options.clone())
            .map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
        let sm = RegionStateMachine::open(StateMachineConfig {
            region: RegionConfig {
                region_bytes: 1024 * 1024,
                hash_seed: HashSeed(1, 1),
                ..RegionConfig::default()
            },
            snapshot_dir: dir.path().join("snapshots"),
            shard: rdkv_proto::shard::ShardId(0),
        })
        .map_err(|e| StorageError::read(TypeConfig::err_from_error(&e)))?;
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_suite_default_options() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder {
        options: LogOptions::default(),
    })
    .await
}

/// The same suite with one record per segment and no entry cache, so that
/// every read comes from the files and every truncate and purge deletes
/// segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_suite_tiny_segments_no_cache() -> Result<(), StorageError<TypeConfig>> {
    Suite::test_all(Builder {
        options: LogOptions {
            segment_size: 1,
            cache_bytes: 0,
            ..LogOptions::default()
        },
    })
    .await
}
