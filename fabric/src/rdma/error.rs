//! Typed errors of the `rdma` transport, and the mapping of a work
//! completion's status (a verbs `ibv_wc_status` number) to them. Any failed
//! completion moves the queue pair to the error state, so every error here
//! except [`RdmaError::Timeout`] on a single request ends the connection;
//! the client then reconnects or falls back to `shm`/`tcp`.

use rdkv_proto::wire::WireError;
use thiserror::Error;

use super::admission::AdmissionFull;
use super::buffer_pool::PoolError;
use super::credits::CreditError;
use super::device::SelectError;
use super::fragment::FragmentError;
use super::wr_table::WrTableFull;
use crate::transport::FabricError;

/// The status of a work completion, by its verbs ABI number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionStatus {
    Success,
    LocalLength,
    LocalQpOperation,
    LocalProtection,
    /// The queue pair entered the error state before this request ran
    /// (another request failed first, or the connection is being torn down).
    Flushed,
    BadResponse,
    LocalAccess,
    RemoteInvalidRequest,
    /// The rkey is unknown, the range is outside the memory region or the
    /// region does not allow the access: the server deregistered the region
    /// (a new epoch) or the request was out of bounds.
    RemoteAccess,
    RemoteOperation,
    /// No acknowledgement after `retry_cnt` transport retries: the peer (or
    /// the path) is gone.
    RetryExceeded,
    /// The peer had no receive buffer posted `rnr_retry` times in a row (a
    /// credit accounting bug or a stalled peer).
    RnrRetryExceeded,
    RemoteAborted,
    Fatal,
    ResponseTimeout,
    General,
    /// Any other number (older or newer rdma-core).
    Other(u32),
}

impl CompletionStatus {
    /// Maps `ibv_wc_status` (include/infiniband/verbs.h; ABI-stable numbers).
    pub fn from_raw(status: u32) -> CompletionStatus {
        match status {
            0 => CompletionStatus::Success,
            1 => CompletionStatus::LocalLength,
            2 => CompletionStatus::LocalQpOperation,
            4 => CompletionStatus::LocalProtection,
            5 => CompletionStatus::Flushed,
            7 => CompletionStatus::BadResponse,
            8 => CompletionStatus::LocalAccess,
            9 => CompletionStatus::RemoteInvalidRequest,
            10 => CompletionStatus::RemoteAccess,
            11 => CompletionStatus::RemoteOperation,
            12 => CompletionStatus::RetryExceeded,
            13 => CompletionStatus::RnrRetryExceeded,
            16 => CompletionStatus::RemoteAborted,
            19 => CompletionStatus::Fatal,
            20 => CompletionStatus::ResponseTimeout,
            21 => CompletionStatus::General,
            other => CompletionStatus::Other(other),
        }
    }

    pub fn is_success(self) -> bool {
        self == CompletionStatus::Success
    }
}

impl std::fmt::Display for CompletionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            CompletionStatus::Success => "success",
            CompletionStatus::LocalLength => "local length error",
            CompletionStatus::LocalQpOperation => "local QP operation error",
            CompletionStatus::LocalProtection => "local protection error",
            CompletionStatus::Flushed => "flushed (the queue pair is in the error state)",
            CompletionStatus::BadResponse => "bad response",
            CompletionStatus::LocalAccess => "local access error",
            CompletionStatus::RemoteInvalidRequest => "remote invalid request",
            CompletionStatus::RemoteAccess => "remote access error (bad rkey or range)",
            CompletionStatus::RemoteOperation => "remote operation error",
            CompletionStatus::RetryExceeded => {
                "transport retry counter exceeded (peer unreachable)"
            }
            CompletionStatus::RnrRetryExceeded => "receiver-not-ready retry counter exceeded",
            CompletionStatus::RemoteAborted => "remote aborted",
            CompletionStatus::Fatal => "fatal error",
            CompletionStatus::ResponseTimeout => "response timeout",
            CompletionStatus::General => "general error",
            CompletionStatus::Other(n) => return write!(f, "completion status {n}"),
        };
        f.write_str(text)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RdmaError {
    /// rdma-core is not installed, there is no device, or none is usable:
    /// the reason is logged and the node or client falls back.
    #[error("rdma unavailable: {0}")]
    Unavailable(String),
    #[error("selecting a device: {0}")]
    Select(#[from] SelectError),
    /// A verbs call failed (`op` names it).
    #[error("{op} failed: {detail}")]
    Verbs { op: &'static str, detail: String },
    /// A work request completed with an error; the connection is dead.
    #[error("work request failed: {status} (vendor error {vendor_err:#x})")]
    Completion {
        status: CompletionStatus,
        vendor_err: u32,
    },
    #[error("no completion within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    #[error("rdma connection closed: {0}")]
    Closed(String),
    #[error("peer broke the credit protocol: {0}")]
    Credits(#[from] CreditError),
    #[error("peer sent a bad fragment: {0}")]
    Fragment(#[from] FragmentError),
    #[error("read buffers: {0}")]
    Pool(#[from] PoolError),
    #[error(transparent)]
    WrTable(#[from] WrTableFull),
    #[error("control message: {0}")]
    Wire(#[from] WireError),
    #[error(transparent)]
    Admission(#[from] AdmissionFull),
    #[error("the device reported {event}")]
    DeviceEvent {
        event: super::async_event::EventKind,
    },
    #[error("the server refused the rdma connection: {0}")]
    Refused(String),
}

impl RdmaError {
    /// The error a failed completion means (`None` for a success).
    pub fn from_completion(status: u32, vendor_err: u32) -> Option<RdmaError> {
        let status = CompletionStatus::from_raw(status);
        (!status.is_success()).then_some(RdmaError::Completion { status, vendor_err })
    }

    pub fn verbs(op: &'static str, error: impl std::fmt::Display) -> RdmaError {
        RdmaError::Verbs {
            op,
            detail: error.to_string(),
        }
    }

    /// The one-sided reader's view: a READ refused by the remote memory
    /// region means the region (rkey) is gone, anything else a lost peer.
    pub fn into_fabric(self, key: u64) -> FabricError {
        match self {
            RdmaError::Completion {
                status: CompletionStatus::RemoteAccess,
                ..
            } => FabricError::BadKey { key },
            other => FabricError::PeerGone(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_statuses_map_to_typed_errors() {
        assert_eq!(RdmaError::from_completion(0, 0), None);
        let cases = [
            (5, CompletionStatus::Flushed),
            (10, CompletionStatus::RemoteAccess),
            (12, CompletionStatus::RetryExceeded),
            (13, CompletionStatus::RnrRetryExceeded),
            (4, CompletionStatus::LocalProtection),
            (999, CompletionStatus::Other(999)),
        ];
        for (raw, status) in cases {
            assert_eq!(
                RdmaError::from_completion(raw, 0x51),
                Some(RdmaError::Completion {
                    status,
                    vendor_err: 0x51
                })
            );
        }
        let bad_key = RdmaError::from_completion(10, 0).unwrap().into_fabric(42);
        assert!(matches!(bad_key, FabricError::BadKey { key: 42 }));
        let gone = RdmaError::from_completion(12, 0).unwrap().into_fabric(42);
        assert!(matches!(gone, FabricError::PeerGone(ref m) if m.contains("retry counter")));
        assert!(matches!(
            RdmaError::Timeout { timeout_ms: 5 }.into_fabric(1),
            FabricError::PeerGone(_)
        ));
    }

    /// The numbers above are rdma-core's; with the verbs bindings built,
    /// check them against sideway's own enum.
    #[cfg(feature = "rdma")]
    #[test]
    fn status_numbers_match_rdma_core() {
        use sideway::ibverbs::completion::WorkCompletionStatus as W;
        let pairs = [
            (W::Success, CompletionStatus::Success),
            (W::LocalLengthError, CompletionStatus::LocalLength),
            (
                W::LocalQueuePairOperationError,
                CompletionStatus::LocalQpOperation,
            ),
            (W::LocalProtectionError, CompletionStatus::LocalProtection),
            (W::WorkRequestFlushedError, CompletionStatus::Flushed),
            (W::BadResponseError, CompletionStatus::BadResponse),
            (W::LocalAccessError, CompletionStatus::LocalAccess),
            (
                W::RemoteInvalidRequestError,
                CompletionStatus::RemoteInvalidRequest,
            ),
            (W::RemoteAccessError, CompletionStatus::RemoteAccess),
            (W::RemoteOperationError, CompletionStatus::RemoteOperation),
            (
                W::RetryCounterExceededError,
                CompletionStatus::RetryExceeded,
            ),
            (
                W::ResponderNotReadyRetryCounterExceededError,
                CompletionStatus::RnrRetryExceeded,
            ),
            (W::RemoteAbortedError, CompletionStatus::RemoteAborted),
            (W::FatalError, CompletionStatus::Fatal),
            (W::ResponseTimeoutError, CompletionStatus::ResponseTimeout),
            (W::GeneralError, CompletionStatus::General),
        ];
        for (raw, ours) in pairs {
            assert_eq!(CompletionStatus::from_raw(raw as u32), ours, "{raw:?}");
        }
    }
}
