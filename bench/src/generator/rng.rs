//! The benchmark's seeded PRNG: xoshiro256** seeded through splitmix64, so a
//! `--seed` reproduces the same keys, operations and values on any machine.
//! (YCSB draws from `ThreadLocalRandom`, which cannot be seeded; only the
//! distributions are YCSB's, not the exact sequences.)

/// xoshiro256** (Blackman and Vigna), 256 bits of state.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

/// splitmix64: spreads a seed over the state so that nearby seeds (1, 2, 3
/// for the tasks of one run) give unrelated streams.
fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        let mut x = seed;
        let state = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Rng { state }
    }

    /// A generator for stream `stream` of the run seeded with `seed` (one per
    /// task), independent of the others.
    pub fn for_stream(seed: u64, stream: u64) -> Rng {
        let mut x = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        Rng::seeded(splitmix64(&mut x))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits, as Java's `nextDouble`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 2^63): what YCSB gets from `Math.abs(nextLong())`
    /// without its one negative outcome (`Long.MIN_VALUE`).
    pub fn next_non_negative(&mut self) -> i64 {
        (self.next_u64() >> 1) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream_and_streams_differ() {
        let mut a = Rng::seeded(42);
        let mut b = Rng::seeded(42);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut c = Rng::for_stream(42, 1);
        let zs: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_ne!(xs, zs);
    }

    #[test]
    fn doubles_stay_in_the_unit_interval() {
        let mut rng = Rng::seeded(7);
        let mut sum = 0.0;
        for _ in 0..100_000 {
            let x = rng.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        let mean = sum / 100_000.0;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
