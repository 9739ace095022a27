//! Random training sequences for tests that measure a step rather than check its numbers.

use swerve::rng::{Rng, SplitMix64};
use swerve::train::data::TrainSequence;

/// `count` sequences of `len` random tokens below `vocab` (seeded), the second half of each the
/// action, advantage 1 (an RFT-shaped batch).
pub fn rft_sequences(vocab: usize, seed: u64, count: usize, len: usize) -> Vec<TrainSequence> {
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|i| {
            let tokens: Vec<u32> = (0..len).map(|_| rng.below(vocab) as u32).collect();
            let mut targets = tokens[1..].to_vec();
            targets.push(0);
            TrainSequence {
                location: format!("sequence {i}"),
                tokens,
                targets,
                action_mask: (0..len).map(|r| r >= len / 2 && r + 1 < len).collect(),
                advantage: 1.0,
                rollout_logprobs: vec![0.0; len],
                has_rollout_logprobs: false,
            }
        })
        .collect()
}
