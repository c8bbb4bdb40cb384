//! YCSB's `HotspotIntegerGenerator`: a hot set (the first
//! `hotsetFraction` of the range) receives `hotOpnFraction` of the draws,
//! uniformly; the rest go uniformly to the cold set.

use thiserror::Error;

use super::Rng;

#[derive(Debug, Error, PartialEq)]
pub enum HotspotError {
    #[error("hotspot {name} must be between 0 and 1, got {value}")]
    Fraction { name: &'static str, value: f64 },
    #[error("hotspot bounds: lower {lower} is above upper {upper}")]
    Bounds { lower: i64, upper: i64 },
}

#[derive(Debug, Clone)]
pub struct HotspotIntegerGenerator {
    lower_bound: i64,
    hot_interval: i64,
    cold_interval: i64,
    hot_opn_fraction: f64,
}

impl HotspotIntegerGenerator {
    /// YCSB warns and uses 0 for fractions outside [0, 1]; here they are an
    /// error, since a silently changed distribution makes results lie.
    pub fn new(
        lower_bound: i64,
        upper_bound: i64,
        hotset_fraction: f64,
        hot_opn_fraction: f64,
    ) -> Result<HotspotIntegerGenerator, HotspotError> {
        for (name, value) in [
            ("hotspotdatafraction", hotset_fraction),
            ("hotspotopnfraction", hot_opn_fraction),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(HotspotError::Fraction { name, value });
            }
        }
        if lower_bound > upper_bound {
            return Err(HotspotError::Bounds {
                lower: lower_bound,
                upper: upper_bound,
            });
        }
        let interval = upper_bound - lower_bound + 1;
        let hot_interval = (interval as f64 * hotset_fraction) as i64;
        Ok(HotspotIntegerGenerator {
            lower_bound,
            hot_interval,
            cold_interval: interval - hot_interval,
            hot_opn_fraction,
        })
    }

    pub fn next_value(&self, rng: &mut Rng) -> i64 {
        // An empty hot or cold set (tiny ranges) sends every draw to the other
        // one instead of dividing by zero as YCSB would.
        let hot = rng.next_f64() < self.hot_opn_fraction;
        if (hot && self.hot_interval > 0) || self.cold_interval == 0 {
            self.lower_bound + rng.next_non_negative() % self.hot_interval
        } else {
            self.lower_bound + self.hot_interval + rng.next_non_negative() % self.cold_interval
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_set_gets_its_share() {
        let generator = HotspotIntegerGenerator::new(0, 999, 0.2, 0.8).unwrap();
        let mut rng = Rng::seeded(9);
        let draws = 200_000;
        let mut hot = 0;
        for _ in 0..draws {
            let v = generator.next_value(&mut rng);
            assert!((0..1000).contains(&v), "{v}");
            hot += u32::from(v < 200);
        }
        let share = f64::from(hot) / f64::from(draws);
        assert!((share - 0.8).abs() < 0.01, "hot share {share}");
    }

    #[test]
    fn bad_fractions_are_refused() {
        assert_eq!(
            HotspotIntegerGenerator::new(0, 9, 1.5, 0.8).unwrap_err(),
            HotspotError::Fraction {
                name: "hotspotdatafraction",
                value: 1.5
            }
        );
        assert!(HotspotIntegerGenerator::new(0, 9, 0.2, -0.1).is_err());
        assert!(HotspotIntegerGenerator::new(9, 0, 0.2, 0.8).is_err());
    }

    #[test]
    fn a_range_too_small_for_a_hot_set_still_draws_in_range() {
        let generator = HotspotIntegerGenerator::new(5, 5, 0.2, 0.8).unwrap();
        let mut rng = Rng::seeded(1);
        for _ in 0..100 {
            assert_eq!(generator.next_value(&mut rng), 5);
        }
    }
}
