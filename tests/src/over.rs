//! The one-sided transport a shared test body runs over ([`Over`]): the
//! torn-read stress (`stress`) and the lease reads across a leader change
//! (`lease_change`) are one body each, run over `shm` by their own test
//! files and over `ofi` by `tests/tests/ofi.rs`.

use anyhow::Result;
use rdkv_fabric::RegionReader;

use crate::Cluster;

/// Which transport the clients read the nodes' regions with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The node's memfd mapped read-only (same host).
    Shm,
    /// libfabric's `fi_read` over [`crate::ofi::PROVIDER`]; the nodes offer
    /// no shm socket, so nothing else is one-sided.
    #[cfg(feature = "ofi")]
    Ofi,
}

impl Over {
    pub fn name(self) -> &'static str {
        match self {
            Over::Shm => "shm",
            #[cfg(feature = "ofi")]
            Over::Ofi => "ofi",
        }
    }

    /// Node flags (beside the test's own) that make the nodes serve it.
    pub fn node_args(self) -> &'static [&'static str] {
        match self {
            Over::Shm => &[],
            #[cfg(feature = "ofi")]
            Over::Ofi => &crate::ofi::NODE_ARGS,
        }
    }

    /// `extra` and the transport's node flags, for `Cluster::start_*`.
    pub fn with_node_args<'a>(self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = extra.to_vec();
        args.extend_from_slice(self.node_args());
        args
    }

    /// Whether `cluster` serves it (ofi: else a visible skip, a failure
    /// under CI); shm always is.
    #[cfg_attr(not(feature = "ofi"), allow(unused_variables))]
    pub async fn served_by(self, cluster: &Cluster) -> Result<bool> {
        match self {
            Over::Shm => Ok(true),
            #[cfg(feature = "ofi")]
            Over::Ofi => crate::ofi::ofi_on(cluster).await,
        }
    }

    /// Node `id`'s region read over this transport by the test itself
    /// (validated, but with no lease or abandon bound): what it holds.
    pub async fn region_reader(self, cluster: &Cluster, id: u64) -> Result<RegionReader> {
        match self {
            Over::Shm => cluster.map_region(id).await,
            #[cfg(feature = "ofi")]
            Over::Ofi => crate::ofi::region_reader(cluster, id).await,
        }
    }

    /// A 3-node-style cluster of `n` nodes for a test that deposes a
    /// leader ([`Over::depose`]): plain for shm; for ofi one that can be
    /// partitioned (network namespaces where the host allows, else the
    /// peer network's fault hook).
    pub fn start_deposable(self, n: u64) -> Result<Cluster> {
        match self {
            Over::Shm => Cluster::start(n),
            #[cfg(feature = "ofi")]
            Over::Ofi => Cluster::start_faulty(n, &crate::ofi::NODE_ARGS),
        }
    }

    /// Deposes leader `id` without telling it: its region stays as it
    /// was, claiming the lease it can no longer renew. Over shm it is
    /// frozen (SIGSTOP). Over ofi it is cut from its peers instead, the
    /// test still reaching it: with a manual-progress provider
    /// (`tcp;ofi_rxm`) a frozen node serves no `fi_read` at all, so reads
    /// would time out and never reach the lease check this is about.
    pub async fn depose(self, cluster: &mut Cluster, id: u64) -> Result<()> {
        match self {
            Over::Shm => cluster.node_mut(id)?.pause(),
            #[cfg(feature = "ofi")]
            Over::Ofi => {
                let others: Vec<u64> = cluster.nodes.keys().copied().filter(|n| *n != id).collect();
                cluster.partition(&[&[id], &others]).await
            }
        }
    }

    /// Undoes [`Over::depose`].
    pub async fn reinstate(self, cluster: &mut Cluster, id: u64) -> Result<()> {
        match self {
            Over::Shm => cluster.node_mut(id)?.resume(),
            #[cfg(feature = "ofi")]
            Over::Ofi => cluster.heal().await,
        }
    }
}
