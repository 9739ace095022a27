//! The PyTorch training fixtures (`train.safetensors`, tests/fixtures/generate.py) and the bf16
//! yardstick GPU training tests hold gradients and losses to: twice the error of the same batch
//! run by transformers in bf16, its two sources (bf16 weights, bf16 arithmetic) added, per
//! tensor and for the loss (see tests/gpu_grad_model.rs for the reasoning and the floors).

use super::relative_error;
use safetensors::{Dtype, SafeTensors};
use swerve::model::PackedBatch;
use swerve::train::loss::{LossRows, Objective};

pub fn fixture_tensor(st: &SafeTensors<'_>, key: &str) -> Vec<f64> {
    let view = st
        .tensor(key)
        .unwrap_or_else(|_| panic!("fixture has no {key}"));
    match view.dtype() {
        Dtype::F64 => view
            .data()
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        Dtype::I64 => view
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        other => panic!("{key}: {other:?}"),
    }
}

/// 2^-8: the gradients' floor (see [`whole_model_gradients_match_the_fixtures_in_bf16`]).
pub const GRAD_FLOOR: f64 = 1.0 / 256.0;
/// 2^-9, times the mean term size over sqrt(N): the loss's floor.
pub const LOSS_FLOOR: f64 = 1.0 / 512.0;

/// A fixture's training batch: its rows' data (the batch itself is returned beside it).
pub struct FixtureBatch {
    pub targets: Vec<u32>,
    pub mask: Vec<bool>,
    pub advantages: Vec<f32>,
    pub old: Vec<f32>,
    pub rollout: Vec<f32>,
}

impl FixtureBatch {
    pub fn read(st: &SafeTensors<'_>) -> (PackedBatch, Self) {
        let tokens: Vec<u32> = fixture_tensor(st, "tokens")
            .iter()
            .map(|&v| v as u32)
            .collect();
        let cu: Vec<usize> = fixture_tensor(st, "cu_seqlens")
            .iter()
            .map(|&v| v as usize)
            .collect();
        let sequences: Vec<Vec<u32>> = cu.windows(2).map(|w| tokens[w[0]..w[1]].to_vec()).collect();
        let batch = PackedBatch::from_sequences(&sequences);
        let targets: Vec<u32> = fixture_tensor(st, "targets")
            .iter()
            .map(|&v| v as u32)
            .collect();
        let mask: Vec<bool> = fixture_tensor(st, "action_mask")
            .iter()
            .map(|&v| v > 0.0)
            .collect();
        let f32s = |k: &str| {
            fixture_tensor(st, k)
                .iter()
                .map(|&v| v as f32)
                .collect::<Vec<_>>()
        };
        let (advantages, old, rollout) = (
            f32s("advantages"),
            f32s("old_logprobs"),
            f32s("rollout_logprobs"),
        );
        let data = Self {
            targets,
            mask,
            advantages,
            old,
            rollout,
        };
        (batch, data)
    }

    pub fn rows(&self) -> LossRows<'_> {
        LossRows {
            targets: &self.targets,
            action_mask: &self.mask,
            advantages: &self.advantages,
            old_logprobs: &self.old,
            rollout_logprobs: &self.rollout,
        }
    }
}

/// One fixture model and objective (`which`: "ce" or "dapo"), with the fixture's expected values.
pub struct FixtureCase<'a> {
    pub name: &'a str,
    pub which: &'a str,
    pub st: &'a SafeTensors<'a>,
}

impl FixtureCase<'_> {
    fn scalar(&self, key: &str) -> f64 {
        fixture_tensor(self.st, key)[0]
    }

    /// The loss against the fixture's, within twice the naive bf16 error (its two sources
    /// added) or the floor; a failure in words.
    pub fn check_loss(
        &self,
        objective: &Objective,
        loss: f64,
        data: &FixtureBatch,
        n_act: f64,
    ) -> Option<String> {
        let (name, which) = (self.name, self.which);
        let scalar = |k: &str| self.scalar(k);
        let (mask, advantages) = (&data.mask, &data.advantages);
        let action_rows = mask.iter().filter(|&&m| m).count() as f64;
        let loss_key = format!("{which}_loss");
        let want_loss = scalar(&loss_key);
        // The naive loss error and its two sources: the bf16 weights, the bf16 arithmetic.
        let (naive_loss, weights_loss) = (
            scalar(&format!("bf16_{which}_loss")),
            scalar(&format!("bf16_weights_{which}_loss")),
        );
        let naive_loss_err = (naive_loss - want_loss).abs();
        let yardstick_loss = (weights_loss - want_loss).abs() + (naive_loss - weights_loss).abs();
        // The loss is a mean of per-token terms; bf16 logprob errors move each term by
        // about |A_t| |d logp_t| (CE: |d logp_t|), so the error scales with the mean term
        // size, not with the mean itself: DAPO's terms of size ~1 nearly cancel (0.028 for
        // the tied model).
        let term_scale = if matches!(objective, Objective::MaskedCe) {
            want_loss.abs()
        } else {
            mask.iter()
                .zip(advantages)
                .filter(|(m, _)| **m)
                .map(|(_, a)| a.abs() as f64)
                .sum::<f64>()
                / n_act
        };
        let loss_err = (loss - want_loss).abs();
        let loss_bound = 2.0 * yardstick_loss.max(LOSS_FLOOR * term_scale / action_rows.sqrt());
        println!(
            "{name} {loss_key}: {:.6} vs {want_loss:.6}: error {loss_err:.2e}, naive bf16 \
             {naive_loss_err:.2e} (sources added {yardstick_loss:.2e}), ratio to bound {:.2}",
            loss,
            loss_err / loss_bound
        );
        (loss_err > loss_bound).then(|| {
            format!(
                "{name} {loss_key}: {} vs {want_loss}: error {loss_err:.3e} > {loss_bound:.3e}",
                loss
            )
        })
    }

    /// Every parameter's gradient against the fixture's, each within twice its naive bf16
    /// error (sources added) or the floor; the failures in words.
    /// `grads`: every parameter's whole gradient on the host, in checkpoint order (`names`).
    pub fn check_grads(&self, names: &[String], grads: &[Vec<f32>]) -> Vec<String> {
        let (name, which) = (self.name, self.which);
        let scalar = |k: &str| self.scalar(k);
        let prefix = format!("{which}_grad");
        let mut failures = Vec::new();
        let mut worst = (0.0, String::new());
        for (hf_name, got) in names.iter().zip(grads) {
            let err = relative_error(
                got,
                &fixture_tensor(self.st, &format!("{prefix}.{hf_name}")),
            );
            let naive = scalar(&format!("bf16_{which}_grad_error.{hf_name}"));
            let yardstick = scalar(&format!("bf16_weights_{which}_grad_error.{hf_name}"))
                + scalar(&format!("bf16_arithmetic_{which}_grad_error.{hf_name}"));
            let bound = 2.0 * yardstick.max(GRAD_FLOOR);
            println!(
                "{name} {prefix} {hf_name}: error {err:.2e}, naive bf16 {naive:.2e} (sources \
                 added {yardstick:.2e}), ratio to bound {:.2}",
                err / bound
            );
            if err > bound {
                failures.push(format!(
                    "{name} {prefix} {hf_name}: relative error {err:.3e} > {bound:.3e}"
                ));
            }
            if err / bound > worst.0 {
                worst = (err / bound, hf_name.clone());
            }
        }
        println!(
            "{name} {prefix}: worst ratio to bound {:.2} ({})",
            worst.0, worst.1
        );
        failures
    }
}
