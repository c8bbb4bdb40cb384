//! The exception hierarchy: every failure of a call is an `rdkv.Error`, of
//! the subclass that says what to do about it, with attributes `code` (the
//! server's error code or the client's cause, e.g. `"no_space"`,
//! `"connect_failed"`) and `retryable` (whether repeating the call later may
//! succeed). Branch on the class or on `code`, never on the message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use rdkv_client::{ConnectError, Error as ClientError, ErrorCode};

create_exception!(
    rdkv,
    Error,
    PyException,
    "Base class of every rdkv error. `code` names the cause (a server error code such as \
     'no_space', or a client cause such as 'connect_failed'); `retryable` says whether the \
     same call may succeed later."
);
create_exception!(
    rdkv,
    NoSpace,
    Error,
    "The write would take the cluster past its quota (or its memory). Deletes make room."
);
create_exception!(
    rdkv,
    Unavailable,
    Error,
    "No server could serve the call: none reachable, no leader (election, no quorum), or the \
     connection broke. Retryable."
);
create_exception!(
    rdkv,
    Timeout,
    Error,
    "The call did not complete within the client's timeout, and nothing was changed (a read, \
     or a write that was never sent)."
);
create_exception!(
    rdkv,
    OutcomeUnknown,
    Error,
    "A write was sent but its reply never came: it may or may not have been applied. The \
     client never repeats it by itself; read the key back or use cas()."
);
create_exception!(
    rdkv,
    Unauthenticated,
    Error,
    "The cluster refused the token (missing or wrong), or TLS failed: the server's certificate \
     does not chain to tls_ca, the server refused this client's certificate (or its lack of \
     one), or the server wants TLS and no tls_ca was given."
);
create_exception!(
    rdkv,
    TooLarge,
    Error,
    "A key, value, batch or frame exceeds the server's limits."
);
create_exception!(
    rdkv,
    InvalidRequest,
    Error,
    "The request is malformed or cannot be done in the cluster's current state."
);
create_exception!(
    rdkv,
    BufferTooSmall,
    Error,
    "A value is larger than the buffer given to receive it (get_into, batch_get_into). \
     `index` is the position of the key in the batch, `needed` the value's length."
);
create_exception!(
    rdkv,
    ProtocolError,
    Error,
    "A frame could not be decoded, or the server answered with the wrong kind of response."
);

/// Adds the exception classes to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("Error", py.get_type::<Error>())?;
    module.add("NoSpace", py.get_type::<NoSpace>())?;
    module.add("Unavailable", py.get_type::<Unavailable>())?;
    module.add("Timeout", py.get_type::<Timeout>())?;
    module.add("OutcomeUnknown", py.get_type::<OutcomeUnknown>())?;
    module.add("Unauthenticated", py.get_type::<Unauthenticated>())?;
    module.add("TooLarge", py.get_type::<TooLarge>())?;
    module.add("InvalidRequest", py.get_type::<InvalidRequest>())?;
    module.add("BufferTooSmall", py.get_type::<BufferTooSmall>())?;
    module.add("ProtocolError", py.get_type::<ProtocolError>())?;
    Ok(())
}

/// Which exception class a failure raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    NoSpace,
    Unavailable,
    Timeout,
    OutcomeUnknown,
    Unauthenticated,
    TooLarge,
    InvalidRequest,
    Protocol,
    /// The base class: causes with no better subclass (internal errors).
    Other,
}

/// The class of a server error code.
pub(crate) fn kind_of_code(code: ErrorCode) -> Kind {
    match code {
        ErrorCode::NoSpace => Kind::NoSpace,
        ErrorCode::Unauthenticated => Kind::Unauthenticated,
        ErrorCode::Unavailable
        | ErrorCode::NotLeader
        | ErrorCode::StaleFollower
        | ErrorCode::TooManyInFlight => Kind::Unavailable,
        ErrorCode::Timeout => Kind::Timeout,
        ErrorCode::KeyTooLarge
        | ErrorCode::ValueTooLarge
        | ErrorCode::BatchTooLarge
        | ErrorCode::FrameTooLarge => Kind::TooLarge,
        ErrorCode::EmptyBatch
        | ErrorCode::InvalidRequest
        | ErrorCode::NotFound
        | ErrorCode::Malformed => Kind::InvalidRequest,
        ErrorCode::UnsupportedVersion | ErrorCode::Internal | ErrorCode::Unknown => Kind::Other,
    }
}

/// The class and `code` of a client error.
pub(crate) fn classify(error: &ClientError) -> (Kind, &'static str) {
    match error {
        ClientError::Server(reply) => (kind_of_code(reply.code), reply.code.name()),
        ClientError::Connect(ConnectError::Handshake { code, .. }) => {
            (kind_of_code(*code), code.name())
        }
        ClientError::Connect(ConnectError::Tls { .. }) => (Kind::Unauthenticated, "tls_refused"),
        ClientError::Connect(ConnectError::ServerWantsTls { .. }) => {
            (Kind::Unauthenticated, "tls_required")
        }
        ClientError::Connect(_) => (Kind::Unavailable, "connect_failed"),
        ClientError::Tls(_) => (Kind::InvalidRequest, "tls_settings"),
        ClientError::Timeout(_) => (Kind::Timeout, "timeout"),
        ClientError::NoLeader => (Kind::Unavailable, "no_leader"),
        ClientError::OneSidedUnavailable => (Kind::Unavailable, "one_sided_unavailable"),
        ClientError::ConnectionLost { .. } => (Kind::Unavailable, "connection_lost"),
        ClientError::OutcomeUnknown { .. } => (Kind::OutcomeUnknown, "outcome_unknown"),
        ClientError::NoEndpoints => (Kind::InvalidRequest, "no_endpoints"),
        ClientError::Protocol(_) => (Kind::Protocol, "protocol"),
        ClientError::UnexpectedResponse { .. } => (Kind::Protocol, "unexpected_response"),
        ClientError::SnapshotChanged { .. } => (Kind::Other, "snapshot_changed"),
        ClientError::StaleShardMap { .. } => (Kind::Unavailable, "stale_shard_map"),
        // Some shards' parts were written: neither a clean failure nor an
        // unknown outcome; the message names the keys.
        ClientError::PartialMPut(_) => (Kind::Other, "partial_mput"),
        ClientError::Io(_) => (Kind::Other, "io"),
        _ => (Kind::Other, "other"),
    }
}

/// An exception of class `kind` with `message`, `code` and `retryable` set.
pub(crate) fn exception(
    py: Python<'_>,
    kind: Kind,
    code: &str,
    retryable: bool,
    message: String,
) -> PyErr {
    let error = match kind {
        Kind::NoSpace => NoSpace::new_err(message),
        Kind::Unavailable => Unavailable::new_err(message),
        Kind::Timeout => Timeout::new_err(message),
        Kind::OutcomeUnknown => OutcomeUnknown::new_err(message),
        Kind::Unauthenticated => Unauthenticated::new_err(message),
        Kind::TooLarge => TooLarge::new_err(message),
        Kind::InvalidRequest => InvalidRequest::new_err(message),
        Kind::Protocol => ProtocolError::new_err(message),
        Kind::Other => Error::new_err(message),
    };
    let value = error.value(py);
    let tagged = value
        .setattr("code", code)
        .and_then(|()| value.setattr("retryable", retryable));
    // Setting an attribute of a fresh exception does not fail; if it did,
    // that failure is what the caller sees.
    match tagged {
        Ok(()) => error,
        Err(failure) => failure,
    }
}

/// The exception for a failed client call.
pub(crate) fn to_py(py: Python<'_>, error: ClientError) -> PyErr {
    let (kind, code) = classify(&error);
    exception(py, kind, code, error.is_retryable(), with_causes(&error))
}

/// The error's message followed by its causes (a TLS failure's reason is
/// in its cause), as anyhow's `{:#}` shows them.
fn with_causes(error: &ClientError) -> String {
    let mut message = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        cause = inner.source();
    }
    message
}

/// `BufferTooSmall` for the key at `index`, whose value has `needed` bytes
/// and whose buffer `room`.
pub(crate) fn buffer_too_small(py: Python<'_>, index: usize, needed: usize, room: usize) -> PyErr {
    let error = BufferTooSmall::new_err(format!(
        "the value of key {index} has {needed} bytes, its buffer only {room}"
    ));
    let value = error.value(py);
    let tagged = value
        .setattr("code", "buffer_too_small")
        .and_then(|()| value.setattr("retryable", false))
        .and_then(|()| value.setattr("index", index))
        .and_then(|()| value.setattr("needed", needed));
    match tagged {
        Ok(()) => error,
        Err(failure) => failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_server_code_has_a_class_and_the_important_ones_their_own() {
        for code in ErrorCode::ALL {
            let _ = kind_of_code(code);
        }
        assert_eq!(kind_of_code(ErrorCode::NoSpace), Kind::NoSpace);
        assert_eq!(
            kind_of_code(ErrorCode::Unauthenticated),
            Kind::Unauthenticated
        );
        assert_eq!(kind_of_code(ErrorCode::Unavailable), Kind::Unavailable);
        assert_eq!(kind_of_code(ErrorCode::ValueTooLarge), Kind::TooLarge);
    }

    #[test]
    fn client_causes_map_to_their_class_and_code() {
        let timeout = ClientError::Timeout(std::time::Duration::from_secs(1));
        assert_eq!(classify(&timeout), (Kind::Timeout, "timeout"));
        assert_eq!(
            classify(&ClientError::NoLeader),
            (Kind::Unavailable, "no_leader")
        );
        let unknown = ClientError::OutcomeUnknown {
            addr: "a".into(),
            reason: "b".into(),
        };
        assert_eq!(
            classify(&unknown),
            (Kind::OutcomeUnknown, "outcome_unknown")
        );
        let refused = ClientError::Connect(ConnectError::Handshake {
            addr: "a".into(),
            code: ErrorCode::Unauthenticated,
            message: "bad token".into(),
        });
        assert_eq!(
            classify(&refused),
            (Kind::Unauthenticated, "unauthenticated")
        );
    }
}
