//! Typed errors of region-byte validation. Each says what was wrong with the
//! bytes, so a reader can count the cause (torn read vs corruption) and retry.

use thiserror::Error;

/// The static header did not validate: the region is not one this code can read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HeaderError {
    #[error("region header too short: {len} bytes, need {need}")]
    Truncated { len: usize, need: usize },
    #[error("bad region magic {found:#018x}")]
    BadMagic { found: u64 },
    #[error("unsupported region layout version {found} (this build reads {supported})")]
    UnsupportedVersion { found: u64, supported: u64 },
    #[error("region header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u64, computed: u64 },
    #[error("region geometry invalid: {0}")]
    Geometry(&'static str),
}

/// A slot word failed its check or points outside the data area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SlotError {
    #[error("slot {raw:#018x} fails its check byte")]
    Check { raw: u64 },
    #[error("slot {raw:#018x} has an unknown size class")]
    SizeClass { raw: u64 },
    #[error("slot {raw:#018x} points outside the data area")]
    OutOfRange { raw: u64 },
    /// A valid word of a kind its position cannot hold: a link outside an
    /// anchor or a table's last slot, an entry in a table's last slot.
    #[error("slot word {raw:#018x} is of a kind its position cannot hold")]
    Misplaced { raw: u64 },
    /// An overflow chain goes on past the bound every writer keeps to: a
    /// corrupt link (perhaps a cycle).
    #[error("overflow chain longer than {max_tables} tables")]
    ChainTooLong { max_tables: usize },
}

/// A block read from the data area is not a whole, committed block. Under
/// concurrent reuse this is a torn read (retry); if it persists, corruption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BlockError {
    #[error("block read too short: {len} bytes, need {need}")]
    Truncated { len: usize, need: usize },
    /// Its writer took it out of service (the invalidation word is cleared):
    /// the key is being replaced or deleted, so the slot is worth reading again.
    #[error("block invalidated by its writer (being replaced or deleted)")]
    Invalidated,
    #[error("bad block magic {found:#010x}")]
    BadMagic { found: u32 },
    #[error("block lengths out of range: key {key_len} value {value_len} in {available} bytes")]
    Length {
        key_len: u32,
        value_len: u32,
        available: usize,
    },
    #[error("block checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("block has version 0 (never committed)")]
    ZeroVersion,
}
