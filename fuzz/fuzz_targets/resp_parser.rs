//! The RESP2 request parser (`rdkv_server::resp::parse`).
//!
//! Input: one control byte (where to split, which limits) and the bytes a
//! Redis client sent. Checked:
//! - nothing panics (the parser faces unauthenticated peers);
//! - a parsed command never claims more bytes than it was given, and never
//!   more than the command limit (so the server buffers at most one bounded
//!   command);
//! - `parse_command` does not consume: asking twice gives the same answer;
//! - parsing is independent of how the bytes arrived: the whole input, and
//!   the same input in two pieces with the connection loop's
//!   `next_command` in between, give the same commands and the same error.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use rdkv_server::resp::parse::{ParseLimits, Parsed, ProtocolError, next_command, parse_command};

/// What a node allows before AUTH (the same values as the server's
/// `UNAUTHENTICATED_LIMITS`): small, so the fuzzer reaches every limit.
const SMALL: ParseLimits = ParseLimits {
    max_bulk_bytes: 4096,
    max_array_len: 16,
    max_inline_bytes: 4096,
    max_command_bytes: 16 * 1024,
};

/// Commands taken, the protocol error that stopped the loop, bytes left.
type Outcome = (Vec<Vec<Bytes>>, Option<ProtocolError>, Vec<u8>);

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    // The node's defaults (1 MiB values, 1024-key batches) or the small set.
    let limits = if control & 1 == 0 {
        ParseLimits::default()
    } else {
        SMALL
    };

    // `parse_command` on the raw input: bounded and side-effect free.
    let first = parse_command(input, &limits);
    if let Ok(Parsed::Command { args, len }) = &first {
        assert!(
            *len >= 1 && *len <= input.len(),
            "consumed more than the input"
        );
        assert!(*len <= limits.max_command_bytes.max(limits.max_inline_bytes + 2));
        assert!(args.len() <= limits.max_array_len);
        let arg_bytes: usize = args.iter().map(Bytes::len).sum();
        assert!(
            arg_bytes <= *len,
            "arguments larger than the bytes they came from"
        );
    }
    assert_eq!(first, parse_command(input, &limits), "parsing is not pure");

    // Whole vs two pieces, split at a fuzzer-chosen point.
    let split = if input.is_empty() {
        0
    } else {
        usize::from(control >> 1) * input.len() / 127
    };
    let (whole, whole_err, whole_rest) = run(&[input], &limits);
    let (a, b) = input.split_at(split.min(input.len()));
    let (pieces, pieces_err, pieces_rest) = run(&[a, b], &limits);
    assert_eq!(whole, pieces, "chunking changed the commands");
    assert_eq!(whole_err, pieces_err, "chunking changed the error");
    if whole_err.is_none() {
        // After an error the connection closes; what was still buffered then
        // depends on how much had arrived, so only clean runs must agree.
        assert_eq!(whole_rest, pieces_rest, "chunking changed what is left");
    }
});

/// What the connection loop does: append what arrived, then take commands
/// until one is incomplete; stop at the first protocol error (the server
/// closes the connection). Returns the commands, the error and what is left.
fn run(pieces: &[&[u8]], limits: &ParseLimits) -> Outcome {
    let mut buf = BytesMut::new();
    let mut commands = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.len();
            match next_command(&mut buf, limits) {
                Ok(Some(args)) => {
                    // Every command consumes at least one byte: no livelock.
                    assert!(buf.len() < before);
                    commands.push(args);
                }
                Ok(None) => break,
                Err(error) => return (commands, Some(error), buf.to_vec()),
            }
        }
    }
    (commands, None, buf.to_vec())
}
