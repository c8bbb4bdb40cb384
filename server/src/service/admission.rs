//! What the node takes in: client connections (a fixed number of slots),
//! bytes of large requests in flight across connections (a budget that
//! backpressures readers), and the quota a write must stay within.

use std::sync::Arc;

use bytes::Bytes;
use rdkv_proto::region::charged_bytes;
use rdkv_proto::wire::{ErrorReply, TxnOp, Update};
use rdkv_storage::raft::Command;
use rdkv_storage::state_machine::no_space;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests up to this size do not take from the in-flight budget: a node
/// at its budget still answers reads and small writes (each connection's
/// credits bound those).
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;
/// What an INCR may add to a value at most (an i64 in decimal, with sign).
const INCR_GROWTH_BYTES: usize = 20;

#[derive(Debug)]
pub struct Admission {
    /// One permit per client connection allowed.
    connection_slots: Arc<Semaphore>,
    max_client_connections: u32,
    /// One permit per KiB of large requests allowed in flight.
    in_flight_kib: Arc<Semaphore>,
    max_in_flight_kib: u32,
}

impl Admission {
    pub fn new(max_client_connections: u32, max_in_flight_bytes: u64) -> Admission {
        let max_in_flight_kib = u32::try_from(max_in_flight_bytes / 1024).unwrap_or(u32::MAX);
        Admission {
            connection_slots: Arc::new(Semaphore::new(max_client_connections as usize)),
            max_client_connections,
            in_flight_kib: Arc::new(Semaphore::new(max_in_flight_kib as usize)),
            max_in_flight_kib,
        }
    }

    /// A slot for one more client connection, if the limit allows.
    pub fn connection_slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.connection_slots).try_acquire_owned().ok()
    }

    pub fn max_client_connections(&self) -> u32 {
        self.max_client_connections
    }

    /// Takes `payload_bytes` from the node's in-flight budget for a large
    /// request (`Ok(None)` for a small one). While the budget is spent,
    /// `Err` holds the wait for it (cancel-safe: dropping it gives up its
    /// place in the queue).
    pub fn try_in_flight_permit(
        &self,
        payload_bytes: usize,
    ) -> Result<
        Option<OwnedSemaphorePermit>,
        impl Future<Output = Option<OwnedSemaphorePermit>> + Send + 'static,
    > {
        if payload_bytes <= SMALL_REQUEST_BYTES {
            return Ok(None);
        }
        let kib = u32::try_from(payload_bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.max_in_flight_kib);
        let budget = Arc::clone(&self.in_flight_kib);
        match Arc::clone(&budget).try_acquire_many_owned(kib) {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(async move { budget.acquire_many_owned(kib).await.ok() }),
        }
    }

    /// (budget, in use) of large in-flight requests, in bytes.
    pub fn in_flight_bytes(&self) -> (u64, u64) {
        let total = u64::from(self.max_in_flight_kib) * 1024;
        let free = self.in_flight_kib.available_permits() as u64 * 1024;
        (total, total.saturating_sub(free))
    }
}

/// The most an update may make its key's value: the current value's
/// length is not known before apply. `None`: it writes no new value (a
/// deadline change rewrites the same one, GETDEL removes it), so it is
/// admitted like a delete.
fn update_growth_bytes(update: &Update) -> Option<usize> {
    match update {
        Update::Incr { .. } => Some(INCR_GROWTH_BYTES),
        Update::Append { suffix } => Some(suffix.len()),
        Update::SetIf { value, .. } | Update::Set { value, .. } => Some(value.len()),
        // The source's length is not known before apply either; apply's
        // quota check (the same on every replica) decides.
        Update::CopyFrom { .. } => Some(0),
        Update::Expire { .. } | Update::GetEx { .. } | Update::GetDel => None,
    }
}

/// The most `command` may add to the live pairs' charge (`None`: it only
/// removes): each written pair's charge, as if no key existed before.
fn incoming_charge(command: &Command) -> Option<u64> {
    let charge = |key: &Bytes, value_len: usize| charged_bytes(key.len(), value_len).unwrap_or(0);
    Some(match command {
        Command::Put { key, value } => charge(key, value.len()),
        Command::Cas {
            key,
            new_value: Some(value),
            ..
        } => charge(key, value.len()),
        Command::MPut { pairs } => pairs.iter().map(|(k, v)| charge(k, v.len())).sum(),
        Command::Update { key, update } => charge(key, update_growth_bytes(update)?),
        Command::Transaction { ops, .. } => {
            let writes = ops.iter().filter_map(|op| match op {
                TxnOp::Put { key, value } => Some(charge(key, value.len())),
                TxnOp::Update { key, update } => Some(charge(key, update_growth_bytes(update)?)),
                TxnOp::Get { .. } | TxnOp::Delete { .. } | TxnOp::Ttl { .. } => None,
            });
            writes.reduce(u64::saturating_add)?
        }
        Command::Timed { command, .. } => return incoming_charge(command),
        Command::Delete { .. }
        | Command::ExpireKeys { .. }
        | Command::Clear
        | Command::SetHashSeed { .. }
        | Command::SetQuota { .. }
        | Command::SetClusterId { .. }
        | Command::PublishShardMap { .. }
        | Command::Cas {
            new_value: None, ..
        } => return None,
    })
}

/// Refuses, before proposing, a write that would take the live pairs past
/// `quota_bytes` (as Redis refuses writes past `maxmemory`, overwrites
/// included); apply checks it exactly on every replica, overwrites
/// credited. Removing is always admitted.
pub fn within_quota(
    command: &Command,
    charged_bytes: u64,
    quota_bytes: u64,
) -> Result<(), ErrorReply> {
    match incoming_charge(command) {
        Some(incoming) if charged_bytes.saturating_add(incoming) > quota_bytes => {
            Err(no_space(charged_bytes, incoming, quota_bytes))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use rdkv_proto::wire::ErrorCode;

    use super::*;

    #[test]
    fn a_write_must_stay_within_the_quota() {
        let put = Command::Put {
            key: Bytes::from("k"),
            value: Bytes::from(vec![0u8; 31]),
        };
        // 32-byte header + 1 + 31 = one 64-byte unit, plus an 8-byte slot.
        assert!(within_quota(&put, 928, 1000).is_ok());
        let refused = within_quota(&put, 929, 1000);
        assert!(refused.is_err_and(|e| e.code == ErrorCode::NoSpace));
        // Stamped with a leader's clock it is admitted the same.
        let timed = put.timed(1);
        assert!(within_quota(&timed, 929, 1000).is_err());
        // Removing, and changing a deadline, are always admitted, even past
        // the quota.
        let delete = Command::Delete {
            key: Bytes::from("k"),
        };
        assert!(within_quota(&delete, 2000, 1000).is_ok());
        let persist = Command::Update {
            key: Bytes::from("k"),
            update: Update::Expire {
                expiry: rdkv_proto::wire::Expiry::Never,
                condition: rdkv_proto::wire::ExpireCondition::Always,
            },
        };
        assert!(within_quota(&persist, 2000, 1000).is_ok());
    }

    #[tokio::test]
    async fn small_requests_take_nothing_from_the_budget() {
        let admission = Admission::new(1, 1024 * 1024);
        assert!(matches!(
            admission.try_in_flight_permit(SMALL_REQUEST_BYTES),
            Ok(None)
        ));
        let large = admission.try_in_flight_permit(SMALL_REQUEST_BYTES + 1);
        assert!(matches!(large, Ok(Some(_))), "the budget has room");
        assert_eq!(admission.in_flight_bytes(), (1024 * 1024, 65 * 1024));
        let slot = admission.connection_slot();
        assert!(slot.is_some());
        assert!(admission.connection_slot().is_none(), "the limit is one");
    }

    #[tokio::test]
    async fn a_large_request_past_the_budget_waits_for_it() {
        let admission = Admission::new(1, 128 * 1024);
        let first = admission.try_in_flight_permit(100 * 1024);
        let Ok(Some(first)) = first else {
            panic!("the budget has room for the first");
        };
        let Err(wait) = admission.try_in_flight_permit(100 * 1024) else {
            panic!("the second is past the budget");
        };
        let wait = tokio::spawn(wait);
        tokio::task::yield_now().await;
        assert!(!wait.is_finished(), "the budget is spent");
        drop(first);
        let second = tokio::time::timeout(std::time::Duration::from_secs(10), wait).await;
        assert!(
            matches!(second, Ok(Ok(Some(_)))),
            "given once the first is done"
        );
    }
}
