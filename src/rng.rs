//! Deterministic pseudo-random numbers: the same stream for the same seed on every machine, for
//! request sampling, episode seeds, synthetic weights, data order and tests. Not for secrets.
//!
//! Three generators, each kept for the streams already depended on:
//!
//! | generator | state | used for |
//! | --- | --- | --- |
//! | [`SplitMix64`] | one `u64`, + golden gamma per draw | seeds, weights, shuffles, test data |
//! | [`XorShift64`] | one nonzero `u64` (13, 7, 17) | benchmark inputs |
//! | [`Xoshiro256StarStar`] | four `u64`, seeded by SplitMix64 | the sampler ([`crate::engine::sampler::SampleRng`]) |
//!
//! The [`Rng`] trait turns any of them into floats, bounded integers and shuffles, the same way
//! for all.

/// SplitMix64's increment: 2^64 / golden ratio, odd.
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijection on `u64` with full avalanche (every input bit flips
/// each output bit with probability about 1/2). Also a good 64-bit hash finaliser.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What every generator gives beyond its raw 64-bit words.
pub trait Rng {
    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64;

    /// Uniform in [0, 1) with 53 random bits (the top bits of one word).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1) with 24 random bits (the top bits of one word).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1): `2 next_f32() - 1`.
    fn next_signed_f32(&mut self) -> f32 {
        self.next_f32() * 2.0 - 1.0
    }

    /// An integer in `0..n` (0 when `n` is 0): one word modulo `n`, whose bias (at most
    /// `n / 2^64`) nothing here can see.
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// One of `items`, uniformly (`items[below(len)]`); an empty slice is the caller's bug.
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T
    where
        Self: Sized,
    {
        &items[self.below(items.len())]
    }

    /// Shuffles `items` in place (Fisher-Yates from the back: slot `i` takes `below(i + 1)`).
    fn shuffle<T>(&mut self, items: &mut [T])
    where
        Self: Sized,
    {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// SplitMix64 (Steele, Lea and Flood): add [`GOLDEN_GAMMA`], output [`mix64`] of the state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream whose first output is `mix64(seed + GOLDEN_GAMMA)`; any seed is valid.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }
}

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }
}

/// Marsaglia's xorshift64 with shifts (13, 7, 17), started from `seed * GOLDEN_GAMMA | 1` (never
/// zero).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XorShift64 {
    state: u64,
}

impl XorShift64 {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed.wrapping_mul(GOLDEN_GAMMA) | 1,
        }
    }
}

impl Rng for XorShift64 {
    fn next_u64(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }
}

/// xoshiro256** (Blackman and Vigna) with its four words seeded through [`SplitMix64`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xoshiro256StarStar {
    state: [u64; 4],
}

impl Xoshiro256StarStar {
    /// The generator for `seed`; any seed (0 included) gives a valid, distinct stream.
    pub fn from_seed(seed: u64) -> Self {
        let mut seeder = SplitMix64::new(seed);
        Self {
            state: std::array::from_fn(|_| seeder.next_u64()),
        }
    }

    /// The generator at a given state (not all zero, or it outputs zeros forever).
    pub fn from_state(state: [u64; 4]) -> Self {
        Self { state }
    }

    /// The next 64 random bits (also [`Rng::next_u64`]; inherent, so callers need no import).
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1) with 53 random bits: [`Rng::next_f64`], one call to `next_u64`.
    pub fn next_f64(&mut self) -> f64 {
        Rng::next_f64(self)
    }
}

impl Rng for Xoshiro256StarStar {
    fn next_u64(&mut self) -> u64 {
        Xoshiro256StarStar::next_u64(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference outputs from the published algorithms (the C code of prng.di.unimi.it and
    // Marsaglia's paper), computed independently of this file.
    #[test]
    fn streams_match_the_reference_algorithms() {
        let mut sm = SplitMix64::new(1234567);
        assert_eq!(sm.next_u64(), 6457827717110365317);
        assert_eq!(sm.next_u64(), 3203168211198807973);
        let mut x = Xoshiro256StarStar::from_state([1, 2, 3, 4]);
        let got: Vec<u64> = (0..4).map(|_| x.next_u64()).collect();
        assert_eq!(got, [11520, 0, 1509978240, 1215971899390074240]);
        // xorshift64 (13, 7, 17) from state 1: 1 ^ 1<<13 = 8193, ^ 8193>>7 = 8257, ...
        let mut xs = XorShift64 { state: 1 };
        assert_eq!(xs.next_u64(), 1082269761);
        assert_eq!(mix64(0), 0);
    }

    #[test]
    fn floats_and_ranges_stay_in_bounds() {
        let mut rng = Xoshiro256StarStar::from_seed(0);
        for _ in 0..10_000 {
            assert!((0.0..1.0).contains(&rng.next_f64()));
            assert!((0.0..1.0).contains(&Rng::next_f32(&mut rng)));
            assert!((-1.0..1.0).contains(&rng.next_signed_f32()));
            assert!(rng.below(7) < 7);
        }
        assert_eq!(rng.below(0), 0);
        // The extremes of the float maps: all-ones words stay below 1.
        struct Ones;
        impl Rng for Ones {
            fn next_u64(&mut self) -> u64 {
                u64::MAX
            }
        }
        assert!(Ones.next_f64() < 1.0 && Ones.next_f32() < 1.0);
    }

    #[test]
    fn shuffle_is_a_permutation_and_depends_on_the_seed() {
        let shuffled = |seed| {
            let mut v: Vec<u32> = (0..50).collect();
            SplitMix64::new(seed).shuffle(&mut v);
            v
        };
        let mut sorted = shuffled(1);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_eq!(shuffled(1), shuffled(1));
        assert_ne!(shuffled(1), shuffled(2));
        assert_ne!(shuffled(1), (0..50).collect::<Vec<_>>());
    }
}
