//! The `shm` transport's attach protocol: how a same-host client gets the
//! server's region mapped read-only (brief §6, §8).
//!
//! 1. The client connects to the server's Unix socket and sends one
//!    [`ClientHello`] frame (the native framing, at most
//!    [`SHM_MAX_HELLO_BYTES`]): the node's primary region (a single
//!    group's); or one [`ShmAttach`] frame naming a shard (protocol version
//!    3): that shard's region, or [`ShmGrant::WrongShard`] from a node that
//!    does not host it (docs/sharding.md, section 5).
//! 2. The server negotiates the version and checks the token in constant time.
//!    It answers with exactly one message `[u32 LE len][postcard(ShmGrant)]`
//!    and closes. A [`ShmGrant::Granted`] goes out in the same `sendmsg` as a
//!    read-only fd of the region's sealed memfd (SCM_RIGHTS); a
//!    [`ShmGrant::Refused`] carries no fd, so a client without the token never
//!    holds one.
//! 3. The client maps the fd read-only ([`RegionMemory::map_read_only`]); GETs
//!    are then [`RegionReader`](crate::RegionReader) reads over that mapping.
//!
//! The client cannot write the server's memory: the fd is `O_RDONLY`, the
//! memfd is sealed against writable mappings, and the mapping is `PROT_READ`
//! (a write through it faults; tests prove it in a child process).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rdkv_proto::region::{HEADER_USED_BYTES, HeaderError, RegionLayout};
use rdkv_proto::shard::ShardId;
use rdkv_proto::wire::{
    ClientHello, ErrorCode, Frame, FrameDecoder, FrameKind, MAX_SHM_GRANT_BYTES,
    MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, SHARDED_PROTOCOL_VERSION, SHM_GRANT_PREFIX_BYTES,
    ShmAttach, ShmGrant, WireError, WrongShard, decode_payload, encoded_frame, negotiate,
    tokens_match,
};
use rustix::fs::SealFlags;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::memory::RegionMemory;

/// A connection that has not finished its handshake by then is closed.
pub const SHM_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`attach_shm`] waits for the whole exchange.
pub const SHM_ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest hello frame body the server reads (checked before allocating).
pub const SHM_MAX_HELLO_BYTES: u32 = 64 * 1024;
/// Handshakes served at once; further connections wait in the listen backlog.
pub const SHM_MAX_CONCURRENT_HANDSHAKES: usize = 64;

/// Fds a client accepts with one `recvmsg`; a conforming server sends one,
/// extras are closed at once.
const MAX_RECEIVED_FDS: usize = 4;

#[derive(Debug, Error)]
pub enum ShmError {
    #[error("connecting to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("shm socket I/O: {0}")]
    Io(#[from] io::Error),
    #[error("encoding the hello: {0}")]
    Encode(#[source] WireError),
    #[error("the server refused the attach ({code:?}): {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("the node does not host shard {}", .0.shard)]
    WrongShard(WrongShard),
    #[error("the server closed the connection before a complete grant")]
    Closed,
    #[error("grant of {len_bytes} bytes exceeds the {max_bytes}-byte limit")]
    GrantTooLarge { len_bytes: u32, max_bytes: u32 },
    #[error("malformed grant: {0}")]
    Decode(#[source] WireError),
    #[error("the server granted the region without passing an fd")]
    MissingFd,
    #[error("the region fd is not a memfd sealed against shrinking")]
    Unsealed,
    #[error("granted region of {region_bytes} bytes cannot be mapped here")]
    BadLength { region_bytes: u64 },
    #[error("mapping the region: {0}")]
    Map(#[source] io::Error),
    #[error("the mapped region's header: {0}")]
    Header(#[from] HeaderError),
    #[error("the grant says region epoch {granted}, the mapping says {mapped}: re-attach")]
    EpochMismatch { granted: u64, mapped: u64 },
    #[error("attach timed out after {0:?}")]
    Timeout(Duration),
}

/// A region mapped read-only from a same-host server.
#[derive(Debug, Clone)]
pub struct ShmAttachment {
    pub node_id: u64,
    pub region_epoch: u64,
    pub memory: Arc<RegionMemory>,
}

/// The raw reply of one attach exchange, before interpretation.
#[derive(Debug)]
pub struct ReceivedGrant {
    pub grant: ShmGrant,
    /// The first fd that came with the grant, if any (extras were closed).
    pub fd: Option<OwnedFd>,
    /// How many further fds arrived (and were closed): a conforming server sends none.
    pub extra_fds: usize,
}

// ---------------------------------------------------------------------------
// Server side
// ---------------------------------------------------------------------------

struct ShmContext<F> {
    token: Option<String>,
    node_id: u64,
    current_region: F,
}

/// The refusal of an attach when there is no region to hand out yet.
pub fn no_region_yet() -> ShmGrant {
    ShmGrant::Refused {
        code: ErrorCode::Unavailable,
        message: "no region is being served yet".to_owned(),
    }
}

/// Serves attach requests on `listener` until `shutdown` becomes `true` (or
/// its sender is dropped); handshakes still in progress are then aborted.
///
/// `token: None` accepts every well-formed hello (the socket's file
/// permissions are then the only gate). `current_region` is asked on every
/// attach (with the shard it names, `None` for a plain hello), so a rebuilt
/// region is handed out from then on; its `Err` is the refusal sent instead
/// (no region yet: [`no_region_yet`]; a shard not hosted:
/// [`ShmGrant::WrongShard`]).
pub async fn serve_shm<F>(
    listener: UnixListener,
    token: Option<String>,
    node_id: u64,
    current_region: F,
    mut shutdown: watch::Receiver<bool>,
) where
    F: Fn(Option<ShardId>) -> Result<Arc<RegionMemory>, ShmGrant> + Send + Sync + 'static,
{
    let ctx = Arc::new(ShmContext {
        token,
        node_id,
        current_region,
    });
    let permits = Arc::new(Semaphore::new(SHM_MAX_CONCURRENT_HANDSHAKES));
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let permit = tokio::select! {
            () = shutdown_requested(&mut shutdown) => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = shutdown_requested(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(%error, "shm: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let ctx = Arc::clone(&ctx);
        tasks.spawn(async move {
            let _permit = permit;
            handle_connection(stream, &ctx).await;
        });
    }
    tasks.shutdown().await;
}

async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: nobody can keep us running.
    let _stopped = shutdown.wait_for(|&stop| stop).await.is_ok();
}

#[derive(Debug, Error)]
enum HandshakeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("peer closed before a complete hello")]
    Eof,
    #[error("the grant could not be encoded")]
    Encode,
}

async fn handle_connection<F>(mut stream: UnixStream, ctx: &ShmContext<F>)
where
    F: Fn(Option<ShardId>) -> Result<Arc<RegionMemory>, ShmGrant>,
{
    let peer = stream.peer_cred().ok();
    let peer_uid = peer.map(|c| c.uid());
    let peer_pid = peer.and_then(|c| c.pid());
    match tokio::time::timeout(
        SHM_HANDSHAKE_TIMEOUT,
        handshake(&mut stream, ctx, peer_uid, peer_pid),
    )
    .await
    {
        Err(_) => tracing::warn!(?peer_uid, ?peer_pid, "shm: handshake timed out; closed"),
        Ok(Err(error)) => {
            tracing::warn!(?peer_uid, ?peer_pid, %error, "shm: bad handshake; closed");
        }
        Ok(Ok(())) => {}
    }
}

async fn handshake<F>(
    stream: &mut UnixStream,
    ctx: &ShmContext<F>,
    peer_uid: Option<u32>,
    peer_pid: Option<i32>,
) -> Result<(), HandshakeError>
where
    F: Fn(Option<ShardId>) -> Result<Arc<RegionMemory>, ShmGrant>,
{
    let frame = read_hello_frame(stream).await?;
    let (client_name, decision) = decide(ctx, &frame);
    let (grant, fd) = match decision {
        Ok((grant, fd)) => {
            tracing::debug!(?peer_uid, ?peer_pid, client_name, "shm: region granted");
            (grant, Some(fd))
        }
        Err(refusal) => {
            tracing::warn!(
                ?peer_uid,
                ?peer_pid,
                client_name,
                ?refusal,
                "shm: attach refused"
            );
            (refusal, None)
        }
    };
    let bytes = grant.encode().ok_or(HandshakeError::Encode)?;
    send_with_fd(stream, &bytes, fd.as_ref().map(AsFd::as_fd)).await?;
    Ok(())
}

/// Reads exactly one frame; framing errors (garbage) end the connection.
async fn read_hello_frame(stream: &mut UnixStream) -> Result<Frame, HandshakeError> {
    let mut decoder = FrameDecoder::new(SHM_MAX_HELLO_BYTES);
    let mut buf = BytesMut::with_capacity(512);
    loop {
        if let Some(frame) = decoder.decode(&mut buf)? {
            return Ok(frame);
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(HandshakeError::Eof);
        }
    }
}

/// A refusal as sent: `Refused` or `WrongShard`.
type Refusal = ShmGrant;

fn refused(code: ErrorCode, message: String) -> Refusal {
    ShmGrant::Refused { code, message }
}

fn wire_refusal(error: &WireError) -> Refusal {
    refused(ErrorCode::from(error), error.to_string())
}

/// The client's name (for logs) and either the grant with its fd or a
/// refusal. A `ClientHello` asks for the primary region; a `ShmAttach` for
/// the shard it names, and only over a version that has shards.
fn decide<F>(ctx: &ShmContext<F>, frame: &Frame) -> (String, Result<(ShmGrant, OwnedFd), Refusal>)
where
    F: Fn(Option<ShardId>) -> Result<Arc<RegionMemory>, ShmGrant>,
{
    let asked = match frame.kind {
        FrameKind::ShmAttach => {
            decode_payload::<ShmAttach>(frame).map(|a| (a.hello, Some(a.shard)))
        }
        _ => frame
            .expect_kind(FrameKind::ClientHello)
            .and_then(|()| decode_payload::<ClientHello>(frame))
            .map(|hello| (hello, None)),
    };
    let (hello, shard) = match asked {
        Ok(asked) => asked,
        Err(error) => return (String::new(), Err(wire_refusal(&error))),
    };
    let name = hello.client_name.chars().take(128).collect::<String>();
    (name, grant_for(ctx, &hello, shard))
}

fn grant_for<F>(
    ctx: &ShmContext<F>,
    hello: &ClientHello,
    shard: Option<ShardId>,
) -> Result<(ShmGrant, OwnedFd), Refusal>
where
    F: Fn(Option<ShardId>) -> Result<Arc<RegionMemory>, ShmGrant>,
{
    let version = negotiate(hello, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
        .map_err(|error| wire_refusal(&error))?;
    if shard.is_some() && version < SHARDED_PROTOCOL_VERSION {
        return Err(refused(
            ErrorCode::InvalidRequest,
            format!("an attach naming a shard needs protocol version {SHARDED_PROTOCOL_VERSION}"),
        ));
    }
    if let Some(expected) = &ctx.token {
        let presented = hello.token.as_deref().unwrap_or("");
        // Both checks always run, so a missing token costs the same as a wrong one.
        let matched = tokens_match(expected.as_bytes(), presented.as_bytes());
        if !(matched && hello.token.is_some()) {
            return Err(refused(
                ErrorCode::Unauthenticated,
                "missing or wrong cluster token".to_owned(),
            ));
        }
    }
    let memory = (ctx.current_region)(shard)?;
    let unavailable = |what: &str, error: &dyn std::fmt::Display| {
        refused(ErrorCode::Unavailable, format!("{what}: {error}"))
    };
    let mut header = [0u8; HEADER_USED_BYTES];
    memory
        .read_bytes(0, &mut header)
        .map_err(|error| unavailable("region header", &error))?;
    let layout =
        RegionLayout::decode(&header).map_err(|error| unavailable("region header", &error))?;
    let fd = memory
        .read_only_fd()
        .map_err(|error| unavailable("region cannot be shared", &error))?;
    let grant = ShmGrant::Granted {
        node_id: ctx.node_id,
        region_epoch: layout.region_epoch,
        region_bytes: memory.len_bytes() as u64,
    };
    Ok((grant, fd))
}

// ---------------------------------------------------------------------------
// fd passing over tokio's UnixStream
// ---------------------------------------------------------------------------

/// One `sendmsg`, with `fd` attached if given; returns the bytes written.
async fn sendmsg_once(
    stream: &UnixStream,
    data: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<usize> {
    loop {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other(
                    "SCM_RIGHTS does not fit the control buffer",
                ));
            }
            rustix::net::sendmsg(
                stream.as_fd(),
                &[IoSlice::new(data)],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(io::Error::from)
        });
        match sent {
            Ok(n) => return Ok(n),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Writes all of `data`; the fd rides on the first byte(s).
async fn send_with_fd(
    stream: &UnixStream,
    data: &[u8],
    mut fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut offset = 0;
    while offset < data.len() {
        let rest = data.get(offset..).unwrap_or_default();
        let n = sendmsg_once(stream, rest, fd.take()).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        offset += n;
    }
    Ok(())
}

/// One `recvmsg` into `dst` (close-on-exec fds); returns the bytes read and
/// the fds that came with them.
async fn recvmsg_once(stream: &UnixStream, dst: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        stream.readable().await?;
        let received = stream.try_io(Interest::READABLE, || {
            let mut space =
                [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_RECEIVED_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let msg = rustix::net::recvmsg(
                stream.as_fd(),
                &mut [IoSliceMut::new(dst)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(io::Error::from)?;
            let mut fds = Vec::new();
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = message {
                    fds.extend(received);
                }
            }
            if msg.flags.contains(ReturnFlags::CTRUNC) {
                // The kernel dropped the fds that did not fit; nothing leaks.
                tracing::warn!("shm: the server sent more fds than expected");
            }
            Ok((msg.bytes, fds))
        });
        match received {
            Ok(got) => return Ok(got),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
}

// ---------------------------------------------------------------------------
// Client side
// ---------------------------------------------------------------------------

/// Sends `hello` on a connected stream and reads the single grant message
/// with its fd, without interpreting it. Reads at most
/// `4 + MAX_SHM_GRANT_BYTES` bytes whatever the server sends.
pub async fn request_shm_grant(
    stream: &mut UnixStream,
    hello: &ClientHello,
) -> Result<ReceivedGrant, ShmError> {
    let frame = encoded_frame(FrameKind::ClientHello, 0, hello, SHM_MAX_HELLO_BYTES);
    exchange(stream, frame).await
}

/// [`request_shm_grant`] of one shard's region (a `ShmAttach` frame).
pub async fn request_shard_grant(
    stream: &mut UnixStream,
    attach: &ShmAttach,
) -> Result<ReceivedGrant, ShmError> {
    let frame = encoded_frame(FrameKind::ShmAttach, 0, attach, SHM_MAX_HELLO_BYTES);
    exchange(stream, frame).await
}

/// Sends the request `frame` (once it encoded) and reads the single grant
/// message with its fd.
async fn exchange(
    stream: &mut UnixStream,
    frame: Result<BytesMut, WireError>,
) -> Result<ReceivedGrant, ShmError> {
    stream.write_all(&frame.map_err(ShmError::Encode)?).await?;

    let mut buf = vec![0u8; SHM_GRANT_PREFIX_BYTES + MAX_SHM_GRANT_BYTES as usize];
    let mut have = 0;
    let mut need = SHM_GRANT_PREFIX_BYTES;
    let mut fd = None;
    let mut extra_fds = 0;
    let mut prefix_seen = false;
    while have < need {
        let dst = buf.get_mut(have..need).ok_or(ShmError::Closed)?;
        let (n, fds) = recvmsg_once(stream, dst).await?;
        for received in fds {
            if fd.is_none() {
                fd = Some(received);
            } else {
                extra_fds += 1;
                drop(received);
            }
        }
        if n == 0 {
            return Err(ShmError::Closed);
        }
        have += n;
        if !prefix_seen && have >= SHM_GRANT_PREFIX_BYTES {
            prefix_seen = true;
            let prefix = buf
                .first_chunk::<SHM_GRANT_PREFIX_BYTES>()
                .ok_or(ShmError::Closed)?;
            let len_bytes = u32::from_le_bytes(*prefix);
            if len_bytes > MAX_SHM_GRANT_BYTES {
                return Err(ShmError::GrantTooLarge {
                    len_bytes,
                    max_bytes: MAX_SHM_GRANT_BYTES,
                });
            }
            need = SHM_GRANT_PREFIX_BYTES + len_bytes as usize;
        }
    }
    let body = buf
        .get(SHM_GRANT_PREFIX_BYTES..need)
        .ok_or(ShmError::Closed)?;
    let grant = ShmGrant::decode(body).map_err(ShmError::Decode)?;
    Ok(ReceivedGrant {
        grant,
        fd,
        extra_fds,
    })
}

/// Attaches to the region served on the Unix socket at `path`: authenticates
/// with `token`, receives the region's fd and maps it read-only.
pub async fn attach_shm(
    path: &Path,
    token: Option<&str>,
    client_name: &str,
) -> Result<ShmAttachment, ShmError> {
    attach_shm_shard(path, token, client_name, None).await
}

/// [`attach_shm`] of the region of `shard` (`None`: the node's primary,
/// a plain hello as before shards); a node that does not host the shard
/// answers [`ShmError::WrongShard`].
pub async fn attach_shm_shard(
    path: &Path,
    token: Option<&str>,
    client_name: &str,
    shard: Option<ShardId>,
) -> Result<ShmAttachment, ShmError> {
    let attach = attach_inner(path, token, client_name, shard);
    tokio::time::timeout(SHM_ATTACH_TIMEOUT, attach)
        .await
        .map_err(|_| ShmError::Timeout(SHM_ATTACH_TIMEOUT))?
}

async fn attach_inner(
    path: &Path,
    token: Option<&str>,
    client_name: &str,
    shard: Option<ShardId>,
) -> Result<ShmAttachment, ShmError> {
    let mut stream = UnixStream::connect(path)
        .await
        .map_err(|source| ShmError::Connect {
            path: path.to_owned(),
            source,
        })?;
    let hello = ClientHello::new(client_name, token.map(str::to_owned));
    let received = match shard {
        None => request_shm_grant(&mut stream, &hello).await?,
        Some(shard) => request_shard_grant(&mut stream, &ShmAttach { hello, shard }).await?,
    };
    drop(stream);
    let (node_id, region_epoch, region_bytes) = match received.grant {
        ShmGrant::Granted {
            node_id,
            region_epoch,
            region_bytes,
        } => (node_id, region_epoch, region_bytes),
        ShmGrant::Refused { code, message } => return Err(ShmError::Refused { code, message }),
        ShmGrant::WrongShard(wrong) => return Err(ShmError::WrongShard(wrong)),
    };
    let fd = received.fd.ok_or(ShmError::MissingFd)?;
    map_granted(fd, node_id, region_epoch, region_bytes)
}

fn map_granted(
    fd: OwnedFd,
    node_id: u64,
    region_epoch: u64,
    region_bytes: u64,
) -> Result<ShmAttachment, ShmError> {
    // A file that could shrink under the mapping would SIGBUS our reads.
    let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|_| ShmError::Unsealed)?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(ShmError::Unsealed);
    }
    let len = usize::try_from(region_bytes)
        .ok()
        .filter(|&n| n >= HEADER_USED_BYTES)
        .ok_or(ShmError::BadLength { region_bytes })?;
    let memory = RegionMemory::map_read_only(fd, len).map_err(ShmError::Map)?;
    let mut header = [0u8; HEADER_USED_BYTES];
    memory
        .read_bytes(0, &mut header)
        .map_err(|_| ShmError::BadLength { region_bytes })?;
    let layout = RegionLayout::decode(&header)?;
    // The node id is the server's configuration; the epoch must be the one
    // this mapping carries, or a rebuild raced the attach.
    if layout.region_epoch != region_epoch {
        return Err(ShmError::EpochMismatch {
            granted: region_epoch,
            mapped: layout.region_epoch,
        });
    }
    Ok(ShmAttachment {
        node_id,
        region_epoch,
        memory: Arc::new(memory),
    })
}
