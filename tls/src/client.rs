//! The client side: [`ClientTls`], built from the CA the server's
//! certificate must chain to and an optional client certificate, used by
//! every outgoing TCP connection that has TLS (rdkv-client, a node's peer
//! connections and its own forwarding client).

use std::path::PathBuf;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{Reloadable, Stream, TlsError, TlsFiles, files, provider};

/// Where the client's CA and certificate are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA certificates (PEM) the server's certificate must chain to.
    pub ca: PathBuf,
    /// This client's certificate chain (PEM), for servers that verify
    /// clients; with `key`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry. Default: the host of
    /// the address connected to (an IP address is matched against the
    /// certificate's IP address entries).
    pub server_name: Option<String>,
}

impl ClientTlsFiles {
    /// A client that checks the server against `ca` and shows no certificate.
    pub fn with_ca(ca: impl Into<PathBuf>) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: ca.into(),
            ..ClientTlsFiles::default()
        }
    }

    /// From a command line's settings: none without a CA; a certificate
    /// or key without a CA is an error (it would be silently unused).
    pub fn from_settings(
        ca: Option<PathBuf>,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        server_name: Option<String>,
    ) -> Result<Option<ClientTlsFiles>, TlsError> {
        let Some(ca) = ca else {
            if cert.is_some() || key.is_some() || server_name.is_some() {
                return Err(TlsError::NoCa);
            }
            return Ok(None);
        };
        if cert.is_some() != key.is_some() {
            return Err(TlsError::IncompleteIdentity);
        }
        Ok(Some(ClientTlsFiles {
            ca,
            cert,
            key,
            server_name,
        }))
    }
}

impl TlsFiles for ClientTlsFiles {
    type Config = ClientConfig;

    fn build(&self) -> Result<ClientConfig, TlsError> {
        if self.cert.is_some() != self.key.is_some() {
            return Err(TlsError::IncompleteIdentity);
        }
        if let Some(name) = &self.server_name {
            server_name(name)?;
        }
        let roots = files::roots("TLS CA file", &self.ca)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|reason| TlsError::Config {
                what: "TLS client".into(),
                reason,
            })?
            .with_root_certificates(roots);
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let certs = files::certificates("TLS client certificate", cert)?;
                let key = files::private_key("TLS client key", key)?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|reason| TlsError::Config {
                        what: "TLS client certificate and key".into(),
                        reason,
                    })
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }
}

/// A client's TLS configuration, swappable (a node's peer identity rotates
/// with its certificate files).
pub type ClientTls = Reloadable<ClientTlsFiles>;

impl Reloadable<ClientTlsFiles> {
    /// The TLS handshake over `tcp`, connected to `addr` (`host:port`),
    /// checking the server's certificate against the CA and the server name.
    pub async fn connect(&self, tcp: TcpStream, addr: &str) -> std::io::Result<Stream> {
        let name = match &self.files().server_name {
            Some(name) => server_name(name),
            None => server_name(host_of(addr)),
        }
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let tls = TlsConnector::from(self.current())
            .connect(name, tcp)
            .await?;
        Ok(Stream::Tls(Box::new(tls.into())))
    }
}

fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))
}

/// The host of `host:port` or `[v6]:port`; the whole string when it has
/// no port.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_host_of_the_address() {
        assert_eq!(host_of("127.0.0.1:7379"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7379"), "::1");
        assert_eq!(host_of("db.example:7379"), "db.example");
        assert!(matches!(
            server_name(host_of("127.0.0.1:7379")),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("db.example"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name("not a name!").is_err());
    }

    #[test]
    fn settings_without_a_ca_are_no_tls_or_an_error() {
        let none = ClientTlsFiles::from_settings(None, None, None, None);
        assert!(matches!(none, Ok(None)));
        let cert = Some(PathBuf::from("c.pem"));
        let key = Some(PathBuf::from("c.key"));
        let orphan = ClientTlsFiles::from_settings(None, cert.clone(), key.clone(), None);
        assert!(matches!(orphan, Err(TlsError::NoCa)));
        let ca = Some(PathBuf::from("ca.pem"));
        let half = ClientTlsFiles::from_settings(ca.clone(), cert.clone(), None, None);
        assert!(matches!(half, Err(TlsError::IncompleteIdentity)));
        let files = ClientTlsFiles::from_settings(ca, cert, key, None)
            .unwrap()
            .unwrap();
        assert_eq!(files.ca, PathBuf::from("ca.pem"));
        assert_eq!(files.key, Some(PathBuf::from("c.key")));
    }

    #[test]
    fn a_certificate_without_its_key_is_refused() {
        let files = ClientTlsFiles {
            cert: Some("cert.pem".into()),
            ..ClientTlsFiles::with_ca("ca.pem")
        };
        assert!(matches!(
            ClientTls::load(files),
            Err(TlsError::IncompleteIdentity)
        ));
    }
}
