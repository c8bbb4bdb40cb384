//! The native protocol spoken by hand: for tests that must control exactly
//! what is written and when (garbage, floods, pipelines), which
//! `rdkv-client` decides for itself. The one raw connection of the tests.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::BytesMut;
use rdkv_proto::wire::{
    ClientHello, DEFAULT_MAX_FRAME_BYTES, Frame, FrameDecoder, FrameKind, Request, Response,
    ServerHello, decode_payload, encoded_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a read waits for the server to answer or close.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// A connection speaking (or not) the native protocol, with its read
/// buffer.
#[derive(Debug)]
pub struct RawConnection {
    stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl RawConnection {
    /// Connects without saying anything.
    pub async fn connect(addr: SocketAddr) -> Result<RawConnection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawConnection {
            stream,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES),
        })
    }

    /// Connects and says hello as `name`; the inner `Err` carries the
    /// server's refusal.
    pub async fn open(
        addr: SocketAddr,
        name: &str,
        token: Option<&str>,
    ) -> Result<std::result::Result<RawConnection, String>> {
        let mut raw = RawConnection::connect(addr).await?;
        raw.send_hello(&ClientHello::new(name, token.map(str::to_owned)))
            .await?;
        Ok(match raw.server_hello().await? {
            ServerHello::Accepted(_) | ServerHello::AcceptedSharded { .. } => Ok(raw),
            ServerHello::Rejected { code, message } => Err(format!("{code:?}: {message}")),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await?;
        Ok(())
    }

    pub async fn send_hello(&mut self, hello: &ClientHello) -> Result<()> {
        let frame = encoded_frame(FrameKind::ClientHello, 0, hello, DEFAULT_MAX_FRAME_BYTES)?;
        self.send(&frame).await
    }

    pub async fn send_request(&mut self, request_id: u64, request: &Request) -> Result<()> {
        let frame = encoded_frame(
            FrameKind::Request,
            request_id,
            request,
            DEFAULT_MAX_FRAME_BYTES,
        )?;
        self.send(&frame).await
    }

    /// The next frame, or `None` once the server has closed the connection
    /// (end of stream or reset). Fails if neither happens within
    /// [`CLOSE_WITHIN`].
    pub async fn next_frame(&mut self) -> Result<Option<Frame>> {
        let deadline = tokio::time::Instant::now() + CLOSE_WITHIN;
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(frame));
            }
            let read = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf))
                .await
                .context("the server neither answered nor closed the connection")?;
            match read {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn server_hello(&mut self) -> Result<ServerHello> {
        let frame = self.next_frame().await?.context("closed before a hello")?;
        ensure!(frame.kind == FrameKind::ServerHello, "got {frame:?}");
        Ok(decode_payload(&frame)?)
    }

    pub async fn response(&mut self) -> Result<(u64, Response)> {
        let frame = self
            .next_frame()
            .await?
            .context("closed before a response")?;
        ensure!(frame.kind == FrameKind::Response, "got {frame:?}");
        Ok((frame.request_id, decode_payload(&frame)?))
    }

    /// Reads whatever the server still sends until it closes; fails if it
    /// keeps the connection open.
    pub async fn until_closed(&mut self) -> Result<Vec<Frame>> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next_frame().await? {
            frames.push(frame);
        }
        Ok(frames)
    }

    /// The socket as a blocking std stream, for a thread that writes
    /// without a runtime (a flooder). Bytes already read are dropped.
    pub fn into_std(self) -> Result<std::net::TcpStream> {
        let stream = self.stream.into_std()?;
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}
