//! Messages over SEND/RECV: each SEND fills one receive buffer of the peer,
//! so a message (one native-protocol frame) larger than a buffer goes out as
//! several fragments, each with a 16-byte header:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind: 1 data, 2 credit update (no payload) |
//! | 1 | 1 | reserved, 0 |
//! | 2 | 2 | reserved, 0 |
//! | 4 | 4 | credits granted (see `credits`) |
//! | 8 | 4 | total message length |
//! | 12 | 4 | this fragment's offset in the message |
//!
//! All little-endian. An RC queue pair delivers SENDs in order and a sender
//! writes a message's fragments back to back (one message at a time per
//! connection), so the receiver expects fragments at consecutive offsets and
//! treats anything else as a protocol error. The total length is checked
//! against the largest frame before anything is allocated.

use thiserror::Error;

pub const FRAGMENT_HEADER_BYTES: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragmentKind {
    Data,
    CreditUpdate,
}

impl FragmentKind {
    fn byte(self) -> u8 {
        match self {
            FragmentKind::Data => 1,
            FragmentKind::CreditUpdate => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FragmentError {
    #[error("received {len_bytes} bytes, shorter than a fragment header")]
    Short { len_bytes: usize },
    #[error("unknown fragment kind {0}")]
    Kind(u8),
    #[error("message of {len_bytes} bytes exceeds the {max_bytes}-byte limit")]
    TooLarge { len_bytes: u64, max_bytes: u64 },
    #[error("fragment at offset {found}, expected {expected} (total {total_bytes})")]
    OutOfOrder {
        found: u32,
        expected: u32,
        total_bytes: u32,
    },
    #[error("fragment of {len_bytes} bytes at {offset} runs past the {total_bytes}-byte message")]
    Overflow {
        offset: u32,
        len_bytes: usize,
        total_bytes: u32,
    },
    #[error("a credit update carries {len_bytes} payload bytes")]
    UpdateWithPayload { len_bytes: usize },
    #[error("an empty fragment of a non-empty message")]
    Empty,
}

/// A parsed received buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    pub kind: FragmentKind,
    pub credits_granted: u32,
    pub total_bytes: u32,
    pub offset: u32,
    pub payload: &'a [u8],
}

/// Writes a fragment header into `out[..FRAGMENT_HEADER_BYTES]`.
pub fn write_header(
    out: &mut [u8; FRAGMENT_HEADER_BYTES],
    kind: FragmentKind,
    credits_granted: u32,
    total_bytes: u32,
    offset: u32,
) {
    out[0] = kind.byte();
    out[1..4].fill(0);
    out[4..8].copy_from_slice(&credits_granted.to_le_bytes());
    out[8..12].copy_from_slice(&total_bytes.to_le_bytes());
    out[12..16].copy_from_slice(&offset.to_le_bytes());
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

/// Parses the bytes a receive completion reported (`byte_len` of them).
pub fn parse(received: &[u8]) -> Result<Fragment<'_>, FragmentError> {
    if received.len() < FRAGMENT_HEADER_BYTES {
        return Err(FragmentError::Short {
            len_bytes: received.len(),
        });
    }
    let kind = match received[0] {
        1 => FragmentKind::Data,
        2 => FragmentKind::CreditUpdate,
        other => return Err(FragmentError::Kind(other)),
    };
    let payload = &received[FRAGMENT_HEADER_BYTES..];
    if kind == FragmentKind::CreditUpdate && !payload.is_empty() {
        return Err(FragmentError::UpdateWithPayload {
            len_bytes: payload.len(),
        });
    }
    Ok(Fragment {
        kind,
        credits_granted: le_u32(received, 4),
        total_bytes: le_u32(received, 8),
        offset: le_u32(received, 12),
        payload,
    })
}

/// How a message of `total_bytes` is cut for buffers carrying at most
/// `max_payload_bytes` after the header: `(offset, len)` per fragment. An
/// empty message is one empty fragment.
pub fn plan(total_bytes: usize, max_payload_bytes: usize) -> impl Iterator<Item = (usize, usize)> {
    let step = max_payload_bytes.max(1);
    let count = total_bytes.div_ceil(step).max(1);
    (0..count).map(move |i| {
        let offset = i * step;
        (offset, step.min(total_bytes - offset))
    })
}

/// Rebuilds messages from in-order fragments.
#[derive(Debug)]
pub struct Reassembler {
    max_message_bytes: u32,
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    total_bytes: u32,
    bytes: Vec<u8>,
}

/// Up-front capacity for a message being reassembled: the announced total is
/// the peer's word, so large messages grow as their fragments arrive.
const MAX_PREALLOC_BYTES: usize = 64 * 1024;

impl Reassembler {
    pub fn new(max_message_bytes: u32) -> Reassembler {
        Reassembler {
            max_message_bytes,
            partial: None,
        }
    }

    /// Feeds one data fragment; returns the message once it is complete.
    pub fn push(&mut self, fragment: &Fragment<'_>) -> Result<Option<Vec<u8>>, FragmentError> {
        let total = fragment.total_bytes;
        if total > self.max_message_bytes {
            return Err(FragmentError::TooLarge {
                len_bytes: u64::from(total),
                max_bytes: u64::from(self.max_message_bytes),
            });
        }
        let expected = self.partial.as_ref().map_or(0, |p| p.bytes.len() as u32);
        if fragment.offset != expected
            || self
                .partial
                .as_ref()
                .is_some_and(|p| p.total_bytes != total)
        {
            return Err(FragmentError::OutOfOrder {
                found: fragment.offset,
                expected,
                total_bytes: total,
            });
        }
        let end = u64::from(fragment.offset) + fragment.payload.len() as u64;
        if end > u64::from(total) {
            return Err(FragmentError::Overflow {
                offset: fragment.offset,
                len_bytes: fragment.payload.len(),
                total_bytes: total,
            });
        }
        if fragment.payload.is_empty() && total > 0 {
            return Err(FragmentError::Empty);
        }
        let partial = self.partial.get_or_insert_with(|| Partial {
            total_bytes: total,
            bytes: Vec::with_capacity((total as usize).min(MAX_PREALLOC_BYTES)),
        });
        partial.bytes.extend_from_slice(fragment.payload);
        if partial.bytes.len() as u64 == u64::from(total) {
            Ok(self.partial.take().map(|p| p.bytes))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragments_of(message: &[u8], max_payload: usize, grant: u32) -> Vec<Vec<u8>> {
        plan(message.len(), max_payload)
            .map(|(offset, len)| {
                let mut header = [0u8; FRAGMENT_HEADER_BYTES];
                write_header(
                    &mut header,
                    FragmentKind::Data,
                    grant,
                    message.len() as u32,
                    offset as u32,
                );
                let mut buf = header.to_vec();
                buf.extend_from_slice(&message[offset..offset + len]);
                buf
            })
            .collect()
    }

    #[test]
    fn large_messages_are_cut_and_rebuilt() {
        for (len, max_payload) in [
            (0usize, 100usize),
            (1, 100),
            (100, 100),
            (101, 100),
            (10_000, 240),
        ] {
            let message: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let buffers = fragments_of(&message, max_payload, 3);
            assert_eq!(buffers.len(), len.div_ceil(max_payload).max(1));
            let mut r = Reassembler::new(1 << 20);
            let mut out = None;
            for (i, buf) in buffers.iter().enumerate() {
                assert!(buf.len() <= FRAGMENT_HEADER_BYTES + max_payload);
                let f = parse(buf).unwrap();
                assert_eq!(f.credits_granted, 3);
                let done = r.push(&f).unwrap();
                assert_eq!(done.is_some(), i == buffers.len() - 1);
                out = done.or(out);
            }
            assert_eq!(out.unwrap(), message);
        }
    }

    #[test]
    fn bad_fragments_are_protocol_errors() {
        assert_eq!(parse(&[1; 5]), Err(FragmentError::Short { len_bytes: 5 }));
        let mut header = [0u8; FRAGMENT_HEADER_BYTES];
        write_header(&mut header, FragmentKind::Data, 0, 10, 0);
        header[0] = 9;
        assert_eq!(parse(&header), Err(FragmentError::Kind(9)));
        let mut update = [0u8; FRAGMENT_HEADER_BYTES + 1];
        let mut h = [0u8; FRAGMENT_HEADER_BYTES];
        write_header(&mut h, FragmentKind::CreditUpdate, 4, 0, 0);
        update[..FRAGMENT_HEADER_BYTES].copy_from_slice(&h);
        assert!(matches!(
            parse(&update),
            Err(FragmentError::UpdateWithPayload { .. })
        ));

        let message = vec![5u8; 300];
        let buffers = fragments_of(&message, 100, 0);
        // Too large for this receiver: refused before any allocation.
        let mut small = Reassembler::new(299);
        assert!(matches!(
            small.push(&parse(&buffers[0]).unwrap()),
            Err(FragmentError::TooLarge { .. })
        ));
        // Skipping a fragment.
        let mut r = Reassembler::new(1000);
        r.push(&parse(&buffers[0]).unwrap()).unwrap();
        assert!(matches!(
            r.push(&parse(&buffers[2]).unwrap()),
            Err(FragmentError::OutOfOrder { .. })
        ));
        // A fragment that claims a different total mid-message.
        let mut r = Reassembler::new(1000);
        r.push(&parse(&buffers[0]).unwrap()).unwrap();
        let mut lying = buffers[1].clone();
        lying[8..12].copy_from_slice(&301u32.to_le_bytes());
        assert!(r.push(&parse(&lying).unwrap()).is_err());
        // A payload running past the total.
        let mut r = Reassembler::new(1000);
        let mut long = buffers[0].clone();
        long[8..12].copy_from_slice(&50u32.to_le_bytes());
        assert!(matches!(
            r.push(&parse(&long).unwrap()),
            Err(FragmentError::Overflow { .. })
        ));
        // An empty fragment of a non-empty message would never finish.
        let mut r = Reassembler::new(1000);
        assert_eq!(
            r.push(&parse(&buffers[0][..FRAGMENT_HEADER_BYTES]).unwrap()),
            Err(FragmentError::Empty)
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_buffers_never_panic(bufs in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 0..8)) {
            let mut r = Reassembler::new(256);
            for buf in &bufs {
                if let Ok(f) = parse(buf)
                    && f.kind == FragmentKind::Data
                    && let Ok(Some(message)) = r.push(&f)
                {
                    proptest::prop_assert!(message.len() <= 256);
                }
            }
        }
    }
}
