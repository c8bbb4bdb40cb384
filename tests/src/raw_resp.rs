//! RESP spoken by hand: for tests that must send exactly these bytes
//! (inline commands, several commands in one write, a command cut short),
//! which a client library decides for itself.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result};

/// Longest a reply may take to arrive.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes `bytes` on a new connection and reads until the server closes
/// it (the bytes end with QUIT, or with something it refuses).
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.write_all(bytes)?;
    let mut out = Vec::new();
    stream
        .read_to_end(&mut out)
        .context("the server did not close the connection")?;
    Ok(out)
}
