//! What each iteration and each optimizer step of `rl` uses, decided from the seed and the
//! options alone (so `--resume` repeats it): the tasks of an iteration, the order of batches, and
//! each phase's learning rate counted in that phase's own optimizer steps (RL-SPEC.md).
//!
//! ```text
//!   RFT  (--rft-first):  steps 1..=T_rft, T_rft = epochs * ceil(resolved / --rft-batch-size)
//!        lr = --rft-lr * s / W_rft                  s <= W_rft (--rft-warmup-steps)
//!             cosine from --rft-lr towards 0        after (reached just after step T_rft)
//!   DAPO:                steps 1, 2, ... counted from DAPO's first step, not RFT's
//!        lr = --lr * s / W                          s <= W (--warmup-steps)
//!             --lr                                  after
//! ```

use crate::agent::rollout::episode_seed;
use crate::train::optimizer::{lr_at, LrSchedule};

/// The tasks of `iteration` (1-based): the next `per_iteration` of an endless sequence of seeded
/// shuffles of the task file, one shuffle per pass.
pub fn tasks_of_iteration(
    n: usize,
    per_iteration: usize,
    seed: u64,
    iteration: usize,
) -> Vec<usize> {
    let start = (iteration - 1) * per_iteration;
    (start..start + per_iteration)
        .map(|k| {
            let pass = (k / n) as u64;
            let order = shuffled(n, seed ^ pass.wrapping_mul(0xA076_1D64_78BD_642F));
            order[k % n]
        })
        .collect()
}

/// `0..n` in a seeded order (Fisher-Yates over SplitMix64-mixed seeds).
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        state = episode_seed(state, "shuffle", i);
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// One phase's learning rate over its own optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseSchedule {
    pub peak_lr: f64,
    pub warmup_steps: u64,
    /// `Cosine` decays over `total_steps`; `Constant` ignores it.
    pub decay: LrSchedule,
    pub total_steps: u64,
    /// Trajectories per optimizer step.
    pub batch_size: usize,
}

impl PhaseSchedule {
    /// The RFT phase over `trajectories` resolved rollouts: warmup, then cosine to 0 over its
    /// `epochs * ceil(trajectories / batch_size)` steps (RL-SPEC: 10 warmup steps, lr 5e-6,
    /// batch 64, 1 epoch).
    pub fn rft(
        peak_lr: f64,
        warmup_steps: u64,
        batch_size: usize,
        epochs: usize,
        trajectories: usize,
    ) -> Self {
        Self {
            peak_lr,
            warmup_steps,
            decay: LrSchedule::Cosine,
            total_steps: (epochs * trajectories.div_ceil(batch_size)) as u64,
            batch_size,
        }
    }

    /// The DAPO phase: warmup, then constant (RL-SPEC: lr 1e-6 with linear warmup).
    pub fn dapo(peak_lr: f64, warmup_steps: u64, batch_size: usize) -> Self {
        Self {
            peak_lr,
            warmup_steps,
            decay: LrSchedule::Constant,
            total_steps: 0,
            batch_size,
        }
    }

    /// The learning rate of the phase's step `step` (1-based, counted in this phase only).
    pub fn lr(&self, step: u64) -> f64 {
        lr_at(
            self.decay,
            self.peak_lr,
            self.warmup_steps,
            self.total_steps,
            step,
        )
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        let after = match self.decay {
            LrSchedule::Constant => "then constant".to_string(),
            // Before the rollouts the number of resolved ones is not known.
            LrSchedule::Cosine if self.total_steps == 0 => {
                "then cosine to 0 over the phase's epochs x ceil(resolved / batch) steps".into()
            }
            LrSchedule::Cosine => format!(
                "then cosine to 0 over the phase's {} steps",
                self.total_steps
            ),
        };
        format!(
            "lr {}, linear warmup over the phase's first {} steps, {after}, {} trajectories a step",
            self.peak_lr, self.warmup_steps, self.batch_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rft_warms_up_then_decays_to_zero_in_its_own_steps() {
        // 130 trajectories at 64 a step, 2 epochs: 3 steps an epoch, 6 in all.
        let s = PhaseSchedule::rft(5e-6, 2, 64, 2, 130);
        assert_eq!(s.total_steps, 6);
        let lrs: Vec<f64> = (1..=6).map(|k| s.lr(k)).collect();
        assert_eq!(lrs[0], 2.5e-6);
        assert_eq!(lrs[1], 5e-6);
        // Cosine from the peak at step 3 over the remaining 4 steps: 1, 0.854, 0.5, 0.146.
        let want = [1.0, 0.853_553_390_593_273_8, 0.5, 0.146_446_609_406_726_24];
        for (got, w) in lrs[2..].iter().zip(want) {
            assert!((got / 5e-6 - w).abs() < 1e-12, "{lrs:?}");
        }
    }

    #[test]
    fn dapo_warmup_counts_its_own_steps() {
        let s = PhaseSchedule::dapo(1e-6, 10, 128);
        assert_eq!(s.lr(1), 1e-7);
        assert_eq!(s.lr(10), 1e-6);
        assert_eq!(s.lr(11), 1e-6);
        assert_eq!(s.lr(1000), 1e-6);
    }

    #[test]
    fn an_iteration_takes_the_next_tasks_of_a_seeded_pass() {
        let all: Vec<usize> = (1..=3)
            .flat_map(|i| tasks_of_iteration(6, 2, 7, i))
            .collect();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..6).collect::<Vec<_>>(),
            "one pass covers every task once"
        );
        assert_eq!(
            tasks_of_iteration(6, 2, 7, 2),
            tasks_of_iteration(6, 2, 7, 2)
        );
    }
}
