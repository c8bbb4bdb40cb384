//! Two-sided RPC over SEND/RECV: each message is one native-protocol frame
//! (the same encoding, limits and decoder as over TCP), fragmented to fit
//! the peer's receive buffers and flow-controlled by credits.
//!
//! Client: [`RdmaChannel`], an [`RpcChannel`] with pipelining by request id
//! like the TCP [`Connection`](crate::Connection). Server: [`serve`], the
//! request loop of one connection, handing requests to the node's
//! [`RpcHandler`] with at most `max_in_flight` of them running (beyond that
//! it stops taking messages, so credits stop flowing back: backpressure).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use rdkv_proto::wire::{
    DEFAULT_MAX_FRAME_BYTES, ErrorCode, ErrorReply, Frame, FrameDecoder, FrameKind, Request,
    Response, decode_payload, encoded_frame,
};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};

use super::connection::{ConnShared, Incoming};
use crate::rdma::error::RdmaError;
use crate::rpc::{CallError, CallFuture, RpcChannel, RpcHandler, request_frame};

/// Decodes one received message as exactly one frame.
fn decode_frame(message: Vec<u8>, max_frame_bytes: u32) -> Result<Frame, String> {
    let mut decoder = FrameDecoder::new(max_frame_bytes);
    let mut buf = BytesMut::from(&message[..]);
    match decoder.decode(&mut buf) {
        Ok(Some(frame)) if buf.is_empty() => Ok(frame),
        Ok(Some(_)) => Err("a message carried more than one frame".into()),
        Ok(None) => Err("a message carried a truncated frame".into()),
        Err(e) => Err(e.to_string()),
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Frame>>>>;

/// The client's RPC channel over an RDMA session.
#[derive(Debug)]
pub struct RdmaChannel {
    conn: Arc<ConnShared>,
    pending: Pending,
    next_id: AtomicU64,
    max_frame_bytes: u32,
    reader: JoinHandle<()>,
}

impl Drop for RdmaChannel {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl RdmaChannel {
    pub(crate) fn start(
        conn: Arc<ConnShared>,
        incoming: mpsc::UnboundedReceiver<Incoming>,
        max_frame_bytes: u32,
    ) -> RdmaChannel {
        let pending: Pending = Arc::default();
        let reader = tokio::spawn(read_responses(
            Arc::clone(&conn),
            incoming,
            Arc::clone(&pending),
            max_frame_bytes.max(DEFAULT_MAX_FRAME_BYTES),
        ));
        RdmaChannel {
            conn,
            pending,
            next_id: AtomicU64::new(1),
            max_frame_bytes,
            reader,
        }
    }

    pub async fn call(&self, request: &Request, deadline: Instant) -> Result<Response, CallError> {
        if let Some(e) = self.conn.failure() {
            return Err(CallError::NotSent {
                reason: e.to_string(),
                timed_out: false,
            });
        }
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = request_frame(request_id, request, self.max_frame_bytes)?;
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request_id, tx);
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&request_id);
        };
        match self.conn.send_message(&frame, deadline).await {
            Ok(true) => {}
            Ok(false) => {
                forget();
                return Err(CallError::NotSent {
                    reason: "no send credit before the deadline".into(),
                    timed_out: true,
                });
            }
            Err(e) => {
                forget();
                return Err(CallError::Lost {
                    reason: e.to_string(),
                });
            }
        }
        match timeout_at(deadline, rx).await {
            Ok(Ok(frame)) => decode_payload::<Response>(&frame).map_err(CallError::Decode),
            Ok(Err(_closed)) => Err(CallError::Lost {
                reason: self
                    .conn
                    .failure()
                    .map_or_else(|| "rdma connection closed".to_owned(), |e| e.to_string()),
            }),
            Err(_elapsed) => {
                forget();
                Err(CallError::TimedOut)
            }
        }
    }
}

impl RpcChannel for RdmaChannel {
    fn call_boxed<'a>(&'a self, request: &'a Request, deadline: Instant) -> CallFuture<'a> {
        Box::pin(self.call(request, deadline))
    }

    fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }
}

async fn read_responses(
    conn: Arc<ConnShared>,
    mut incoming: mpsc::UnboundedReceiver<Incoming>,
    pending: Pending,
    max_frame_bytes: u32,
) {
    while let Some(message) = incoming.recv().await {
        conn.consumed();
        let frame = match decode_frame(message.bytes, max_frame_bytes) {
            Ok(frame) if frame.kind == FrameKind::Response => frame,
            Ok(frame) => {
                conn.fail(RdmaError::Closed(format!(
                    "protocol error: unexpected {:?} frame from the server",
                    frame.kind
                )));
                break;
            }
            Err(e) => {
                conn.fail(RdmaError::Closed(format!("protocol error: {e}")));
                break;
            }
        };
        let waiter = pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&frame.request_id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(frame);
        }
    }
    // Closed: every waiter's sender drops here, failing its call as Lost.
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// The server's request loop of one connection.
pub(crate) async fn serve(
    conn: Arc<ConnShared>,
    mut incoming: mpsc::UnboundedReceiver<Incoming>,
    handler: Arc<dyn RpcHandler>,
    max_frame_bytes: u32,
    max_in_flight: u32,
) {
    let in_flight = Arc::new(Semaphore::new(max_in_flight.max(1) as usize));
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let Some(message) = incoming.recv().await else {
            return;
        };
        conn.consumed();
        let frame = match decode_frame(message.bytes, max_frame_bytes) {
            Ok(frame) if frame.kind == FrameKind::Request => frame,
            Ok(_) | Err(_) => {
                conn.fail(RdmaError::Closed(
                    "protocol error: a client sent something other than one request frame".into(),
                ));
                return;
            }
        };
        let conn = Arc::clone(&conn);
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let response = match decode_payload::<Request>(&frame) {
                Ok(request) => handler.handle(request).await,
                Err(e) => Response::Error(ErrorReply::new(ErrorCode::Malformed, e.to_string())),
            };
            let encode = |response: &Response| {
                encoded_frame(
                    FrameKind::Response,
                    frame.request_id,
                    response,
                    max_frame_bytes,
                )
            };
            let encoded = encode(&response).or_else(|_| {
                encode(&Response::Error(ErrorReply::new(
                    ErrorCode::FrameTooLarge,
                    "the response exceeds the frame limit",
                )))
            });
            let Ok(out) = encoded else {
                return;
            };
            // A reply that cannot get credits for a minute means a client
            // that stopped reading: give up on the connection.
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            if let Ok(false) = conn.send_message(&out, deadline).await {
                conn.fail(RdmaError::Closed(
                    "the client stopped granting credits".into(),
                ));
            }
            drop(permit);
        });
    }
}
