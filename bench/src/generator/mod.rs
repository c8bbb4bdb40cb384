//! YCSB's number generators, ported from the YCSB Java source
//! (`site.ycsb.generator`), one per file. They draw from a [`Rng`] passed in
//! by the caller, so every benchmark task has its own seeded stream.

pub mod counter;
pub mod discrete;
pub mod fnv;
pub mod hotspot;
pub mod rng;
pub mod scrambled_zipfian;
pub mod skewed_latest;
pub mod uniform;
pub mod zipfian;

pub use counter::{AcknowledgedCounterGenerator, CounterGenerator, TooManyUnacknowledged};
pub use discrete::DiscreteGenerator;
pub use fnv::fnvhash64;
pub use hotspot::{HotspotError, HotspotIntegerGenerator};
pub use rng::Rng;
pub use scrambled_zipfian::ScrambledZipfianGenerator;
pub use skewed_latest::SkewedLatestGenerator;
pub use uniform::UniformLongGenerator;
pub use zipfian::{ZIPFIAN_CONSTANT, ZipfianGenerator};
