//! The node's TLS (docs/security.md): what its listeners accept with, what
//! it connects to its peers with, and what its own clients of other
//! members' client ports (RESP forwarding, `--join`) use. Loaded at start,
//! so that a missing or bad file stops the start; read again on SIGHUP and
//! when a file changes, so that certificates rotate without a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use rdkv_tls::{ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles};
use tokio::sync::watch;

use crate::config::Config;

/// How often the certificate files are looked at for a change.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct NodeTls {
    /// The client, RESP and HTTP ports.
    pub front: Option<Arc<ServerTls>>,
    /// The peer port.
    pub peer_server: Option<Arc<ServerTls>>,
    /// Connections to the other members' peer ports: the same certificate,
    /// verified by them against their peer CA.
    pub peer_client: Option<Arc<ClientTls>>,
    /// What this node's own clients of other members' client ports use.
    pub own_client: Option<ClientTlsFiles>,
}

impl NodeTls {
    pub fn load(config: &Config) -> Result<NodeTls> {
        let front = config.tls.clone().map(ServerTls::load).transpose()?;
        let peer_server = config.peer_tls.clone().map(ServerTls::load).transpose()?;
        let peer_client = config
            .peer_tls
            .as_ref()
            .map(|files| ClientTls::load(peer_identity(files)))
            .transpose()
            .context("the peer certificate as a client")?;
        Ok(NodeTls {
            own_client: own_client(config),
            front: front.map(Arc::new),
            peer_server: peer_server.map(Arc::new),
            peer_client: peer_client.map(Arc::new),
        })
    }

    fn is_on(&self) -> bool {
        self.front.is_some() || self.peer_server.is_some()
    }

    /// Every file a reload reads.
    fn watched(&self) -> Vec<PathBuf> {
        let servers = [&self.front, &self.peer_server];
        servers
            .into_iter()
            .flatten()
            .flat_map(|tls| tls.files().paths())
            .collect()
    }

    /// Reads every file again; what fails keeps its previous configuration.
    fn reload(&self, why: &str) {
        let results = [
            ("client ports", self.front.as_ref().map(|t| t.reload())),
            ("peer port", self.peer_server.as_ref().map(|t| t.reload())),
            ("peer client", self.peer_client.as_ref().map(|t| t.reload())),
        ];
        for (what, result) in results {
            match result {
                Some(Ok(())) => tracing::info!("{why}: reloaded the TLS files of the {what}"),
                Some(Err(e)) => tracing::error!(
                    "{why}: reloading the TLS files of the {what} failed, keeping the previous ones: {e}"
                ),
                None => {}
            }
        }
    }

    /// Reloads on SIGHUP and when a watched file's time or size changes,
    /// until shutdown.
    pub async fn reload_on_change(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        if !self.is_on() {
            return;
        }
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(hangup) => Some(hangup),
            Err(e) => {
                tracing::warn!("no SIGHUP handler ({e}); TLS files reload when they change");
                None
            }
        };
        let paths = self.watched();
        let mut seen = fingerprint(&paths);
        let mut tick = tokio::time::interval(WATCH_PERIOD);
        loop {
            tokio::select! {
                Some(()) = async { hangup.as_mut()?.recv().await } => self.reload("SIGHUP"),
                _ = tick.tick() => {
                    let now = fingerprint(&paths);
                    if now != seen {
                        seen = now;
                        self.reload("a TLS file changed");
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// The peer certificate as a client identity, checked against the peer CA.
fn peer_identity(files: &ServerTlsFiles) -> ClientTlsFiles {
    ClientTlsFiles {
        ca: files.client_ca.clone().unwrap_or_default(),
        cert: Some(files.cert.clone()),
        key: Some(files.key.clone()),
        server_name: None,
    }
}

/// This node's clients of other members' TLS client ports trust `--tls-ca`
/// (else the peer CA) and show the node's `--tls-cert`. Without either CA
/// they cannot verify those ports, so they are left plain (and refused).
fn own_client(config: &Config) -> Option<ClientTlsFiles> {
    let front = config.tls.as_ref()?;
    let peer_ca = config.peer_tls.as_ref().and_then(|p| p.client_ca.clone());
    let Some(ca) = front.client_ca.clone().or(peer_ca) else {
        tracing::warn!(
            "--tls-cert without --tls-ca or --peer-tls-ca: this node cannot verify other \
             members' client ports, so it cannot forward RESP writes or --join through them"
        );
        return None;
    };
    Some(ClientTlsFiles {
        ca,
        cert: Some(front.cert.clone()),
        key: Some(front.key.clone()),
        server_name: None,
    })
}

/// Modification time and length of each file (`None` for a file that
/// cannot be read now, e.g. in the middle of being replaced).
fn fingerprint(paths: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    paths
        .iter()
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::Args;

    #[test]
    fn a_missing_certificate_file_stops_the_start_naming_the_flag_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("node.pem");
        let argv = [
            "rdkv-server",
            "--tls-cert",
            missing.to_str().unwrap(),
            "--tls-key",
            "node.key",
        ];
        let config = Config::resolve(Args::parse_from(argv)).unwrap();
        let error = NodeTls::load(&config).unwrap_err().to_string();
        assert!(error.contains("--tls-cert"), "{error}");
        assert!(error.contains("node.pem"), "{error}");
    }

    #[test]
    fn without_tls_settings_nothing_is_loaded_or_watched() {
        let config = Config::resolve(Args::parse_from(["rdkv-server"])).unwrap();
        let tls = NodeTls::load(&config).unwrap();
        assert!(!tls.is_on());
        assert!(tls.watched().is_empty() && tls.own_client.is_none());
    }
}
