//! The native protocol's framing and message decoding (`rdkv_proto::wire`).
//!
//! Input: one control byte (how to split the stream) and the stream itself.
//! The stream is decoded twice, whole and in fuzzer-chosen chunks, by a
//! `FrameDecoder` with a small limit, and every frame's payload is decoded as
//! each message type. Checked:
//! - nothing panics (the hostile-input policy of `wire/mod.rs`);
//! - chunking never changes the frames or the error (a TCP stream can be
//!   split anywhere);
//! - the frames re-encode to exactly the bytes they were taken from (the frame
//!   header is fixed-width, so framing is canonical);
//! - a length over the limit is refused without growing the buffer, and the
//!   buffer never grows past what the limit allows;
//! - a decoded message re-encodes to a frame that decodes to the same message,
//!   and that re-encoding is a fixed point (postcard output is canonical even
//!   when the input used over-long varints).
#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use rdkv_proto::wire::{
    ClientHello, Frame, FrameDecoder, FrameKind, Limits, MIN_BODY_BYTES, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION, Request, Response, ServerHello, ShmGrant, WireError, decode_payload,
    encode_frame, negotiate,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Small enough that the fuzzer reaches it, large enough for real messages.
const MAX_FRAME_BYTES: u32 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let (whole, whole_err, whole_rest) = decode_stream(stream, &[stream.len()]);
    let (chunked, chunked_err, chunked_rest) = decode_stream(stream, &chunk_sizes(split, stream));
    assert_eq!(whole, chunked, "chunking changed the frames");
    assert_eq!(whole_err, chunked_err, "chunking changed the error");
    if whole_err.is_none() {
        // (After an error the stream is dead and what sits in the buffer
        // depends on how much had arrived, so only compare clean runs.)
        assert_eq!(whole_rest, chunked_rest, "chunking changed what is left");
    }

    // Re-encoding the frames gives back the consumed prefix of the stream.
    let mut reencoded = Vec::new();
    for frame in &whole {
        let body_len = u32::try_from(frame.payload.len()).unwrap() + MIN_BODY_BYTES;
        assert!(
            body_len <= MAX_FRAME_BYTES,
            "a frame over the limit was accepted"
        );
        reencoded.put_u32_le(body_len);
        reencoded.put_u8(frame.kind.as_u8());
        reencoded.put_u64_le(frame.request_id);
        reencoded.extend_from_slice(&frame.payload);
    }
    assert_eq!(&stream[..reencoded.len()], &reencoded[..]);
    if whole_err.is_none() {
        assert_eq!(&stream[reencoded.len()..], &whole_rest[..]);
    }

    for frame in &whole {
        check_payload::<Request>(frame, |request| {
            let _ = request.validate(&Limits::default());
        });
        check_payload::<Response>(frame, |_| {});
        check_payload::<ClientHello>(frame, |hello| {
            let _ = negotiate(hello, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION);
        });
        check_payload::<ServerHello>(frame, |_| {});
        if let Ok(grant) = ShmGrant::decode(&frame.payload) {
            // Same canonical round trip for the shm attach reply.
            if let Some(encoded) = grant.encode() {
                assert_eq!(ShmGrant::decode(&encoded[4..]).as_ref(), Ok(&grant));
            }
        }
    }
});

/// Chunk lengths (cycled) derived from one byte: 1..=16 bytes, so that every
/// boundary (inside the length prefix, at the kind byte, inside the payload)
/// gets hit.
fn chunk_sizes(split: u8, stream: &[u8]) -> Vec<usize> {
    let first = usize::from(split & 0x0f) + 1;
    let second = usize::from(split >> 4) + 1;
    if stream.is_empty() {
        vec![1]
    } else {
        vec![first, second]
    }
}

/// Feeds `stream` in chunks of the (cycled) `sizes`, decoding after each
/// chunk until the decoder wants more; stops at the first error.
fn decode_stream(stream: &[u8], sizes: &[usize]) -> (Vec<Frame>, Option<WireError>, BytesMut) {
    let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = stream;
    let mut sizes = sizes.iter().cycle();
    loop {
        let n = (*sizes.next().unwrap()).clamp(1, rest.len().max(1));
        let (chunk, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        buf.extend_from_slice(chunk);
        loop {
            let capacity_before = buf.capacity();
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(error) => {
                    if matches!(error, WireError::FrameTooLarge { .. }) {
                        // Refused on the prefix alone: nothing was reserved.
                        assert_eq!(buf.capacity(), capacity_before);
                    }
                    return (frames, Some(error), buf);
                }
            }
            // Growth is bounded by what is buffered plus one frame of at
            // most the limit (BytesMut may round up by doubling).
            let bound = 2 * (stream.len() + MAX_FRAME_BYTES as usize + 4) + 64;
            assert!(buf.capacity() <= bound, "buffer grew past the frame limit");
        }
        if rest.is_empty() {
            return (frames, None, buf);
        }
    }
}

/// If the frame's payload decodes as `T`: run `also`, re-encode it, decode
/// that again (must be equal) and re-encode once more (must be identical).
fn check_payload<T>(frame: &Frame, also: impl FnOnce(&T))
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let Ok(msg) = decode_payload::<T>(frame) else {
        return;
    };
    also(&msg);
    let first = reencode(frame.kind, frame.request_id, &msg);
    let mut buf = first.clone();
    let again = FrameDecoder::new(MAX_FRAME_BYTES)
        .decode(&mut buf)
        .expect("a re-encoded frame decodes")
        .expect("a re-encoded frame is complete");
    assert!(buf.is_empty());
    assert_eq!(
        (again.kind, again.request_id),
        (frame.kind, frame.request_id)
    );
    let decoded = decode_payload::<T>(&again).expect("a re-encoded payload decodes");
    assert_eq!(decoded, msg, "the message changed in a round trip");
    assert_eq!(reencode(frame.kind, frame.request_id, &decoded), first);
}

fn reencode<T: Serialize>(kind: FrameKind, request_id: u64, msg: &T) -> BytesMut {
    let mut out = BytesMut::new();
    // Canonical postcard is never longer than what was decoded, which fitted
    // the limit, so this cannot fail.
    encode_frame(kind, request_id, msg, MAX_FRAME_BYTES, &mut out)
        .expect("a decoded message re-encodes within the limit");
    out
}
