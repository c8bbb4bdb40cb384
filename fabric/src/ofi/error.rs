//! The `ofi` transport's errors, and how they map onto the transport-neutral
//! [`FabricError`] every reader handles the same way.

use thiserror::Error;

use crate::transport::FabricError;

#[derive(Debug, Error)]
pub enum OfiError {
    /// libfabric could not be used at all (not installed, too old, built
    /// without the feature): the one log line says this.
    #[error("libfabric unavailable: {0}")]
    Unavailable(String),
    #[error("{what}: {message}")]
    Call {
        what: &'static str,
        code: i32,
        message: String,
    },
    /// A read completed with an error: `code` is libfabric's (positive).
    #[error("read completed with error {code}: {message}")]
    Completion { code: i32, message: String },
    #[error("reads did not complete within {ms} ms; the endpoint was closed")]
    Timeout { ms: u64 },
    #[error("the endpoint is closed: {0}")]
    Closed(String),
    #[error("the grant is unusable: {0}")]
    Grant(String),
}

impl OfiError {
    /// A rejected key or an access outside the registration is `BadKey`
    /// (the client asks for a new grant); anything else means the peer or
    /// the path is gone.
    pub fn into_fabric(self, key: u64) -> FabricError {
        match self {
            OfiError::Completion { code, .. } if is_access_error(code) => {
                FabricError::BadKey { key }
            }
            other => FabricError::PeerGone(other.to_string()),
        }
    }
}

/// libfabric's error numbers (`fi_errno.h`: the errno values) for an
/// access the target refused.
pub const FI_EACCES: i32 = 13;
pub const FI_EINVAL: i32 = 22;
pub const FI_EKEYREJECTED: i32 = 129;

/// Completion errors a provider reports for a wrong key or range.
pub fn is_access_error(code: i32) -> bool {
    matches!(code, FI_EACCES | FI_EINVAL | FI_EKEYREJECTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_errors_become_bad_key_and_the_rest_peer_gone() {
        let rejected = OfiError::Completion {
            code: FI_EKEYREJECTED,
            message: String::new(),
        };
        assert!(matches!(
            rejected.into_fabric(7),
            FabricError::BadKey { key: 7 }
        ));
        let reset = OfiError::Completion {
            code: 104,
            message: String::new(),
        };
        assert!(matches!(reset.into_fabric(7), FabricError::PeerGone(_)));
        assert!(matches!(
            OfiError::Timeout { ms: 1 }.into_fabric(7),
            FabricError::PeerGone(_)
        ));
    }
}
