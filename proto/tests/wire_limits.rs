//! Request limits and the sanity check on a limits configuration.

use bytes::Bytes;
use rdkv_proto::wire::{
    Consistency, ErrorCode, ErrorReply, HARD_MAX_BATCH_ENTRIES, LimitError, Limits,
    LimitsConfigError, Request, Response,
};

fn key(n: usize) -> Bytes {
    Bytes::from(vec![b'k'; n])
}

fn value(n: usize) -> Bytes {
    Bytes::from(vec![b'v'; n])
}

fn small() -> Limits {
    Limits {
        max_key_bytes: 8,
        max_value_bytes: 32,
        max_batch_keys: 4,
        max_frame_bytes: 1024,
    }
}

#[test]
fn defaults_match_the_design() {
    let limits = Limits::default();
    assert_eq!(limits.max_key_bytes, 1024);
    assert_eq!(limits.max_value_bytes, 1_048_576);
    assert_eq!(limits.max_batch_keys, 1024);
    assert_eq!(limits.max_frame_bytes, 8 * 1024 * 1024);
    assert_eq!(limits.validate_self(), Ok(()));
}

#[test]
fn key_at_max_is_accepted_and_one_more_is_rejected() {
    let limits = Limits::default();
    let max = limits.max_key_bytes as usize;
    let ok = Request::Delete { key: key(max) };
    assert_eq!(ok.validate(&limits), Ok(()));
    let get = Request::Get {
        key: key(max + 1),
        consistency: Consistency::Lease,
    };
    assert_eq!(
        get.validate(&limits),
        Err(LimitError::KeyTooLarge {
            len_bytes: max as u64 + 1,
            max_bytes: limits.max_key_bytes
        })
    );
}

#[test]
fn value_at_max_is_accepted_and_one_more_is_rejected() {
    let limits = Limits::default();
    let max = limits.max_value_bytes as usize;
    let ok = Request::Put {
        key: key(1),
        value: value(max),
    };
    assert_eq!(ok.validate(&limits), Ok(()));
    let too_big = Request::Put {
        key: key(1),
        value: value(max + 1),
    };
    let err = too_big.validate(&limits).unwrap_err();
    assert_eq!(
        err,
        LimitError::ValueTooLarge {
            len_bytes: max as u64 + 1,
            max_bytes: limits.max_value_bytes
        }
    );
    let reply = ErrorReply::from(&err);
    assert_eq!(reply.code, ErrorCode::ValueTooLarge);
    assert!(reply.message.contains("1048577"), "{}", reply.message);
    assert!(reply.message.contains("1048576"), "{}", reply.message);
}

#[test]
fn cas_checks_key_and_new_value() {
    let limits = small();
    let cas = |k: usize, v: Option<usize>| Request::Cas {
        key: key(k),
        expected_version: Some(3),
        new_value: v.map(value),
    };
    assert_eq!(cas(8, Some(32)).validate(&limits), Ok(()));
    assert_eq!(cas(8, None).validate(&limits), Ok(()));
    assert!(matches!(
        cas(9, None).validate(&limits),
        Err(LimitError::KeyTooLarge { .. })
    ));
    assert!(matches!(
        cas(8, Some(33)).validate(&limits),
        Err(LimitError::ValueTooLarge { .. })
    ));
}

#[test]
fn batch_at_max_is_accepted_over_max_and_empty_are_rejected() {
    let limits = small();
    let mget = |n: usize| Request::MGet {
        keys: vec![key(1); n],
        consistency: Consistency::Linearizable,
    };
    let mput = |n: usize| Request::MPut {
        pairs: vec![(key(1), value(1)); n],
    };
    assert_eq!(mget(4).validate(&limits), Ok(()));
    assert_eq!(mput(4).validate(&limits), Ok(()));
    let over = LimitError::BatchTooLarge {
        entries: 5,
        max_entries: 4,
    };
    assert_eq!(mget(5).validate(&limits), Err(over.clone()));
    assert_eq!(mput(5).validate(&limits), Err(over.clone()));
    assert_eq!(ErrorCode::from(&over), ErrorCode::BatchTooLarge);
    assert_eq!(mget(0).validate(&limits), Err(LimitError::EmptyBatch));
    assert_eq!(mput(0).validate(&limits), Err(LimitError::EmptyBatch));

    // A scan's limit is a batch size; its keys are keys.
    let scan = |limit: u32, end_key: Option<Bytes>| Request::Scan {
        start_key: key(1),
        end_key,
        limit,
        consistency: Consistency::Lease,
    };
    assert_eq!(scan(4, Some(key(8))).validate(&limits), Ok(()));
    assert_eq!(scan(5, None).validate(&limits), Err(over));
    assert_eq!(scan(0, None).validate(&limits), Err(LimitError::EmptyBatch));
    assert!(matches!(
        scan(1, Some(key(9))).validate(&limits),
        Err(LimitError::KeyTooLarge { len_bytes: 9, .. })
    ));
}

#[test]
fn every_entry_of_a_batch_is_checked() {
    let limits = small();
    let mget = Request::MGet {
        keys: vec![key(1), key(9)],
        consistency: Consistency::Lease,
    };
    assert!(matches!(
        mget.validate(&limits),
        Err(LimitError::KeyTooLarge { len_bytes: 9, .. })
    ));
    let mput = Request::MPut {
        pairs: vec![(key(1), value(1)), (key(1), value(33))],
    };
    assert!(matches!(
        mput.validate(&limits),
        Err(LimitError::ValueTooLarge { len_bytes: 33, .. })
    ));
    assert_eq!(Request::Ping.validate(&limits), Ok(()));
}

#[test]
fn a_transaction_counts_watched_keys_and_ops_and_checks_each() {
    use rdkv_proto::wire::{TxnOp, Update};
    let limits = small();
    let get = |n| TxnOp::Get { key: key(n) };
    let txn = |watch: Vec<Bytes>, ops: Vec<TxnOp>| Request::Transaction {
        watch: watch.into_iter().map(|k| (k, None)).collect(),
        ops,
    };
    // 4 in all is the batch limit: 2 watched and 2 ops pass, one more fails.
    assert_eq!(
        txn(vec![key(1), key(1)], vec![get(1), get(1)]).validate(&limits),
        Ok(())
    );
    assert!(matches!(
        txn(vec![key(1), key(1)], vec![get(1), get(1), get(1)]).validate(&limits),
        Err(LimitError::BatchTooLarge { .. })
    ));
    assert!(matches!(
        txn(vec![key(1); 5], Vec::new()).validate(&limits),
        Err(LimitError::BatchTooLarge { .. })
    ));
    let too_long = [
        txn(vec![key(9)], Vec::new()),
        txn(Vec::new(), vec![get(9)]),
        txn(Vec::new(), vec![TxnOp::Delete { key: key(9) }]),
        txn(
            Vec::new(),
            vec![TxnOp::Put {
                key: key(9),
                value: value(1),
            }],
        ),
        txn(
            Vec::new(),
            vec![TxnOp::Update {
                key: key(9),
                update: Update::Incr { delta: 1 },
            }],
        ),
        txn(
            Vec::new(),
            vec![TxnOp::Update {
                key: key(1),
                update: Update::CopyFrom {
                    source: key(9),
                    replace: true,
                    remove_source: true,
                },
            }],
        ),
    ];
    for request in too_long {
        assert!(
            matches!(
                request.validate(&limits),
                Err(LimitError::KeyTooLarge { len_bytes: 9, .. })
            ),
            "{request:?}"
        );
    }
    let large_values = [
        TxnOp::Put {
            key: key(1),
            value: value(33),
        },
        TxnOp::Update {
            key: key(1),
            update: Update::Append { suffix: value(33) },
        },
    ];
    for op in large_values {
        assert!(matches!(
            txn(Vec::new(), vec![op]).validate(&limits),
            Err(LimitError::ValueTooLarge { len_bytes: 33, .. })
        ));
    }
}

#[test]
fn nonsensical_configurations_are_rejected() {
    let zero_key = Limits {
        max_key_bytes: 0,
        ..Limits::default()
    };
    assert_eq!(
        zero_key.validate_self(),
        Err(LimitsConfigError::Zero {
            field: "max_key_bytes"
        })
    );

    let over_cap = Limits {
        max_batch_keys: HARD_MAX_BATCH_ENTRIES + 1,
        ..Limits::default()
    };
    assert!(matches!(
        over_cap.validate_self(),
        Err(LimitsConfigError::BatchOverHardCap { .. })
    ));
    let at_cap = Limits {
        max_batch_keys: HARD_MAX_BATCH_ENTRIES,
        ..Limits::default()
    };
    assert_eq!(at_cap.validate_self(), Ok(()));

    let value_bigger_than_frame = Limits {
        max_value_bytes: 16 * 1024 * 1024,
        ..Limits::default()
    };
    assert!(matches!(
        value_bigger_than_frame.validate_self(),
        Err(LimitsConfigError::EntryDoesNotFitFrame { .. })
    ));
    assert_eq!(small().validate_self(), Ok(()));
}

#[test]
fn a_max_size_put_fits_in_a_max_size_frame_under_valid_limits() {
    use bytes::BytesMut;
    use rdkv_proto::wire::{FrameKind, SINGLE_ENTRY_OVERHEAD_BYTES, encode_frame};

    let limits = Limits {
        max_key_bytes: 300,
        max_value_bytes: 70_000,
        max_batch_keys: 1,
        max_frame_bytes: 300 + 70_000 + SINGLE_ENTRY_OVERHEAD_BYTES,
    };
    assert_eq!(limits.validate_self(), Ok(()));
    let mut dst = BytesMut::new();
    let cas = Request::Cas {
        key: key(300),
        expected_version: Some(u64::MAX),
        new_value: Some(value(70_000)),
    };
    encode_frame(
        FrameKind::Request,
        1,
        &cas,
        limits.max_frame_bytes,
        &mut dst,
    )
    .unwrap();
}

/// The codes' names are metrics labels (dashboards select on them) and
/// retryability steers every client's retry loop.
#[test]
fn error_codes_have_their_label_and_retry_rule() {
    assert_eq!(ErrorCode::NotLeader.name(), "not_leader");
    assert_eq!(ErrorCode::NoSpace.name(), "no_space");
    // NoSpace kept RegionFull's wire number: an older peer's code decodes.
    assert_eq!(u32::from(ErrorCode::NoSpace), 6);
    assert_eq!(ErrorCode::TooManyInFlight.name(), "too_many_in_flight");
    for retryable in [
        ErrorCode::NotLeader,
        ErrorCode::Unavailable,
        ErrorCode::StaleFollower,
        ErrorCode::TooManyInFlight,
    ] {
        assert!(retryable.is_retryable(), "{retryable:?}");
    }
    // A timed-out write may have happened; a bad request fails again.
    for final_code in [
        ErrorCode::Timeout,
        ErrorCode::Malformed,
        ErrorCode::NoSpace,
        ErrorCode::Unauthenticated,
    ] {
        assert!(!final_code.is_retryable(), "{final_code:?}");
    }
}

/// What a response shows the answering replica had applied: the largest
/// version it carries (a client's reads must not go back past it).
#[test]
fn a_response_shows_the_highest_index_it_carries() {
    use rdkv_proto::wire::{UpdateOutcome, Versioned};
    let v = |version| Versioned {
        value: Bytes::from_static(b"x"),
        version,
    };
    let cases = [
        (Response::Value(Some(v(7))), Some(7)),
        (Response::Value(None), None),
        (
            Response::Values(vec![Some(v(3)), None, Some(v(9)), Some(v(4))]),
            Some(9),
        ),
        (Response::Values(vec![None]), None),
        (
            Response::Pairs {
                pairs: vec![
                    (Bytes::from_static(b"a"), v(5)),
                    (Bytes::from_static(b"b"), v(2)),
                ],
                more: false,
            },
            Some(5),
        ),
        (Response::Written { version: 11 }, Some(11)),
        (
            Response::Deleted {
                existed: false,
                version: 12,
            },
            Some(12),
        ),
        (
            Response::CasDone {
                succeeded: false,
                version: 13,
                current: None,
            },
            Some(13),
        ),
        (Response::MWritten { version: 14 }, Some(14)),
        (
            Response::Cleared {
                removed: 0,
                version: 15,
            },
            Some(15),
        ),
        (
            Response::Updated(UpdateOutcome::Integer {
                value: 1,
                version: 16,
            }),
            Some(16),
        ),
        (
            Response::Updated(UpdateOutcome::Length {
                len: 1,
                version: 17,
            }),
            Some(17),
        ),
        (
            Response::Updated(UpdateOutcome::Set {
                written: true,
                old: None,
                version: 18,
            }),
            Some(18),
        ),
        (
            Response::Updated(UpdateOutcome::NotAnInteger { version: 19 }),
            Some(19),
        ),
        (
            Response::Updated(UpdateOutcome::TooLarge {
                len: 1,
                version: 20,
            }),
            Some(20),
        ),
        (
            Response::Updated(UpdateOutcome::Copied {
                copied: false,
                source_missing: true,
                version: 21,
            }),
            Some(21),
        ),
        (
            Response::Transaction {
                aborted: true,
                results: Vec::new(),
                version: 22,
            },
            Some(22),
        ),
        (Response::Pong, None),
        (Response::Done, None),
    ];
    for (response, expected) in cases {
        assert_eq!(response.applied_at_least(), expected, "{response:?}");
    }
}
