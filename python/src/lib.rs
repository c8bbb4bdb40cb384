//! The `rdkv` Python module: [`rdkv_client::Client`] for Python programs
//! (PyTorch jobs, inference servers and their KV-cache connectors).
//!
//! - `client`: the `Client` class; every call releases the GIL while it
//!   waits on the network or a region, and holds it only to take its
//!   arguments and to copy a value into the caller's buffer.
//! - `buffers`: Python buffer-protocol objects (bytearray, memoryview, numpy
//!   arrays) seen as bytes, read into and written from without unsafe code.
//! - `batch`: splits a batch into requests that fit one frame.
//! - `errors`: the exception hierarchy (`rdkv.Error` and its subclasses).
//! - `options`: the constructor's arguments as `ClientOptions`.
//! - `runtime`: the tokio runtime the calls run on.
//!
//! `python/rdkv.pyi` is the typed surface; `python/tests` tests it against a
//! real 3-node cluster.

#![forbid(unsafe_code)]

mod batch;
mod buffers;
mod client;
mod errors;
mod options;
mod runtime;

use pyo3::prelude::*;

/// rdkv: a replicated key-value store whose GETs read the servers' memory
/// directly (shared memory on the same host, RDMA where built). See
/// `rdkv.Client`.
#[pymodule]
fn rdkv(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_class::<client::Client>()?;
    module.add_class::<client::CasResult>()?;
    errors::register(module)?;
    Ok(())
}
