//! The native protocol spoken by hand over a blocking socket: for tests
//! that must control exactly what is written and when (floods, pipelines),
//! which `rdkv-client` decides for itself.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Result, bail};
use bytes::BytesMut;
use rdkv_proto::wire::{
    ClientHello, DEFAULT_MAX_FRAME_BYTES, Frame, FrameDecoder, FrameKind, ServerHello,
    decode_payload, encoded_frame,
};

/// A connection that has done the handshake, with its read buffer.
#[derive(Debug)]
pub struct RawConnection {
    pub stream: TcpStream,
    decoder: FrameDecoder,
    buf: BytesMut,
}

impl RawConnection {
    /// Connects and says hello as `name`; the inner `Err` carries the
    /// server's refusal.
    pub fn open(
        addr: SocketAddr,
        name: &str,
        token: Option<&str>,
    ) -> Result<std::result::Result<RawConnection, String>> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let hello = ClientHello::new(name, token.map(str::to_owned));
        let out = encoded_frame(FrameKind::ClientHello, 0, &hello, DEFAULT_MAX_FRAME_BYTES)?;
        stream.write_all(&out)?;
        let mut connection = RawConnection {
            stream,
            decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_BYTES),
            buf: BytesMut::new(),
        };
        let frame = connection.next_frame()?;
        Ok(match decode_payload::<ServerHello>(&frame)? {
            ServerHello::Accepted(_) => Ok(connection),
            ServerHello::Rejected { code, message } => Err(format!("{code:?}: {message}")),
        })
    }

    /// The next frame the server sends.
    pub fn next_frame(&mut self) -> Result<Frame> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf)? {
                return Ok(frame);
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
