//! How tests get a client, by intent: [`Intent::Any`] (the cluster routes
//! each request), [`Intent::Via`] (requests enter at the named nodes), or a
//! [`Replica`], which reads one node and nothing else. Built by
//! [`Cluster::client`](crate::Cluster::client),
//! [`Cluster::client_with`](crate::Cluster::client_with) and
//! [`Cluster::replica`](crate::Cluster::replica).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use rdkv_client::{Client, ClientOptions, Consistency, NodeStatus, Transport, Versioned};

/// Budget of one call of a harness client: generous, for a loaded machine.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Which nodes a client is given as its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent<'a> {
    /// Every node of the cluster: the client routes each request itself
    /// (writes and lease reads to the leader, follower reads spread over
    /// the nodes, GETs one-sided where the transport allows).
    Any,
    /// Only these nodes: requests enter there, and the client follows their
    /// redirects to the leader as usual. For "the leader only" pass the
    /// leader's id; for reads that must be served by one node, use a
    /// [`Replica`] instead.
    Via(&'a [u64]),
}

/// Client options of the harness: a 10 s budget per call, optionally a
/// token; everything else the client's defaults. Override fields with
/// `ClientOptions { transport: Transport::Tcp, ..client_options(None) }`.
pub fn client_options(token: Option<&str>) -> ClientOptions {
    ClientOptions {
        token: token.map(str::to_owned),
        request_timeout: REQUEST_TIMEOUT,
        ..ClientOptions::default()
    }
}

/// Reads served by one node alone, for checks that a given replica holds
/// something. Every read goes by RPC (`Transport::Tcp`: no region of another
/// member is mapped) at `Follower` consistency with no lag bound, to this
/// node's endpoint only: a follower read is answered where it is asked (the
/// node never redirects it), so a key this node lacks reads as absent or
/// fails; no other replica can answer in its place. It offers no writes:
/// those would be redirected to the leader.
#[derive(Debug, Clone)]
pub struct Replica {
    id: u64,
    endpoint: String,
    client: Client,
}

/// Any lag: the read is about what this node has applied, not about freshness.
const LOCAL: Consistency = Consistency::Follower {
    max_lag_entries: u64::MAX,
};

impl Replica {
    /// A replica reader of node `id` at `endpoint`; `options` may carry a
    /// token or other budgets, but its transport is replaced by TCP.
    pub(crate) fn new(id: u64, endpoint: String, options: ClientOptions) -> Result<Replica> {
        let options = ClientOptions {
            transport: Transport::Tcp,
            ..options
        };
        let client = Client::new(std::slice::from_ref(&endpoint), options)?;
        Ok(Replica {
            id,
            endpoint,
            client,
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// `key` as this node has applied it.
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Versioned>> {
        Ok(self.client.get_with(key, LOCAL).await?)
    }

    /// `keys` as this node has applied them, in order.
    pub async fn mget<I, K>(&self, keys: I) -> Result<Vec<Option<Versioned>>>
    where
        I: IntoIterator<Item = K>,
        K: Into<Bytes>,
    {
        Ok(self.client.mget_with(keys, LOCAL).await?)
    }

    /// Up to `limit` pairs from `start_key` (before `end_key`, if given) as
    /// this node has applied them.
    pub async fn scan_range(
        &self,
        start_key: impl Into<Bytes>,
        end_key: Option<Bytes>,
        limit: usize,
    ) -> Result<Vec<(Bytes, Versioned)>> {
        Ok(self
            .client
            .scan_range(start_key, end_key, limit, LOCAL)
            .await?)
    }

    /// This node's own status.
    pub async fn status(&self) -> Result<NodeStatus> {
        Ok(self.client.status_of(&self.endpoint).await?)
    }

    /// Fails unless this node holds `key` with `value`, saying what it has.
    pub async fn expect(&self, key: &str, value: &str) -> Result<()> {
        let got = self
            .get(Bytes::copy_from_slice(key.as_bytes()))
            .await
            .with_context(|| format!("reading {key} on node {}", self.id))?;
        ensure!(
            got.as_ref().is_some_and(|v| v.value == value.as_bytes()),
            "node {} has {key} = {got:?}, expected {value:?}",
            self.id
        );
        Ok(())
    }
}

/// The acknowledged keys a linearizable read does not return as written.
pub async fn lost_writes(client: &Client, acked: &[String]) -> Result<Vec<String>> {
    let mut lost = Vec::new();
    for chunk in acked.chunks(100) {
        let values = client
            .mget_with(
                chunk.iter().map(|k| Bytes::from(k.clone())),
                Consistency::Linearizable,
            )
            .await?;
        for (key, got) in chunk.iter().zip(values) {
            if got.map(|v| v.value).as_deref() != Some(key.as_bytes()) {
                lost.push(key.clone());
            }
        }
    }
    Ok(lost)
}

/// Fails unless `client`, whose transport is one-sided only, refuses a
/// linearizable GET with `OneSidedUnavailable`: such a client never sends
/// a GET to a server.
pub async fn ensure_linearizable_refused(client: &Client) -> Result<()> {
    let got = client
        .get_with(Bytes::from_static(b"key-001"), Consistency::Linearizable)
        .await;
    ensure!(
        matches!(got, Err(rdkv_client::Error::OneSidedUnavailable)),
        "a linearizable GET was answered: {got:?}"
    );
    Ok(())
}
