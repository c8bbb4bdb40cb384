//! Python objects as bytes: keys (`bytes` or `str`), values and buffers
//! (anything with the buffer protocol: bytes, bytearray, memoryview, numpy
//! arrays, `torch_tensor.numpy()`), through PyO3's safe buffer API.
//!
//! A buffer of another element type (float32, ...) or several dimensions is
//! seen as its raw bytes in C order, as `memoryview(obj).cast("B")` would;
//! it must be C-contiguous.

use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySlice, PyString};

/// A key: `bytes` as they are, `str` as UTF-8, any other buffer as its bytes.
pub(crate) fn key_of(object: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(text) = object.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(text.to_str()?.as_bytes()));
    }
    if let Ok(bytes) = object.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(bytes.as_bytes()));
    }
    ByteView::readable(object)
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "a key must be bytes, str or a buffer, not {}",
                type_name(object)
            ))
        })?
        .to_bytes(object.py())
}

/// A value to write: `str` as UTF-8, else the bytes of a buffer (one copy,
/// into memory the request then owns).
pub(crate) fn value_of(object: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(text) = object.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(text.to_str()?.as_bytes()));
    }
    if let Ok(bytes) = object.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(bytes.as_bytes()));
    }
    ByteView::readable(object)?.to_bytes(object.py())
}

/// Every item of a Python iterable, converted by `convert`.
pub(crate) fn each<'py, T>(
    objects: &Bound<'py, PyAny>,
    convert: impl Fn(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    objects
        .try_iter()?
        .map(|item| convert(&item?))
        .collect::<PyResult<Vec<T>>>()
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string())
}

/// A Python buffer seen as C-contiguous bytes, held (so that its exporter
/// cannot resize or free it) while the view lives.
pub(crate) struct ByteView<'py> {
    object: Bound<'py, PyAny>,
    buffer: PyBuffer<u8>,
}

impl<'py> ByteView<'py> {
    /// `object`'s bytes, for reading.
    pub(crate) fn readable(object: &Bound<'py, PyAny>) -> PyResult<Self> {
        let buffer = match PyBuffer::<u8>::get(object) {
            Ok(buffer) if buffer.is_c_contiguous() => buffer,
            // Another element type or layout: its bytes, C-contiguous only.
            _ => PyBuffer::<u8>::get(&as_bytes_view(object)?)?,
        };
        Ok(ByteView {
            object: object.clone(),
            buffer,
        })
    }

    /// `object`'s bytes, for writing into: refused when read-only.
    pub(crate) fn writable(object: &Bound<'py, PyAny>) -> PyResult<Self> {
        let view = Self::readable(object)?;
        if view.buffer.readonly() {
            return Err(PyTypeError::new_err(format!(
                "a buffer to read into must be writable; {} is read-only \
                 (use a bytearray, a numpy array or a writable memoryview)",
                type_name(object)
            )));
        }
        Ok(view)
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.buffer.len_bytes()
    }

    /// A copy of its bytes.
    pub(crate) fn to_bytes(&self, py: Python<'_>) -> PyResult<Bytes> {
        self.buffer.to_vec(py).map(Bytes::from)
    }

    /// Copies `bytes` to its start (the rest is left as it was); `bytes`
    /// must not be longer than the buffer.
    pub(crate) fn fill(&self, py: Python<'py>, bytes: &[u8]) -> PyResult<()> {
        if bytes.len() == self.len() {
            return self.buffer.copy_from_slice(py, bytes);
        }
        if bytes.len() > self.len() {
            return Err(PyBufferError::new_err(format!(
                "{} bytes do not fit a buffer of {}",
                bytes.len(),
                self.len()
            )));
        }
        // The first bytes.len() bytes, as a buffer of their own.
        let start = as_bytes_view(&self.object)?;
        let end = isize::try_from(bytes.len())?;
        let prefix = start.get_item(PySlice::new(py, 0, end, 1))?;
        PyBuffer::<u8>::get(&prefix)?.copy_from_slice(py, bytes)
    }
}

/// `memoryview(object).cast("B")`: a one-dimensional byte view of a
/// C-contiguous buffer of any element type.
fn as_bytes_view<'py>(object: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let view = PyMemoryView::from(object)?;
    view.call_method1("cast", ("B",)).map_err(|e| {
        PyBufferError::new_err(format!(
            "{} cannot be seen as bytes (it must be C-contiguous): {e}",
            type_name(object)
        ))
    })
}
