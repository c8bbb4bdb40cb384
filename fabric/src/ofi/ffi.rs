//! The shim's C interface (`shim.c`), declared by hand: a dozen functions
//! over integers, byte buffers and opaque handles. No libfabric struct
//! crosses into Rust (the shim is compiled against the system headers, so
//! their layouts are the installed library's), which is why this needs no
//! bindgen pass over `fabric.h`.

use std::ffi::{c_char, c_int, c_void};

/// An opened RDM endpoint with its fabric, domain, address vector and
/// completion queue (`struct rdkv_ofi_ep`).
#[repr(C)]
pub struct RawEndpoint {
    _private: [u8; 0],
}

/// A memory registration (`struct fid_mr`).
#[repr(C)]
pub struct RawMr {
    _private: [u8; 0],
}

pub const FI_READ: u64 = 1 << 8;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_MR_VIRT_ADDR: u64 = 1 << 4;
pub const FI_MR_PROV_KEY: u64 = 1 << 5;

pub const FI_EINTR: isize = 4;
pub const FI_EAGAIN: isize = 11;
pub const FI_ECANCELED: isize = 125;
pub const FI_EAVAIL: isize = 259;

unsafe extern "C" {
    pub fn rdkv_ofi_load(path: *const c_char, err: *mut c_char, errlen: usize) -> c_int;
    pub fn rdkv_ofi_version() -> u32;
    pub fn rdkv_ofi_strerror(errnum: c_int) -> *const c_char;
    pub fn rdkv_ofi_open(
        prov: *const c_char,
        node: *const c_char,
        thread_safe: c_int,
        out: *mut *mut RawEndpoint,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn rdkv_ofi_close(e: *mut RawEndpoint);
    pub fn rdkv_ofi_close_transfers(e: *mut RawEndpoint);
    pub fn rdkv_ofi_provider(e: *const RawEndpoint) -> *const c_char;
    pub fn rdkv_ofi_mr_mode(e: *const RawEndpoint) -> u64;
    pub fn rdkv_ofi_mr_key_size(e: *const RawEndpoint) -> usize;
    pub fn rdkv_ofi_tx_size(e: *const RawEndpoint) -> usize;
    pub fn rdkv_ofi_waitable(e: *const RawEndpoint) -> c_int;
    pub fn rdkv_ofi_name(e: *mut RawEndpoint, buf: *mut c_void, len: *mut usize) -> c_int;
    pub fn rdkv_ofi_mr_reg(
        e: *mut RawEndpoint,
        buf: *const c_void,
        len: usize,
        access: u64,
        requested_key: u64,
        mr: *mut *mut RawMr,
        key: *mut u64,
        desc: *mut *mut c_void,
    ) -> c_int;
    pub fn rdkv_ofi_mr_close(mr: *mut RawMr) -> c_int;
    pub fn rdkv_ofi_av_insert(e: *mut RawEndpoint, addr: *const c_void, fi_addr: *mut u64)
    -> c_int;
    pub fn rdkv_ofi_read(
        e: *mut RawEndpoint,
        buf: *mut c_void,
        len: usize,
        desc: *mut c_void,
        src: u64,
        addr: u64,
        key: u64,
        tag: u64,
    ) -> isize;
    pub fn rdkv_ofi_cq_read(e: *mut RawEndpoint, tags: *mut u64, n: usize) -> isize;
    pub fn rdkv_ofi_cq_sread(
        e: *mut RawEndpoint,
        tags: *mut u64,
        n: usize,
        timeout_ms: c_int,
    ) -> isize;
    pub fn rdkv_ofi_cq_signal(e: *mut RawEndpoint) -> c_int;
    pub fn rdkv_ofi_cq_readerr(e: *mut RawEndpoint, tag: *mut u64, errnum: *mut c_int) -> isize;
}
