//! The length + CRC framing of every file rdkv writes
//! (`rdkv_storage::record`): Raft log segments, snapshots, vote and meta.
//! After a crash a file may end in a torn record, and a disk may return
//! garbage, so decoding must classify, never panic or over-read.
//!
//! Input: two bytes choosing the payload bound, then a file's bytes. Checked:
//! - `decode_record` never panics, with a tight bound and with none;
//! - a decoded record lies inside the input, its payload respects the bound
//!   and its CRC matches; re-encoding the payload gives back exactly the
//!   bytes it occupied (the framing is canonical);
//! - walking the input record by record ends in a clean end or an error,
//!   never a loop;
//! - round trip: the input's bytes cut into payloads and encoded with
//!   `encode_record` decode back to the same payloads, and truncating that
//!   file anywhere inside the last record yields `Truncated`, never a record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdkv_storage::record::{RECORD_HEADER_BYTES, RecordError, decode_record, encode_record};

fuzz_target!(|data: &[u8]| {
    let Some((bound, bytes)) = data.split_first_chunk::<2>() else {
        return;
    };
    let max_payload_bytes = u64::from(u16::from_le_bytes(*bound));
    check_walk(bytes, max_payload_bytes);
    check_walk(bytes, u64::MAX);
    round_trip(bytes, max_payload_bytes);
});

/// Decodes records back to back, as a segment scan does.
fn check_walk(bytes: &[u8], max_payload_bytes: u64) {
    let mut rest = bytes;
    while !rest.is_empty() {
        match decode_record(rest, max_payload_bytes) {
            Ok((payload, used)) => {
                assert_eq!(used, RECORD_HEADER_BYTES + payload.len());
                assert!(used <= rest.len(), "record extends past the input");
                assert!(payload.len() as u64 <= max_payload_bytes);
                assert_eq!(payload, &rest[RECORD_HEADER_BYTES..used]);
                let stored = u32::from_le_bytes(rest[4..8].try_into().unwrap());
                assert_eq!(stored, crc32fast::hash(payload));
                let mut encoded = Vec::new();
                encode_record(payload, &mut encoded);
                assert_eq!(&encoded[..], &rest[..used]);
                rest = &rest[used..];
            }
            Err(RecordError::Truncated { need, have }) => {
                assert_eq!(have, rest.len() as u64);
                assert!(need > have);
                return;
            }
            Err(RecordError::TooLarge { len, max }) => {
                assert!(len > max);
                return;
            }
            Err(RecordError::Checksum { stored, computed }) => {
                assert_ne!(stored, computed);
                return;
            }
        }
    }
}

/// Cuts `bytes` into payloads (each at most the bound, sizes taken from the
/// bytes themselves), encodes them into one file and reads it back.
fn round_trip(bytes: &[u8], max_payload_bytes: u64) {
    let max = usize::try_from(max_payload_bytes).unwrap();
    let mut payloads = Vec::new();
    let mut rest = bytes;
    while let Some((&size, tail)) = rest.split_first() {
        let n = usize::from(size).min(max).min(tail.len());
        payloads.push(&tail[..n]);
        rest = &tail[n..];
    }
    let mut file = Vec::new();
    for payload in &payloads {
        encode_record(payload, &mut file);
    }
    let mut at = 0;
    for payload in &payloads {
        let (decoded, used) = decode_record(&file[at..], max_payload_bytes).unwrap();
        assert_eq!(decoded, *payload);
        at += used;
    }
    assert_eq!(at, file.len());
    // A torn tail: every cut inside the last record is reported as truncation.
    if let Some(last) = payloads.last() {
        let last_start = file.len() - RECORD_HEADER_BYTES - last.len();
        for cut in last_start..file.len() {
            assert!(matches!(
                decode_record(&file[last_start..cut], max_payload_bytes),
                Err(RecordError::Truncated { .. })
            ));
        }
    }
}
