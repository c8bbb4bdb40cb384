//! Size limits on requests, enforced after decoding and before any work is done.

use super::batch::HARD_MAX_BATCH_ENTRIES;
use super::error::{LimitError, LimitsConfigError};
use super::frame::DEFAULT_MAX_FRAME_BYTES;
use super::message::{Request, TxnOp, Update};

pub const DEFAULT_MAX_KEY_BYTES: u32 = 1024;
pub const DEFAULT_MAX_VALUE_BYTES: u32 = 1024 * 1024;
pub const DEFAULT_MAX_BATCH_KEYS: u32 = 1024;

/// Frame bytes a single-entry message needs besides its key and value: the frame's
/// kind and request id, enum tags, option tags, length varints and a version.
/// Generous on purpose, so that a max-size Put, Cas or Get reply always fits.
pub const SINGLE_ENTRY_OVERHEAD_BYTES: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    pub max_key_bytes: u32,
    pub max_value_bytes: u32,
    /// Keys in one MGet or pairs in one MPut.
    pub max_batch_keys: u32,
    /// Bounds a frame's body; see [`FrameDecoder`](super::frame::FrameDecoder).
    pub max_frame_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_batch_keys: DEFAULT_MAX_BATCH_KEYS,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        }
    }
}

impl Limits {
    /// Rejects configurations under which some legal request or reply could never be
    /// sent, so a misconfiguration fails at startup rather than on the first big value.
    pub fn validate_self(&self) -> Result<(), LimitsConfigError> {
        for (field, value) in [
            ("max_key_bytes", self.max_key_bytes),
            ("max_value_bytes", self.max_value_bytes),
            ("max_batch_keys", self.max_batch_keys),
            ("max_frame_bytes", self.max_frame_bytes),
        ] {
            if value == 0 {
                return Err(LimitsConfigError::Zero { field });
            }
        }
        if self.max_batch_keys > HARD_MAX_BATCH_ENTRIES {
            return Err(LimitsConfigError::BatchOverHardCap {
                max_batch_keys: self.max_batch_keys,
                hard_max: HARD_MAX_BATCH_ENTRIES,
            });
        }
        let needed_bytes = u64::from(self.max_key_bytes)
            + u64::from(self.max_value_bytes)
            + u64::from(SINGLE_ENTRY_OVERHEAD_BYTES);
        if needed_bytes > u64::from(self.max_frame_bytes) {
            return Err(LimitsConfigError::EntryDoesNotFitFrame {
                max_key_bytes: self.max_key_bytes,
                max_value_bytes: self.max_value_bytes,
                needed_bytes,
                max_frame_bytes: self.max_frame_bytes,
            });
        }
        Ok(())
    }

    pub fn check_key(&self, key: &[u8]) -> Result<(), LimitError> {
        let max_bytes = self.max_key_bytes;
        within(key, max_bytes).map_err(|len_bytes| LimitError::KeyTooLarge {
            len_bytes,
            max_bytes,
        })
    }

    pub fn check_value(&self, value: &[u8]) -> Result<(), LimitError> {
        let max_bytes = self.max_value_bytes;
        within(value, max_bytes).map_err(|len_bytes| LimitError::ValueTooLarge {
            len_bytes,
            max_bytes,
        })
    }

    pub fn check_batch(&self, entries: usize) -> Result<(), LimitError> {
        if entries == 0 {
            return Err(LimitError::EmptyBatch);
        }
        let entries = len_u64(entries);
        if entries > u64::from(self.max_batch_keys) {
            return Err(LimitError::BatchTooLarge {
                entries,
                max_entries: self.max_batch_keys,
            });
        }
        Ok(())
    }
}

fn check_update(limits: &Limits, key: &[u8], update: &Update) -> Result<(), LimitError> {
    limits.check_key(key)?;
    match update {
        Update::Incr { .. } | Update::Expire { .. } | Update::GetEx { .. } | Update::GetDel => {
            Ok(())
        }
        Update::Append { suffix: value }
        | Update::SetIf { value, .. }
        | Update::Set { value, .. } => limits.check_value(value),
        Update::CopyFrom { source, .. } => limits.check_key(source),
    }
}

impl Request {
    /// Checks every key, value and batch size against `limits`; the first violation
    /// wins. Batch size is checked before the entries so an oversized batch is
    /// rejected without scanning it.
    pub fn validate(&self, limits: &Limits) -> Result<(), LimitError> {
        match self {
            Self::Get { key, .. } | Self::Delete { key } | Self::Ttl { key, .. } => {
                limits.check_key(key)
            }
            Self::Put { key, value } => {
                limits.check_key(key)?;
                limits.check_value(value)
            }
            Self::Cas { key, new_value, .. } => {
                limits.check_key(key)?;
                new_value
                    .as_ref()
                    .map_or(Ok(()), |value| limits.check_value(value))
            }
            Self::MGet { keys, .. } => {
                limits.check_batch(keys.len())?;
                keys.iter().try_for_each(|key| limits.check_key(key))
            }
            Self::MPut { pairs } => {
                limits.check_batch(pairs.len())?;
                pairs.iter().try_for_each(|(key, value)| {
                    limits.check_key(key)?;
                    limits.check_value(value)
                })
            }
            Self::Update { key, update } => check_update(limits, key, update),
            Self::Transaction { watch, ops } => {
                limits.check_batch(watch.len().saturating_add(ops.len()))?;
                watch
                    .iter()
                    .try_for_each(|(key, _)| limits.check_key(key))?;
                ops.iter().try_for_each(|op| match op {
                    TxnOp::Get { key } | TxnOp::Delete { key } | TxnOp::Ttl { key } => {
                        limits.check_key(key)
                    }
                    TxnOp::Put { key, value } => {
                        limits.check_key(key)?;
                        limits.check_value(value)
                    }
                    TxnOp::Update { key, update } => check_update(limits, key, update),
                })
            }
            Self::Scan {
                start_key,
                end_key,
                limit,
                ..
            } => {
                limits.check_batch(usize::try_from(*limit).unwrap_or(usize::MAX))?;
                limits.check_key(start_key)?;
                end_key.as_ref().map_or(Ok(()), |key| limits.check_key(key))
            }
            // A shard's placement operations carry no key or value.
            Self::Sharded { request, .. } => request
                .to_request()
                .map_or(Ok(()), |request| request.validate(limits)),
            // Admin requests carry no keys or values; the server checks their
            // arguments against the cluster state.
            Self::Ping
            | Self::Status
            | Self::Health
            | Self::Members
            | Self::AddMember { .. }
            | Self::PromoteMember { .. }
            | Self::RemoveMember { .. }
            | Self::MoveLeader { .. }
            | Self::SnapshotRead { .. }
            | Self::ReportReads(_)
            | Self::InjectFault(_)
            | Self::Clear
            | Self::RdmaConnect { .. }
            | Self::RdmaRegion
            | Self::OfiRegion
            | Self::ShardMap
            | Self::ShardStatus
            | Self::ShardMoveLeader { .. }
            | Self::PublishShardMap { .. }
            | Self::AddNode { .. }
            | Self::RemoveNode { .. }
            | Self::Digests => Ok(()),
        }
    }
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// `Ok` when `bytes` is at most `max_bytes` long, else its length.
fn within(bytes: &[u8], max_bytes: u32) -> Result<(), u64> {
    let len_bytes = len_u64(bytes.len());
    if len_bytes > u64::from(max_bytes) {
        return Err(len_bytes);
    }
    Ok(())
}
