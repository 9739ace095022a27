//! AdamW over f32 master weights (RL-SPEC.md "Optimizer and schedule"), global-norm gradient
//! clipping, and the learning-rate schedules. The per-element update is
//! [`crate::backend::adamw`]'s (re-exported here).
//!
//! Clipping: `norm = sqrt(sum of every gradient element squared)`, reported before clipping;
//! `grad_scale = min(1, max_norm / (norm + 1e-6))` as `torch.nn.utils.clip_grad_norm_`. A norm
//! that is NaN or infinite skips the step: nothing changes, not even the step count.

pub use crate::backend::adamw::{adamw_update_slice, AdamWScalars, AdamWStep};
use crate::backend::grad::BackendGrad;
use anyhow::{ensure, Result};

/// Learning rate over optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LrSchedule {
    Constant,
    Cosine,
}

impl std::str::FromStr for LrSchedule {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "constant" => Ok(Self::Constant),
            "cosine" => Ok(Self::Cosine),
            other => Err(format!(
                "unknown schedule {other:?}: expected constant or cosine"
            )),
        }
    }
}

/// The learning rate of optimizer step `step` (1-based) of `total_steps`: linear warmup over the
/// first `warmup_steps` (`lr * step / warmup_steps`, so the first step already moves), then
/// constant, or cosine from `lr` (the first step after warmup) towards 0 (reached just after the
/// last step).
pub fn lr_at(schedule: LrSchedule, lr: f64, warmup_steps: u64, total_steps: u64, step: u64) -> f64 {
    if step <= warmup_steps {
        return lr * step as f64 / warmup_steps as f64;
    }
    match schedule {
        LrSchedule::Constant => lr,
        LrSchedule::Cosine => {
            let decay_steps = total_steps.saturating_sub(warmup_steps).max(1);
            let progress = ((step - 1 - warmup_steps) as f64 / decay_steps as f64).min(1.0);
            lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Global-norm clipping threshold; `None`: no clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    /// RL-SPEC's settings: betas 0.9/0.999, eps 1e-8, weight decay 0.1, clipping at 1.0.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            max_grad_norm: Some(1.0),
        }
    }
}

/// What a step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Global gradient norm before clipping (NaN or infinite when the step was skipped).
    pub grad_norm: f64,
    /// The factor the gradients were multiplied by (1 without clipping).
    pub grad_scale: f64,
    /// True when a NaN or infinite gradient skipped the update.
    pub skipped: bool,
}

/// AdamW state: first and second moments per parameter tensor, and the count of steps taken.
pub struct AdamW<T> {
    pub config: AdamWConfig,
    pub exp_avg: Vec<T>,
    pub exp_avg_sq: Vec<T>,
    /// Updates applied so far (skipped steps do not count).
    pub steps_taken: u64,
}

impl<T> AdamW<T> {
    /// Zero moments shaped like `masters`.
    pub fn new<B: BackendGrad<Tensor = T>>(
        backend: &B,
        config: AdamWConfig,
        masters: &[&T],
    ) -> Result<Self> {
        let zeros = |t: &&T| backend.zeros_f32(backend.shape(t));
        Ok(Self {
            config,
            exp_avg: masters.iter().map(zeros).collect::<Result<_>>()?,
            exp_avg_sq: masters.iter().map(zeros).collect::<Result<_>>()?,
            steps_taken: 0,
        })
    }

    /// The global norm of `grads` (f64 accumulation).
    pub fn global_norm<B: BackendGrad<Tensor = T>>(backend: &B, grads: &[&T]) -> Result<f64> {
        let mut sum = 0.0;
        for g in grads {
            sum += backend.sum_of_squares(g)?;
        }
        Ok(sum.sqrt())
    }

    /// Clips and applies one update at learning rate `lr` to `masters` (2-D tensors get weight
    /// decay), or skips it when the gradient norm is not finite.
    pub fn step<B: BackendGrad<Tensor = T>>(
        &mut self,
        backend: &B,
        masters: &mut [&mut T],
        grads: &[&T],
        lr: f64,
    ) -> Result<StepReport> {
        ensure!(
            masters.len() == grads.len() && masters.len() == self.exp_avg.len(),
            "adamw: {} masters, {} gradients, {} moment tensors",
            masters.len(),
            grads.len(),
            self.exp_avg.len()
        );
        let grad_norm = Self::global_norm(backend, grads)?;
        self.apply(backend, masters, grads, grad_norm, lr)
    }

    /// [`Self::step`] with the global gradient norm given (tensor and data parallelism compute
    /// it over every rank's part): `masters` and `grads` are those whose moments this holds.
    pub fn apply<B: BackendGrad<Tensor = T>>(
        &mut self,
        backend: &B,
        masters: &mut [&mut T],
        grads: &[&T],
        grad_norm: f64,
        lr: f64,
    ) -> Result<StepReport> {
        ensure!(
            masters.len() == grads.len() && masters.len() == self.exp_avg.len(),
            "adamw: {} masters, {} gradients, {} moment tensors",
            masters.len(),
            grads.len(),
            self.exp_avg.len()
        );
        if !grad_norm.is_finite() {
            return Ok(StepReport {
                grad_norm,
                grad_scale: 0.0,
                skipped: true,
            });
        }
        let grad_scale = match self.config.max_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        self.steps_taken += 1;
        for (i, (master, grad)) in masters.iter_mut().zip(grads).enumerate() {
            let is_matrix = backend.shape(master).len() == 2;
            let step = AdamWStep {
                lr: lr as f32,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                eps: self.config.eps,
                weight_decay: if is_matrix {
                    self.config.weight_decay
                } else {
                    0.0
                },
                step: self.steps_taken,
                grad_scale: grad_scale as f32,
            };
            backend.adamw_update(
                master,
                grad,
                &mut self.exp_avg[i],
                &mut self.exp_avg_sq[i],
                &step,
            )?;
        }
        Ok(StepReport {
            grad_norm,
            grad_scale,
            skipped: false,
        })
    }
}
