//! AdamW over f32 master weights (RL-SPEC.md "Optimizer and schedule"), global-norm gradient
//! clipping, and the learning-rate schedules.
//!
//! Per element, as `torch.optim.AdamW` does it (step `t` counts from 1):
//!
//! ```text
//! g  = grad * grad_scale                          (grad_scale: the clipping factor)
//! p -= lr * weight_decay * p                      (decoupled; 2-D weights only)
//! m  = beta1 m + (1 - beta1) g                   (as torch: m + (1 - beta1) (g - m))
//! v  = beta2 v + (1 - beta2) g^2
//! p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//!
//! Clipping: `norm = sqrt(sum of every gradient element squared)`, reported before clipping;
//! `grad_scale = min(1, max_norm / (norm + 1e-6))` as `torch.nn.utils.clip_grad_norm_`. A norm
//! that is NaN or infinite skips the step: nothing changes, not even the step count.

use crate::backend::grad::BackendGrad;
use anyhow::{ensure, Result};

/// One update's scalars, shared by every tensor of a step except `weight_decay` (0 for tensors
/// that are not 2-D).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based.
    pub step: u64,
    pub grad_scale: f32,
}

/// The reference update over host slices (the CPU backend's `adamw_update`).
pub fn adamw_update_slice(
    master: &mut [f32],
    grad: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    s: &AdamWStep,
) {
    assert!(
        grad.len() == master.len()
            && exp_avg.len() == master.len()
            && exp_avg_sq.len() == master.len(),
        "adamw: tensors of different sizes"
    );
    let k = s.scalars();
    for i in 0..master.len() {
        let g = grad[i] * k.grad_scale;
        let p = master[i] * k.decay;
        let m = exp_avg[i] + k.one_minus_beta1 * (g - exp_avg[i]);
        let v = k.beta2 * exp_avg_sq[i] + k.one_minus_beta2 * g * g;
        let denom = v.sqrt() / k.bias_correction2_sqrt + k.eps;
        master[i] = p - k.step_size * (m / denom);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

/// The per-step f32 constants of one update, in the order `kernels/adamw.cu` takes them; one
/// computation shared by the CPU reference and the GPU kernel, so both see the same bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    pub grad_scale: f32,
    /// `1 - lr * weight_decay`.
    pub decay: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
}

impl AdamWStep {
    pub fn scalars(&self) -> AdamWScalars {
        let bias_correction1 = 1.0 - (self.beta1 as f64).powi(self.step as i32);
        let bias_correction2_sqrt = (1.0 - (self.beta2 as f64).powi(self.step as i32)).sqrt();
        AdamWScalars {
            grad_scale: self.grad_scale,
            decay: 1.0 - self.lr * self.weight_decay,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            bias_correction2_sqrt: bias_correction2_sqrt as f32,
            eps: self.eps,
            step_size: (self.lr as f64 / bias_correction1) as f32,
        }
    }
}

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
