//! A TCP connection with or without TLS, so that every connection loop is
//! written once. Split, plain TCP keeps tokio's owned halves (no lock
//! between the reading and the writing task); a TLS stream is one state
//! machine, so its halves share it through `tokio::io::split`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_rustls::TlsStream;

/// One connection, plain or TLS.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The reading half of a [`Stream`].
#[derive(Debug)]
pub enum ReadHalf {
    Tcp(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsStream<TcpStream>>),
}

/// The writing half of a [`Stream`].
#[derive(Debug)]
pub enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsStream<TcpStream>>),
}

impl Stream {
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(tcp) => {
                let (read, write) = tcp.into_split();
                (ReadHalf::Tcp(read), WriteHalf::Tcp(write))
            }
            Stream::Tls(tls) => {
                let (read, write) = tokio::io::split(*tls);
                (ReadHalf::Tls(read), WriteHalf::Tls(write))
            }
        }
    }

    /// The TCP connection underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(tcp) => tcp,
            Stream::Tls(tls) => tls.get_ref().0,
        }
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

/// `AsyncRead` for an enum whose variants all implement it.
macro_rules! forward_read {
    ($type:ty) => {
        impl AsyncRead for $type {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
}

/// `AsyncWrite` for an enum whose variants all implement it.
macro_rules! forward_write {
    ($type:ty) => {
        impl AsyncWrite for $type {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

forward_read!(Stream);
forward_write!(Stream);
forward_read!(ReadHalf);
forward_write!(WriteHalf);
