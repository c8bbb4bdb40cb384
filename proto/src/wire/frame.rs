//! Length-prefixed framing.
//!
//! ```text
//! [u32 LE body_len][u8 kind][u64 LE request_id][payload: postcard bytes]
//!                  \_________________ body_len bytes __________________/
//! ```
//!
//! `body_len` counts kind + request id + payload, so it is at least
//! [`MIN_BODY_BYTES`]; `max_frame_bytes` bounds `body_len` (the 4-byte prefix
//! itself is not counted).

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::WireError;

/// Length prefix + kind + request id.
pub const FRAME_HEADER_BYTES: usize = 13;
/// Kind + request id: the smallest legal `body_len`.
pub const MIN_BODY_BYTES: u32 = 9;
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 8 * 1024 * 1024;

const LEN_PREFIX_BYTES: usize = 4;

/// What a frame's payload contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    ClientHello = 1,
    ServerHello = 2,
    Request = 3,
    Response = 4,
    /// The `shm` attach of a named shard's region (`ShmAttach`, protocol
    /// version 3); a plain attach is a `ClientHello`.
    ShmAttach = 5,
}

impl FrameKind {
    pub const fn as_u8(self) -> u8 {
        self as u8
    }
}

impl TryFrom<u8> for FrameKind {
    type Error = WireError;

    fn try_from(byte: u8) -> Result<Self, WireError> {
        match byte {
            1 => Ok(Self::ClientHello),
            2 => Ok(Self::ServerHello),
            3 => Ok(Self::Request),
            4 => Ok(Self::Response),
            5 => Ok(Self::ShmAttach),
            other => Err(WireError::UnknownFrameKind(other)),
        }
    }
}

/// One decoded frame; the payload is still postcard bytes (see [`decode_payload`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    /// Chosen by the client and echoed in the response, so requests can be pipelined
    /// and answered out of order.
    pub request_id: u64,
    pub payload: Bytes,
}

impl Frame {
    pub fn expect_kind(&self, expected: FrameKind) -> Result<(), WireError> {
        if self.kind == expected {
            Ok(())
        } else {
            Err(WireError::UnexpectedFrameKind {
                expected,
                found: self.kind,
            })
        }
    }
}

/// Incremental decoder over a connection's read buffer.
///
/// After an error the buffer is left untouched and the stream is unusable: the
/// caller should close the connection (see [`WireError::closes_connection`]).
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame_bytes: u32,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl FrameDecoder {
    pub fn new(max_frame_bytes: u32) -> Self {
        Self { max_frame_bytes }
    }

    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Takes one complete frame off the front of `buf`, or returns `Ok(None)` when
    /// more bytes are needed.
    ///
    /// The announced length is checked before anything is reserved, so a hostile
    /// length prefix cannot make us allocate; once it passes, `buf` may be grown
    /// towards the announced (bounded) size to avoid repeated reallocation.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let Some(&prefix) = buf.first_chunk::<LEN_PREFIX_BYTES>() else {
            return Ok(None);
        };
        let body_len = u32::from_le_bytes(prefix);
        if body_len > self.max_frame_bytes {
            return Err(WireError::FrameTooLarge {
                len_bytes: u64::from(body_len),
                max_bytes: self.max_frame_bytes,
            });
        }
        if body_len < MIN_BODY_BYTES {
            return Err(WireError::FrameTooShort {
                len_bytes: body_len,
            });
        }
        // Reject garbage as soon as the kind byte is in, not after buffering a body.
        if let Some(&[_, _, _, _, kind]) = buf.first_chunk::<5>() {
            FrameKind::try_from(kind)?;
        }
        let total_bytes = usize::try_from(body_len)
            .ok()
            .and_then(|n| n.checked_add(LEN_PREFIX_BYTES))
            .ok_or(WireError::FrameTooLarge {
                len_bytes: u64::from(body_len),
                max_bytes: self.max_frame_bytes,
            })?;
        if buf.len() < total_bytes {
            buf.reserve(total_bytes - buf.len());
            return Ok(None);
        }
        let Some(&header) = buf.first_chunk::<FRAME_HEADER_BYTES>() else {
            // Unreachable: total_bytes >= FRAME_HEADER_BYTES was checked above.
            return Ok(None);
        };
        let [_, _, _, _, kind, id @ ..] = header;
        let kind = FrameKind::try_from(kind)?;
        let request_id = u64::from_le_bytes(id);
        let mut frame_bytes = buf.split_to(total_bytes);
        let payload = frame_bytes.split_off(FRAME_HEADER_BYTES).freeze();
        Ok(Some(Frame {
            kind,
            request_id,
            payload,
        }))
    }
}

/// Appends one frame carrying `msg` to `dst`.
///
/// The message is serialised straight into `dst`; bytes beyond the limit are only
/// counted, never stored, so an oversized message costs no memory. On error `dst`
/// is restored to its previous length.
pub fn encode_frame<T: Serialize + ?Sized>(
    kind: FrameKind,
    request_id: u64,
    msg: &T,
    max_frame_bytes: u32,
    dst: &mut BytesMut,
) -> Result<(), WireError> {
    let start = dst.len();
    dst.put_u32_le(0);
    dst.put_u8(kind.as_u8());
    dst.put_u64_le(request_id);
    let budget_bytes = u64::from(max_frame_bytes.saturating_sub(MIN_BODY_BYTES));
    let payload_bytes = match serialize_bounded(msg, budget_bytes, dst) {
        Ok(n) => n,
        Err(e) => {
            dst.truncate(start);
            return Err(WireError::Encode(e));
        }
    };
    let body_len = payload_bytes.saturating_add(u64::from(MIN_BODY_BYTES));
    let fits = u32::try_from(body_len)
        .ok()
        .filter(|&len| len <= max_frame_bytes);
    let Some(body_len) = fits else {
        dst.truncate(start);
        return Err(WireError::FrameTooLarge {
            len_bytes: body_len,
            max_bytes: max_frame_bytes,
        });
    };
    if let Some(slot) = dst
        .get_mut(start..)
        .and_then(|s| s.first_chunk_mut::<LEN_PREFIX_BYTES>())
    {
        *slot = body_len.to_le_bytes();
    }
    Ok(())
}

/// One frame carrying `msg`, in a buffer of its own ([`encode_frame`] appends
/// to one the caller keeps).
pub fn encoded_frame<T: Serialize + ?Sized>(
    kind: FrameKind,
    request_id: u64,
    msg: &T,
    max_frame_bytes: u32,
) -> Result<BytesMut, WireError> {
    let mut frame = BytesMut::new();
    encode_frame(kind, request_id, msg, max_frame_bytes, &mut frame)?;
    Ok(frame)
}

/// Decodes a frame's payload with [`decode_exact`].
pub fn decode_payload<T: DeserializeOwned>(frame: &Frame) -> Result<T, WireError> {
    decode_exact(&frame.payload)
}

/// Decodes one postcard message that fills `bytes`, rejecting trailing bytes:
/// a conforming encoder never emits them, so they signal a version mismatch
/// or a corrupted stream.
pub fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let (msg, rest) = postcard::take_from_bytes::<T>(bytes).map_err(WireError::Decode)?;
    if rest.is_empty() {
        Ok(msg)
    } else {
        Err(WireError::TrailingBytes {
            n_bytes: rest.len(),
        })
    }
}

/// Appends `msg`'s postcard encoding to `dst`, storing at most
/// `budget_bytes` of it and only counting the rest, and returns its whole
/// length. Why: a message over its limit costs no memory, and one that fits
/// is written once, where it will stay (a frame, a log record), with no
/// buffer of its own. A length over the budget means `dst` holds a
/// truncated encoding the caller must discard.
pub fn serialize_bounded<T: Serialize + ?Sized, B: BufMut>(
    msg: &T,
    budget_bytes: u64,
    dst: &mut B,
) -> postcard::Result<u64> {
    let flavor = BoundedFlavor {
        dst,
        budget_bytes,
        seen_bytes: 0,
    };
    postcard::serialize_with_flavor(msg, flavor)
}

/// Writes up to `budget_bytes` into `dst` and only counts the rest.
#[derive(Debug)]
struct BoundedFlavor<'a, B> {
    dst: &'a mut B,
    budget_bytes: u64,
    seen_bytes: u64,
}

impl<B: BufMut> postcard::ser_flavors::Flavor for BoundedFlavor<'_, B> {
    type Output = u64;

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
        self.seen_bytes = self.seen_bytes.saturating_add(len);
        if self.seen_bytes <= self.budget_bytes {
            self.dst.put_slice(data);
        }
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<u64> {
        Ok(self.seen_bytes)
    }
}
