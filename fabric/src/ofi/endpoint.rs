//! Safe handles over the shim: the library (loaded once per process), an
//! RDM endpoint with its domain, completion queue and address vector, and
//! memory registrations that keep their memory and their domain alive.
//!
//! Every endpoint is used under its mutex ([`SharedEndpoint`]): a client's
//! is opened `FI_THREAD_DOMAIN`, under which libfabric leaves serialising
//! calls on a domain's objects to the application. A server's is opened
//! `FI_THREAD_SAFE`, so that its progress thread can sleep in the
//! completion queue's wait ([`Progress`]) without the mutex while other
//! threads register and close memory under it.

use std::any::Any;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::error::OfiError;
use super::ffi;

const ERR_BYTES: usize = 256;
/// Largest endpoint name accepted (a sockaddr_in6 is 28 bytes; EFA's 32).
pub const MAX_NAME_BYTES: usize = 256;

static LOADED: OnceLock<Result<u32, String>> = OnceLock::new();

fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn strerror(code: c_int) -> String {
    // SAFETY: `rdkv_ofi_strerror` returns a static NUL-terminated string
    // (libfabric's own table, or the shim's literal when not loaded).
    unsafe { CStr::from_ptr(ffi::rdkv_ofi_strerror(code)) }
        .to_string_lossy()
        .into_owned()
}

fn call_error(what: &'static str, rc: c_int) -> OfiError {
    OfiError::Call {
        what,
        code: rc,
        message: strerror(rc.saturating_abs()),
    }
}

/// The library [`load`] opens unless [`LIBRARY_ENV`] names another.
pub const DEFAULT_LIBRARY: &str = "libfabric.so.1";

/// Names the libfabric to load instead of [`DEFAULT_LIBRARY`]: a vendor's
/// build outside the loader's path (AWS's EFA installer puts its own in
/// /opt/amazon/efa/lib), or, in tests, one that is not there. Read as
/// libfabric itself reads `FI_PROVIDER`: from the environment, once.
pub const LIBRARY_ENV: &str = "RDKV_OFI_LIBRARY";

/// Loads libfabric (once per process: [`DEFAULT_LIBRARY`] or what
/// [`LIBRARY_ENV`] names); the version it reports, or why it cannot be used.
pub fn load() -> Result<u32, OfiError> {
    let loaded = LOADED.get_or_init(|| {
        let path = std::env::var_os(LIBRARY_ENV).unwrap_or_else(|| DEFAULT_LIBRARY.into());
        let path = std::ffi::CString::new(path.as_encoded_bytes())
            .map_err(|_| format!("{LIBRARY_ENV} holds a NUL byte"))?;
        let mut err = [0 as c_char; ERR_BYTES];
        // SAFETY: `path` is a NUL-terminated string that outlives the call;
        // `err` is a writable buffer of the length passed, into which the
        // shim writes a NUL-terminated message. `OnceLock` runs this once,
        // so the shim's global table is written by one thread.
        let rc = unsafe { ffi::rdkv_ofi_load(path.as_ptr(), err.as_mut_ptr(), err.len()) };
        if rc != 0 {
            return Err(text(&err));
        }
        // SAFETY: the library is loaded (rc == 0 above).
        Ok(unsafe { ffi::rdkv_ofi_version() })
    });
    loaded.clone().map_err(OfiError::Unavailable)
}

/// The version as `major.minor`.
pub fn version_text(version: u32) -> String {
    format!("{}.{}", version >> 16, version & 0xFFFF)
}

/// An opened RDM endpoint (and its fabric, domain, CQ and AV).
pub struct Endpoint {
    raw: NonNull<ffi::RawEndpoint>,
    provider: String,
    mr_mode: u64,
    mr_key_size: usize,
    tx_size: usize,
    /// Whether its completion queue has a wait object ([`Endpoint::wait`]).
    waitable: bool,
    /// Opened `FI_THREAD_SAFE` ([`Progress`] needs it).
    thread_safe: bool,
    /// Set once transfers were ended by [`Endpoint::close_transfers`].
    transfers_closed: bool,
}

// SAFETY: the handle is an owned heap object of the shim; libfabric objects
// opened with FI_THREAD_DOMAIN may be used from any thread provided calls
// are serialised, which `&mut self` on every call (and the mutex of
// `SharedEndpoint`) ensures.
unsafe impl Send for Endpoint {}

pub type SharedEndpoint = Arc<Mutex<Endpoint>>;

pub fn lock(endpoint: &SharedEndpoint) -> MutexGuard<'_, Endpoint> {
    endpoint.lock().unwrap_or_else(|p| p.into_inner())
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("mr_mode", &format_args!("{:#x}", self.mr_mode))
            .field("transfers_closed", &self.transfers_closed)
            .finish()
    }
}

fn c_string(s: Option<&str>, what: &str) -> Result<Option<CString>, OfiError> {
    s.map(|s| CString::new(s).map_err(|_| OfiError::Unavailable(format!("{what} contains NUL"))))
        .transpose()
}

impl Endpoint {
    /// Opens an RDM endpoint of `provider` (e.g. `tcp;ofi_rxm`; `None`: the
    /// first RMA-capable one), bound to `node`'s address when given;
    /// `FI_THREAD_SAFE` when `thread_safe` (a server's, see [`Progress`]).
    pub fn open(
        provider: Option<&str>,
        node: Option<&str>,
        thread_safe: bool,
    ) -> Result<SharedEndpoint, OfiError> {
        load()?;
        let prov = c_string(provider, "provider")?;
        let node = c_string(node, "node")?;
        let mut raw = std::ptr::null_mut();
        let mut err = [0 as c_char; ERR_BYTES];
        // SAFETY: the strings are NUL-terminated and outlive the call (or
        // null); `raw` and `err` are writable and `err`'s length is passed.
        let rc = unsafe {
            ffi::rdkv_ofi_open(
                prov.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
                node.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
                c_int::from(thread_safe),
                &mut raw,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        let raw = match NonNull::new(raw) {
            Some(raw) if rc == 0 => raw,
            _ => return Err(OfiError::Unavailable(text(&err))),
        };
        // SAFETY: `raw` is an opened endpoint; these only read its info and
        // the provider name is a NUL-terminated array inside it.
        let (provider, mr_mode, mr_key_size, tx_size, waitable) = unsafe {
            (
                CStr::from_ptr(ffi::rdkv_ofi_provider(raw.as_ptr()))
                    .to_string_lossy()
                    .into_owned(),
                ffi::rdkv_ofi_mr_mode(raw.as_ptr()),
                ffi::rdkv_ofi_mr_key_size(raw.as_ptr()),
                ffi::rdkv_ofi_tx_size(raw.as_ptr()),
                ffi::rdkv_ofi_waitable(raw.as_ptr()) != 0,
            )
        };
        Ok(Arc::new(Mutex::new(Endpoint {
            raw,
            provider,
            mr_mode,
            mr_key_size,
            tx_size,
            waitable,
            thread_safe,
            transfers_closed: false,
        })))
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Whether remote addresses are virtual addresses (else offsets into
    /// the registration).
    pub fn virtual_addresses(&self) -> bool {
        self.mr_mode & ffi::FI_MR_VIRT_ADDR != 0
    }

    /// Whether the provider picks keys (else rdkv picks a random one).
    pub fn provider_keys(&self) -> bool {
        self.mr_mode & ffi::FI_MR_PROV_KEY != 0
    }

    /// Key bits the provider accepts for requested keys.
    pub fn key_bits(&self) -> u32 {
        (self.mr_key_size.min(8) * 8) as u32
    }

    /// Whether [`Endpoint::wait`] can sleep (else it polls once).
    pub fn waitable(&self) -> bool {
        self.waitable
    }

    /// Reads that may be outstanding on the transmit queue.
    pub fn tx_size(&self) -> usize {
        self.tx_size
    }

    fn live(&self) -> Result<*mut ffi::RawEndpoint, OfiError> {
        if self.transfers_closed {
            return Err(OfiError::Closed("transfers were ended".into()));
        }
        Ok(self.raw.as_ptr())
    }

    /// The endpoint's address, as peers insert it into their address vector.
    pub fn name(&mut self) -> Result<Vec<u8>, OfiError> {
        let raw = self.live()?;
        let mut buf = vec![0u8; MAX_NAME_BYTES];
        let mut len = buf.len();
        // SAFETY: `buf` is writable for `len` bytes; the shim writes at
        // most that and stores the real length in `len`.
        let rc = unsafe { ffi::rdkv_ofi_name(raw, buf.as_mut_ptr().cast(), &mut len) };
        if rc != 0 {
            return Err(call_error("fi_getname", rc));
        }
        buf.truncate(len.min(MAX_NAME_BYTES));
        Ok(buf)
    }

    /// Inserts a peer's address; the handle reads name it by.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<u64, OfiError> {
        let raw = self.live()?;
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(OfiError::Grant(format!(
                "endpoint name of {} bytes",
                name.len()
            )));
        }
        // The provider reads an address of its own format's length: pad a
        // short name so it never reads past what we own.
        let mut padded = [0u8; MAX_NAME_BYTES];
        padded[..name.len()].copy_from_slice(name);
        let mut fi_addr = 0u64;
        // SAFETY: `padded` is readable for MAX_NAME_BYTES, more than any
        // address format's length; `fi_addr` is writable.
        let rc = unsafe { ffi::rdkv_ofi_av_insert(raw, padded.as_ptr().cast(), &mut fi_addr) };
        if rc != 0 {
            return Err(call_error("fi_av_insert", rc));
        }
        Ok(fi_addr)
    }

    /// Posts a read of `len` remote bytes at `addr` (under `key`, from peer
    /// `peer`) into `buf`; `Ok(false)` when the queue is full (poll, then
    /// post again).
    ///
    /// # Safety
    /// `buf` must stay valid for writes of `len` bytes, and not be read or
    /// written by anyone else, until the read's completion was polled or
    /// [`Endpoint::close_transfers`] returned. `desc` is the descriptor of
    /// a registration covering `buf` (or null if the provider needs none).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post_read(
        &mut self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        peer: u64,
        addr: u64,
        key: u64,
        tag: u64,
    ) -> Result<bool, OfiError> {
        let raw = self.live()?;
        // SAFETY: the caller upholds the buffer contract above; `raw` is a
        // live endpoint serialised by `&mut self`.
        let rc = unsafe { ffi::rdkv_ofi_read(raw, buf.cast(), len, desc, peer, addr, key, tag) };
        match rc {
            0 => Ok(true),
            rc if rc == -ffi::FI_EAGAIN => Ok(false),
            rc => Err(call_error("fi_read", rc as c_int)),
        }
    }

    /// Polls completions (this also drives the provider's progress): the
    /// tags of successful ones into `tags`, their count returned; an error
    /// completion is returned as an error with its tag.
    pub fn poll(&mut self, tags: &mut [u64]) -> Result<usize, (u64, OfiError)> {
        let raw = self.live().map_err(|e| (0, e))?;
        // SAFETY: `tags` is writable for its length; the shim writes at
        // most that many (and at most 64) tags. `raw` is live, serialised
        // by `&mut self`.
        let rc = unsafe { ffi::rdkv_ofi_cq_read(raw, tags.as_mut_ptr(), tags.len()) };
        // SAFETY: as above.
        unsafe { completions(raw, rc, "fi_cq_read") }
    }

    /// [`Endpoint::poll`], sleeping up to `timeout` for a completion on a
    /// [`waitable`](Endpoint::waitable) endpoint (progress is driven when
    /// the provider wakes it); a plain poll on another.
    pub fn wait(&mut self, tags: &mut [u64], timeout: Duration) -> Result<usize, (u64, OfiError)> {
        if !self.waitable {
            return self.poll(tags);
        }
        let raw = self.live().map_err(|e| (0, e))?;
        // SAFETY: as in `poll`; the shim's sread writes at most
        // `tags.len()` (and at most 64) tags.
        unsafe { sread(raw, tags, timeout) }
    }

    /// Ends this endpoint's transfers: once this returns, no read posted on
    /// it writes memory any more (its buffers may be reused or freed).
    pub fn close_transfers(&mut self) {
        if !self.transfers_closed {
            // SAFETY: `raw` is live; serialised by `&mut self`.
            unsafe { ffi::rdkv_ofi_close_transfers(self.raw.as_ptr()) };
            self.transfers_closed = true;
        }
    }

    /// Registers `len` bytes at `ptr` with `access`.
    ///
    /// # Safety
    /// The memory must stay mapped until the registration is closed.
    unsafe fn register_raw(
        &mut self,
        ptr: *const u8,
        len: usize,
        access: u64,
        requested_key: u64,
    ) -> Result<(NonNull<ffi::RawMr>, u64, *mut c_void), OfiError> {
        let raw = self.live()?;
        let (mut mr, mut key, mut desc) = (std::ptr::null_mut(), 0u64, std::ptr::null_mut());
        // SAFETY: the caller keeps the memory mapped for the registration's
        // life; the out-pointers are writable locals.
        let rc = unsafe {
            ffi::rdkv_ofi_mr_reg(
                raw,
                ptr.cast(),
                len,
                access,
                requested_key,
                &mut mr,
                &mut key,
                &mut desc,
            )
        };
        match NonNull::new(mr) {
            Some(mr) if rc == 0 => Ok((mr, key, desc)),
            _ => Err(call_error("fi_mr_reg", rc)),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: `raw` is owned and closed once; every registration holds
        // an `Arc` of this endpoint, so none is open any more.
        unsafe { ffi::rdkv_ofi_close(self.raw.as_ptr()) };
    }
}

/// The outcome of a completion queue read `rc` on `raw` (`what` names the
/// call): the count of tags read, nothing on `-FI_EAGAIN` (or a wait
/// interrupted by a signal), else the next error completion with its tag.
///
/// # Safety
/// `raw` is a live endpoint the caller may call into (serialised, or
/// opened `FI_THREAD_SAFE`).
unsafe fn completions(
    raw: *mut ffi::RawEndpoint,
    rc: isize,
    what: &'static str,
) -> Result<usize, (u64, OfiError)> {
    if rc >= 0 {
        return Ok(rc as usize);
    }
    if rc == -ffi::FI_EAGAIN || rc == -ffi::FI_ECANCELED || rc == -ffi::FI_EINTR {
        return Ok(0);
    }
    if rc != -ffi::FI_EAVAIL {
        return Err((0, call_error(what, rc as c_int)));
    }
    let (mut tag, mut errnum) = (0u64, 0 as c_int);
    // SAFETY: the caller's contract; `tag` and `errnum` are writable locals.
    let rc = unsafe { ffi::rdkv_ofi_cq_readerr(raw, &mut tag, &mut errnum) };
    if rc != 1 {
        return Err((0, call_error("fi_cq_readerr", rc as c_int)));
    }
    Err((
        tag,
        OfiError::Completion {
            code: errnum,
            message: strerror(errnum),
        },
    ))
}

/// A completion queue wait of up to `timeout` (whole milliseconds, at
/// least one) on `raw`.
///
/// # Safety
/// As [`completions`]; `raw` is waitable.
unsafe fn sread(
    raw: *mut ffi::RawEndpoint,
    tags: &mut [u64],
    timeout: Duration,
) -> Result<usize, (u64, OfiError)> {
    let ms = c_int::try_from(timeout.as_millis().max(1)).unwrap_or(c_int::MAX);
    // SAFETY: the caller's contract; `tags` is writable for its length and
    // the shim writes at most that many (and at most 64) tags.
    let rc = unsafe { ffi::rdkv_ofi_cq_sread(raw, tags.as_mut_ptr(), tags.len(), ms) };
    // SAFETY: as above.
    unsafe { completions(raw, rc, "fi_cq_sread") }
}

/// A server's progress thread's hold on its endpoint: waits on the
/// completion queue without the endpoint's mutex (the endpoint is
/// `FI_THREAD_SAFE`), so that a provider with manual progress
/// (`tcp;ofi_rxm`) serves peers' reads as their requests arrive, the thread
/// asleep in between; and the signal that wakes it.
pub struct Progress {
    raw: NonNull<ffi::RawEndpoint>,
    /// Keeps the endpoint open while the progress thread uses it.
    _endpoint: SharedEndpoint,
}

// SAFETY: the endpoint was opened FI_THREAD_SAFE (checked in `of`):
// libfabric serialises calls on it, from any thread; `_endpoint` keeps it
// open while this lives.
unsafe impl Send for Progress {}
// SAFETY: as above (`wait` and `signal` may run on two threads at once).
unsafe impl Sync for Progress {}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress").finish_non_exhaustive()
    }
}

impl Progress {
    /// The progress hold on `endpoint`, if it was opened thread-safe with a
    /// waitable completion queue (else the caller polls under the mutex).
    pub fn of(endpoint: &SharedEndpoint) -> Option<Progress> {
        let ep = lock(endpoint);
        (ep.thread_safe && ep.waitable && !ep.transfers_closed).then(|| Progress {
            raw: ep.raw,
            _endpoint: Arc::clone(endpoint),
        })
    }

    /// Sleeps up to `timeout` for a completion, driving progress when the
    /// provider sees activity; as [`Endpoint::poll`] otherwise.
    pub fn wait(&self, tags: &mut [u64], timeout: Duration) -> Result<usize, (u64, OfiError)> {
        // SAFETY: `raw` is open (`_endpoint`), FI_THREAD_SAFE and waitable
        // (`of`); a server never ends its endpoint's transfers.
        unsafe { sread(self.raw.as_ptr(), tags, timeout) }
    }

    /// Wakes a [`Progress::wait`] now (the server is stopping).
    pub fn signal(&self) {
        // SAFETY: as in `wait`.
        let rc = unsafe { ffi::rdkv_ofi_cq_signal(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::debug!("fi_cq_signal: {}", strerror(rc.saturating_abs()));
        }
    }
}

/// A registration of memory owned by `owner`, on an endpoint's domain. It
/// keeps both alive, and is closed (before the domain) when dropped.
pub struct Registration {
    mr: NonNull<ffi::RawMr>,
    key: u64,
    desc: *mut c_void,
    endpoint: SharedEndpoint,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the registration handle is only closed (in Drop, under the
// endpoint's lock); `desc` is an opaque provider token passed back to it
// under that same lock.
unsafe impl Send for Registration {}
// SAFETY: as above: `&Registration` only reads `key` and `desc` values.
unsafe impl Sync for Registration {}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .finish()
    }
}

impl Registration {
    /// Registers `len` bytes at `ptr`, memory that `owner` keeps mapped.
    ///
    /// # Safety
    /// `owner` must own the memory at `[ptr, ptr + len)` and keep it
    /// mapped while it lives.
    pub unsafe fn new(
        endpoint: &SharedEndpoint,
        owner: Arc<dyn Any + Send + Sync>,
        ptr: *const u8,
        len: usize,
        access: u64,
        requested_key: u64,
    ) -> Result<Registration, OfiError> {
        // SAFETY: the caller's contract; `owner` is held by the result.
        let (mr, key, desc) =
            unsafe { lock(endpoint).register_raw(ptr, len, access, requested_key)? };
        Ok(Registration {
            mr,
            key,
            desc,
            endpoint: Arc::clone(endpoint),
            _owner: owner,
        })
    }

    pub fn key(&self) -> u64 {
        self.key
    }

    pub fn desc(&self) -> *mut c_void {
        self.desc
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _serialised = lock(&self.endpoint);
        // SAFETY: `mr` is open and closed once, under the endpoint's lock,
        // while its domain is alive (`self.endpoint` holds it).
        let rc = unsafe { ffi::rdkv_ofi_mr_close(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "closing an ofi memory registration: {}",
                strerror(rc.saturating_abs())
            );
        }
    }
}
