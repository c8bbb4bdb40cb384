//! The tokio runtime every `Client` of the process runs on.
//!
//! One multi-threaded runtime, made on first use: its workers drive the
//! connections' reader and writer tasks between calls, and each Python
//! thread runs its own call with `block_on` (GIL released), so calls from
//! several threads proceed at once.
//!
//! A forked child has no copy of the workers: make clients after `fork`
//! (e.g. in each DataLoader worker), not before.

use std::sync::OnceLock;

use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;
use tokio::runtime::{Builder, Runtime};

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The process's runtime, started on first use.
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    let made = RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .thread_name("rdkv-io")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    made.as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("rdkv: cannot start the I/O runtime: {e}")))
}
