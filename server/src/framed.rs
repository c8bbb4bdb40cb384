//! Frames over a TCP stream: the read side bounded by the frame limit
//! (checked before allocating), the write side one encoded frame at a time.

use bytes::BytesMut;
use rdkv_proto::wire::{Frame, FrameDecoder, FrameKind, WireError, encode_frame};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum FramedError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Wire(#[from] WireError),
}

#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    decoder: FrameDecoder,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame_bytes: u32) -> Self {
        FrameReader {
            inner,
            decoder: FrameDecoder::new(max_frame_bytes),
            buf: BytesMut::with_capacity(8 * 1024),
        }
    }

    /// Changes the largest frame accepted from now on: a handshake is read
    /// under a small limit, the traffic it authenticates under a larger one.
    pub fn set_max_frame_bytes(&mut self, max_frame_bytes: u32) {
        self.decoder = FrameDecoder::new(max_frame_bytes);
    }

    /// The next frame if it is already buffered, without reading.
    pub fn next_buffered(&mut self) -> Result<Option<Frame>, FramedError> {
        Ok(self.decoder.decode(&mut self.buf)?)
    }

    /// The next frame; `None` on a clean end of stream between frames.
    /// Cancel-safe: bytes read before a cancellation stay buffered.
    pub async fn next(&mut self) -> Result<Option<Frame>, FramedError> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(frame));
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(8 * 1024);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into())
                };
            }
        }
    }
}

#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    max_frame_bytes: u32,
    buf: BytesMut,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W, max_frame_bytes: u32) -> Self {
        FrameWriter {
            inner,
            max_frame_bytes,
            buf: BytesMut::new(),
        }
    }

    /// Encodes without sending: several frames can then go out in one write.
    pub fn queue<T: Serialize + ?Sized>(
        &mut self,
        kind: FrameKind,
        request_id: u64,
        payload: &T,
    ) -> Result<(), FramedError> {
        encode_frame(
            kind,
            request_id,
            payload,
            self.max_frame_bytes,
            &mut self.buf,
        )?;
        Ok(())
    }

    /// Whether frames are queued and not yet sent.
    pub fn has_queued(&self) -> bool {
        !self.buf.is_empty()
    }

    pub async fn flush(&mut self) -> Result<(), FramedError> {
        self.inner.write_all(&self.buf).await?;
        self.buf.clear();
        self.inner.flush().await?;
        Ok(())
    }

    pub async fn send<T: Serialize + ?Sized>(
        &mut self,
        kind: FrameKind,
        request_id: u64,
        payload: &T,
    ) -> Result<(), FramedError> {
        self.queue(kind, request_id, payload)?;
        self.flush().await
    }
}
