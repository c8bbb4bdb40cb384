//! What each request kind is answered with, taken out of a [`Response`]: one
//! [`FromResponse`] impl per answer type, so that the typed methods of
//! [`Client`](crate::Client) are `send` plus a conversion, with no match of
//! their own.

use bytes::Bytes;
use rdkv_proto::wire::{
    Health, KeyExpiry, MemberInfo, NodeStatus, Op, Response, ShardStatus, SnapshotChunk,
    StateDigestAt, UpdateOutcome, Versioned,
};

use crate::error::{Error, Result};

/// Result of [`Client::delete`](crate::Client::delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// Whether the key existed.
    pub existed: bool,
    /// Log index of the delete (also when the key did not exist).
    pub version: u64,
}

/// Result of [`Client::cas`](crate::Client::cas), shaped like an etcd transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasOutcome {
    /// Whether the comparison held and the write (or delete) was applied.
    pub succeeded: bool,
    /// On success the log index of the write; on failure the applied index the
    /// comparison was evaluated at.
    pub version: u64,
    /// On failure, what the key holds (`None` = absent); `None` on success.
    pub current: Option<Versioned>,
}

/// The version of a `Put` (`Response::Written`).
pub(crate) struct Written(pub(crate) u64);

/// The version of an `MPut` (`Response::MWritten`).
pub(crate) struct MWritten(pub(crate) u64);

/// What a `Clear` removed, and the version of its entry.
pub(crate) struct Cleared {
    pub(crate) removed: u64,
    pub(crate) version: u64,
}

/// The answer to `Ping`.
pub(crate) struct Pong;

/// The answer to requests that only say they were done (`MoveLeader`,
/// `InjectFault`, `ReportReads`).
pub(crate) struct Done;

/// One reply of a `Scan`.
pub(crate) struct ScanPage {
    pub(crate) pairs: Vec<(Bytes, Versioned)>,
    pub(crate) more: bool,
}

/// An answer type one request kind is answered with. (`TryFrom<Response>`
/// cannot be implemented here for proto's own types, hence a trait of ours.)
pub(crate) trait FromResponse: Sized {
    /// The answer, or the response back when it is of another kind.
    fn from_response(response: Response) -> Result<Self, Response>;
}

/// Takes the answer of a request of kind `op` out of `response`.
pub(crate) fn answer<T: FromResponse>(op: Op, response: Response) -> Result<T> {
    T::from_response(response).map_err(|other| unexpected(op, &other))
}

/// The error for a reply of the wrong kind (an error reply stays what it says).
pub(crate) fn unexpected(op: Op, response: &Response) -> Error {
    match response {
        Response::Error(reply) => Error::Server(reply.clone()),
        other => Error::UnexpectedResponse {
            request: op.name(),
            response: format!("{other:?}").chars().take(200).collect(),
        },
    }
}

/// `FromResponse` for `$answer`: the variant `$pattern` gives `$value`.
macro_rules! from_response {
    ($($answer:ty: $pattern:pat => $value:expr;)*) => {$(
        impl FromResponse for $answer {
            fn from_response(response: Response) -> Result<Self, Response> {
                match response {
                    $pattern => Ok($value),
                    other => Err(other),
                }
            }
        }
    )*};
}

from_response! {
    Option<Versioned>: Response::Value(value) => value;
    Vec<Option<Versioned>>: Response::Values(values) => values;
    Written: Response::Written { version } => Written(version);
    MWritten: Response::MWritten { version } => MWritten(version);
    DeleteOutcome: Response::Deleted { existed, version } => DeleteOutcome { existed, version };
    CasOutcome: Response::CasDone { succeeded, version, current } =>
        CasOutcome { succeeded, version, current };
    UpdateOutcome: Response::Updated(outcome) => outcome;
    Cleared: Response::Cleared { removed, version } => Cleared { removed, version };
    ScanPage: Response::Pairs { pairs, more } => ScanPage { pairs, more };
    Pong: Response::Pong => Pong;
    Done: Response::Done => Done;
    NodeStatus: Response::Status(status) => *status;
    Health: Response::Health(health) => health;
    Vec<MemberInfo>: Response::Members(members) => members;
    SnapshotChunk: Response::Snapshot(chunk) => chunk;
    Vec<StateDigestAt>: Response::Digests(digests) => digests;
    Option<KeyExpiry>: Response::Expiry(expiry) => expiry;
    Vec<ShardStatus>: Response::ShardStatus(shards) => shards;
}

#[cfg(test)]
mod tests {
    use rdkv_proto::wire::{ErrorCode, ErrorReply};

    use super::*;

    #[test]
    fn an_answer_of_the_right_kind_is_taken_out() {
        let deleted = Response::Deleted {
            existed: true,
            version: 7,
        };
        let outcome: DeleteOutcome = answer(Op::Delete, deleted).expect("a Deleted reply");
        assert_eq!(
            outcome,
            DeleteOutcome {
                existed: true,
                version: 7
            }
        );
    }

    #[test]
    fn a_reply_of_another_kind_is_unexpected_and_names_the_request() {
        let got = answer::<CasOutcome>(Op::Cas, Response::Pong);
        assert!(
            matches!(got, Err(Error::UnexpectedResponse { request: "cas", .. })),
            "{got:?}"
        );
    }

    #[test]
    fn an_error_reply_stays_a_server_error() {
        let reply = ErrorReply::new(ErrorCode::InvalidRequest, "no");
        let got = answer::<Vec<MemberInfo>>(Op::Members, Response::Error(reply.clone()));
        assert!(matches!(got, Err(Error::Server(r)) if r == reply));
    }
}
