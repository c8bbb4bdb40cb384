//! The one-sided GET against the floor under it (`rdkv-bench fabric
//! --transports floor`): in one run, per region size and value size, what a
//! GET costs against what the memory work alone costs.
//!
//! - floor: a random 64-byte slot read (a bucket of the index) plus a copy
//!   of a block of the GET's size class from a random place plus the CRC32
//!   (crc32fast, as the region format's) over it, in a plain buffer of the
//!   region's size: no rdkv code. Hot: a 1 MiB region (the caches hold it);
//!   cold: as large as the server's region (DRAM misses).
//! - `get_into`: `ReadHandle::get_into` of a random key of that size from
//!   the leader's region (mapped over shm), lease and deadline checked:
//!   hot over as many keys as fill about 1 MiB of blocks, cold over keys
//!   spread over the whole region.
//! - `get`: the async `Client::get_with` (Lease) of the same keys.
//! - tiny rows: 64 keys (and a floor over 64 fixed places of the hot
//!   region), all in L1/L2 and the TLB: the GET's software cost alone.
//! - spread floor: the floor's work over as many fixed (bucket, block)
//!   places as the row has keys, scattered over a buffer of the cold
//!   region's size: the cache footprint of the row's keys and their page
//!   footprint too (a hot row's keys fill 1 MiB of cache lines but lie on
//!   thousands of pages of the 256 MiB region, more than the TLB holds).
//!   Not a target: it tells how much of a GET's gap is the TLB.
//! - chained floor: the floor's work with the block's place taken from the
//!   slot's bytes, as a GET takes it from the slot it found: the block's
//!   miss cannot start before the slot's has ended. The floor's two places
//!   are independent random numbers, so the CPU overlaps their misses; a
//!   GET's are serial. Not a target either (the floor is the
//!   other): it tells how much of a cold GET's gap is that dependency.
//! - ordered floor: the floor's work done as a GET must do it, with the
//!   parts (below) in their places: the key made and hashed, the bucket
//!   taken from the hash, the block's place from the bucket's bytes (and
//!   the hash), the clock read after the copy, then the CRC, for the row's
//!   keys. The floors above run operations back to back whose addresses
//!   owe nothing to each other's work, and the CPU overlaps one
//!   operation's misses with the next one's (measured: made serial, the
//!   cold 8 B floor took three times as long); with the parts in place
//!   much of that overlap goes, so adding the parts to the floor
//!   understates the bound. `least` = (ordered floor - keys) / floor:
//!   what a GET handed its key, doing the floor's work, the hash and the
//!   clock reading in that order, cannot go under, measured rather than
//!   added up.
//! - parts: what every GET must do that the floor does not, alone: the
//!   keyed hash of its key (SipHash-1-3, `KeyHash::new`: the region
//!   format's, seeded so that a client cannot aim keys at one bucket, for
//!   the server's default geometry of the cold region) and its one reading
//!   of the lease's clock (boottime); less a round that only makes the
//!   keys (`keys`). The GET rounds make their keys too, so leaving that
//!   out keeps the figure low.
//!
//! Every figure is the mean time per operation over a round of
//! back-to-back operations (a clock reading per operation would cost about
//! as much as the floor); the kinds of round take turns, and each
//! column's median round is reported (the parts: the median of the
//! rounds' differences).

use std::time::{Duration, Instant};

use bytes::Bytes;
use memmap2::MmapMut;
use rdkv_client::{Client, Consistency, GetIntoError, ReadHandle};
use rdkv_fabric::clock::boottime_now_us;
use rdkv_fabric::pages::{MappingPages, ThpSetting, shmem_huge_bytes};
use rdkv_proto::region::{HashSeed, KeyHash, bucket_count_for};
use serde::Serialize;

use crate::fabric_bench::FabricBenchError;

/// The hot region's size.
pub const HOT_REGION_BYTES: usize = 1 << 20;
/// Keys of the tiny rows (and places of their floor, in the hot region).
const TINY_KEYS: usize = 64;
/// Bytes of a key of the floor table's keys (`floor/<size>/<index>`, padded).
const KEY_BYTES: usize = 28;
/// The region header and the 32-byte block header.
const BLOCK_HEADER_BYTES: usize = 32;
/// Region bytes per index slot (the server's default `--bytes-per-slot`).
const BYTES_PER_SLOT: usize = 128;

#[derive(Debug, Clone, Serialize)]
pub struct FloorRow {
    pub region: &'static str,
    pub region_bytes: usize,
    pub bytes: usize,
    pub keys: usize,
    pub floor_ns: f64,
    pub spread_floor_ns: f64,
    pub chained_floor_ns: f64,
    pub ordered_floor_ns: f64,
    pub parts_ns: f64,
    pub keys_ns: f64,
    pub get_into_ns: f64,
    pub get_ns: f64,
    pub get_into_ratio: f64,
    pub get_ratio: f64,
    pub get_into_spread_ratio: f64,
    pub get_into_chained_ratio: f64,
    pub get_into_ordered_ratio: f64,
    /// (ordered floor - keys) / floor: the least `get_into_ratio` could be
    /// for a GET handed its key.
    pub least_ratio: f64,
}

#[derive(Debug, Clone)]
pub struct FloorOptions {
    pub sizes: Vec<usize>,
    /// The cold region: the server's region size.
    pub cold_region_bytes: usize,
    /// Operations per round, and rounds.
    pub ops_per_round: usize,
    pub rounds: usize,
    /// Which rows: tiny, hot, cold.
    pub regions: Vec<String>,
}

/// The block a value of `size` bytes takes: its size class (64-byte steps
/// up to 2 KiB, then four per doubling), as the region format has it.
pub fn block_bytes(size: usize) -> usize {
    let need = BLOCK_HEADER_BYTES + KEY_BYTES + size;
    if need <= 2048 {
        need.next_multiple_of(64)
    } else {
        let power = need.next_power_of_two();
        let step = power / 8;
        need.next_multiple_of(step)
    }
}

fn key(size: usize, index: usize) -> Bytes {
    let mut out = [0u8; KEY_BYTES];
    Bytes::copy_from_slice(KeyMaker::new(size).make(index, &mut out))
}

/// Writes the keys of one size (`floor/<size>/<index>`, the index
/// zero-padded to [`KEY_BYTES`]) into a buffer on the stack, as the timed
/// loops need them: an application holds the key it asks for, while a
/// table of 150 000 keys on the heap would add a cache miss or two per
/// GET that the floor does not have.
struct KeyMaker {
    prefix: [u8; KEY_BYTES],
    prefix_len: usize,
}

impl KeyMaker {
    fn new(size: usize) -> KeyMaker {
        let text = format!("floor/{size}/");
        let mut prefix = [b'0'; KEY_BYTES];
        let prefix_len = text.len().min(KEY_BYTES);
        prefix[..prefix_len].copy_from_slice(&text.as_bytes()[..prefix_len]);
        KeyMaker { prefix, prefix_len }
    }

    fn make<'o>(&self, mut index: usize, out: &'o mut [u8; KEY_BYTES]) -> &'o [u8] {
        // The prefix brings the padding zeros: only the index's own
        // digits are written (a few, not twenty: a dependent chain of
        // twenty divisions cost a GET row about 50 ns the floor has not).
        *out = self.prefix;
        for digit in out[self.prefix_len..].iter_mut().rev() {
            *digit = b'0' + (index % 10) as u8;
            index /= 10;
            if index == 0 {
                break;
            }
        }
        out
    }
}

/// A small fast generator (xorshift64*), the same for every row.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`: the high half of a widening multiply, not a
    /// division (a `div` costs several ns; with `%` the floor took two an
    /// operation and a GET's row one, work neither measures).
    fn below(&mut self, n: usize) -> usize {
        scale(self.next(), n)
    }
}

/// `word` taken as a fraction of 2^64, times `n`: a number below `n` (0
/// when `n` is 0) from the high half of a widening multiply.
fn scale(word: u64, n: usize) -> usize {
    ((u128::from(word) * n as u128) >> 64) as usize
}

/// A plain buffer of `region_bytes`, every page touched, asking for the
/// pages a region gets here: 2 MiB pages asked for when the kernel's
/// setting for shared memory (the regions', `rdkv_fabric::pages`) allows
/// them, refused otherwise. The buffer is anonymous memory, which another
/// setting governs (`enabled`): the table's pages line shows what each
/// got. A floor on other pages than the region's would measure the TLB,
/// not the GET.
fn floor_region(region_bytes: usize) -> std::io::Result<MmapMut> {
    let mut buffer = MmapMut::map_anon(region_bytes)?;
    let huge = ThpSetting::shmem().is_ok_and(|s| s.allows_advised_mappings());
    // Refused only by a kernel without transparent huge pages: then 4 KiB
    // pages, as the pages line shows.
    let _ = buffer.advise(if huge {
        memmap2::Advice::HugePage
    } else {
        memmap2::Advice::NoHugePage
    });
    for (i, byte) in buffer.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    Ok(buffer)
}

/// Which pages the floor's buffers and the regions the GETs read sat on,
/// read at the end of the run (`/proc/self/smaps`); `None`: not known.
#[derive(Debug, Clone, Serialize)]
pub struct FloorPages {
    /// The kernel's setting for shared memory, the regions'.
    pub shmem_setting: Option<String>,
    pub floor_bytes: u64,
    /// Of `floor_bytes`, on 2 MiB pages.
    pub floor_huge_bytes: Option<u64>,
    /// Shared memory this process maps on 2 MiB pages: the regions it read.
    pub regions_huge_bytes: Option<u64>,
    /// The cold buffer's size, the server's region size.
    pub cold_region_bytes: u64,
}

impl FloorPages {
    fn of(hot: &MmapMut, cold: &MmapMut) -> FloorPages {
        let buffers = [hot, cold];
        let floor_huge_bytes = buffers
            .iter()
            .map(|b| MappingPages::of_this_process(b.as_ptr() as usize).map(|p| p.huge_bytes))
            .sum::<std::io::Result<u64>>()
            .ok();
        let regions_huge_bytes = std::fs::read_to_string("/proc/self/smaps_rollup")
            .ok()
            .and_then(|rollup| shmem_huge_bytes(&rollup));
        FloorPages {
            shmem_setting: ThpSetting::shmem().ok().map(|s| s.0),
            floor_bytes: buffers.iter().map(|b| b.len() as u64).sum(),
            floor_huge_bytes,
            regions_huge_bytes,
            cold_region_bytes: cold.len() as u64,
        }
    }

    /// The table's pages line.
    fn line(&self) -> String {
        let mib = |bytes: Option<u64>| {
            bytes.map_or("unknown".to_owned(), |b| {
                format!("{:.0}", b as f64 / f64::from(1 << 20))
            })
        };
        format!(
            " pages: floor buffers {} of {} MiB on 2 MiB pages; shared memory mapped here (the regions read; the cold one is {} MiB) {} MiB on 2 MiB pages; shmem_enabled: {}",
            mib(self.floor_huge_bytes),
            mib(Some(self.floor_bytes)),
            self.cold_region_bytes >> 20,
            mib(self.regions_huge_bytes),
            self.shmem_setting.as_deref().unwrap_or("unknown")
        )
    }
}

/// The floor table: its rows and the pages they were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct FloorTable {
    pub rows: Vec<FloorRow>,
    pub pages: FloorPages,
}

/// Bytes of the index at the start of a floor buffer of `region_bytes`:
/// one 8-byte slot per `BYTES_PER_SLOT` of region, at least one bucket.
fn index_bytes(region_bytes: usize) -> usize {
    (region_bytes / BYTES_PER_SLOT * 8).max(64)
}

/// A floor buffer's index and the block places after it: `blocks`
/// 64-byte steps at which a block of the row's size fits (at least one).
#[derive(Debug, Clone, Copy)]
struct BufferLayout {
    index_bytes: usize,
    blocks: usize,
}

impl BufferLayout {
    fn of(region_bytes: usize, block: usize) -> BufferLayout {
        let index_bytes = index_bytes(region_bytes);
        let blocks = (region_bytes.saturating_sub(index_bytes + block) / 64).max(1);
        BufferLayout {
            index_bytes,
            blocks,
        }
    }
}

/// Where a round of the floor finds its block, once its bucket is read.
#[derive(Debug, Clone, Copy)]
enum BlockPlace {
    /// At random: the floor, whose two misses can overlap.
    Random,
    /// At a place computed from the bucket's first word and a random
    /// number, so that the block's load waits for the bucket's, as a GET's
    /// does, while the places spread over the whole region as the issue's
    /// floor's do: the chained floor.
    FromSlot,
}

/// One round of the floor: `ops` times a random bucket read, a copy of a
/// block found as `place` says, and its CRC. Returns ns per operation.
fn floor_round(region: &[u8], block: usize, ops: usize, rng: &mut Rng, place: BlockPlace) -> f64 {
    let BufferLayout {
        index_bytes,
        blocks,
    } = BufferLayout::of(region.len(), block);
    let mut slot = [0u8; 64];
    let mut copy = vec![0u8; block];
    let mut sum = 0u32;
    let start = Instant::now();
    for _ in 0..ops {
        let bucket = rng.below(index_bytes / 64) * 64;
        slot.copy_from_slice(&region[bucket..bucket + 64]);
        let number = match place {
            BlockPlace::Random => rng.below(blocks),
            BlockPlace::FromSlot => place_from_slot(&slot, rng.next(), blocks),
        };
        let at = index_bytes + number * 64;
        copy.copy_from_slice(&region[at..at + block]);
        sum ^= crc32fast::hash(&copy[4..]) ^ u32::from(slot[7]);
    }
    let elapsed = start.elapsed();
    std::hint::black_box(sum);
    per_op(elapsed, ops)
}

/// A block number below `blocks` that depends on the slot's first word,
/// mixed with `salt` (the chained floor's: a random number per operation;
/// the ordered floor's: the key's home), without a division. Why the salt: a
/// place that is a function of the slot alone is a function of the bucket
/// (the buffer's bytes are fixed), so there were at most as many places as
/// buckets: 1,024 in the hot region against the floor's ~15,000,
/// a smaller footprint than the floor it is compared with.
fn place_from_slot(slot: &[u8; 64], salt: u64, blocks: usize) -> usize {
    let mut word = [0u8; 8];
    word.copy_from_slice(&slot[..8]);
    place_from_word(u64::from_le_bytes(word) ^ salt, blocks)
}

/// A number below `n` that depends on every bit of `word`, without a
/// division: a multiply and the high half of a widening multiply.
fn place_from_word(word: u64, n: usize) -> usize {
    scale(word.wrapping_mul(0x9e37_79b9_7f4a_7c15), n)
}

/// Where the ordered floor's buckets and blocks lie: anywhere in its
/// buffer, or (a tiny row) among a row's fixed places: the bucket one of
/// their buckets, the block one of their blocks, each chosen on its own.
#[derive(Debug, Clone, Copy)]
enum OrderedPlaces<'p> {
    Anywhere(BufferLayout),
    Fixed(&'p [(usize, usize)]),
}

impl OrderedPlaces<'_> {
    /// The offset of the bucket a key whose home is `home` reads.
    fn bucket(&self, home: u64) -> usize {
        match *self {
            OrderedPlaces::Anywhere(layout) => place_from_word(home, layout.index_bytes / 64) * 64,
            OrderedPlaces::Fixed(fixed) => fixed[place_from_word(home, fixed.len())].0,
        }
    }

    /// The offset of the block that key reads, found from its bucket's
    /// bytes (and its home, so that keys of one bucket differ).
    fn block(&self, slot: &[u8; 64], home: u64) -> usize {
        match *self {
            OrderedPlaces::Anywhere(BufferLayout {
                index_bytes,
                blocks,
            }) => index_bytes + place_from_slot(slot, home, blocks) * 64,
            OrderedPlaces::Fixed(fixed) => fixed[place_from_slot(slot, home, fixed.len())].1,
        }
    }
}

/// One round of the ordered floor (see the module's comment): `ops` times
/// a random key of `row` made and hashed for `geometry`, the bucket the
/// hash picks read, a block whose place follows the bucket's bytes
/// copied, the clock read, the copy's CRC. Returns ns per operation.
fn ordered_round(
    region: &[u8],
    block: usize,
    ops: usize,
    rng: &mut Rng,
    row: &RowKeys,
    geometry: HashGeometry,
    places: OrderedPlaces,
) -> f64 {
    let seed = HashSeed(rng.next(), rng.next());
    let mut slot = [0u8; 64];
    let mut copy = vec![0u8; block];
    let mut sum = 0u64;
    let start = Instant::now();
    for _ in 0..ops {
        let mut key = [0u8; KEY_BYTES];
        let key = row.maker.make(rng.below(row.count), &mut key);
        let home = KeyHash::new(seed, key, geometry.buckets, geometry.neighbourhood).home_bucket;
        let bucket = places.bucket(home);
        slot.copy_from_slice(&region[bucket..bucket + 64]);
        let at = places.block(&slot, home);
        copy.copy_from_slice(&region[at..at + block]);
        let now_us = boottime_now_us();
        sum ^= u64::from(crc32fast::hash(&copy[4..]) ^ u32::from(slot[7])) ^ now_us;
    }
    let elapsed = start.elapsed();
    std::hint::black_box(sum);
    per_op(elapsed, ops)
}

/// Fixed places of the spread floor: `keys` (bucket, block) offsets,
/// random over `region` laid out as the floor lays it out.
fn spread_places(
    region_bytes: usize,
    block: usize,
    keys: usize,
    rng: &mut Rng,
) -> Vec<(usize, usize)> {
    let BufferLayout {
        index_bytes,
        blocks,
    } = BufferLayout::of(region_bytes, block);
    (0..keys)
        .map(|_| {
            let bucket = rng.below(index_bytes / 64) * 64;
            let at = index_bytes + rng.below(blocks) * 64;
            (bucket, at)
        })
        .collect()
}

/// One round of the spread floor: the floor's work at a random one of
/// `places`. Returns ns per operation.
fn spread_round(
    region: &[u8],
    places: &[(usize, usize)],
    block: usize,
    ops: usize,
    rng: &mut Rng,
) -> f64 {
    let mut slot = [0u8; 64];
    let mut copy = vec![0u8; block];
    let mut sum = 0u32;
    let start = Instant::now();
    for _ in 0..ops {
        let (bucket, at) = places[rng.below(places.len())];
        slot.copy_from_slice(&region[bucket..bucket + 64]);
        copy.copy_from_slice(&region[at..at + block]);
        sum ^= crc32fast::hash(&copy[4..]) ^ u32::from(slot[7]);
    }
    let elapsed = start.elapsed();
    std::hint::black_box(sum);
    per_op(elapsed, ops)
}

/// The neighbourhood of the server's default regions, in buckets.
const NEIGHBOURHOOD_BUCKETS: u64 = 2;

/// What a GET's keyed hash is computed for: the bucket count and
/// neighbourhood of a region the server makes by default (its homes a
/// power of two for a power-of-two region, so the bucket is a mask).
#[derive(Debug, Clone, Copy)]
struct HashGeometry {
    buckets: u64,
    neighbourhood: u64,
}

impl HashGeometry {
    fn of_region(region_bytes: usize) -> HashGeometry {
        HashGeometry {
            buckets: bucket_count_for(
                region_bytes as u64,
                BYTES_PER_SLOT as u64,
                NEIGHBOURHOOD_BUCKETS,
            ),
            neighbourhood: NEIGHBOURHOOD_BUCKETS,
        }
    }
}

/// What a round of the parts times besides making the key: the keyed hash
/// and the clock (`Both`), or nothing (`KeyOnly`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartsWork {
    Both,
    KeyOnly,
}

/// One round of a GET's parts the floor lacks: for `ops` random keys of
/// `row`, the keyed hash a GET computes for `geometry` and a reading of the
/// boottime clock, as `work` says. Returns ns per operation.
fn parts_round(
    row: &RowKeys,
    geometry: HashGeometry,
    ops: usize,
    rng: &mut Rng,
    work: PartsWork,
) -> f64 {
    let HashGeometry {
        buckets,
        neighbourhood,
    } = geometry;
    let seed = HashSeed(rng.next(), rng.next());
    let mut sum = 0u64;
    let start = Instant::now();
    for _ in 0..ops {
        let mut key = [0u8; KEY_BYTES];
        let key = row.maker.make(rng.below(row.count), &mut key);
        sum ^= match work {
            PartsWork::Both => {
                let hash = KeyHash::new(seed, key, buckets, neighbourhood);
                hash.home_bucket ^ boottime_now_us()
            }
            PartsWork::KeyOnly => u64::from(std::hint::black_box(key)[KEY_BYTES - 1]),
        };
    }
    let elapsed = start.elapsed();
    std::hint::black_box(sum);
    per_op(elapsed, ops)
}

/// One round's figures of the parts, ns per operation.
#[derive(Debug, Clone, Copy)]
struct PartsFigures {
    /// A round of both less a round of the keys alone.
    parts_ns: f64,
    /// The round of the keys alone: what making a key of the row costs
    /// the bench's GET rounds and its ordered floor, which the issue's
    /// floor does not pay.
    keys_ns: f64,
}

fn parts_figures(row: &RowKeys, geometry: HashGeometry, ops: usize, rng: &mut Rng) -> PartsFigures {
    let both = parts_round(row, geometry, ops, rng, PartsWork::Both);
    let keys_ns = parts_round(row, geometry, ops, rng, PartsWork::KeyOnly);
    PartsFigures {
        parts_ns: (both - keys_ns).max(0.0),
        keys_ns,
    }
}

fn per_op(elapsed: Duration, ops: usize) -> f64 {
    elapsed.as_nanos() as f64 / ops.max(1) as f64
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(0.0)
}

fn failed(message: String) -> FabricBenchError {
    FabricBenchError::Read {
        transport: "floor",
        message,
    }
}

/// Writes `count` keys of `size` bytes (in batches), interleaved over the
/// sizes so that each size's blocks spread over the region.
pub async fn fill(client: &Client, sizes: &[usize], count: usize) -> Result<(), FabricBenchError> {
    const BATCH: usize = 256;
    for start in (0..count).step_by(BATCH) {
        let end = (start + BATCH).min(count);
        let pairs: Vec<(Bytes, Bytes)> = (start..end)
            .flat_map(|i| {
                sizes
                    .iter()
                    .map(move |&size| (key(size, i), Bytes::from(vec![b'v'; size])))
            })
            .collect();
        client
            .mput(pairs)
            .await
            .map_err(|e| failed(format!("filling the region: {e}")))?;
    }
    Ok(())
}

/// Keys of one row: `floor/<size>/<i>` for i below `count`.
struct RowKeys {
    maker: KeyMaker,
    count: usize,
    size: usize,
}

/// Times a round that is run again (after a refresh of the view) when a
/// read was not served one-sided: on a loaded machine a leader's lease can
/// lapse for a moment, and a round with a refused read is not the path
/// measured. `None` from a round: not served.
const ROUND_TRIES: usize = 5;

fn get_into_round(
    handle: &mut ReadHandle,
    row: &RowKeys,
    ops: usize,
    rng: &mut Rng,
) -> Result<Option<f64>, FabricBenchError> {
    let mut buf = vec![0u8; row.size];
    let start = Instant::now();
    for _ in 0..ops {
        let mut key = [0u8; KEY_BYTES];
        let key = row.maker.make(rng.below(row.count), &mut key);
        match handle.get_into(key, &mut buf) {
            Ok(Some(got)) if got.len == row.size => {}
            Err(GetIntoError::NotServed(_)) => return Ok(None),
            other => {
                return Err(failed(format!(
                    "get_into of a {}-byte value: {other:?}",
                    row.size
                )));
            }
        }
    }
    Ok(Some(per_op(start.elapsed(), ops)))
}

async fn get_round(
    client: &Client,
    row: &RowKeys,
    ops: usize,
    rng: &mut Rng,
) -> Result<Option<f64>, FabricBenchError> {
    let start = Instant::now();
    for _ in 0..ops {
        let mut key = [0u8; KEY_BYTES];
        let key = Bytes::copy_from_slice(row.maker.make(rng.below(row.count), &mut key));
        match client.get_with(key, Consistency::Lease).await {
            Ok(Some(v)) if v.value.len() == row.size => {}
            Err(rdkv_client::Error::OneSidedUnavailable) => return Ok(None),
            other => {
                return Err(failed(format!(
                    "get of a {}-byte value: {other:?}",
                    row.size
                )));
            }
        }
    }
    Ok(Some(per_op(start.elapsed(), ops)))
}

/// A round of `round`, run again after a refresh while it was not served
/// (at most [`ROUND_TRIES`] times).
async fn served_round(
    handle: &mut ReadHandle,
    mut round: impl AsyncFnMut(&mut ReadHandle, &mut Rng) -> Result<Option<f64>, FabricBenchError>,
    rng: &mut Rng,
) -> Result<f64, FabricBenchError> {
    for _ in 0..ROUND_TRIES {
        if let Some(ns) = round(handle, rng).await? {
            return Ok(ns);
        }
        handle.refresh().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(failed(format!(
        "{ROUND_TRIES} rounds in a row had a read not served one-sided (no lease?)"
    )))
}

/// The floors of one row: the (at random, or for a tiny row at
/// its fixed places), the chained and the spread floor; and the parts a
/// GET of the row's `keys` adds to them, hashed for `geometry`.
struct RowFloors<'r> {
    floor: &'r [u8],
    cold: &'r [u8],
    tiny_places: Option<&'r [(usize, usize)]>,
    places: &'r [(usize, usize)],
    keys: &'r RowKeys,
    geometry: HashGeometry,
    block: usize,
    ops: usize,
}

/// One round of each of a row's floors and of its parts, ns per operation.
struct FloorRound {
    floor_ns: f64,
    chained_ns: f64,
    spread_ns: f64,
    ordered_ns: f64,
    parts: PartsFigures,
}

impl RowFloors<'_> {
    /// `chained_first` swaps the order of the and the chained
    /// floor: each warms the caches for the one after it over the same
    /// buffer, so the caller alternates it from round to round.
    fn round(&self, rng: &mut Rng, chained_first: bool) -> FloorRound {
        let (block, ops) = (self.block, self.ops);
        let floor = |rng: &mut Rng| match self.tiny_places {
            Some(places) => spread_round(self.floor, places, block, ops, rng),
            None => floor_round(self.floor, block, ops, rng, BlockPlace::Random),
        };
        let chained =
            |rng: &mut Rng| floor_round(self.floor, block, ops, rng, BlockPlace::FromSlot);
        let (floor_ns, chained_ns) = if chained_first {
            let chained_ns = chained(rng);
            (floor(rng), chained_ns)
        } else {
            let floor_ns = floor(rng);
            (floor_ns, chained(rng))
        };
        // Right after the two floors over the same buffer, before the
        // spread floor's round over the cold one evicts it.
        let places = match self.tiny_places {
            Some(places) => OrderedPlaces::Fixed(places),
            None => OrderedPlaces::Anywhere(BufferLayout::of(self.floor.len(), block)),
        };
        let ordered_ns = ordered_round(
            self.floor,
            block,
            ops,
            rng,
            self.keys,
            self.geometry,
            places,
        );
        let spread_ns = spread_round(self.cold, self.places, block, ops, rng);
        FloorRound {
            floor_ns,
            chained_ns,
            spread_ns,
            ordered_ns,
            parts: parts_figures(self.keys, self.geometry, ops, rng),
        }
    }
}

/// How many keys a row reads. Hot: as many as the hot floor region holds
/// blocks and index lines (two 64-byte bucket lines each). Tiny: so few
/// that their lines and pages stay in L1/L2 and the TLB, for floor and GET
/// alike: what is left of a GET is its software. Cold: every key.
fn keys_of_row(region: &str, block: usize, cold_keys: usize) -> usize {
    match region {
        "tiny" => TINY_KEYS.min(cold_keys),
        "hot" => (HOT_REGION_BYTES / (block + 128)).clamp(1, cold_keys),
        _ => cold_keys,
    }
}

/// Reads every key of the row once: attaches the regions, and caches the
/// hot set.
fn warm_up(handle: &mut ReadHandle, row: &RowKeys) {
    let mut value = vec![0u8; row.size];
    for i in 0..row.count {
        let mut key = [0u8; KEY_BYTES];
        let key = row.maker.make(i, &mut key);
        let _ = handle.get_into(key, &mut value);
    }
}

/// The table: for the hot and the cold region, each size. The cluster
/// behind `client` must hold `cold_keys` keys of each size (see [`fill`]).
pub async fn run_floor(
    client: &Client,
    options: &FloorOptions,
    cold_keys: usize,
) -> Result<FloorTable, FabricBenchError> {
    let mut handle = client.read_handle();
    let mut rows = Vec::new();
    let buffer = |region_bytes| {
        floor_region(region_bytes).map_err(|source| FabricBenchError::Region {
            transport: "floor",
            source,
        })
    };
    let (hot, cold) = (
        buffer(HOT_REGION_BYTES)?,
        buffer(options.cold_region_bytes)?,
    );
    // Every row's GETs hash against the server's region, the cold one.
    let geometry = HashGeometry::of_region(options.cold_region_bytes);
    for (region, region_bytes) in [
        ("tiny", HOT_REGION_BYTES),
        ("hot", HOT_REGION_BYTES),
        ("cold", options.cold_region_bytes),
    ] {
        if !options.regions.iter().any(|r| r == region) {
            continue;
        }
        let floor = if region == "cold" { &cold } else { &hot };
        for &size in &options.sizes {
            let block = block_bytes(size);
            let keys = keys_of_row(region, block, cold_keys);
            let row_keys = RowKeys {
                maker: KeyMaker::new(size),
                count: keys,
                size,
            };
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ size as u64);
            let places = spread_places(cold.len(), block, keys, &mut rng);
            let tiny_places = spread_places(hot.len(), block, keys, &mut rng);
            // Attaches the regions (this runtime runs the refresher only
            // when the rounds of `get` poll it).
            handle.refresh().await;
            warm_up(&mut handle, &row_keys);
            let floors = RowFloors {
                floor,
                cold: &cold,
                tiny_places: (region == "tiny").then_some(&tiny_places[..]),
                places: &places,
                keys: &row_keys,
                geometry,
                block,
                ops: options.ops_per_round,
            };
            let (mut floor_rounds, mut gi, mut g) = (Vec::new(), Vec::new(), Vec::new());
            for round_number in 0..options.rounds {
                floor_rounds.push(floors.round(&mut rng, round_number % 2 == 1));
                gi.push(
                    served_round(
                        &mut handle,
                        async |handle, rng| {
                            get_into_round(handle, &row_keys, options.ops_per_round, rng)
                        },
                        &mut rng,
                    )
                    .await?,
                );
                g.push(
                    served_round(
                        &mut handle,
                        async |_, rng| {
                            get_round(client, &row_keys, options.ops_per_round, rng).await
                        },
                        &mut rng,
                    )
                    .await?,
                );
            }
            rows.push(FloorRow::of_rounds(
                RowShape {
                    region,
                    region_bytes,
                    bytes: size,
                    keys,
                },
                &floor_rounds,
                median(gi),
                median(g),
            ));
        }
    }
    let pages = FloorPages::of(&hot, &cold);
    Ok(FloorTable { rows, pages })
}

/// What a row of the table is about.
struct RowShape {
    region: &'static str,
    region_bytes: usize,
    bytes: usize,
    keys: usize,
}

impl FloorRow {
    /// The row of `shape`: each floor's median round, and the GET's
    /// medians (`get_into_ns`, `get_ns`) over them.
    fn of_rounds(
        shape: RowShape,
        floor_rounds: &[FloorRound],
        get_into_ns: f64,
        get_ns: f64,
    ) -> FloorRow {
        let of_rounds =
            |figure: fn(&FloorRound) -> f64| median(floor_rounds.iter().map(figure).collect());
        let floor_ns = of_rounds(|r| r.floor_ns);
        let spread_floor_ns = of_rounds(|r| r.spread_ns);
        let chained_floor_ns = of_rounds(|r| r.chained_ns);
        let ordered_floor_ns = of_rounds(|r| r.ordered_ns);
        let (parts_ns, keys_ns) = (
            of_rounds(|r| r.parts.parts_ns),
            of_rounds(|r| r.parts.keys_ns),
        );
        FloorRow {
            region: shape.region,
            region_bytes: shape.region_bytes,
            bytes: shape.bytes,
            keys: shape.keys,
            floor_ns,
            spread_floor_ns,
            chained_floor_ns,
            ordered_floor_ns,
            parts_ns,
            keys_ns,
            get_into_ns,
            get_ns,
            get_into_ratio: get_into_ns / floor_ns,
            get_ratio: get_ns / floor_ns,
            get_into_spread_ratio: get_into_ns / spread_floor_ns,
            get_into_chained_ratio: get_into_ns / chained_floor_ns,
            get_into_ordered_ratio: get_into_ns / ordered_floor_ns,
            least_ratio: (ordered_floor_ns - keys_ns) / floor_ns,
        }
    }
}

pub fn format_floor(table: &FloorTable) -> String {
    let rows = &table.rows;
    use std::fmt::Write as _;
    let mut out = String::new();
    let rule = "-".repeat(214);
    let _ = writeln!(out, "{rule}");
    let _ = writeln!(
        out,
        " one-sided GET (shm) vs floor (random 64 B slot read + block copy + CRC32, same region size, no rdkv code)"
    );
    let _ = writeln!(
        out,
        " {:<6} {:<12} {:<8} {:<8} {:<10} {:<14} {:<10} {:<10} {:<10} {:<12} {:<10} {:<12} {:<10} {:<12} {:<10} {:<10} {:<9} {:<6}",
        "region",
        "region_bytes",
        "#bytes",
        "#keys",
        "floor[ns]",
        "get_into[ns]",
        "ratio",
        "get[ns]",
        "ratio",
        "spread[ns]",
        "gi/spread",
        "chained[ns]",
        "gi/chained",
        "ordered[ns]",
        "gi/ordered",
        "parts[ns]",
        "keys[ns]",
        "least"
    );
    for r in rows {
        let _ = writeln!(
            out,
            " {:<6} {:<12} {:<8} {:<8} {:<10.1} {:<14.1} {:<10.2} {:<10.1} {:<10.2} {:<12.1} {:<10.2} {:<12.1} {:<10.2} {:<12.1} {:<10.2} {:<10.1} {:<9.1} {:<6.2}",
            r.region,
            r.region_bytes,
            r.bytes,
            r.keys,
            r.floor_ns,
            r.get_into_ns,
            r.get_into_ratio,
            r.get_ns,
            r.get_ratio,
            r.spread_floor_ns,
            r.get_into_spread_ratio,
            r.chained_floor_ns,
            r.get_into_chained_ratio,
            r.ordered_floor_ns,
            r.get_into_ordered_ratio,
            r.parts_ns,
            r.keys_ns,
            r.least_ratio
        );
    }
    let _ = writeln!(out, "{}", table.pages.line());
    let _ = writeln!(out, "{rule}");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn blocks_take_their_size_class() {
        assert_eq!(block_bytes(8), 128);
        assert_eq!(block_bytes(1024), 1088);
        assert_eq!(key(1024, 5).len(), KEY_BYTES);
        assert_eq!(key(8, 123_456).len(), KEY_BYTES);
        assert_eq!(&key(8, 123_456)[..], b"floor/8/00000000000000123456");
        assert_eq!(&key(1024, 7)[..], b"floor/1024/00000000000000007");
    }

    /// The chained floor's places depend on the slot's bytes, and spread
    /// over the whole block range as the floor's do: not one place
    /// per bucket, which kept a hot 8 B row's blocks in the L2 cache.
    #[test]
    fn the_chained_floor_takes_its_place_from_the_slot() {
        let region = floor_region(1 << 20).unwrap();
        let BufferLayout {
            index_bytes,
            blocks,
        } = BufferLayout::of(region.len(), 128);
        let buckets = index_bytes / 64;
        let mut rng = Rng(3);
        let (mut chained, mut random) = (HashSet::new(), HashSet::new());
        for _ in 0..20_000 {
            let bucket = rng.below(buckets) * 64;
            let mut slot = [0u8; 64];
            slot.copy_from_slice(&region[bucket..bucket + 64]);
            chained.insert(place_from_slot(&slot, rng.next(), blocks));
            random.insert(rng.below(blocks));
        }
        assert!(chained.iter().all(|&p| p < blocks));
        // 20,000 draws over ~15,000 places: about 11,000 distinct at random.
        assert!(
            chained.len() > random.len() * 9 / 10 && chained.len() > 4 * buckets,
            "{} chained places, {} random, {buckets} buckets",
            chained.len(),
            random.len()
        );
        let mut other = [0u8; 64];
        other[0] = 1;
        assert_ne!(
            place_from_slot(&[0u8; 64], 7, blocks),
            place_from_slot(&other, 7, blocks),
            "the place follows the slot's bytes"
        );
        assert!(floor_round(&region, 1088, 100, &mut Rng(1), BlockPlace::FromSlot) > 0.0);
    }

    /// The ordered floor's bucket follows the key's hash and its block
    /// the bucket's bytes and the key: its places spread over the whole
    /// index and block range as random ones do (keys of one bucket do not
    /// share a block), and a tiny row's stay at the row's fixed places.
    #[test]
    fn the_ordered_floor_reads_where_each_keys_hash_leads() {
        let region = floor_region(1 << 20).unwrap();
        let geometry = HashGeometry::of_region(256 << 20);
        let layout = BufferLayout::of(region.len(), 128);
        let (blocks, places) = (layout.blocks, OrderedPlaces::Anywhere(layout));
        let mut rng = Rng(5);
        let (mut buckets, mut blocks_read, mut random) =
            (HashSet::new(), HashSet::new(), HashSet::new());
        for i in 0..20_000 {
            let key = key(8, i);
            let hash = KeyHash::new(HashSeed(1, 2), &key, geometry.buckets, 2);
            let bucket = places.bucket(hash.home_bucket);
            assert!(bucket + 64 <= index_bytes(region.len()) && bucket.is_multiple_of(64));
            let mut slot = [0u8; 64];
            slot.copy_from_slice(&region[bucket..bucket + 64]);
            let at = places.block(&slot, hash.home_bucket);
            assert!(at >= index_bytes(region.len()) && at + 128 <= region.len());
            buckets.insert(bucket);
            blocks_read.insert(at);
            random.insert(rng.below(blocks));
        }
        // 1,024 buckets, all reached; ~15,000 blocks, about as many
        // distinct as random draws give (the chained floor's test).
        assert_eq!(buckets.len(), 1_024);
        assert!(
            blocks_read.len() > random.len() * 9 / 10,
            "{} blocks, {} at random",
            blocks_read.len(),
            random.len()
        );
        let fixed = spread_places(region.len(), 128, 64, &mut rng);
        let tiny = OrderedPlaces::Fixed(&fixed);
        // For one key (one home), the block follows the bucket's bytes: its
        // load waits for the bucket's, as a GET's does.
        for places in [places, tiny] {
            let blocks_of_one_key: HashSet<usize> = (0..64u8)
                .map(|byte| places.block(&[byte; 64], 12_345))
                .collect();
            assert!(
                blocks_of_one_key.len() > 8,
                "{places:?}: {blocks_of_one_key:?}"
            );
        }
        for home in 0..1_000u64 {
            let bucket = tiny.bucket(home);
            assert!(fixed.iter().any(|&(b, _)| b == bucket));
            let slot = [home as u8; 64];
            let at = tiny.block(&slot, home);
            assert!(fixed.iter().any(|&(_, a)| a == at));
        }
        let row = RowKeys {
            maker: KeyMaker::new(8),
            count: 64,
            size: 8,
        };
        for places in [places, tiny] {
            assert!(ordered_round(&region, 128, 100, &mut rng, &row, geometry, places) > 0.0);
        }
    }

    #[test]
    fn random_numbers_stay_below_their_bound_and_cover_it() {
        let mut rng = Rng(7);
        let mut seen = [0usize; 10];
        for _ in 0..10_000 {
            seen[rng.below(10)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
    }

    /// The parts hash for the server's geometry: a power of two of homes
    /// (the bucket by a mask) for the table's region sizes, the same count
    /// a server region of that size has (`bucket_count_for`, storage's
    /// layout), every home bucket below the homes.
    #[test]
    fn the_parts_hash_for_the_servers_geometry() {
        for (region_bytes, homes) in [(1usize << 20, 1u64 << 10), (256 << 20, 1 << 18)] {
            let geometry = HashGeometry::of_region(region_bytes);
            assert_eq!(geometry.buckets - geometry.neighbourhood + 1, homes);
            for i in 0..1_000 {
                let key = key(8, i);
                let hash = KeyHash::new(
                    HashSeed(1, 2),
                    &key,
                    geometry.buckets,
                    geometry.neighbourhood,
                );
                assert!(hash.home_bucket < homes);
            }
        }
        let row = RowKeys {
            maker: KeyMaker::new(8),
            count: 64,
            size: 8,
        };
        // A region of one bucket: no division by zero, no panic.
        let tiny = HashGeometry::of_region(64);
        for work in [PartsWork::Both, PartsWork::KeyOnly] {
            assert!(parts_round(&row, tiny, 100, &mut Rng(1), work) > 0.0);
        }
        let figures = parts_figures(&row, tiny, 100, &mut Rng(1));
        assert!(figures.parts_ns >= 0.0 && figures.keys_ns > 0.0);
    }

    #[test]
    fn the_floor_reads_random_places() {
        let region = floor_region(1 << 16).unwrap();
        let ns = floor_round(&region, 1088, 100, &mut Rng(1), BlockPlace::Random);
        assert!(ns > 0.0);
    }
}
