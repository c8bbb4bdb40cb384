//! Test certificate authorities, made at test time with rcgen: a CA that
//! issues node and client certificates, written as PEM files the way an
//! operator would hand them to `rdkv-server` and the clients. The
//! extensions strict verifiers want (key usages, key identifiers) are set,
//! so that OpenSSL-based clients (redis-cli, Python's ssl) accept them too.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rdkv_client::ClientTlsFiles;

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority whose certificate is at [`TestCa::cert`].
pub struct TestCa {
    name: String,
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("cert", &self.cert).finish()
    }
}

fn named(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

impl TestCa {
    /// A new CA named `name`, its files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = named(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let cert = dir.join(format!("{name}.pem"));
        std::fs::write(&cert, issuer.pem()).with_context(|| format!("writing {name}.pem"))?;
        Ok(TestCa {
            name: name.to_owned(),
            dir: dir.to_owned(),
            issuer,
            cert,
        })
    }

    /// A certificate for `names` (IP addresses or DNS names), good for a
    /// server and a client, written as `<ca>-<file>.pem` and `.key`.
    pub fn issue(&self, file: &str, names: &[String]) -> Result<CertFiles> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = named(file);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{}-{file}.pem", self.name)),
            key: self.dir.join(format!("{}-{file}.key", self.name)),
        };
        write(&files.cert, &cert.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }

    /// Client options' TLS: trust this CA, show `identity` if given.
    pub fn client_tls(&self, identity: Option<&CertFiles>) -> ClientTlsFiles {
        ClientTlsFiles {
            cert: identity.map(|i| i.cert.clone()),
            key: identity.map(|i| i.key.clone()),
            ..ClientTlsFiles::with_ca(&self.cert)
        }
    }
}

/// Replaces `path`'s contents at once (a rename), as a rotation script
/// would, so that a reader never sees half a file.
pub fn write(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

/// `files` copied over `to` (a rotation of `to`'s certificate and key).
pub fn replace(to: &CertFiles, files: &CertFiles) -> Result<()> {
    write(&to.key, &std::fs::read_to_string(&files.key)?)?;
    write(&to.cert, &std::fs::read_to_string(&files.cert)?)
}
