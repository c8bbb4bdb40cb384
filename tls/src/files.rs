//! PEM files: certificate chains, private keys and CA bundles. A missing
//! file, a file with no certificate or no key, or bad PEM is an error that
//! names the file, so that a bad setting stops a node at start.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

fn file_error(what: &str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        what: what.to_owned(),
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// Every certificate in `path`, in order (a leaf then its intermediates).
pub fn certificates(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The first private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            file_error(what, path, "no PEM private key in it")
        }
        other => file_error(what, path, other),
    })
}

/// The CA certificates in `path` as trust anchors.
pub fn roots(what: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certificates(what, path)? {
        store
            .add(cert)
            .map_err(|e| file_error(what, path, format!("not a CA certificate: {e}")))?;
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_and_a_file_without_pem_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let error = certificates("--tls-cert", &missing).unwrap_err();
        assert!(error.to_string().contains("missing.pem"), "{error}");
        assert!(error.to_string().starts_with("--tls-cert"), "{error}");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not pem at all\n").unwrap();
        let error = certificates("--tls-ca", &garbage).unwrap_err();
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
        let error = private_key("--tls-key", &garbage).unwrap_err();
        assert!(error.to_string().contains("no PEM private key"), "{error}");
    }

    #[test]
    fn certificates_keys_and_roots_are_read_from_pem() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let cert_path = dir.path().join("ca.pem");
        let key_path = dir.path().join("ca.key");
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        assert_eq!(certificates("cert", &cert_path).unwrap().len(), 1);
        private_key("key", &key_path).unwrap();
        assert_eq!(roots("ca", &cert_path).unwrap().len(), 1);
        // A key is not a certificate.
        assert!(certificates("cert", &key_path).is_err());
    }
}
