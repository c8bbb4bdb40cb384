//! Framing: pipelining, length checks before allocation, kinds, trailing bytes and
//! hostile length fields inside payloads.

use bytes::{BufMut, Bytes, BytesMut};
use rdkv_proto::wire::{
    ClientHello, Consistency, DEFAULT_MAX_FRAME_BYTES, ErrorCode, FRAME_HEADER_BYTES, Frame,
    FrameDecoder, FrameKind, HARD_MAX_BATCH_ENTRIES, Request, Response, ServerHello, WireError,
    decode_payload, encode_frame,
};

fn raw_frame(body_len: u32, kind: u8, request_id: u64, payload: &[u8]) -> BytesMut {
    let mut buf = BytesMut::new();
    buf.put_u32_le(body_len);
    buf.put_u8(kind);
    buf.put_u64_le(request_id);
    buf.put_slice(payload);
    buf
}

fn frame_with_payload(kind: FrameKind, payload: &[u8]) -> Frame {
    Frame {
        kind,
        request_id: 7,
        payload: Bytes::copy_from_slice(payload),
    }
}

fn sample_requests() -> Vec<Request> {
    vec![
        Request::Ping,
        Request::Get {
            key: Bytes::from_static(b"alpha"),
            consistency: Consistency::Follower { max_lag_entries: 3 },
        },
        Request::Put {
            key: Bytes::from_static(b"k"),
            value: Bytes::from(vec![0xAB; 3000]),
        },
        Request::MGet {
            keys: vec![Bytes::from_static(b"a"), Bytes::new()],
            consistency: Consistency::Linearizable,
        },
        Request::Cas {
            key: Bytes::from_static(b"c"),
            expected_version: None,
            new_value: Some(Bytes::from_static(b"v")),
        },
    ]
}

#[test]
fn pipelined_frames_fed_one_byte_at_a_time_come_out_in_order() {
    let requests = sample_requests();
    let mut wire = BytesMut::new();
    for (i, req) in requests.iter().enumerate() {
        let id = 1000 + i as u64 * 3;
        encode_frame(
            FrameKind::Request,
            id,
            req,
            DEFAULT_MAX_FRAME_BYTES,
            &mut wire,
        )
        .unwrap();
    }

    let mut decoder = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for byte in wire.iter() {
        buf.put_u8(*byte);
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            got.push(frame);
        }
    }
    assert!(buf.is_empty());
    assert_eq!(got.len(), requests.len());
    for (i, (frame, req)) in got.iter().zip(&requests).enumerate() {
        assert_eq!(frame.kind, FrameKind::Request);
        assert_eq!(frame.request_id, 1000 + i as u64 * 3);
        assert_eq!(&decode_payload::<Request>(frame).unwrap(), req);
    }
}

#[test]
fn oversized_length_is_rejected_without_growing_the_buffer() {
    let max = 1024;
    let mut buf = BytesMut::with_capacity(16);
    buf.put_u32_le(u32::MAX);
    buf.put_u8(FrameKind::Request.as_u8());
    let capacity_before = buf.capacity();
    let len_before = buf.len();

    let err = FrameDecoder::new(max).decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        WireError::FrameTooLarge {
            len_bytes: u64::from(u32::MAX),
            max_bytes: max
        }
    );
    assert!(err.closes_connection());
    assert_eq!(buf.capacity(), capacity_before);
    assert_eq!(buf.len(), len_before);

    // One past the limit is the boundary that matters.
    let mut buf = BytesMut::with_capacity(8);
    buf.put_u32_le(max + 1);
    let capacity_before = buf.capacity();
    assert!(matches!(
        FrameDecoder::new(max).decode(&mut buf),
        Err(WireError::FrameTooLarge { len_bytes, .. }) if len_bytes == u64::from(max) + 1
    ));
    assert_eq!(buf.capacity(), capacity_before);
}

#[test]
fn frame_of_exactly_the_max_is_accepted_and_one_more_is_refused_by_the_encoder() {
    let max = 64u32;
    // A Bytes payload of n bytes encodes as 1 length byte + n; body = 9 + 1 + n.
    let fitting = Bytes::from(vec![1u8; (max - 10) as usize]);
    let mut wire = BytesMut::new();
    encode_frame(FrameKind::Response, 5, &fitting, max, &mut wire).unwrap();
    assert_eq!(wire.len(), 4 + max as usize);
    let frame = FrameDecoder::new(max).decode(&mut wire).unwrap().unwrap();
    assert_eq!(frame.payload.len(), 4 + max as usize - FRAME_HEADER_BYTES);
    assert_eq!(decode_payload::<Bytes>(&frame).unwrap(), fitting);

    let mut dst = BytesMut::from(&b"keep"[..]);
    let too_big = Bytes::from(vec![1u8; (max - 9) as usize]);
    let err = encode_frame(FrameKind::Response, 5, &too_big, max, &mut dst).unwrap_err();
    assert_eq!(
        err,
        WireError::FrameTooLarge {
            len_bytes: u64::from(max) + 1,
            max_bytes: max
        }
    );
    assert_eq!(
        &dst[..],
        b"keep",
        "a refused frame must leave dst as it was"
    );
}

#[test]
fn encoder_counts_but_does_not_store_a_huge_message() {
    let huge = Bytes::from(vec![0u8; 4 * 1024 * 1024]);
    let mut dst = BytesMut::new();
    let err = encode_frame(FrameKind::Response, 1, &huge, 1024, &mut dst).unwrap_err();
    assert!(
        matches!(err, WireError::FrameTooLarge { len_bytes, .. } if len_bytes > 4 * 1024 * 1024)
    );
    assert!(dst.is_empty());
    assert!(dst.capacity() < 64 * 1024, "capacity {}", dst.capacity());
}

#[test]
fn body_shorter_than_kind_and_request_id_is_rejected() {
    for body_len in 0..9 {
        let mut buf = raw_frame(body_len, 3, 1, &[]);
        assert_eq!(
            FrameDecoder::default().decode(&mut buf),
            Err(WireError::FrameTooShort {
                len_bytes: body_len
            }),
            "body_len {body_len}"
        );
    }
    let mut ok = raw_frame(9, 3, 1, &[]);
    let frame = FrameDecoder::default().decode(&mut ok).unwrap().unwrap();
    assert!(frame.payload.is_empty());
}

#[test]
fn unknown_kind_is_rejected_as_soon_as_the_kind_byte_arrives() {
    for kind in [0u8, 6, 0x7F, 0xFF] {
        let mut buf = BytesMut::new();
        buf.put_u32_le(100);
        buf.put_u8(kind);
        assert_eq!(
            FrameDecoder::default().decode(&mut buf),
            Err(WireError::UnknownFrameKind(kind))
        );
    }
    for kind in 1..=5u8 {
        let mut buf = raw_frame(9, kind, 42, &[]);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(frame.kind.as_u8(), kind);
        assert_eq!(frame.request_id, 42);
    }
}

#[test]
fn partial_header_needs_more_bytes() {
    let full = raw_frame(12, 4, 9, b"abc");
    for cut in 0..full.len() {
        let mut buf = BytesMut::from(&full[..cut]);
        assert_eq!(
            FrameDecoder::default().decode(&mut buf),
            Ok(None),
            "cut {cut}"
        );
        assert_eq!(buf.len(), cut);
    }
}

#[test]
fn trailing_bytes_after_a_message_are_rejected() {
    let mut payload = postcard::to_stdvec(&Request::Ping).unwrap();
    payload.extend_from_slice(&[0, 0]);
    let frame = frame_with_payload(FrameKind::Request, &payload);
    assert_eq!(
        decode_payload::<Request>(&frame),
        Err(WireError::TrailingBytes { n_bytes: 2 })
    );
    let err = decode_payload::<Request>(&frame).unwrap_err();
    assert!(!err.closes_connection());
    assert_eq!(ErrorCode::from(&err), ErrorCode::Malformed);
}

#[test]
fn expect_kind_reports_a_mismatch() {
    let frame = frame_with_payload(FrameKind::Response, &[]);
    assert!(frame.expect_kind(FrameKind::Response).is_ok());
    assert_eq!(
        frame.expect_kind(FrameKind::ServerHello),
        Err(WireError::UnexpectedFrameKind {
            expected: FrameKind::ServerHello,
            found: FrameKind::Response
        })
    );
}

/// Varint of 2^32 (postcard LEB128).
const VARINT_2_POW_32: [u8; 5] = [0x80, 0x80, 0x80, 0x80, 0x10];

#[test]
fn huge_announced_lengths_fail_fast_without_allocating() {
    // Each case must fail as a decode error of its own bytes (the announced
    // length is checked against what is there); no clock: a time bound
    // fails on a loaded machine and proves nothing about allocation (the
    // frame_decoder fuzz target checks that under -malloc_limit_mb).
    let cases: [(&str, Vec<u8>); 4] = [
        // Request::MGet and Response::Values are both variant 4.
        ("mget keys", [&[4u8][..], &VARINT_2_POW_32].concat()),
        ("values", [&[4u8][..], &VARINT_2_POW_32].concat()),
        // Request::Put with a key claiming 2^32 bytes.
        ("put key", [&[1u8][..], &VARINT_2_POW_32, b"xy"].concat()),
        // MPut announcing 65535 pairs (just under the hard cap) in a handful of bytes.
        ("mput pairs", vec![5, 0xFF, 0xFF, 0x03, 0, 0]),
    ];
    for (what, payload) in &cases {
        let frame = frame_with_payload(FrameKind::Request, payload);
        let err = if *what == "values" {
            decode_payload::<Response>(&frame).map(|_| ()).unwrap_err()
        } else {
            decode_payload::<Request>(&frame).map(|_| ()).unwrap_err()
        };
        assert!(matches!(err, WireError::Decode(_)), "{what}: {err:?}");
    }
    let hello = [&b"RDKV"[..], &[1, 1, 0], &VARINT_2_POW_32, b"n"].concat();
    let frame = frame_with_payload(FrameKind::ClientHello, &hello);
    assert!(decode_payload::<ClientHello>(&frame).is_err());
    let frame = frame_with_payload(
        FrameKind::ServerHello,
        &[1, 0, 0x80, 0x80, 0x80, 0x80, 0x10],
    );
    assert!(decode_payload::<ServerHello>(&frame).is_err());
}

#[test]
fn batch_over_the_hard_cap_is_rejected_while_decoding() {
    let n = HARD_MAX_BATCH_ENTRIES as usize + 1;
    let over = Request::MGet {
        keys: vec![Bytes::new(); n],
        consistency: Consistency::Lease,
    };
    let frame = frame_with_payload(FrameKind::Request, &postcard::to_stdvec(&over).unwrap());
    assert!(matches!(
        decode_payload::<Request>(&frame),
        Err(WireError::Decode(_))
    ));

    let at_cap = Request::MGet {
        keys: vec![Bytes::new(); n - 1],
        consistency: Consistency::Lease,
    };
    let frame = frame_with_payload(FrameKind::Request, &postcard::to_stdvec(&at_cap).unwrap());
    assert_eq!(decode_payload::<Request>(&frame).unwrap(), at_cap);
}

#[test]
fn enum_indices_are_pinned() {
    // Reordering variants would break old peers silently; these bytes are the contract.
    let enc = |v: &dyn erased::Enc| v.bytes();
    assert_eq!(enc(&Request::Ping), [6]);
    assert_eq!(enc(&Response::Pong), [6]);
    assert_eq!(enc(&ErrorCode::NotLeader), [0]);
    assert_eq!(enc(&ErrorCode::TooManyInFlight), [12]);
    assert_eq!(enc(&ErrorCode::Internal), [14]);
    assert_eq!(enc(&ErrorCode::Unknown), [15]);
    assert_eq!(enc(&ErrorCode::NotFound), [16]);
    assert_eq!(enc(&ErrorCode::InvalidRequest), [17]);
    assert_eq!(enc(&Request::Status), [7]);
    assert_eq!(enc(&Consistency::default()), [1]);
    assert_eq!(
        postcard::from_bytes::<ErrorCode>(&[100]),
        Ok(ErrorCode::Unknown)
    );
    // 200 as a varint.
    assert_eq!(
        postcard::from_bytes::<ErrorCode>(&[0xC8, 0x01]),
        Ok(ErrorCode::Unknown)
    );
    assert_eq!(
        postcard::from_bytes::<ErrorCode>(&[7]),
        Ok(ErrorCode::Unauthenticated)
    );
}

mod erased {
    pub trait Enc {
        fn bytes(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Enc for T {
        fn bytes(&self) -> Vec<u8> {
            postcard::to_stdvec(self).unwrap()
        }
    }
}

#[test]
fn a_decoder_reports_the_limit_it_enforces() {
    let decoder = FrameDecoder::new(4096);
    assert_eq!(decoder.max_frame_bytes(), 4096);
    assert_eq!(
        FrameDecoder::default().max_frame_bytes(),
        DEFAULT_MAX_FRAME_BYTES
    );
}

/// A partial frame reserves room for the rest of it, so the body is read
/// without reallocating on every chunk.
#[test]
fn a_partial_frame_reserves_room_for_its_whole_length() {
    let body_len = 100_000u32;
    let mut buf = raw_frame(body_len, FrameKind::Request as u8, 1, &[0; 16]);
    let total = 4 + body_len as usize;
    assert_eq!(FrameDecoder::default().decode(&mut buf).unwrap(), None);
    assert!(buf.capacity() >= total, "{} < {total}", buf.capacity());
}
