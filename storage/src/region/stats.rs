//! Region statistics for metrics and `endpoint status`. Byte figures count
//! allocated space (blocks by size class, and overflow tables: `used_bytes`
//! includes `overflow_bytes`), `payload_bytes` the keys and values.

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegionStats {
    pub data_capacity_bytes: u64,
    pub used_bytes: u64,
    pub payload_bytes: u64,
    pub pending_reclaim_bytes: u64,
    pub pending_reclaim_blocks: u64,
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    /// 1 - largest free extent / free bytes: 0 when free space is one piece.
    pub fragmentation: f64,
    pub live_keys: u64,
    /// The live pairs' charge against the quota: their blocks' size classes
    /// plus one index slot each (see `rdkv_proto::region::charge`).
    pub charged_bytes: u64,
    pub index_slots: u64,
    /// Overflow tables linked (never freed while the region lives).
    pub overflow_tables: u64,
    pub overflow_bytes: u64,
    pub reclaimed_blocks_total: u64,
    pub reclaimed_bytes_total: u64,
}
