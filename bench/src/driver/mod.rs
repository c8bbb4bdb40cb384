//! The stores a benchmark drives, behind one trait: [`rdkv::RdkvDriver`]
//! (the `rdkv-client` crate), [`redis::RedisDriver`] (any Redis-compatible
//! endpoint) and, with the feature `etcd`, `etcd::EtcdDriver` (etcd v3).
//! All store a record as one value with the same bytes (see
//! [`crate::record`]).

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod rdkv;
pub mod redis;

use bytes::Bytes;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DriverError {
    #[error("rdkv: {0}")]
    Rdkv(#[from] rdkv_client::Error),
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[cfg(feature = "etcd")]
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Config(String),
}

/// One read of a batch: the record's bytes, `None` if absent.
pub type ReadResult<'a> = Result<Option<&'a [u8]>, DriverError>;

/// One store's operations, as YCSB's `DB` class has them (delete is not
/// needed by the core workloads). Records are opaque encoded values.
///
/// Drivers run on a current-thread runtime, one per benchmark thread, so
/// their futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Driver {
    /// Whether `scan` is available (workload E needs it).
    fn supports_scan(&self) -> bool;

    /// The record stored under `key`, if any.
    async fn read(&self, key: &str) -> Result<Option<Bytes>, DriverError>;

    /// The record stored under `key` passed to `each` once it is known,
    /// borrowed from the driver's buffer where it has one (`None`:
    /// absent); `each` is called exactly once. By default
    /// [`Driver::read`]'s answer.
    async fn read_with(&self, key: &str, each: &mut dyn FnMut(ReadResult<'_>)) {
        match self.read(key).await {
            Ok(record) => each(Ok(record.as_deref())),
            Err(error) => each(Err(error)),
        }
    }

    /// Whether [`Driver::read_batch`] serves several reads at once (the
    /// runner then issues a thread's in-flight reads together).
    fn batches_reads(&self) -> bool {
        false
    }

    /// The records of `keys`, each passed to `each(i, record)` as it is
    /// known (borrowed from the driver's buffers; `None`: absent). By
    /// default one [`Driver::read_with`] after another.
    async fn read_batch(&self, keys: &[&str], each: &mut dyn FnMut(usize, ReadResult<'_>)) {
        for (i, key) in keys.iter().enumerate() {
            self.read_with(key, &mut |record| each(i, record)).await;
        }
    }

    /// Replaces the record of an existing key.
    async fn update(&self, key: &str, record: Bytes) -> Result<(), DriverError>;

    /// Stores a new record.
    async fn insert(&self, key: &str, record: Bytes) -> Result<(), DriverError>;

    /// Up to `count` records in key order from `start_key` (inclusive).
    async fn scan(&self, start_key: &str, count: usize) -> Result<Vec<Bytes>, DriverError>;
}

/// Builds one driver per benchmark thread, inside that thread's runtime
/// (connections belong to the runtime that made them).
#[allow(async_fn_in_trait)]
pub trait DriverFactory: Sync {
    type Driver: Driver;

    /// Label of the target in reports (`rdkv-shm`, `redis`, ...).
    fn label(&self) -> String;

    async fn connect(&self) -> Result<Self::Driver, DriverError>;
}
