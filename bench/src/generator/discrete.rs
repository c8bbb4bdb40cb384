//! YCSB's `DiscreteGenerator`: picks one of several values with given
//! weights (CoreWorkload's operation chooser).

use super::Rng;

#[derive(Debug, Clone)]
pub struct DiscreteGenerator<T> {
    values: Vec<(f64, T)>,
    sum: f64,
}

impl<T: Copy> DiscreteGenerator<T> {
    pub fn new() -> DiscreteGenerator<T> {
        DiscreteGenerator {
            values: Vec::new(),
            sum: 0.0,
        }
    }

    pub fn add_value(&mut self, weight: f64, value: T) {
        self.values.push((weight, value));
        self.sum += weight;
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `None` only when no value was added.
    pub fn next_value(&self, rng: &mut Rng) -> Option<T> {
        let mut val = rng.next_f64();
        for (weight, value) in &self.values {
            let share = weight / self.sum;
            if val < share {
                return Some(*value);
            }
            val -= share;
        }
        // Rounding can leave `val` a hair above the last share, as in YCSB.
        self.values.last().map(|(_, value)| *value)
    }
}

impl<T: Copy> Default for DiscreteGenerator<T> {
    fn default() -> Self {
        DiscreteGenerator::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_respected() {
        let mut generator = DiscreteGenerator::new();
        generator.add_value(0.5, 'a');
        generator.add_value(0.3, 'b');
        generator.add_value(0.2, 'c');
        let mut rng = Rng::seeded(4);
        let mut counts = [0u32; 3];
        for _ in 0..100_000 {
            match generator.next_value(&mut rng) {
                Some('a') => counts[0] += 1,
                Some('b') => counts[1] += 1,
                Some('c') => counts[2] += 1,
                other => panic!("{other:?}"),
            }
        }
        for (count, expected) in counts.iter().zip([0.5, 0.3, 0.2]) {
            let share = f64::from(*count) / 100_000.0;
            assert!((share - expected).abs() < 0.01, "{share} vs {expected}");
        }
        assert_eq!(DiscreteGenerator::<u8>::new().next_value(&mut rng), None);
    }
}
