//! The redirect and retry rules, as one pure function: what one attempt's
//! outcome means for the call ([`next_step`]). The request loop in
//! [`Router`](super::Router) only carries the steps out.

use std::time::Duration;

use rdkv_fabric::rpc::CallError;
use rdkv_proto::wire::{ErrorCode, ErrorReply, Response};

use super::route::Idempotence;
use crate::error::{Error, Result};

/// What became of one attempt to send a request to one node.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// No channel to the node could be had.
    Unreachable(Error),
    /// The node answered (possibly with an error reply).
    Replied(Response),
    /// The channel failed the call.
    CallFailed(CallError),
    /// Not sent: the node's hello announced a shard map of this version,
    /// newer than the client's.
    MapAnnounced(u64),
}

/// The facts about an attempt besides its outcome.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt<'a> {
    /// The node it went to.
    pub(crate) addr: &'a str,
    pub(crate) idempotence: Idempotence,
    /// The call's whole budget (for the message of an unknown outcome).
    pub(crate) request_timeout: Duration,
    /// Time since the call began.
    pub(crate) elapsed: Duration,
    /// Whether the call's deadline had passed when the outcome came.
    pub(crate) past_deadline: bool,
    /// Whether an earlier attempt of the call already failed.
    pub(crate) earlier_error: bool,
}

/// When to sleep before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackOff {
    Always,
    /// Only once every endpoint has been tried since the last sleep.
    AfterRound,
}

/// What the request loop does next.
#[derive(Debug)]
pub(crate) enum Step {
    /// The call succeeded with this response (never an error reply).
    Done(Response),
    /// The call fails with `error`; `suspect`: the node did not answer and
    /// must not stay the first choice of the next calls.
    Fail { error: Error, suspect: bool },
    /// Try again, on the next node when `skip_node`; `error` is what the call
    /// reports if its budget runs out first.
    Retry {
        error: Error,
        skip_node: bool,
        back_off: BackOff,
    },
    /// Try the leader a hint named, at once.
    Redirect { to: String, error: Error },
    /// The node serves a newer shard map than the client's (`WrongShard`):
    /// bring the map to at least `at_least` (the node has it), then send
    /// the request again, a write too: a node answers `WrongShard` before
    /// it proposes anything.
    Remap { at_least: u64 },
    /// The deadline cut the call short: report the earlier error.
    GiveUp,
}

/// The step that follows `outcome` of `attempt`. A write that may have been
/// applied (sent, and no reply) is never retried: it fails `OutcomeUnknown`.
pub(crate) fn next_step(outcome: Outcome, attempt: &Attempt<'_>) -> Step {
    match outcome {
        Outcome::Unreachable(error) => unreachable_step(error, attempt),
        Outcome::Replied(Response::Error(reply)) => error_reply_step(reply, attempt),
        Outcome::Replied(Response::WrongShard(wrong)) => Step::Remap {
            at_least: wrong.map_version,
        },
        Outcome::Replied(response) => Step::Done(response),
        Outcome::CallFailed(failure) => call_failed_step(failure, attempt),
        Outcome::MapAnnounced(at_least) => Step::Remap { at_least },
    }
}

fn unreachable_step(error: Error, attempt: &Attempt<'_>) -> Step {
    if error.is_handshake_refusal() && !error.is_retryable() {
        return Step::Fail {
            error,
            suspect: false,
        };
    }
    if attempt.past_deadline && attempt.earlier_error {
        // Our own deadline may have cut this connect short: the earlier error
        // says more, and the node may be fine.
        return Step::GiveUp;
    }
    Step::Retry {
        error,
        skip_node: true,
        back_off: BackOff::AfterRound,
    }
}

fn call_failed_step(failure: CallError, attempt: &Attempt<'_>) -> Step {
    let write = attempt.idempotence == Idempotence::Write;
    let addr = attempt.addr.to_owned();
    match failure {
        CallError::Encode(e) | CallError::Decode(e) => Step::Fail {
            error: Error::Protocol(e),
            suspect: false,
        },
        CallError::TimedOut => Step::Fail {
            error: if write {
                Error::OutcomeUnknown {
                    addr,
                    reason: format!("no reply came within {:?}", attempt.request_timeout),
                }
            } else {
                Error::Timeout(attempt.elapsed)
            },
            suspect: true,
        },
        CallError::NotSent {
            timed_out: true, ..
        } => Step::GiveUp,
        CallError::Lost { reason } if write => Step::Fail {
            error: Error::OutcomeUnknown {
                addr,
                reason: format!("the connection broke before the reply ({reason})"),
            },
            suspect: false,
        },
        CallError::NotSent { reason, .. } | CallError::Lost { reason } => Step::Retry {
            error: Error::ConnectionLost { addr, reason },
            skip_node: true,
            back_off: BackOff::AfterRound,
        },
    }
}

fn error_reply_step(reply: ErrorReply, attempt: &Attempt<'_>) -> Step {
    let redirects = matches!(reply.code, ErrorCode::NotLeader | ErrorCode::Unavailable);
    if let Some(hint) = reply
        .leader_hint
        .as_ref()
        .filter(|h| redirects && h.client_addr != attempt.addr)
    {
        return Step::Redirect {
            to: hint.client_addr.clone(),
            error: match reply.code {
                ErrorCode::NotLeader => Error::NoLeader,
                _ => Error::Server(reply),
            },
        };
    }
    let retry = |error, skip_node| Step::Retry {
        error,
        skip_node,
        back_off: BackOff::Always,
    };
    match reply.code {
        // No leader known (an election): another node may know one.
        ErrorCode::NotLeader => retry(Error::NoLeader, true),
        ErrorCode::Unavailable | ErrorCode::StaleFollower => retry(Error::Server(reply), true),
        // Full up: the same node frees a credit soonest.
        ErrorCode::TooManyInFlight => retry(Error::Server(reply), false),
        ErrorCode::Timeout if attempt.idempotence == Idempotence::Write => Step::Fail {
            error: Error::OutcomeUnknown {
                addr: attempt.addr.to_owned(),
                reason: format!("the server answered Timeout: {}", reply.message),
            },
            suspect: false,
        },
        ErrorCode::Timeout => retry(Error::Server(reply), false),
        _ => Step::Fail {
            error: Error::Server(reply),
            suspect: false,
        },
    }
}

/// The result of a request sent to exactly one node, with no redirect and no
/// retry: every failure is the call's.
pub(crate) fn direct_result(outcome: Outcome, addr: &str, elapsed: Duration) -> Result<Response> {
    match outcome {
        Outcome::Unreachable(error) => Err(error),
        Outcome::Replied(Response::Error(reply)) => Err(Error::Server(reply)),
        Outcome::Replied(response) => Ok(response),
        // Only routed attempts are held back for a map.
        Outcome::MapAnnounced(version) => Err(Error::StaleShardMap {
            needed: version,
            held: 0,
        }),
        Outcome::CallFailed(
            CallError::NotSent {
                timed_out: true, ..
            }
            | CallError::TimedOut,
        ) => Err(Error::Timeout(elapsed)),
        Outcome::CallFailed(CallError::NotSent { reason, .. } | CallError::Lost { reason }) => {
            Err(Error::ConnectionLost {
                addr: addr.to_owned(),
                reason,
            })
        }
        Outcome::CallFailed(CallError::Encode(e) | CallError::Decode(e)) => Err(Error::Protocol(e)),
    }
}

#[cfg(test)]
mod tests {
    use rdkv_proto::shard::{ShardId, key_slot};
    use rdkv_proto::wire::{LeaderHint, WireError, WrongShard};

    use crate::error::ConnectError;

    use super::*;

    /// The shape of a step, to compare in a table.
    #[derive(Debug, PartialEq, Eq)]
    enum Shape {
        Done,
        Fail(&'static str, bool),
        Retry(&'static str, bool, BackOff),
        Redirect(String, &'static str),
        Remap(u64),
        GiveUp,
    }

    /// The error's variant name, enough to tell the rules apart.
    fn kind(error: &Error) -> &'static str {
        match error {
            Error::Connect(ConnectError::Handshake { .. }) => "Handshake",
            Error::Connect(_) => "Connect",
            Error::Server(_) => "Server",
            Error::Timeout(_) => "Timeout",
            Error::NoLeader => "NoLeader",
            Error::OutcomeUnknown { .. } => "OutcomeUnknown",
            Error::ConnectionLost { .. } => "ConnectionLost",
            Error::Protocol(_) => "Protocol",
            _ => "other",
        }
    }

    fn shape(step: &Step) -> Shape {
        match step {
            Step::Done(_) => Shape::Done,
            Step::Fail { error, suspect } => Shape::Fail(kind(error), *suspect),
            Step::Retry {
                error,
                skip_node,
                back_off,
            } => Shape::Retry(kind(error), *skip_node, *back_off),
            Step::Redirect { to, error } => Shape::Redirect(to.clone(), kind(error)),
            Step::Remap { at_least } => Shape::Remap(*at_least),
            Step::GiveUp => Shape::GiveUp,
        }
    }

    /// When an attempt happens in its call.
    #[derive(Debug, Clone, Copy)]
    enum When {
        /// Before the deadline.
        InTime,
        /// Past the deadline, on the call's first attempt.
        LateFirst,
        /// Past the deadline, after an attempt that failed.
        LateAgain,
    }

    fn attempt(idempotence: Idempotence, when: When) -> Attempt<'static> {
        Attempt {
            addr: "a",
            idempotence,
            request_timeout: Duration::from_secs(5),
            elapsed: Duration::from_secs(1),
            past_deadline: !matches!(when, When::InTime),
            earlier_error: matches!(when, When::LateAgain),
        }
    }

    fn reply(code: ErrorCode, hint: Option<&str>) -> Outcome {
        let mut reply = ErrorReply::new(code, "refused");
        reply.leader_hint = hint.map(|addr| LeaderHint {
            node_id: 2,
            client_addr: addr.to_owned(),
        });
        Outcome::Replied(Response::Error(reply))
    }

    fn wrong_shard() -> Outcome {
        Outcome::Replied(Response::WrongShard(WrongShard {
            map_version: 7,
            slot: key_slot(b"foo"),
            shard: ShardId(1),
        }))
    }

    fn connect_error() -> Outcome {
        Outcome::Unreachable(Error::Connect(ConnectError::Connect {
            addr: "a".into(),
            source: std::io::Error::other("refused"),
        }))
    }

    fn handshake(code: ErrorCode) -> Outcome {
        Outcome::Unreachable(Error::Connect(ConnectError::Handshake {
            addr: "a".into(),
            code,
            message: "no".into(),
        }))
    }

    fn wire_error() -> WireError {
        WireError::FrameTooLarge {
            len_bytes: 2,
            max_bytes: 1,
        }
    }

    fn failed(e: CallError) -> Outcome {
        Outcome::CallFailed(e)
    }

    fn not_sent(timed_out: bool) -> Outcome {
        failed(CallError::NotSent {
            reason: "closed".into(),
            timed_out,
        })
    }

    fn lost() -> Outcome {
        failed(CallError::Lost {
            reason: "reset".into(),
        })
    }

    /// One row of the table: what happened, to a read or a write, when, and
    /// the step that must follow.
    type Row = (&'static str, fn() -> Outcome, Idempotence, When, Shape);

    /// Every outcome, for reads and for writes.
    #[test]
    fn every_outcome_maps_to_its_step() {
        use BackOff::{AfterRound, Always};
        use ErrorCode as C;
        use Idempotence::{Read, Write};
        use Shape::*;
        use When::{InTime, LateAgain, LateFirst};
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("an answer", || Outcome::Replied(Response::Pong), Read, InTime, Done),
            ("an answer to a write", || Outcome::Replied(Response::Done), Write, InTime, Done),
            ("connect refused", connect_error, Read, InTime, Retry("Connect", true, AfterRound)),
            ("connect refused, write", connect_error, Write, InTime, Retry("Connect", true, AfterRound)),
            ("connect cut by the deadline", connect_error, Write, LateAgain, GiveUp),
            // With nothing better to report, the node is skipped: the next call
            // must not go back to a node that never answers (a frozen leader).
            ("first connect cut by the deadline", connect_error, Write, LateFirst, Retry("Connect", true, AfterRound)),
            ("bad token", || handshake(C::Unauthenticated), Read, InTime, Fail("Handshake", false)),
            ("handshake Unavailable", || handshake(C::Unavailable), Read, InTime, Retry("Handshake", true, AfterRound)),
            ("no reply in time", || failed(CallError::TimedOut), Read, InTime, Fail("Timeout", true)),
            ("no reply in time, write", || failed(CallError::TimedOut), Write, InTime, Fail("OutcomeUnknown", true)),
            ("no credit before the deadline", || not_sent(true), Write, InTime, GiveUp),
            ("not sent, channel closed", || not_sent(false), Read, InTime, Retry("ConnectionLost", true, AfterRound)),
            ("not sent, channel closed, write", || not_sent(false), Write, InTime, Retry("ConnectionLost", true, AfterRound)),
            ("lost after sending", lost, Read, InTime, Retry("ConnectionLost", true, AfterRound)),
            ("lost after sending, write", lost, Write, InTime, Fail("OutcomeUnknown", false)),
            ("undecodable reply", || failed(CallError::Decode(wire_error())), Read, InTime, Fail("Protocol", false)),
            ("unencodable request", || failed(CallError::Encode(wire_error())), Write, InTime, Fail("Protocol", false)),
            ("NotLeader, hint", || reply(C::NotLeader, Some("b")), Write, InTime, Redirect("b".into(), "NoLeader")),
            ("Unavailable, hint", || reply(C::Unavailable, Some("b")), Read, InTime, Redirect("b".into(), "Server")),
            ("NotLeader, hint at itself", || reply(C::NotLeader, Some("a")), Write, InTime, Retry("NoLeader", true, Always)),
            ("NotLeader, no hint", || reply(C::NotLeader, None), Write, InTime, Retry("NoLeader", true, Always)),
            ("Unavailable, no hint", || reply(C::Unavailable, None), Write, InTime, Retry("Server", true, Always)),
            ("StaleFollower", || reply(C::StaleFollower, None), Read, InTime, Retry("Server", true, Always)),
            ("StaleFollower, hint", || reply(C::StaleFollower, Some("b")), Read, InTime, Retry("Server", true, Always)),
            ("TooManyInFlight", || reply(C::TooManyInFlight, None), Write, InTime, Retry("Server", false, Always)),
            ("server Timeout", || reply(C::Timeout, None), Read, InTime, Retry("Server", false, Always)),
            ("server Timeout, write", || reply(C::Timeout, None), Write, InTime, Fail("OutcomeUnknown", false)),
            ("InvalidRequest", || reply(C::InvalidRequest, None), Read, InTime, Fail("Server", false)),
            ("Unauthenticated", || reply(C::Unauthenticated, None), Write, InTime, Fail("Server", false)),
            // Nothing was proposed: a write is sent again once the map is as new.
            ("WrongShard", wrong_shard, Read, InTime, Remap(7)),
            ("WrongShard, write", wrong_shard, Write, InTime, Remap(7)),
        ];
        for (name, outcome, idempotence, when, expected) in rows {
            let step = next_step(outcome(), &attempt(idempotence, when));
            assert_eq!(shape(&step), expected, "{name}");
        }
    }

    #[test]
    fn a_direct_request_is_never_retried() {
        let elapsed = Duration::from_millis(3);
        let got = direct_result(lost(), "a", elapsed);
        assert!(matches!(got, Err(Error::ConnectionLost { .. })), "{got:?}");
        let got = direct_result(not_sent(true), "a", elapsed);
        assert!(
            matches!(got, Err(Error::Timeout(e)) if e == elapsed),
            "{got:?}"
        );
        let got = direct_result(reply(ErrorCode::NotLeader, Some("b")), "a", elapsed);
        assert!(matches!(got, Err(Error::Server(_))), "{got:?}");
        let got = direct_result(Outcome::Replied(Response::Pong), "a", elapsed);
        assert!(matches!(got, Ok(Response::Pong)), "{got:?}");
    }
}
