//! The etcd driver (feature `etcd`): the `etcd-client` crate's gRPC client,
//! one per benchmark thread, against an etcd v3 cluster.
//!
//! A record is one value under its key, with the same encoding as rdkv's,
//! so all stores move the same bytes. Reads are etcd's default range
//! requests, which are linearizable (a ReadIndex through the leader); writes
//! are puts, committed by a quorum that fsynced them, as rdkv's are. A scan
//! is one range request from the start key with a limit, in key order.
//!
//! The client balances its requests over every endpoint's HTTP/2
//! connection and multiplexes them, so the runner's tasks share it; each
//! call works on its own clone of the `KvClient` because the crate's calls
//! take `&mut self`.

use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Client, ConnectOptions, GetOptions, KvClient};

use super::{Driver, DriverError, DriverFactory};

/// The key [`probe`] writes and removes; it sorts before YCSB's `user…` keys.
const PROBE_KEY: &str = "rdkv-bench-probe";

#[derive(Debug, Clone)]
pub struct EtcdFactory {
    /// `host:port` (or `http://host:port`) of the members to balance over.
    pub endpoints: Vec<String>,
    /// Per-request and connect timeout.
    pub request_timeout: Duration,
}

impl EtcdFactory {
    async fn client(&self) -> Result<Client, DriverError> {
        if self.endpoints.is_empty() {
            return Err(DriverError::Config(
                "no etcd endpoints: pass --etcd-endpoints host:port,... or --start-etcd N".into(),
            ));
        }
        let options = ConnectOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.request_timeout);
        Ok(Client::connect(&self.endpoints, Some(options)).await?)
    }
}

impl DriverFactory for EtcdFactory {
    type Driver = EtcdDriver;

    fn label(&self) -> String {
        "etcd".into()
    }

    async fn connect(&self) -> Result<EtcdDriver, DriverError> {
        let mut kv = self.client().await?.kv_client();
        // The connection is made lazily: fail now, not on the first timed
        // operation, if nothing answers (a linearizable read needs a leader).
        kv.get(PROBE_KEY, Some(GetOptions::new().with_count_only()))
            .await?;
        Ok(EtcdDriver { kv })
    }
}

/// Whether the cluster at `factory`'s endpoints takes a write and reads it
/// back: puts, gets and deletes [`PROBE_KEY`].
pub async fn probe(factory: &EtcdFactory) -> Result<(), DriverError> {
    let mut kv = factory.client().await?.kv_client();
    let value = b"ready".to_vec();
    kv.put(PROBE_KEY, value.clone(), None).await?;
    let response = kv.get(PROBE_KEY, None).await?;
    if response.kvs().first().map(|kv| kv.value()) != Some(value.as_slice()) {
        return Err(DriverError::Config(format!(
            "etcd: {PROBE_KEY} read back {:?} after a put",
            response.kvs().first().map(|kv| kv.value())
        )));
    }
    kv.delete(PROBE_KEY, None).await?;
    Ok(())
}

pub struct EtcdDriver {
    kv: KvClient,
}

// `KvClient` is not `Debug`.
impl std::fmt::Debug for EtcdDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdDriver").finish_non_exhaustive()
    }
}

impl Driver for EtcdDriver {
    fn supports_scan(&self) -> bool {
        true
    }

    async fn read(&self, key: &str) -> Result<Option<Bytes>, DriverError> {
        let mut response = self.kv.clone().get(key, None).await?;
        Ok(response
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| Bytes::from(kv.into_key_value().1)))
    }

    async fn update(&self, key: &str, record: Bytes) -> Result<(), DriverError> {
        self.kv.clone().put(key, record, None).await?;
        Ok(())
    }

    async fn insert(&self, key: &str, record: Bytes) -> Result<(), DriverError> {
        self.update(key, record).await
    }

    async fn scan(&self, start_key: &str, count: usize) -> Result<Vec<Bytes>, DriverError> {
        // etcd reads a limit of 0 as no limit.
        if count == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(count)
            .map_err(|_| DriverError::Config(format!("scan of {count} records: too many")))?;
        // `with_from_key`: every key >= start_key, in key order (etcd's
        // default), cut at `limit`.
        let options = GetOptions::new().with_from_key().with_limit(limit);
        let mut response = self.kv.clone().get(start_key, Some(options)).await?;
        Ok(response
            .take_kvs()
            .into_iter()
            .map(|kv| Bytes::from(kv.into_key_value().1))
            .collect())
    }
}
