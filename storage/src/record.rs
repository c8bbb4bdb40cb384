//! Length- and CRC-framed records, the unit of every file rdkv writes (the Raft
//! log's segments, snapshots, the vote and meta files):
//!
//! ```text
//! [u32 LE payload_len][u32 LE crc32(payload)][payload]
//! ```
//!
//! A reader bounds `payload_len` before allocating, so a corrupt length can
//! neither allocate without bound nor be mistaken for data.

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
    debug_assert!(u32::try_from(payload.len()).is_ok());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
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
    let mut len = [0u8; 4];
    len.copy_from_slice(&header[..4]);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&header[4..]);
    let len = u64::from(u32::from_le_bytes(len));
    let stored = u32::from_le_bytes(crc);
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
