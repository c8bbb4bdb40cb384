//! The queue-pair attributes rdkv sets, and why. RC (reliable connected)
//! queue pairs, one per client connection, moved RESET -> INIT -> RTR -> RTS
//! with the peer's endpoint learnt over the TCP control connection.

/// Local ACK timeout, as the verbs exponent: 4.096 µs x 2^14 = 67 ms before
/// a request is retransmitted. Long enough for a loaded switch or a
/// Soft-RoCE peer scheduled out, short enough that `RETRY_COUNT` retries
/// detect a dead peer in about half a second, well inside a client's
/// request budget, so a GET falls back to shm/tcp instead of hanging.
pub const ACK_TIMEOUT_EXPONENT: u8 = 14;

/// Transport retries before the request completes with "retry exceeded"
/// (the verbs maximum, 7): lossy RoCE fabrics without PFC drop packets now
/// and then and a retransmission is cheap; giving up early would turn a
/// dropped packet into a torn-down connection.
pub const RETRY_COUNT: u8 = 7;

/// Retries after a receiver-not-ready NAK. The credit protocol never sends
/// into a buffer that is not posted (a credit is granted only after the
/// buffer is re-posted), so an RNR NAK means a bug or a peer that is not
/// processing: two retries absorb a race, then the connection fails fast
/// instead of retrying forever (7 would mean "infinite").
pub const RNR_RETRY_COUNT: u8 = 2;

/// Delay the responder asks an RNR-NAKed sender to wait, as the verbs code:
/// 12 = 0.64 ms. Only reached on the error path described above.
pub const MIN_RNR_TIMER_CODE: u8 = 12;

/// Outstanding RDMA READs this side issues (initiator depth) and accepts
/// (responder resources), before clamping to the device's limits
/// (`max_qp_init_rd_atom`, `max_qp_rd_atom`). An MGet posts a batch of
/// neighbourhood READs and then of block READs; 16 in flight keeps such a
/// batch pipelined on one QP (perftest's default on mlx5) while bounding
/// the responder state each connection pins on the server's NIC. READs
/// beyond it wait in the send queue, they do not fail.
pub const MAX_OUTSTANDING_READS: u8 = 16;

/// Outstanding READs of one connection's two directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDepths {
    /// READs this side issues at once (`max_rd_atomic`, RTS).
    pub initiator: u8,
    /// READs this side serves at once (`max_dest_rd_atomic`, RTR).
    pub responder: u8,
}

/// What both sides use, agreed as perftest does (each announces its depths
/// in its endpoint, each takes the minimum): an initiator deeper than the
/// peer's responder resources would have READs refused by the peer's NIC
/// (remote invalid request), i.e. a torn-down connection under load.
pub fn agree_read_depths(local: ReadDepths, remote: ReadDepths) -> ReadDepths {
    ReadDepths {
        initiator: local.initiator.min(remote.responder).max(1),
        responder: local.responder.min(remote.initiator).max(1),
    }
}

/// Partition key index 0: the default partition.
pub const PKEY_INDEX: u16 = 0;

/// Hop limit of the GRH on RoCE v2 and routed IB: the network's default.
pub const GRH_HOP_LIMIT: u8 = 64;

/// Send-queue entries reserved for READs and for SENDs of one connection.
pub const READ_QUEUE_DEPTH: u32 = 128;
pub const SEND_QUEUE_DEPTH: u32 = 64;

/// Receive buffers each side posts for the peer (its send window), and
/// their size: a typical request or reply fits one buffer; larger frames
/// (MGet replies, MPuts, snapshot chunks) are fragmented.
pub const RECV_BUFFERS: u32 = 64;
pub const RECV_BUFFER_BYTES: u32 = 64 * 1024;

/// How long a client waits for one READ (or a batch) to complete. A dead
/// peer is detected by the transport after about `RETRY_COUNT` x 67 ms;
/// this bound only guards against a lost completion.
pub const READ_TIMEOUT_MS: u64 = 2_000;

/// The largest message (native frame) accepted over SEND/RECV: the
/// protocol's default frame limit plus its header.
pub const MAX_MESSAGE_BYTES: u32 = rdkv_proto::wire::DEFAULT_MAX_FRAME_BYTES + 64;

/// A random 24-bit packet sequence number (perftest does the same): a new
/// connection never accepts stale packets of an old one with the same QPN.
pub fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(std::process::id().into());
    (hasher.finish() as u32) & 0x00FF_FFFF
}

// The verbs fields are 5-bit (timeout, RNR timer) and 3-bit (retries; an
// RNR retry count of 7 would mean "forever"); the window and buffers must
// be what the endpoint decoder accepts. Checked at compile time.
const _: () = assert!(ACK_TIMEOUT_EXPONENT < 32 && MIN_RNR_TIMER_CODE < 32);
const _: () = assert!(RETRY_COUNT <= 7 && RNR_RETRY_COUNT < 7);
const _: () = assert!(RECV_BUFFERS >= rdkv_proto::wire::MIN_RDMA_RECV_CREDITS);
const _: () = assert!(RECV_BUFFERS <= rdkv_proto::wire::MAX_RDMA_RECV_CREDITS);
const _: () = assert!(RECV_BUFFER_BYTES <= rdkv_proto::wire::MAX_RDMA_RECV_BUFFER_BYTES);
const _: () = assert!(RECV_BUFFER_BYTES >= rdkv_proto::wire::MIN_RDMA_RECV_BUFFER_BYTES);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_depths_are_the_minimum_of_both_sides() {
        let mlx5 = ReadDepths {
            initiator: 16,
            responder: 16,
        };
        let small = ReadDepths {
            initiator: 4,
            responder: 2,
        };
        assert_eq!(
            agree_read_depths(mlx5, small),
            ReadDepths {
                initiator: 2,
                responder: 4
            }
        );
        assert_eq!(
            agree_read_depths(small, mlx5),
            ReadDepths {
                initiator: 4,
                responder: 2
            }
        );
        assert_eq!(agree_read_depths(mlx5, mlx5), mlx5);
    }

    #[test]
    fn psns_are_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0x00FF_FFFF);
        }
    }
}
