//! `rdkv.Client`: the Rust client's calls for Python.
//!
//! Every call takes its arguments while it holds the GIL, releases the GIL
//! while it waits (network, a leader, a region read), and takes it back
//! only to build its answer; a read into a buffer holds it for the one copy
//! of the value into the buffer.

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use rdkv_client::{Error as ClientError, Versioned};

use crate::batch::{self, REQUEST_LIMITS};
use crate::buffers::{ByteView, each, key_of, value_of};
use crate::errors;
use crate::options::{Arguments, TlsArguments, seconds};
use crate::runtime::runtime;

/// A connection to an rdkv cluster, safe to share between threads.
///
/// Reads are served one-sided when they can be (the servers' memory read
/// directly: shared memory on the same host, RDMA where built), else by
/// RPC. Writes go to the leader through Raft. Every call releases the GIL
/// while it waits.
#[pyclass(module = "rdkv", frozen)]
pub(crate) struct Client {
    /// `None` once closed.
    inner: Mutex<Option<rdkv_client::Client>>,
}

/// What `Client.cas` did.
#[pyclass(module = "rdkv", frozen, get_all)]
pub(crate) struct CasResult {
    /// Whether the comparison held and the write (or delete) was applied.
    succeeded: bool,
    /// On success the version of the write; on failure the applied index
    /// the comparison was evaluated at.
    version: u64,
    /// On failure, the key's value then (`None`: absent).
    current_value: Option<Py<PyBytes>>,
    /// On failure, the key's version then (`None`: absent).
    current_version: Option<u64>,
}

#[pymethods]
impl CasResult {
    fn __repr__(&self) -> String {
        format!(
            "CasResult(succeeded={}, version={}, current_version={:?})",
            if self.succeeded { "True" } else { "False" },
            self.version,
            self.current_version
        )
    }

    fn __bool__(&self) -> bool {
        self.succeeded
    }
}

/// Runs `call` on the runtime with the GIL released; a failure becomes the
/// matching `rdkv` exception.
fn wait<T, F>(py: Python<'_>, call: F) -> PyResult<T>
where
    T: Send,
    F: Future<Output = Result<T, ClientError>> + Send,
{
    let runtime = runtime()?;
    py.detach(|| runtime.block_on(call))
        .map_err(|e| errors::to_py(py, e))
}

/// `endpoints` as a list: one string (comma-separated addresses allowed) or
/// an iterable of strings.
fn endpoint_list(endpoints: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let list: Vec<String> = match endpoints.cast::<PyString>() {
        Ok(text) => text
            .to_str()?
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        Err(_) => each(endpoints, |e| e.extract::<String>())?,
    };
    if list.is_empty() {
        return Err(PyValueError::new_err("no endpoints given"));
    }
    Ok(list)
}

fn bytes_of<'py>(py: Python<'py>, value: &Bytes) -> Bound<'py, PyBytes> {
    PyBytes::new(py, value)
}

impl Client {
    /// The Rust client (a cheap clone: it shares connections).
    fn client(&self) -> PyResult<rdkv_client::Client> {
        let inner = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("rdkv.Client: a call panicked"))?;
        inner
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("rdkv.Client is closed"))
    }

    /// Reads `keys` in requests that fit the protocol's limits, assuming
    /// values no longer than `room` bytes each (the buffers' sizes); one
    /// answer per key, in order.
    fn read_batch(
        &self,
        py: Python<'_>,
        keys: Vec<Bytes>,
        room: &[usize],
    ) -> PyResult<Vec<Option<Versioned>>> {
        let sizes: Vec<u64> = keys
            .iter()
            .zip(room)
            .map(|(key, &room)| batch::entry_bytes(key.len(), room))
            .collect();
        let groups = batch::groups(&sizes, REQUEST_LIMITS);
        let client = self.client()?;
        let reads = groups
            .iter()
            .map(|group| client.mget(keys[group.clone()].to_vec()));
        let answers = wait(py, futures::future::try_join_all(reads))?;
        Ok(answers.into_iter().flatten().collect())
    }

    /// Writes `pairs` in requests that fit the protocol's limits, one after
    /// the other; the version of each pair's request.
    fn write_batch(&self, py: Python<'_>, pairs: Vec<(Bytes, Bytes)>) -> PyResult<Vec<u64>> {
        let sizes: Vec<u64> = pairs
            .iter()
            .map(|(key, value)| batch::entry_bytes(key.len(), value.len()))
            .collect();
        let groups = batch::groups(&sizes, REQUEST_LIMITS);
        let client = self.client()?;
        let write = async {
            let mut versions = Vec::with_capacity(pairs.len());
            for group in &groups {
                let version = match client.mput(pairs[group.clone()].to_vec()).await {
                    Ok(version) => version,
                    Err(error) => return Err((versions.len(), error)),
                };
                versions.extend(std::iter::repeat_n(version, group.len()));
            }
            Ok(versions)
        };
        let runtime = runtime()?;
        py.detach(|| runtime.block_on(write))
            .map_err(|(written, error)| partial_failure(py, written, error))
    }
}

/// The error of a batch write whose first `written` pairs were written.
fn partial_failure(py: Python<'_>, written: usize, error: ClientError) -> PyErr {
    let error = errors::to_py(py, error);
    match error.value(py).setattr("written", written) {
        Ok(()) => error,
        Err(failure) => failure,
    }
}

/// Each value into its buffer: bytes written per key, `None` for a missing
/// key; `BufferTooSmall` (after filling the others) for a value longer
/// than its buffer.
fn fill_buffers(
    py: Python<'_>,
    views: &[ByteView<'_>],
    answers: &[Option<Versioned>],
) -> PyResult<Vec<Option<usize>>> {
    let mut too_small = None;
    let mut written = Vec::with_capacity(answers.len());
    for (index, (view, answer)) in views.iter().zip(answers).enumerate() {
        let Some(found) = answer else {
            written.push(None);
            continue;
        };
        let needed = found.value.len();
        if needed > view.len() {
            too_small.get_or_insert((index, needed, view.len()));
            written.push(None);
            continue;
        }
        view.fill(py, &found.value)?;
        written.push(Some(needed));
    }
    match too_small {
        Some((index, needed, room)) => Err(errors::buffer_too_small(py, index, needed, room)),
        None => Ok(written),
    }
}

/// A batch's keys and buffers pair up one to one.
fn same_length(keys: usize, buffers: usize) -> PyResult<()> {
    if keys != buffers {
        return Err(PyValueError::new_err(format!(
            "{keys} keys but {buffers} buffers"
        )));
    }
    Ok(())
}

/// Whole groups of `len` items of at most `max` each (for `mget`).
fn chunks(len: usize, max: usize) -> Vec<Range<usize>> {
    (0..len)
        .step_by(max.max(1))
        .map(|start| start..(start + max.max(1)).min(len))
        .collect()
}

#[pymethods]
impl Client {
    /// Connects to the cluster at `endpoints` (``"host:port"``, a
    /// comma-separated string of them, or a list): the first that answers;
    /// a wrong token or an unreachable cluster raises here.
    ///
    /// - ``token``: the cluster's token, if it has one.
    /// - ``transport``: how GETs are served: ``"auto"`` (one-sided over RDMA
    ///   or shared memory when possible, else TCP), ``"tcp"``, ``"shm"`` or
    ///   ``"rdma"`` (one-sided only: a read that cannot be served so raises
    ///   ``Unavailable``).
    /// - ``consistency``: of reads: ``"lease"`` (linearizable while the
    ///   servers' clocks drift less than 50 ms), ``"linearizable"`` (always
    ///   by RPC), or ``"follower"`` (any replica at most ``max_lag`` log
    ///   entries behind).
    /// - ``timeout``: seconds one call may take, retries included;
    ///   ``connect_timeout``: seconds one connection attempt may take.
    /// - ``tls_ca``: CA file (PEM) the servers' certificates must chain to:
    ///   TCP connections use TLS. ``tls_cert``/``tls_key``: this client's
    ///   certificate and key, for servers that verify clients;
    ///   ``tls_server_name``: the name the certificates must carry (default:
    ///   each endpoint's host).
    #[new]
    #[pyo3(signature = (
        endpoints, token=None, transport="auto", consistency="lease", timeout=5.0,
        connect_timeout=2.0, max_lag=1000, max_attempts=16, tls_ca=None, tls_cert=None,
        tls_key=None, tls_server_name=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoints: &Bound<'_, PyAny>,
        token: Option<String>,
        transport: &str,
        consistency: &str,
        timeout: f64,
        connect_timeout: f64,
        max_lag: u64,
        max_attempts: u32,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_server_name: Option<String>,
    ) -> PyResult<Self> {
        let endpoints = endpoint_list(endpoints)?;
        let options = Arguments {
            token,
            transport,
            consistency,
            max_lag,
            timeout,
            connect_timeout,
            max_attempts,
            tls: TlsArguments {
                ca: tls_ca,
                cert: tls_cert,
                key: tls_key,
                server_name: tls_server_name,
            },
        }
        .options()?;
        let client = wait(py, rdkv_client::Client::connect_with(&endpoints, options))?;
        Ok(Client {
            inner: Mutex::new(Some(client)),
        })
    }

    /// The value of ``key`` (``bytes``), or ``None`` when it is absent.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = key_of(key)?;
        let client = self.client()?;
        let found = wait(py, client.get(key))?;
        Ok(found.map(|v| bytes_of(py, &v.value)))
    }

    /// ``(value, version)`` of ``key``, or ``None`` when it is absent; the
    /// version is what ``cas`` compares.
    fn get_with_version<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u64)>> {
        let key = key_of(key)?;
        let client = self.client()?;
        let found = wait(py, client.get(key))?;
        Ok(found.map(|v| (bytes_of(py, &v.value), v.version)))
    }

    /// Reads ``key`` into ``buffer`` (any writable, C-contiguous buffer:
    /// bytearray, memoryview, numpy array) from its start; returns the
    /// value's length, or ``None`` when the key is absent (the buffer is
    /// untouched). Raises ``BufferTooSmall`` when the value does not fit.
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let view = ByteView::writable(buffer)?;
        let key = key_of(key)?;
        let client = self.client()?;
        let found = wait(py, client.get(key))?;
        fill_buffers(py, &[view], &[found]).map(|written| written.into_iter().flatten().next())
    }

    /// Writes ``value`` (bytes, str or any buffer) under ``key``; with
    /// ``ttl`` (seconds) the key expires that long after the leader takes
    /// the write. Returns the write's version.
    #[pyo3(signature = (key, value, ttl=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl: Option<f64>,
    ) -> PyResult<u64> {
        let key = key_of(key)?;
        let value = value_of(value)?;
        let client = self.client()?;
        match ttl {
            None => wait(py, client.put(key, value)),
            Some(ttl) => {
                let ttl = seconds("ttl", ttl)?;
                wait(py, client.put_with_ttl(key, value, ttl))
            }
        }
    }

    /// Deletes ``key``; returns whether it existed.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = key_of(key)?;
        let client = self.client()?;
        Ok(wait(py, client.delete(key))?.existed)
    }

    /// Compare-and-set on the key's version: writes ``new_value`` (``None``:
    /// deletes the key) only if the key's version is ``expected_version``
    /// (``None``: only if the key is absent).
    #[pyo3(signature = (key, expected_version, new_value))]
    fn cas(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        expected_version: Option<u64>,
        new_value: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CasResult> {
        let key = key_of(key)?;
        let new_value = new_value.map(value_of).transpose()?;
        let client = self.client()?;
        let outcome = wait(py, client.cas(key, expected_version, new_value))?;
        Ok(CasResult {
            succeeded: outcome.succeeded,
            version: outcome.version,
            current_version: outcome.current.as_ref().map(|v| v.version),
            current_value: outcome.current.map(|v| bytes_of(py, &v.value).unbind()),
        })
    }

    /// The values of ``keys`` (``None`` for each absent one), in order.
    fn mget<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
        let keys = each(keys, key_of)?;
        let client = self.client()?;
        let reads = chunks(keys.len(), REQUEST_LIMITS.max_entries)
            .into_iter()
            .map(|group| client.mget(keys[group].to_vec()));
        let answers = wait(py, futures::future::try_join_all(reads))?;
        Ok(answers
            .into_iter()
            .flatten()
            .map(|found| found.map(|v| bytes_of(py, &v.value)))
            .collect())
    }

    /// Writes every ``(key, value)`` pair (a dict or an iterable of pairs)
    /// atomically, as one log entry; returns its version. The batch must
    /// fit one request (see ``batch_put_from`` for larger ones).
    fn mput(&self, py: Python<'_>, pairs: &Bound<'_, PyAny>) -> PyResult<u64> {
        let pairs = match pairs.cast::<PyDict>() {
            Ok(dict) => each(&dict.items().into_any(), pair_of)?,
            Err(_) => each(pairs, pair_of)?,
        };
        let client = self.client()?;
        wait(py, client.mput(pairs))
    }

    /// Up to ``limit`` ``(key, value)`` pairs in key order, from ``start``
    /// (inclusive) to ``end`` (exclusive; ``None``: no end). Pages of 1024
    /// pairs are each consistent, not with each other.
    #[pyo3(signature = (start=None, end=None, limit=1000))]
    fn scan<'py>(
        &self,
        py: Python<'py>,
        start: Option<&Bound<'py, PyAny>>,
        end: Option<&Bound<'py, PyAny>>,
        limit: usize,
    ) -> PyResult<Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        let start = start.map(key_of).transpose()?.unwrap_or_default();
        let end = end.map(key_of).transpose()?;
        let client = self.client()?;
        let consistency = client.options().default_consistency;
        let pairs = wait(py, client.scan_range(start, end, limit, consistency))?;
        Ok(pairs
            .iter()
            .map(|(key, v)| (bytes_of(py, key), bytes_of(py, &v.value)))
            .collect())
    }

    /// Reads each key into its buffer (``keys`` and ``buffers`` of the same
    /// length): one-sided in two rounds of region reads when possible, else
    /// MGET requests of at most one frame each. Returns per key the bytes
    /// written, or ``None`` for an absent key. A value longer than its
    /// buffer raises ``BufferTooSmall`` (``index``: its position) after the
    /// others were filled.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<usize>>> {
        let keys = each(keys, key_of)?;
        let views = each(buffers, ByteView::writable)?;
        same_length(keys.len(), views.len())?;
        let room: Vec<usize> = views.iter().map(ByteView::len).collect();
        let answers = self.read_batch(py, keys, &room)?;
        fill_buffers(py, &views, &answers)
    }

    /// Writes each buffer's bytes under its key, in requests of at most one
    /// frame (each atomic, not the batch as a whole), one after the other.
    /// Returns each key's write version. On a failure the exception's
    /// ``written`` says how many leading pairs were written.
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u64>> {
        let keys = each(keys, key_of)?;
        let values = each(buffers, value_of)?;
        same_length(keys.len(), values.len())?;
        self.write_batch(py, keys.into_iter().zip(values).collect())
    }

    /// Gives ``key`` a deadline ``ttl`` seconds from now (the leader's
    /// clock); returns ``False`` when the key is absent.
    fn expire(&self, py: Python<'_>, key: &Bound<'_, PyAny>, ttl: f64) -> PyResult<bool> {
        let key = key_of(key)?;
        let ttl = seconds("ttl", ttl)?;
        let client = self.client()?;
        wait(py, client.expire(key, ttl))
    }

    /// Removes ``key``'s deadline; returns ``False`` when the key is absent
    /// or had none.
    fn persist(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = key_of(key)?;
        let client = self.client()?;
        wait(py, client.persist(key))
    }

    /// Seconds left before ``key`` expires (on the answering server's
    /// clock); ``math.inf`` when it never expires; ``None`` when it is
    /// absent.
    fn ttl(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
        let key = key_of(key)?;
        let client = self.client()?;
        let expiry = wait(py, client.ttl(key))?;
        #[allow(clippy::cast_precision_loss)] // milliseconds: exact below 2^53
        Ok(expiry.map(|e| {
            e.remaining_ms()
                .map_or(f64::INFINITY, |ms| ms as f64 / 1000.0)
        }))
    }

    /// A round trip to the current node.
    fn ping(&self, py: Python<'_>) -> PyResult<()> {
        let client = self.client()?;
        wait(py, client.ping())
    }

    /// What the one-sided read path has done so far: ``served`` (GETs
    /// answered from a server's memory without its CPU), ``fallbacks``,
    /// ``lease_refusals``, ``lag_refusals``.
    fn one_sided_stats(&self, py: Python<'_>) -> PyResult<BTreeMap<&'static str, u64>> {
        let client = self.client()?;
        let runtime = runtime()?;
        let stats = py.detach(|| runtime.block_on(client.one_sided_stats()));
        Ok(BTreeMap::from([
            ("served", stats.served),
            ("fallbacks", stats.fallbacks),
            ("lease_refusals", stats.lease_refusals),
            ("lag_refusals", stats.lag_refusals),
        ]))
    }

    /// The endpoints this client knows (given, plus leaders it learned).
    #[getter]
    fn endpoints(&self) -> PyResult<Vec<String>> {
        Ok(self.client()?.endpoints())
    }

    /// The client address of the node this client believes leads, if any.
    #[getter]
    fn leader(&self) -> PyResult<Option<String>> {
        Ok(self.client()?.leader())
    }

    /// Closes the client's connections (once every call in flight ends);
    /// later calls raise ``RuntimeError``.
    fn close(&self) -> PyResult<()> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("rdkv.Client: a call panicked"))?;
        inner.take();
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.client() {
            Ok(client) => format!("rdkv.Client({:?})", client.endpoints()),
            Err(_) => "rdkv.Client(closed)".to_owned(),
        }
    }
}

/// A `(key, value)` pair of `mput`.
fn pair_of(pair: &Bound<'_, PyAny>) -> PyResult<(Bytes, Bytes)> {
    let key = pair.get_item(0)?;
    let value = pair.get_item(1)?;
    Ok((key_of(&key)?, value_of(&value)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_index_once_in_order() {
        assert_eq!(chunks(5, 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(chunks(4, 2), vec![0..2, 2..4]);
        assert!(chunks(0, 2).is_empty());
    }
}
