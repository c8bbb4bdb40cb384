//! Loading a region from a snapshot file, the long part of a restart and of
//! a snapshot install: the file is read as a stream and its pairs placed in
//! a fresh region while another thread takes the region's page faults ahead
//! of the writer.

use std::io::BufReader;
use std::sync::Arc;

use rdkv_proto::region::{HashSeed, RegionLayout, SLOT_BYTES};

use super::keyed::KeyedRegion;
use super::snapshot::{SnapshotError, SnapshotReader, SnapshotRegion};
use super::snapshot_store::SnapshotFile;
use super::{StateMachineConfig, StateMachineError, max_snapshot_record_bytes, new_region};
use crate::raft::SnapshotMeta;
use crate::region::{Clock, RegionConfig, RegionError, RegionMemory};

/// Pages populated per call by the thread running ahead of the writer.
const POPULATE_CHUNK_BYTES: u64 = 16 * 1024 * 1024;

/// Bytes of a snapshot file read at a time.
const READ_BUFFER_BYTES: usize = 1024 * 1024;

/// A region rebuilt from a snapshot.
pub(super) struct LoadedRegion {
    pub(super) writer: KeyedRegion,
    /// The replicated settings the snapshot carries.
    pub(super) region: SnapshotRegion,
    pub(super) meta: SnapshotMeta,
}

pub(super) fn seed_of(region: &SnapshotRegion) -> Option<HashSeed> {
    region.hash_seed.map(|(k0, k1)| HashSeed(k0, k1))
}

/// Places the pairs of the snapshot `file`, read as a stream (one record
/// in memory at a time), in a new region of `epoch`, with the cluster seed
/// the snapshot names. A record that fails its check, or a pair the region
/// refuses, is an error, and a snapshot this node's region cannot hold says
/// so ([`StateMachineError::SnapshotDoesNotFit`]); the caller then keeps
/// the region it has.
pub(super) fn load_region(
    config: &StateMachineConfig,
    clock: &Arc<dyn Clock>,
    epoch: u64,
    file: &SnapshotFile,
) -> Result<LoadedRegion, StateMachineError> {
    let input = BufReader::with_capacity(READ_BUFFER_BYTES, file.reader());
    let mut reader = SnapshotReader::from_stream(input, max_snapshot_record_bytes(&config.region))?;
    let region = reader.region;
    let index = reader.meta.last_log_id.map_or(0, |l| l.index);
    let empty = new_region(config, clock, epoch, seed_of(&region))?;
    let memory = Arc::clone(empty.memory());
    let layout = *empty.layout();
    let mut meta = None;
    let writer = std::thread::scope(|scope| {
        scope.spawn(|| populate_ahead(&memory, &layout, file.len()));
        KeyedRegion::load(empty, region.clock_unix_ms, |put| {
            let mut placed = 0u64;
            meta = Some(reader.pairs::<StateMachineError>(|pair| {
                put(pair).map_err(|e| does_not_fit(e, index, placed, &config.region))?;
                placed += 1;
                Ok(())
            })?);
            Ok::<_, StateMachineError>(())
        })
    })?;
    let meta = meta.ok_or(SnapshotError::Structure("the snapshot has no end record"))?;
    Ok(LoadedRegion {
        writer,
        region,
        meta,
    })
}

/// A pair of the snapshot at `index` this node's region refused: the
/// region or its index is full, or the pair is over this node's limits.
/// Any other error passes unchanged.
fn does_not_fit(
    error: StateMachineError,
    index: u64,
    placed: u64,
    region: &RegionConfig,
) -> StateMachineError {
    match error {
        StateMachineError::Region(
            source @ (RegionError::RegionFull { .. }
            | RegionError::IndexFull { .. }
            | RegionError::KeyTooLarge { .. }
            | RegionError::ValueTooLarge { .. }),
        ) => StateMachineError::SnapshotDoesNotFit {
            index,
            placed,
            region_mib: region.region_bytes / (1024 * 1024),
            source,
        },
        other => other,
    }
}

/// Faults in, on this thread, the pages a load of `pairs_bytes` of
/// snapshot will write: the whole index (keys land all over it), then the
/// data area from its start, where a fresh region's allocator places
/// blocks one after another, up to a quarter more than the pairs (block
/// headers and padding). The writer's own faults on pages not yet reached
/// are taken as usual: this only moves work to the other core.
fn populate_ahead(memory: &RegionMemory, layout: &RegionLayout, pairs_bytes: u64) {
    let index_bytes = layout.slot_count() * SLOT_BYTES;
    let data_bytes = (pairs_bytes + pairs_bytes / 4).min(layout.data_bytes);
    let ranges = [
        (layout.index_offset, index_bytes),
        (layout.data_offset, data_bytes),
    ];
    for (start, len) in ranges {
        let mut offset = start;
        while offset < start + len {
            let chunk = POPULATE_CHUNK_BYTES.min(start + len - offset);
            if let Err(e) = memory.populate(offset, chunk) {
                tracing::debug!("populating the region ahead of the load: {e}");
                return;
            }
            offset += chunk;
        }
    }
}
