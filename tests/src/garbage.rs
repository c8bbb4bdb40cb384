//! Deterministic pseudo-random bytes for hostile-input tests (no rand
//! dependency, and a failing case can be replayed from its seed).

/// `n` bytes from an xorshift generator seeded with `seed`.
pub fn garbage(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
