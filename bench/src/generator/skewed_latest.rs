//! YCSB's `SkewedLatestGenerator`: zipfian over the distance from the most
//! recently inserted key, so new records are the popular ones (workload D).

use std::sync::Arc;

use super::Rng;
use super::counter::AcknowledgedCounterGenerator;
use super::zipfian::ZipfianGenerator;

#[derive(Debug, Clone)]
pub struct SkewedLatestGenerator {
    basis: Arc<AcknowledgedCounterGenerator>,
    zipfian: ZipfianGenerator,
}

impl SkewedLatestGenerator {
    pub fn new(basis: Arc<AcknowledgedCounterGenerator>) -> SkewedLatestGenerator {
        let zipfian = ZipfianGenerator::with_items(basis.last_value());
        SkewedLatestGenerator { basis, zipfian }
    }

    /// `max - zipfian.nextLong(max)` where `max` is the newest acknowledged
    /// insert: follows the insert counter as it grows.
    pub fn next_value(&mut self, rng: &mut Rng) -> i64 {
        let max = self.basis.last_value();
        max - self.zipfian.next_long(rng, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::zipfian::{ZIPFIAN_CONSTANT, zeta_static};

    /// Draws 20 000 values; checks they lie in [0, newest], that the newest
    /// key is the most popular and that its share is 1/ζ(newest).
    fn check_follows(latest: &mut SkewedLatestGenerator, rng: &mut Rng, newest: i64) {
        let draws = 20_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..draws {
            let v = latest.next_value(rng);
            assert!((0..=newest).contains(&v), "{v} outside [0, {newest}]");
            *counts.entry(v).or_insert(0u32) += 1;
        }
        let top = counts.iter().max_by_key(|(_, c)| **c).map(|(v, _)| *v);
        assert_eq!(top, Some(newest));
        let share = f64::from(counts[&newest]) / f64::from(draws);
        let expected = 1.0 / zeta_static(0, newest, ZIPFIAN_CONSTANT, 0.0);
        assert!((share - expected).abs() < 0.01, "{share} vs {expected}");
    }

    #[test]
    fn the_newest_insert_is_the_most_popular_and_it_moves_with_inserts() {
        let inserts = Arc::new(AcknowledgedCounterGenerator::new(1000));
        let mut latest = SkewedLatestGenerator::new(Arc::clone(&inserts));
        let mut rng = Rng::seeded(5);
        check_follows(&mut latest, &mut rng, 999);
        for _ in 0..500 {
            let k = inserts.next_value();
            inserts.acknowledge(k).unwrap();
        }
        assert_eq!(inserts.last_value(), 1499);
        check_follows(&mut latest, &mut rng, 1499);
    }
}
