//! The rdkv driver: one `rdkv_client::Client` per benchmark thread; GETs at
//! the chosen consistency over the chosen transport, writes through the
//! leader (Raft, fsynced on a quorum).

use std::time::Duration;

use std::cell::RefCell;

use bytes::Bytes;
use rdkv_client::{
    Client, ClientOptions, ClientTlsFiles, Consistency, GetIntoError, GotInto, ReadHandle,
    Transport,
};

use super::{Driver, DriverError, DriverFactory, ReadResult};

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    Auto,
    Shm,
    Tcp,
    Rdma,
}

impl TransportChoice {
    pub fn parse(s: &str) -> Result<TransportChoice, DriverError> {
        match s {
            "auto" => Ok(TransportChoice::Auto),
            "shm" => Ok(TransportChoice::Shm),
            "tcp" => Ok(TransportChoice::Tcp),
            "rdma" => Ok(TransportChoice::Rdma),
            other => Err(DriverError::Config(format!(
                "unknown transport {other:?}: expected auto, shm, tcp or rdma"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Shm => "shm",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Rdma => "rdma",
        }
    }

    /// Fails with a clear message for a transport this client lacks.
    pub fn check_available(self) -> Result<(), DriverError> {
        self.client_transport().map(drop)
    }

    fn client_transport(self) -> Result<Transport, DriverError> {
        match self {
            TransportChoice::Auto => Ok(Transport::Auto),
            TransportChoice::Shm => Ok(Transport::Shm),
            TransportChoice::Tcp => Ok(Transport::Tcp),
            TransportChoice::Rdma => Err(DriverError::Unsupported(
                "transport rdma: this rdkv-client has no RDMA transport yet (issue 5); \
                 use --transport shm, tcp or auto"
                    .into(),
            )),
        }
    }
}

/// `--consistency`: linearizable, lease, or follower[:max_lag_entries].
pub fn parse_consistency(s: &str) -> Result<Consistency, DriverError> {
    match s {
        "linearizable" => Ok(Consistency::Linearizable),
        "lease" => Ok(Consistency::Lease),
        "follower" => Ok(Consistency::Follower {
            max_lag_entries: 1000,
        }),
        other => match other.strip_prefix("follower:").map(str::parse::<u64>) {
            Some(Ok(max_lag_entries)) => Ok(Consistency::Follower { max_lag_entries }),
            _ => Err(DriverError::Config(format!(
                "unknown consistency {other:?}: expected linearizable, lease, follower \
                 or follower:<max lag entries>"
            ))),
        },
    }
}

#[derive(Debug, Clone)]
pub struct RdkvFactory {
    pub endpoints: Vec<String>,
    pub transport: TransportChoice,
    pub consistency: Consistency,
    pub token: Option<String>,
    pub request_timeout: Duration,
    /// TLS to the servers' client ports (`None`: plain TCP).
    pub tls: Option<ClientTlsFiles>,
    /// Serve a thread's in-flight reads as one `get_many_into` batch
    /// (target `rdkv-<transport>-batch`).
    pub batch_reads: bool,
}

impl RdkvFactory {
    /// Checks what can be checked before any connection (an unavailable
    /// transport), so the user hears it at once.
    pub fn validate(&self) -> Result<(), DriverError> {
        self.transport.client_transport()?;
        if self.endpoints.is_empty() {
            return Err(DriverError::Config(
                "no rdkv endpoints: pass --endpoints host:port,... or --embedded N".into(),
            ));
        }
        Ok(())
    }
}

impl DriverFactory for RdkvFactory {
    type Driver = RdkvDriver;

    fn label(&self) -> String {
        let batch = if self.batch_reads { "-batch" } else { "" };
        format!("rdkv-{}{batch}", self.transport.name())
    }

    async fn connect(&self) -> Result<RdkvDriver, DriverError> {
        let options = ClientOptions {
            token: self.token.clone(),
            request_timeout: self.request_timeout,
            transport: self.transport.client_transport()?,
            default_consistency: self.consistency,
            tls: self.tls.clone(),
            ..ClientOptions::default()
        };
        let client = Client::new(&self.endpoints, options)?;
        // Fail now, not on the first timed operation, if nothing answers.
        // A sharded node's hello announces its map, which the client
        // fetches before this first request: keys go to their shard's
        // leader from the first timed operation.
        client.ping().await?;
        // A first read learns the topology and attaches the regions (on
        // shm, mapping every node's region: about half a second here),
        // which an application pays once per client: before the phase's
        // clock starts, not inside its first operations. Its answer does
        // not matter: a one-sided-only client is refused until the
        // leader's first lease (the topology is learned all the same),
        // and the ping above already proved the cluster answers.
        let _ = client
            .get_with(Bytes::from_static(WARM_UP_KEY), self.consistency)
            .await;
        let handle = RefCell::new((client.read_handle(), Vec::new()));
        Ok(RdkvDriver {
            client,
            consistency: self.consistency,
            handle,
            batch: self.batch_reads.then(RefCell::default),
        })
    }
}

/// The key of the read each driver makes before the phase starts (no
/// workload key looks like it; absent is as good an answer as any).
const WARM_UP_KEY: &[u8] = b"rdkv-bench warm-up";

/// Whether this client can scan (workload E): `Client::scan_with`, served
/// by RPC from the server's ordered key index at the read consistency.
pub const SUPPORTS_SCAN: bool = true;

#[derive(Debug)]
pub struct RdkvDriver {
    client: Client,
    consistency: Consistency,
    /// This thread's one-sided read handle and its value buffer: a READ is
    /// `get_into` (the synchronous path, as an application that reads into
    /// its own buffers uses it), the record handed to the runner from this
    /// buffer (`read_with`; copied out only by `read`); what it does not
    /// serve goes to `get_with`. Borrowed while the runner's callback runs,
    /// which must not call back into the driver.
    handle: RefCell<(ReadHandle, Vec<u8>)>,
    /// With batched reads: a buffer per read in flight and the answers.
    batch: Option<RefCell<BatchBuffers>>,
}

/// What a batch of reads lands in, reused from batch to batch.
#[derive(Debug, Default)]
struct BatchBuffers {
    values: Vec<Vec<u8>>,
    answers: Vec<Option<GotInto>>,
}

/// Times a batch is read again with larger buffers (the first batch
/// learns the records' size).
const BATCH_ATTEMPTS: usize = 3;

impl RdkvDriver {
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl RdkvDriver {
    /// A READ by the read handle, its record passed to `found` from the
    /// handle's buffer, if the handle serves it (`None`: ask the client).
    fn read_one_sided<R>(&self, key: &[u8], found: impl FnOnce(Option<&[u8]>) -> R) -> Option<R> {
        let mut handle = self.handle.borrow_mut();
        let (handle, buf) = &mut *handle;
        for _ in 0..2 {
            match handle.get_into_with(key, buf, self.consistency) {
                Ok(got) => return Some(found(got.map(|g| &buf[..g.len]))),
                Err(GetIntoError::BufferTooSmall { needed, .. }) => buf.resize(needed, 0),
                Err(GetIntoError::NotServed(_)) => return None,
            }
        }
        None
    }
}

impl RdkvDriver {
    async fn read_by_rpc(&self, key: &str) -> Result<Option<Bytes>, DriverError> {
        let got = self
            .client
            .get_with(Bytes::copy_from_slice(key.as_bytes()), self.consistency)
            .await?;
        Ok(got.map(|v| v.value))
    }

    /// A batch of READs by the read handle (`get_many_into`: the
    /// neighbourhoods in one round, the blocks in a second, one clock
    /// reading), each record passed to `each` from its buffer, not copied
    /// out; `false` if the handle does not serve it (nothing was passed).
    fn read_many_one_sided(
        &self,
        batch: &RefCell<BatchBuffers>,
        keys: &[&str],
        each: &mut dyn FnMut(usize, ReadResult<'_>),
    ) -> bool {
        let mut handle = self.handle.borrow_mut();
        let handle = &mut handle.0;
        let mut batch = batch.borrow_mut();
        let BatchBuffers { values, answers } = &mut *batch;
        if values.len() < keys.len() {
            values.resize_with(keys.len(), Vec::new);
        }
        answers.clear();
        answers.resize(keys.len(), None);
        let key_bytes: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        for _ in 0..BATCH_ATTEMPTS {
            let mut bufs: Vec<&mut [u8]> = values.iter_mut().map(Vec::as_mut_slice).collect();
            match handle.get_many_into(&key_bytes, &mut bufs, answers, self.consistency) {
                Ok(()) => {
                    for (i, (answer, value)) in answers.iter().zip(values.iter()).enumerate() {
                        each(i, Ok(answer.map(|got| &value[..got.len])));
                    }
                    return true;
                }
                Err(GetIntoError::BufferTooSmall { needed, .. }) => {
                    for value in values.iter_mut().filter(|v| v.len() < needed) {
                        value.resize(needed, 0);
                    }
                }
                Err(GetIntoError::NotServed(_)) => return false,
            }
        }
        false
    }
}

impl Driver for RdkvDriver {
    fn supports_scan(&self) -> bool {
        SUPPORTS_SCAN
    }

    fn batches_reads(&self) -> bool {
        self.batch.is_some()
    }

    async fn read_batch(&self, keys: &[&str], each: &mut dyn FnMut(usize, ReadResult<'_>)) {
        if let Some(batch) = &self.batch
            && self.read_many_one_sided(batch, keys, each)
        {
            return;
        }
        // Not served one-sided: one read after another, as the default.
        for (i, key) in keys.iter().enumerate() {
            self.read_with(key, &mut |record| each(i, record)).await;
        }
    }

    async fn read(&self, key: &str) -> Result<Option<Bytes>, DriverError> {
        if let Some(value) = self.read_one_sided(key.as_bytes(), |v| v.map(Bytes::copy_from_slice))
        {
            return Ok(value);
        }
        self.read_by_rpc(key).await
    }

    /// The record straight from the read handle's buffer, not copied out
    /// (as a `get_into` user reads it); by RPC when the handle does not
    /// serve it.
    async fn read_with(&self, key: &str, each: &mut dyn FnMut(ReadResult<'_>)) {
        if self
            .read_one_sided(key.as_bytes(), |v| each(Ok(v)))
            .is_some()
        {
            return;
        }
        match self.read_by_rpc(key).await {
            Ok(record) => each(Ok(record.as_deref())),
            Err(error) => each(Err(error)),
        }
    }

    async fn update(&self, key: &str, record: Bytes) -> Result<(), DriverError> {
        self.client
            .put(Bytes::copy_from_slice(key.as_bytes()), record)
            .await?;
        Ok(())
    }

    async fn insert(&self, key: &str, record: Bytes) -> Result<(), DriverError> {
        self.update(key, record).await
    }

    async fn scan(&self, start_key: &str, count: usize) -> Result<Vec<Bytes>, DriverError> {
        let pairs = self
            .client
            .scan_with(
                Bytes::copy_from_slice(start_key.as_bytes()),
                count,
                self.consistency,
            )
            .await?;
        Ok(pairs.into_iter().map(|(_, v)| v.value).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_rdma_is_reported_clearly() {
        assert_eq!(TransportChoice::parse("shm").unwrap(), TransportChoice::Shm);
        assert!(TransportChoice::parse("infiniband").is_err());
        let err = TransportChoice::Rdma
            .client_transport()
            .unwrap_err()
            .to_string();
        assert!(err.contains("no RDMA transport"), "{err}");
        assert_eq!(parse_consistency("lease").unwrap(), Consistency::Lease);
        assert_eq!(
            parse_consistency("follower:5").unwrap(),
            Consistency::Follower { max_lag_entries: 5 }
        );
        assert!(parse_consistency("strong").is_err());
        assert!(parse_consistency("follower:x").is_err());
    }
}
