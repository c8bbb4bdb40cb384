//! Streaming a node's snapshot: chunk by chunk, all from the node that
//! answered the first chunk, checked for gaps and for a snapshot rebuilt
//! mid-way.

use std::path::{Path, PathBuf};

use rdkv_proto::wire::{Op, Request, SnapshotChunk};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::outcome::answer;
use crate::routing::{Idempotence, Route, Router};

/// Largest snapshot chunk asked for (further bounded by the server's frame limit).
const SNAPSHOT_CHUNK_BYTES: u32 = 1024 * 1024;
/// Frame bytes a snapshot chunk needs besides its data.
const SNAPSHOT_CHUNK_OVERHEAD_BYTES: u32 = 64;
/// Times [`to_file`] starts over when the snapshot changes.
const SNAPSHOT_RESTARTS: u32 = 3;

/// What [`Client::snapshot_to`](crate::Client::snapshot_to) wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Log index the snapshot covers.
    pub last_log_index: u64,
    pub total_bytes: u64,
}

/// Streams the current node's snapshot into `writer` and flushes it.
pub(crate) async fn to_writer<W: AsyncWrite + Unpin>(
    router: &Router,
    writer: &mut W,
) -> Result<SnapshotInfo> {
    let request = Request::SnapshotRead {
        offset: 0,
        max_bytes: SNAPSHOT_CHUNK_BYTES,
    };
    let (addr, response) = router
        .request_at(request, Route::AnyPreferLeader, Idempotence::Read)
        .await?;
    let first = answer(Op::SnapshotRead, response)?;
    let info = stream(router, &addr, first, writer).await?;
    writer.flush().await?;
    Ok(info)
}

/// Saves the current node's snapshot to `path` through `path.part` (synced,
/// then renamed), starting over when the snapshot changes mid-way.
pub(crate) async fn to_file(router: &Router, path: &Path) -> Result<SnapshotInfo> {
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    match to_part(router, &part).await {
        Ok(info) => {
            tokio::fs::rename(&part, path).await?;
            Ok(info)
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&part).await;
            Err(e)
        }
    }
}

async fn to_part(router: &Router, part: &Path) -> Result<SnapshotInfo> {
    let mut restarts = 0;
    loop {
        let mut file = tokio::fs::File::create(part).await?;
        match to_writer(router, &mut file).await {
            Ok(info) => {
                file.sync_all().await?;
                return Ok(info);
            }
            Err(Error::SnapshotChanged { from, to }) if restarts < SNAPSHOT_RESTARTS => {
                restarts += 1;
                tracing::debug!(from, to, "snapshot changed during transfer; restarting");
            }
            Err(e) => return Err(e),
        }
    }
}

/// Writes `first` and the chunks after it, asked of `addr`, into `writer`.
async fn stream<W: AsyncWrite + Unpin>(
    router: &Router,
    addr: &str,
    first: SnapshotChunk,
    writer: &mut W,
) -> Result<SnapshotInfo> {
    let info = SnapshotInfo {
        last_log_index: first.last_log_index,
        total_bytes: first.total_bytes,
    };
    let mut chunk = first;
    let mut offset = 0u64;
    loop {
        let end = check_chunk(&info, &chunk, offset)?;
        writer.write_all(&chunk.data).await?;
        offset = end;
        if offset == info.total_bytes {
            return Ok(info);
        }
        let max_bytes = chunk_bytes(router, addr).await;
        let response = router
            .send_to(addr, Request::SnapshotRead { offset, max_bytes })
            .await?;
        chunk = answer(Op::SnapshotRead, response)?;
    }
}

/// Checks that `chunk` is of the snapshot `info` describes and starts at
/// `offset`; returns the offset after it.
fn check_chunk(info: &SnapshotInfo, chunk: &SnapshotChunk, offset: u64) -> Result<u64> {
    if chunk.last_log_index != info.last_log_index {
        return Err(Error::SnapshotChanged {
            from: info.last_log_index,
            to: chunk.last_log_index,
        });
    }
    let len = u64::try_from(chunk.data.len()).unwrap_or(u64::MAX);
    let end = offset.saturating_add(len);
    if chunk.offset != offset
        || chunk.total_bytes != info.total_bytes
        || end > info.total_bytes
        || (len == 0 && offset < info.total_bytes)
    {
        return Err(Error::UnexpectedResponse {
            request: Op::SnapshotRead.name(),
            response: format!(
                "chunk at offset {} of {} bytes (total {}) when offset {} of {} was asked",
                chunk.offset, len, chunk.total_bytes, offset, info.total_bytes
            ),
        });
    }
    Ok(end)
}

/// The chunk size to ask `addr` for: as large as its frames allow.
async fn chunk_bytes(router: &Router, addr: &str) -> u32 {
    router
        .max_frame_bytes(addr)
        .await
        .unwrap_or(SNAPSHOT_CHUNK_BYTES)
        .saturating_sub(SNAPSHOT_CHUNK_OVERHEAD_BYTES)
        .clamp(1, SNAPSHOT_CHUNK_BYTES)
}
