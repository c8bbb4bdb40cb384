//! rdkv-proto: everything two rdkv processes must agree on byte for byte, and no I/O.
//!
//! - [`region`]: the layout of a server's registered memory region (header, index
//!   buckets of packed slots, self-describing data blocks), with the encoders the
//!   writer uses and the validators a one-sided reader applies to raw bytes.
//! - [`shard`]: sharding: a key's hash slot (Redis Cluster's), the shard map.
//! - [`wire`]: the native protocol: length-prefixed frames, the version handshake
//!   and the postcard-encoded request/response messages.

#![forbid(unsafe_code)]
// Non-test functions stay under 100 lines (issue 13); tests may run longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod region;
pub mod shard;
pub mod wire;
