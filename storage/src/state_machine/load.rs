//! Loading a region from a snapshot, the long part of a restart and of a
//! snapshot install: the pairs are placed in a fresh region while another
//! thread takes the region's page faults ahead of the writer.

use std::sync::Arc;

use rdkv_proto::region::{HashSeed, RegionLayout, SLOT_BYTES};

use super::keyed::KeyedRegion;
use super::snapshot::{SnapshotError, SnapshotReader, SnapshotRegion};
use super::{StateMachineConfig, StateMachineError, max_snapshot_record_bytes, new_region};
use crate::raft::SnapshotMeta;
use crate::region::{Clock, RegionMemory};

/// Pages populated per call by the thread running ahead of the writer.
const POPULATE_CHUNK_BYTES: u64 = 16 * 1024 * 1024;

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

/// Places the pairs of the snapshot in `bytes` in a new region of `epoch`,
/// with the cluster seed the snapshot names. A record that fails its check,
/// or a pair the region refuses, is an error; the caller then keeps the
/// region it has.
pub(super) fn load_region(
    config: &StateMachineConfig,
    clock: &Arc<dyn Clock>,
    epoch: u64,
    bytes: &[u8],
) -> Result<LoadedRegion, StateMachineError> {
    let mut reader = SnapshotReader::open(bytes, max_snapshot_record_bytes(&config.region))?;
    let region = reader.region;
    let empty = new_region(config, clock, epoch, seed_of(&region))?;
    let memory = Arc::clone(empty.memory());
    let layout = *empty.layout();
    let mut meta = None;
    let writer = std::thread::scope(|scope| {
        scope.spawn(|| populate_ahead(&memory, &layout, bytes.len() as u64));
        KeyedRegion::load(empty, region.clock_unix_ms, |put| {
            meta = Some(reader.pairs::<StateMachineError>(put)?);
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
