//! The native client protocol: framing, handshake and messages. No I/O.
//!
//! A connection is a stream of [`Frame`]s (`[u32 LE body_len][u8 kind][u64 LE
//! request_id][postcard payload]`). The client opens with a [`ClientHello`], the
//! server answers with a [`ServerHello`], then the client sends [`Request`]s
//! whose [`Response`]s echo the request id, so requests can be pipelined.
//!
//! Hostile input policy: the frame length is checked against the limit before
//! anything is allocated; batch lengths are capped while decoding; nothing here
//! panics on any input. A framing error ([`WireError::closes_connection`]) means
//! the stream is desynchronised and the connection must close; a payload or
//! [`Limits`] error is answered with an [`ErrorReply`] for that request id.

pub mod admin;
pub(crate) mod batch;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod key_use;
pub mod limits;
pub mod message;
pub mod ofi;
pub mod op;
pub mod rdma;
pub mod sharded;
pub mod shm;

pub use admin::{
    Alarm, Fault, Health, MemberInfo, NodeStatus, OpStats, OpenConnections, QuotaUse, ReadReport,
    RegionFill, ReplicationLag, Role, ServedCounts, ShardStatus, SnapshotChunk, StateDigestAt,
};
pub use batch::HARD_MAX_BATCH_ENTRIES;
pub use error::{LimitError, LimitsConfigError, WireError};
pub use frame::{
    DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER_BYTES, Frame, FrameDecoder, FrameKind, MIN_BODY_BYTES,
    decode_exact, decode_payload, encode_frame, encoded_frame, serialize_bounded,
};
pub use handshake::{
    ClientHello, HANDSHAKE_MAGIC, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, SHARDED_PROTOCOL_VERSION,
    SHARDS_PROTOCOL_VERSION, ServerHello, ServerInfo, negotiate, tokens_match,
};
pub use key_use::KeyUse;
pub use limits::{
    DEFAULT_MAX_BATCH_KEYS, DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES, Limits,
    SINGLE_ENTRY_OVERHEAD_BYTES,
};
pub use message::{
    Consistency, ErrorCode, ErrorReply, ExpireCondition, Expiry, KeyExpiry, LeaderHint, Request,
    Response, SetCondition, TxnOp, TxnResult, Update, UpdateOutcome, Versioned, WrongShard,
};
pub use ofi::{MAX_OFI_ENDPOINT_BYTES, MAX_OFI_PROVIDER_BYTES, OfiRegionGrant, OfiWireError};
pub use op::Op;
pub use rdma::{
    MAX_QP_ENDPOINT_BYTES, MAX_RDMA_RECV_BUFFER_BYTES, MAX_RDMA_RECV_CREDITS,
    MIN_RDMA_RECV_BUFFER_BYTES, MIN_RDMA_RECV_CREDITS, QpEndpoint, RDMA_ENDPOINT_VERSION,
    RDMA_MTU_BYTES, RdmaRegionGrant, RdmaWireError,
};
pub use sharded::ShardRequest;
pub use shm::{MAX_SHM_GRANT_BYTES, SHM_GRANT_PREFIX_BYTES, ShmAttach, ShmGrant};
