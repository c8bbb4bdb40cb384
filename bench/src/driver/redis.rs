//! The Redis driver: the `redis` crate's multiplexed async connection, one
//! per benchmark thread, against any Redis-compatible endpoint.
//!
//! A record is one string value with the same encoding as rdkv's (not a
//! hash as in YCSB's redis binding), so both stores move the same bytes.
//! Scans follow YCSB's redis binding in keeping a sorted set `_indices` of
//! every inserted key, maintained on insert (`ZADD` pipelined with the
//! `SET`, one round trip). YCSB scores keys by Java's `String.hashCode` and
//! scans with `ZRANGEBYSCORE`, which returns hash order; here every key has
//! score 0 and a scan is `ZRANGEBYLEX _indices [start + LIMIT 0 n` then one
//! `MGET`, so a scan returns the records in key order, as rdkv's does.

use bytes::Bytes;
use rdkv_client::ClientTlsFiles;
use redis::aio::MultiplexedConnection;
use redis::{ClientTlsConfig, TlsCertificates};

use super::{Driver, DriverError, DriverFactory};

/// YCSB's redis binding's index key.
pub const INDEX_KEY: &str = "_indices";

#[derive(Debug, Clone)]
pub struct RedisFactory {
    pub url: String,
    pub server: RespServer,
    /// The CA (and client certificate) of a `rediss://` endpoint.
    pub tls: Option<ClientTlsFiles>,
}

/// What answers at the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespServer {
    Redis,
    /// rdkv's RESP front end: strings only, so no `_indices` sorted set
    /// (inserts are plain SETs and scans are not supported).
    Rdkv,
}

impl RespServer {
    fn label(self) -> &'static str {
        match self {
            RespServer::Redis => "redis",
            RespServer::Rdkv => "rdkv-resp",
        }
    }
}

/// The redis crate's TLS settings from the files (PEM, as read).
fn certificates(tls: &ClientTlsFiles) -> Result<TlsCertificates, DriverError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| DriverError::Config(format!("reading {}: {e}", path.display())))
    };
    let client_tls = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        _ => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert: Some(read(&tls.ca)?),
    })
}

impl DriverFactory for RedisFactory {
    type Driver = RedisDriver;

    fn label(&self) -> String {
        self.server.label().into()
    }

    async fn connect(&self) -> Result<RedisDriver, DriverError> {
        let client = match &self.tls {
            None => redis::Client::open(self.url.as_str())?,
            Some(tls) => {
                // The redis crate's rustls uses the process's default
                // provider: ring, as rdkv's own TLS (already set is fine).
                let _ = rdkv_tls::rustls::crypto::ring::default_provider().install_default();
                redis::Client::build_with_tls(self.url.as_str(), certificates(tls)?)?
            }
        };
        let connection = client.get_multiplexed_async_connection().await?;
        Ok(RedisDriver {
            connection,
            sorted_index: self.server == RespServer::Redis,
        })
    }
}

#[derive(Debug)]
pub struct RedisDriver {
    connection: MultiplexedConnection,
    /// Inserts maintain `_indices` and scans read it.
    sorted_index: bool,
}

impl Driver for RedisDriver {
    fn supports_scan(&self) -> bool {
        self.sorted_index
    }

    async fn read(&self, key: &str) -> Result<Option<Bytes>, DriverError> {
        let mut connection = self.connection.clone();
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut connection)
            .await?;
        Ok(value.map(Bytes::from))
    }

    async fn update(&self, key: &str, record: Bytes) -> Result<(), DriverError> {
        let mut connection = self.connection.clone();
        let () = redis::cmd("SET")
            .arg(key)
            .arg(record.as_ref())
            .query_async(&mut connection)
            .await?;
        Ok(())
    }

    async fn insert(&self, key: &str, record: Bytes) -> Result<(), DriverError> {
        if !self.sorted_index {
            return self.update(key, record).await;
        }
        let mut connection = self.connection.clone();
        let ((), _added): ((), i64) = redis::pipe()
            .cmd("SET")
            .arg(key)
            .arg(record.as_ref())
            .cmd("ZADD")
            .arg(INDEX_KEY)
            .arg(0)
            .arg(key)
            .query_async(&mut connection)
            .await?;
        Ok(())
    }

    async fn scan(&self, start_key: &str, count: usize) -> Result<Vec<Bytes>, DriverError> {
        let mut connection = self.connection.clone();
        let keys: Vec<String> = redis::cmd("ZRANGEBYLEX")
            .arg(INDEX_KEY)
            .arg(format!("[{start_key}"))
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(count)
            .query_async(&mut connection)
            .await?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut connection)
            .await?;
        Ok(values.into_iter().flatten().map(Bytes::from).collect())
    }
}
