//! The `Client` constructor's arguments, as `ClientOptions`.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::PyResult;
use pyo3::exceptions::PyValueError;
use rdkv_client::{ClientOptions, ClientTlsFiles, Consistency, Transport};

/// What Python passed to `Client(...)`, besides the endpoints.
#[derive(Debug)]
pub(crate) struct Arguments<'a> {
    pub(crate) token: Option<String>,
    pub(crate) transport: &'a str,
    pub(crate) consistency: &'a str,
    pub(crate) max_lag: u64,
    pub(crate) timeout: f64,
    pub(crate) connect_timeout: f64,
    pub(crate) max_attempts: u32,
    pub(crate) tls: TlsArguments,
}

/// The TLS arguments: a CA file turns TLS on.
#[derive(Debug, Default)]
pub(crate) struct TlsArguments {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) server_name: Option<String>,
}

impl TlsArguments {
    fn files(&self) -> PyResult<Option<ClientTlsFiles>> {
        ClientTlsFiles::from_settings(
            self.ca.clone(),
            self.cert.clone(),
            self.key.clone(),
            self.server_name.clone(),
        )
        .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

impl Arguments<'_> {
    pub(crate) fn options(&self) -> PyResult<ClientOptions> {
        Ok(ClientOptions {
            token: self.token.clone().filter(|t| !t.is_empty()),
            transport: transport(self.transport)?,
            default_consistency: consistency(self.consistency, self.max_lag)?,
            request_timeout: seconds("timeout", self.timeout)?,
            connect_timeout: seconds("connect_timeout", self.connect_timeout)?,
            max_attempts: self.max_attempts.max(1),
            client_name: concat!("rdkv-python/", env!("CARGO_PKG_VERSION")).to_owned(),
            tls: self.tls.files()?,
            ..ClientOptions::default()
        })
    }
}

/// `auto`, `tcp`, `shm` or `rdma` (the last only in a build with RDMA).
pub(crate) fn transport(name: &str) -> PyResult<Transport> {
    match name {
        "auto" => Ok(Transport::Auto),
        "tcp" => Ok(Transport::Tcp),
        "shm" => Ok(Transport::Shm),
        "rdma" if cfg!(feature = "rdma") => Ok(Transport::Rdma),
        "rdma" => Err(PyValueError::new_err(
            "transport 'rdma': this rdkv module was built without RDMA \
             (build it with the cargo feature `rdma`, see docs/rdma.md)",
        )),
        other => Err(PyValueError::new_err(format!(
            "transport {other:?}: expected 'auto', 'tcp', 'shm' or 'rdma'"
        ))),
    }
}

/// `lease`, `linearizable`, or `follower` (any replica at most `max_lag`
/// log entries behind the leader).
pub(crate) fn consistency(name: &str, max_lag: u64) -> PyResult<Consistency> {
    match name {
        "lease" => Ok(Consistency::Lease),
        "linearizable" => Ok(Consistency::Linearizable),
        "follower" => Ok(Consistency::Follower {
            max_lag_entries: max_lag,
        }),
        other => Err(PyValueError::new_err(format!(
            "consistency {other:?}: expected 'lease', 'linearizable' or 'follower'"
        ))),
    }
}

/// A positive, finite number of seconds.
pub(crate) fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    match Duration::try_from_secs_f64(value) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        _ => Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, not {value}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_the_client_options() {
        assert_eq!(transport("shm").unwrap(), Transport::Shm);
        assert_eq!(transport("tcp").unwrap(), Transport::Tcp);
        assert!(transport("udp").is_err());
        assert_eq!(
            consistency("follower", 7).unwrap(),
            Consistency::Follower { max_lag_entries: 7 }
        );
        assert!(consistency("eventual", 0).is_err());
        let orphan = TlsArguments {
            cert: Some("client.pem".into()),
            ..TlsArguments::default()
        };
        assert!(orphan.files().is_err());
        assert!(TlsArguments::default().files().unwrap().is_none());
        assert_eq!(seconds("t", 0.25).unwrap(), Duration::from_millis(250));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(seconds("t", bad).is_err(), "{bad}");
        }
    }
}
