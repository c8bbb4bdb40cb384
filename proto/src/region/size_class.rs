//! Block size classes. A slot stores a class index (7 bits) rather than an
//! exact length: the reader reads the whole class in one READ and the block
//! header says how much of it is payload. Classes are exact 64-byte steps up to
//! 2 KiB (at most 63 bytes of padding: a 1 KiB value with its key and header
//! takes 1088 bytes, not 1280), then four per doubling (at most 25% over-read,
//! and large values are read in slices anyway).

/// The data area's allocation unit and block alignment: one cache line.
pub const UNIT_BYTES: u64 = 64;

const LINEAR_CLASSES: u32 = 32;
const STEPS_PER_DOUBLING: u32 = 4;
/// Largest block: 2^22 units = 256 MiB.
pub const MAX_BLOCK_UNITS: u32 = 1 << 22;
/// Classes in the table (the slot's class field must be able to name each).
pub(crate) const CLASS_COUNT: usize = LINEAR_CLASSES as usize + 4 * 17;

const TABLE: [u32; CLASS_COUNT] = build_table();
const _: () = assert!(TABLE[CLASS_COUNT - 1] == MAX_BLOCK_UNITS);

const fn build_table() -> [u32; CLASS_COUNT] {
    let mut table = [0u32; CLASS_COUNT];
    let mut i = 0;
    while i < LINEAR_CLASSES as usize {
        table[i] = i as u32 + 1;
        i += 1;
    }
    let mut base = LINEAR_CLASSES;
    while i < CLASS_COUNT {
        let mut step = 1;
        while step <= STEPS_PER_DOUBLING {
            table[i] = base + base / STEPS_PER_DOUBLING * step;
            i += 1;
            step += 1;
        }
        base *= 2;
    }
    table
}

/// Index into the class table, as stored in a slot (0 ..= 99).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeClass(u8);

impl SizeClass {
    /// The smallest class that holds `units` 64-byte units; `None` when larger
    /// than [`MAX_BLOCK_UNITS`] or zero.
    pub fn for_units(units: u64) -> Option<SizeClass> {
        if units == 0 || units > u64::from(MAX_BLOCK_UNITS) {
            return None;
        }
        let index = TABLE.partition_point(|&class_units| u64::from(class_units) < units);
        u8::try_from(index).ok().map(SizeClass)
    }

    /// The smallest class that holds a block of `bytes` bytes.
    pub fn for_bytes(bytes: u64) -> Option<SizeClass> {
        SizeClass::for_units(bytes.div_ceil(UNIT_BYTES))
    }

    /// Decodes a class index read from a slot.
    pub fn from_index(index: u8) -> Option<SizeClass> {
        (usize::from(index) < CLASS_COUNT).then_some(SizeClass(index))
    }

    pub fn index(self) -> u8 {
        self.0
    }

    /// Allocated size of a block of this class, in 64-byte units.
    pub fn units(self) -> u32 {
        // Construction guarantees the index is in the table.
        TABLE[usize::from(self.0)]
    }

    pub fn bytes(self) -> u64 {
        u64::from(self.units()) * UNIT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_strictly_increasing_and_ends_at_max() {
        for pair in TABLE.windows(2) {
            assert!(pair[0] < pair[1], "{pair:?}");
        }
        assert_eq!(TABLE[CLASS_COUNT - 1], MAX_BLOCK_UNITS);
    }

    #[test]
    fn every_size_maps_to_the_smallest_class_that_holds_it() {
        for units in 1..=5000u64 {
            let class = SizeClass::for_units(units).unwrap();
            assert!(u64::from(class.units()) >= units);
            if class.index() > 0 {
                let smaller = SizeClass::from_index(class.index() - 1).unwrap();
                assert!(u64::from(smaller.units()) < units);
            }
        }
        assert_eq!(SizeClass::for_units(0), None);
        assert_eq!(SizeClass::for_units(u64::from(MAX_BLOCK_UNITS) + 1), None);
        assert_eq!(SizeClass::for_bytes(64).unwrap().units(), 1);
        assert_eq!(SizeClass::for_bytes(65).unwrap().units(), 2);
        assert_eq!(SizeClass::for_bytes(1025).unwrap().units(), 17);
        assert_eq!(SizeClass::for_bytes(2048).unwrap().units(), 32);
        assert_eq!(SizeClass::for_bytes(2049).unwrap().units(), 40);
    }

    #[test]
    fn padding_is_under_a_unit_up_to_two_kib() {
        for bytes in 1..=2048u64 {
            let class = SizeClass::for_bytes(bytes).unwrap();
            assert!(class.bytes() - bytes < UNIT_BYTES, "{bytes}");
        }
    }

    #[test]
    fn over_allocation_is_at_most_a_quarter_above_two_kib() {
        for units in 33..=100_000u64 {
            let class = SizeClass::for_units(units).unwrap();
            assert!(u64::from(class.units()) * 4 <= units * 5, "{units}");
        }
    }
}
