//! rdkv-fabric: how region memory is shared and read. All `unsafe` memory
//! sharing of rdkv lives here.
//!
//! - [`memory`]: [`RegionMemory`], a mapping (anonymous, or a sealed memfd
//!   that other processes map read-only) accessed only through atomics.
//! - [`reader`]: [`RegionReader`], the one-sided GET over a mapped region:
//!   neighbourhood read, block read, validation with `rdkv_proto::region`,
//!   bounded retries. The server's local reads and `shm` clients use it.
//! - [`shm`]: the `shm` transport's attach protocol: a same-host client
//!   authenticates over a Unix socket and receives the region's memfd
//!   (SCM_RIGHTS), which it maps read-only.
//! - [`rpc`]: two-sided request/response: [`RpcChannel`], implemented by
//!   [`Connection`] (`tcp`, and the local Unix socket) and [`MemChannel`]
//!   (`mem`: in process).
//! - [`transport`]: the [`Fabric`] trait (one-sided reads of a described
//!   region, alone or batched) and [`MappedFabric`] (`mem` and `shm`).
//! - [`rdma`]: the RDMA verbs transport (feature `rdma`; its protocol logic
//!   is always built): one-sided READs through the same [`Fabric`] trait,
//!   SEND/RECV as an [`RpcChannel`].
//! - [`pages`]: which pages region memory sits on: the kernel's setting
//!   of transparent huge pages and what a mapping got.
//! - [`clock`]: injectable monotonic time for grace periods and abandonment.

// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

#[cfg(target_endian = "big")]
compile_error!("rdkv regions are little-endian; big-endian targets are not supported");

pub mod alloc_count;
pub mod clock;
pub mod memory;
pub mod ofi;
pub mod pages;
pub mod rdma;
pub mod read_stats;
pub mod reader;
pub mod rpc;
pub mod shm;
pub mod striped;
pub mod transport;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use memory::{MemoryError, RegionMemory};
pub use rdkv_proto::wire::ServerInfo;
pub use read_stats::{ReadCounters, ReadStats, RetryCause};
pub use reader::{
    CachedLocation, GotInto, INLINE_KEY_BYTES, IndexCache, ReadError, ReadProblem, ReadTime,
    ReaderOptions, RegionReader,
};
pub use rpc::{CallError, ConnectError, Connection, MemChannel, RpcChannel, RpcHandler};
pub use shm::{
    ReceivedGrant, SHM_ATTACH_TIMEOUT, SHM_HANDSHAKE_TIMEOUT, SHM_MAX_CONCURRENT_HANDSHAKES,
    SHM_MAX_HELLO_BYTES, ShmAttachment, ShmError, attach_shm, attach_shm_shard, no_region_yet,
    request_shard_grant, request_shm_grant, serve_shm,
};
pub use striped::Striped;
pub use transport::{
    Fabric, FabricError, MappedFabric, MappedRegion, ReadOp, RegionDescriptor, RemoteRegion,
    check_range,
};
