//! Length- and CRC-framed records, the unit of every file rdkv writes (the Raft
//! log's segments, snapshots, the vote and meta files):
//!
//! ```text
//! [u32 LE payload_len][u32 LE crc32(payload)][payload]
//! ```
//!
//! A reader bounds `payload_len` before allocating, so a corrupt length can
//! neither allocate without bound nor be mistaken for data.

use std::io::{self, Read};

use thiserror::Error;

pub const RECORD_HEADER_BYTES: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RecordError {
    /// Fewer bytes than the header or the announced payload: the end of a
    /// file that was being written (a torn tail), or truncation.
    #[error("record truncated: need {need} bytes, have {have}")]
    Truncated { need: u64, have: u64 },
    #[error("record length {len} exceeds the limit {max}")]
    TooLarge { len: u64, max: u64 },
    #[error("record checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

/// Appends one framed record to `out`. Payloads are bounded by their writers
/// (entries and snapshot pairs are limited far below 4 GiB).
pub fn encode_record(payload: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
    out.extend_from_slice(payload);
    seal_record(&mut out[start..]);
}

/// Fills in the header of `record`, a header's worth of bytes followed by
/// the payload, from that payload. Why: a writer can reserve the header,
/// encode the payload straight after it and seal it, with no buffer of its
/// own for the payload (the Raft log's appends).
pub fn seal_record(record: &mut [u8]) {
    let Some((header, payload)) = record.split_first_chunk_mut::<RECORD_HEADER_BYTES>() else {
        debug_assert!(false, "a record shorter than its header");
        return;
    };
    debug_assert!(u32::try_from(payload.len()).is_ok());
    header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
}

/// Decodes the record at the start of `bytes`: its payload and the total
/// bytes it occupies.
pub fn decode_record(bytes: &[u8], max_payload_bytes: u64) -> Result<(&[u8], usize), RecordError> {
    let have = bytes.len() as u64;
    let Some(header) = bytes.get(..RECORD_HEADER_BYTES) else {
        return Err(RecordError::Truncated {
            need: RECORD_HEADER_BYTES as u64,
            have,
        });
    };
    let (len, stored) = header_fields(header);
    if len > max_payload_bytes {
        return Err(RecordError::TooLarge {
            len,
            max: max_payload_bytes,
        });
    }
    let end = RECORD_HEADER_BYTES + len as usize;
    let Some(payload) = bytes.get(RECORD_HEADER_BYTES..end) else {
        return Err(RecordError::Truncated {
            need: end as u64,
            have,
        });
    };
    let computed = crc32fast::hash(payload);
    if computed != stored {
        return Err(RecordError::Checksum { stored, computed });
    }
    Ok((payload, end))
}

/// The payload length and stored CRC of a record header.
fn header_fields(header: &[u8]) -> (u64, u32) {
    let mut len = [0u8; 4];
    len.copy_from_slice(&header[..4]);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&header[4..RECORD_HEADER_BYTES]);
    (u64::from(u32::from_le_bytes(len)), u32::from_le_bytes(crc))
}

/// Reads the record at the reader's position into `payload` (reused, grown
/// only up to `max_payload_bytes`): `Ok(None)` at a clean end of input
/// (no byte of a next record), `Truncated` when the input ends inside one.
/// For files too large to hold at once (snapshots read as a stream).
pub fn read_record(
    input: &mut impl Read,
    max_payload_bytes: u64,
    payload: &mut Vec<u8>,
) -> Result<Option<()>, ReadRecordError> {
    let mut header = [0u8; RECORD_HEADER_BYTES];
    let got = read_full(input, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < RECORD_HEADER_BYTES {
        return Err(RecordError::Truncated {
            need: RECORD_HEADER_BYTES as u64,
            have: got as u64,
        }
        .into());
    }
    let (len, stored) = header_fields(&header);
    if len > max_payload_bytes {
        return Err(RecordError::TooLarge {
            len,
            max: max_payload_bytes,
        }
        .into());
    }
    // Bounded by `max_payload_bytes` just above.
    payload.resize(len as usize, 0);
    let got = read_full(input, payload)?;
    if got < payload.len() {
        return Err(RecordError::Truncated {
            need: RECORD_HEADER_BYTES as u64 + len,
            have: (RECORD_HEADER_BYTES + got) as u64,
        }
        .into());
    }
    let computed = crc32fast::hash(payload);
    if computed != stored {
        return Err(RecordError::Checksum { stored, computed }.into());
    }
    Ok(Some(()))
}

/// Why [`read_record`] failed: the record, or the input under it.
#[derive(Debug, Error)]
pub enum ReadRecordError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Fills `buf` as far as the input goes; the bytes read (short only at its end).
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..10)) {
            let mut buf = Vec::new();
            for p in &payloads {
                encode_record(p, &mut buf);
            }
            let mut rest = &buf[..];
            for p in &payloads {
                let (payload, used) = decode_record(rest, 1024).unwrap();
                prop_assert_eq!(payload, &p[..]);
                rest = &rest[used..];
            }
            prop_assert!(rest.is_empty());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_record(&bytes, u64::MAX);
            let _ = decode_record(&bytes, 16);
        }
    }

    #[test]
    fn a_stream_reads_the_same_records_and_tells_a_clean_end_from_a_cut() {
        let mut buf = Vec::new();
        encode_record(b"hello", &mut buf);
        encode_record(b"", &mut buf);
        let mut input = &buf[..];
        let mut payload = Vec::new();
        assert!(read_record(&mut input, 64, &mut payload).unwrap().is_some());
        assert_eq!(payload, b"hello");
        assert!(read_record(&mut input, 64, &mut payload).unwrap().is_some());
        assert!(payload.is_empty());
        assert!(read_record(&mut input, 64, &mut payload).unwrap().is_none());
        for cut in 1..buf.len() - RECORD_HEADER_BYTES {
            let mut input = &buf[..cut];
            let read = read_record(&mut input, 64, &mut payload);
            assert!(
                matches!(
                    read,
                    Err(ReadRecordError::Record(RecordError::Truncated { .. }))
                ),
                "cut at {cut}: {read:?}"
            );
        }
        let mut flipped = buf.clone();
        flipped[9] ^= 1;
        assert!(matches!(
            read_record(&mut &flipped[..], 64, &mut payload),
            Err(ReadRecordError::Record(RecordError::Checksum { .. }))
        ));
        assert!(matches!(
            read_record(&mut &buf[..], 4, &mut payload),
            Err(ReadRecordError::Record(RecordError::TooLarge {
                len: 5,
                max: 4
            }))
        ));
    }

    #[test]
    fn torn_and_corrupt_records_are_told_apart() {
        let mut buf = Vec::new();
        encode_record(b"hello", &mut buf);
        assert!(matches!(
            decode_record(&buf[..10], 64),
            Err(RecordError::Truncated { .. })
        ));
        assert!(matches!(
            decode_record(&buf[..3], 64),
            Err(RecordError::Truncated { .. })
        ));
        let mut flipped = buf.clone();
        flipped[9] ^= 1;
        assert!(matches!(
            decode_record(&flipped, 64),
            Err(RecordError::Checksum { .. })
        ));
        assert!(matches!(
            decode_record(&buf, 4),
            Err(RecordError::TooLarge { len: 5, max: 4 })
        ));
    }
}
