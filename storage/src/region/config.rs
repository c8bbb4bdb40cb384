//! How a region is sized and limited. Defaults follow the brief: 256 MiB,
//! keys up to 1 KiB, values up to 1 MiB.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use rdkv_proto::region::{HashSeed, LayoutParams, RegionLayout, bucket_count_for};

use crate::region::error::RegionError;

pub const DEFAULT_REGION_BYTES: u64 = 256 * 1024 * 1024;
/// Share of the data area a node's quota defaults to: the rest is room for
/// fragments, blocks in their grace period and overflow tables, which the
/// quota does not count.
pub const DEFAULT_QUOTA_PERCENT: u64 = 90;
const PAGE_BYTES: u64 = 4096;

#[derive(Debug, Clone)]
pub struct RegionConfig {
    /// Whole mapping: header + index + data area. Multiple of 4 KiB.
    pub region_bytes: u64,
    /// Index sizing: one slot per this many bytes of region (default 128:
    /// ~6% of the region is index, enough for blocks of one or two units).
    /// A smaller index is never full: keys whose neighbourhood is full go
    /// to overflow tables, at one more read each for a one-sided GET.
    pub bytes_per_slot: u64,
    /// Buckets a key may be placed in, read together on lookup (1..=8).
    pub neighbourhood_buckets: u64,
    pub max_key_bytes: u32,
    pub max_value_bytes: u32,
    /// A retired block is not reused for this long (invariant 3). Readers
    /// abandon a GET that takes longer than half of it.
    pub grace_period_us: u64,
    pub node_id: u64,
    pub region_epoch: u64,
    pub hash_seed: HashSeed,
    /// Back the region with a sealed memfd that local clients can map
    /// read-only (the `shm` transport); otherwise private anonymous memory.
    pub shared_memory: bool,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            region_bytes: DEFAULT_REGION_BYTES,
            bytes_per_slot: 128,
            neighbourhood_buckets: 2,
            max_key_bytes: 1024,
            max_value_bytes: 1024 * 1024,
            grace_period_us: 250_000,
            node_id: 0,
            region_epoch: 1,
            hash_seed: random_seed(),
            shared_memory: true,
        }
    }
}

/// A seed from the OS-seeded randomness std already uses for `HashMap`.
pub fn random_seed() -> HashSeed {
    let draw = || RandomState::new().build_hasher().finish();
    HashSeed(draw(), draw())
}

impl RegionConfig {
    /// The quota of a node with this region (what it proposes when it
    /// leads, and what a restore checks a backup against): `explicit`
    /// (`--quota-bytes`), else `DEFAULT_QUOTA_PERCENT` of the data area. A
    /// quota the data area cannot hold would admit writes no replica can
    /// place, so it is refused.
    pub fn quota_bytes(&self, explicit: Option<u64>) -> Result<u64, RegionError> {
        let data_bytes = self.layout()?.data_bytes;
        let quota = explicit.unwrap_or(data_bytes / 100 * DEFAULT_QUOTA_PERCENT);
        if quota > data_bytes {
            return Err(RegionError::Config(format!(
                "--quota-bytes {quota} exceeds the region's data area ({data_bytes} bytes): \
                 raise --region-mib or lower --quota-bytes"
            )));
        }
        Ok(quota)
    }

    pub fn layout(&self) -> Result<RegionLayout, RegionError> {
        if self.region_bytes == 0 || !self.region_bytes.is_multiple_of(PAGE_BYTES) {
            return Err(RegionError::Config(format!(
                "region_bytes {} must be a non-zero multiple of {PAGE_BYTES}",
                self.region_bytes
            )));
        }
        if usize::try_from(self.region_bytes).is_err() {
            return Err(RegionError::Config(
                "region_bytes exceeds the address space".into(),
            ));
        }
        if self.bytes_per_slot == 0 {
            return Err(RegionError::Config("bytes_per_slot must be >= 1".into()));
        }
        let bucket_count = bucket_count_for(
            self.region_bytes,
            self.bytes_per_slot,
            self.neighbourhood_buckets,
        );
        RegionLayout::plan(LayoutParams {
            region_bytes: self.region_bytes,
            bucket_count,
            neighbourhood_buckets: self.neighbourhood_buckets,
            region_epoch: self.region_epoch,
            node_id: self.node_id,
            hash_seed: self.hash_seed,
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            grace_period_us: self.grace_period_us,
        })
        .map_err(RegionError::from)
    }
}

#[cfg(test)]
mod homes_tests {
    use super::*;
    use rdkv_proto::region::SLOTS_PER_BUCKET;

    #[test]
    fn a_power_of_two_index_gets_a_power_of_two_of_homes() {
        let config = RegionConfig {
            region_bytes: 64 << 20,
            ..RegionConfig::default()
        };
        let layout = config.layout().unwrap();
        let homes = layout.bucket_count - layout.neighbourhood_buckets + 1;
        assert!(homes.is_power_of_two(), "{} buckets", layout.bucket_count);
        assert_eq!(
            homes,
            (64 << 20) / config.bytes_per_slot / SLOTS_PER_BUCKET as u64
        );
        // Small and odd indexes are left as asked.
        let slot = config.bytes_per_slot * SLOTS_PER_BUCKET as u64;
        assert_eq!(bucket_count_for(512 * slot, config.bytes_per_slot, 2), 512);
        assert_eq!(
            bucket_count_for((3 << 12) * slot, config.bytes_per_slot, 2),
            3 << 12
        );
    }
}
