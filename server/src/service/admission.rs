//! What the node takes in: client connections (a fixed number of slots),
//! bytes of large requests in flight across connections (a budget that
//! backpressures readers), and the region headroom a write must leave.

use std::sync::Arc;

use rdkv_proto::wire::{ErrorCode, ErrorReply, Update};
use rdkv_storage::RegionStats;
use rdkv_storage::raft::Command;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests up to this size do not take from the in-flight budget: a node
/// at its budget still answers reads and small writes (each connection's
/// credits bound those).
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;
/// A leader refuses writes that would leave less than this share of the
/// region free: replicas' regions fill differently (fragmentation, grace
/// periods), and a follower must never be the one that runs out.
const WRITE_HEADROOM_PERCENT: u64 = 5;
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
    /// request (`None` for a small one), waiting while the budget is spent;
    /// `waited` is set if it had to.
    pub async fn in_flight_permit(
        &self,
        payload_bytes: usize,
        waited: &mut bool,
    ) -> Option<OwnedSemaphorePermit> {
        if payload_bytes <= SMALL_REQUEST_BYTES {
            return None;
        }
        let kib = u32::try_from(payload_bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.max_in_flight_kib);
        if let Ok(permit) = Arc::clone(&self.in_flight_kib).try_acquire_many_owned(kib) {
            return Some(permit);
        }
        *waited = true;
        Arc::clone(&self.in_flight_kib)
            .acquire_many_owned(kib)
            .await
            .ok()
    }

    /// (budget, in use) of large in-flight requests, in bytes.
    pub fn in_flight_bytes(&self) -> (u64, u64) {
        let total = u64::from(self.max_in_flight_kib) * 1024;
        let free = self.in_flight_kib.available_permits() as u64 * 1024;
        (total, total.saturating_sub(free))
    }
}

/// Bytes `command` may add to the region (`None`: it only removes).
fn incoming_bytes(command: &Command) -> Option<u64> {
    let bytes = match command {
        Command::Put { key, value } => key.len() + value.len(),
        Command::Cas {
            key,
            new_value: Some(value),
            ..
        } => key.len() + value.len(),
        Command::MPut { pairs } => pairs.iter().map(|(k, v)| k.len() + v.len()).sum(),
        Command::Update { key, update } => {
            key.len()
                + match update {
                    Update::Incr { .. } => INCR_GROWTH_BYTES,
                    Update::Append { suffix } => suffix.len(),
                    Update::SetIf { value, .. } => value.len(),
                }
        }
        Command::Delete { .. }
        | Command::Clear
        | Command::SetHashSeed { .. }
        | Command::Cas {
            new_value: None, ..
        } => return None,
    };
    Some(bytes as u64)
}

/// Refuses a write the region could not take with headroom to spare.
pub fn write_headroom(command: &Command, region: &RegionStats) -> Result<(), ErrorReply> {
    let Some(incoming) = incoming_bytes(command) else {
        return Ok(());
    };
    let reserve = region.data_capacity_bytes * WRITE_HEADROOM_PERCENT / 100;
    let available = region.free_bytes + region.pending_reclaim_bytes;
    if available < incoming.saturating_add(reserve) {
        return Err(ErrorReply::new(
            ErrorCode::RegionFull,
            format!(
                "region full: {available} bytes free or reclaimable, {incoming} needed plus a {reserve}-byte reserve"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn region_with_free(free_bytes: u64) -> RegionStats {
        RegionStats {
            data_capacity_bytes: 1000,
            used_bytes: 1000 - free_bytes,
            payload_bytes: 0,
            pending_reclaim_bytes: 0,
            pending_reclaim_blocks: 0,
            free_bytes,
            largest_free_bytes: free_bytes,
            fragmentation: 0.0,
            live_keys: 0,
            index_slots: 0,
            overflow_tables: 0,
            overflow_bytes: 0,
            reclaimed_blocks_total: 0,
            reclaimed_bytes_total: 0,
        }
    }

    #[test]
    fn a_write_must_leave_the_reserve_free() {
        let put = Command::Put {
            key: Bytes::from("k"),
            value: Bytes::from(vec![0u8; 49]),
        };
        // 50 bytes incoming plus a 50-byte reserve (5% of 1000).
        assert!(write_headroom(&put, &region_with_free(100)).is_ok());
        let refused = write_headroom(&put, &region_with_free(99));
        assert!(refused.is_err_and(|e| e.code == ErrorCode::RegionFull));
        // Removing is always admitted, even into a full region.
        let delete = Command::Delete {
            key: Bytes::from("k"),
        };
        assert!(write_headroom(&delete, &region_with_free(0)).is_ok());
    }

    #[tokio::test]
    async fn small_requests_take_nothing_from_the_budget() {
        let admission = Admission::new(1, 1024 * 1024);
        let mut waited = false;
        assert!(
            admission
                .in_flight_permit(SMALL_REQUEST_BYTES, &mut waited)
                .await
                .is_none()
        );
        let large = admission
            .in_flight_permit(SMALL_REQUEST_BYTES + 1, &mut waited)
            .await;
        assert!(large.is_some());
        assert!(!waited);
        assert_eq!(admission.in_flight_bytes(), (1024 * 1024, 65 * 1024));
        let slot = admission.connection_slot();
        assert!(slot.is_some());
        assert!(admission.connection_slot().is_none(), "the limit is one");
    }
}
