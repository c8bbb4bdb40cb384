//! The server side: one [`ServerTls`] per kind of listener (the client
//! ports share one, the peer port has its own), built from PEM files and
//! rebuilt from them on [`ServerTls::reload`] (certificate rotation without
//! a restart: connections accepted afterwards get the new certificate and
//! CA, open ones keep theirs).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::{Reloadable, Stream, TlsError, TlsFiles, files, provider};

/// Where a listener's certificate, key and (optional) client CA are, and
/// the flag names errors report them under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, every client must present a certificate that chains to
    /// one of these CAs (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// How errors name the settings: `tls` gives `--tls-cert`, `--tls-key`
    /// and `--tls-ca`.
    pub flag_prefix: &'static str,
}

impl ServerTlsFiles {
    /// The files, in the order a watcher should look at them.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cert.clone(), self.key.clone()];
        paths.extend(self.client_ca.clone());
        paths
    }
}

impl TlsFiles for ServerTlsFiles {
    type Config = ServerConfig;

    fn build(&self) -> Result<ServerConfig, TlsError> {
        let prefix = self.flag_prefix;
        let certs = files::certificates(&format!("--{prefix}-cert"), &self.cert)?;
        let key = files::private_key(&format!("--{prefix}-key"), &self.key)?;
        let provider = provider();
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|reason| config_error(format!("--{prefix}-*"), reason))?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let what = format!("--{prefix}-ca");
                let roots = files::roots(&what, ca)?;
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| config_error(what, rustls::Error::General(e.to_string())))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        builder
            .with_single_cert(certs, key)
            .map_err(|reason| config_error(format!("--{prefix}-cert and --{prefix}-key"), reason))
    }
}

fn config_error(what: String, reason: rustls::Error) -> TlsError {
    TlsError::Config { what, reason }
}

/// A listener's TLS configuration, swappable while it serves.
pub type ServerTls = Reloadable<ServerTlsFiles>;

impl Reloadable<ServerTlsFiles> {
    /// The TLS handshake on an accepted connection (bound in time by the
    /// caller).
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<Stream> {
        let tls = TlsAcceptor::from(self.current()).accept(tcp).await?;
        Ok(Stream::Tls(Box::new(tls.into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate and its key, written into `dir` as
    /// `name.pem` and `name.key`.
    fn self_signed(dir: &std::path::Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = self_signed(dir.path(), "a");
        let (_, other_key) = self_signed(dir.path(), "b");
        let files = ServerTlsFiles {
            cert,
            key: other_key,
            client_ca: None,
            flag_prefix: "peer-tls",
        };
        let error = ServerTls::load(files).unwrap_err().to_string();
        assert!(
            error.contains("--peer-tls-cert and --peer-tls-key"),
            "{error}"
        );
    }

    #[test]
    fn a_failed_reload_keeps_the_previous_configuration_and_a_good_one_swaps_it() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "a");
        let files = ServerTlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: None,
            flag_prefix: "tls",
        };
        let tls = ServerTls::load(files).unwrap();
        let before = tls.current();
        std::fs::write(&cert, "half a file").unwrap();
        assert!(tls.reload().is_err());
        assert!(Arc::ptr_eq(&before, &tls.current()));
        let (new_cert, new_key) = self_signed(dir.path(), "b");
        std::fs::rename(new_cert, &cert).unwrap();
        std::fs::rename(new_key, &key).unwrap();
        tls.reload().unwrap();
        assert!(!Arc::ptr_eq(&before, &tls.current()));
    }
}
