//! YCSB's `UniformLongGenerator`: every value of `[lb, ub]` equally likely.

use super::Rng;

#[derive(Debug, Clone)]
pub struct UniformLongGenerator {
    lower_bound: i64,
    interval: i64,
}

impl UniformLongGenerator {
    /// `lb <= ub` is checked by the workload before construction.
    pub fn new(lb: i64, ub: i64) -> UniformLongGenerator {
        UniformLongGenerator {
            lower_bound: lb,
            interval: (ub - lb + 1).max(1),
        }
    }

    pub fn next_value(&self, rng: &mut Rng) -> i64 {
        rng.next_non_negative() % self.interval + self.lower_bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_bounds_and_reaches_both() {
        let generator = UniformLongGenerator::new(10, 19);
        let mut rng = Rng::seeded(2);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            let v = generator.next_value(&mut rng);
            assert!((10..=19).contains(&v), "{v}");
            counts[(v - 10) as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            assert!(
                (9_000..11_000).contains(&c),
                "value {} drawn {c} times",
                i + 10
            );
        }
        let one = UniformLongGenerator::new(7, 7);
        assert_eq!(one.next_value(&mut rng), 7);
    }
}
