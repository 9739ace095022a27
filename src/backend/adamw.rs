//! The AdamW update of one tensor, as `torch.optim.AdamW` does it per element (step `t` counts
//! from 1): the step's scalars ([`AdamWStep`], [`AdamWScalars`]) every backend's
//! [`BackendGrad::adamw_update`](super::BackendGrad::adamw_update) takes, and the CPU reference
//! ([`adamw_update_slice`]) `kernels/adamw.cu` is checked against. The optimizer around it
//! (clipping, schedules, moments) is [`crate::train::optimizer`].
//!
//! ```text
//! g  = grad * grad_scale                          (grad_scale: the clipping factor)
//! p -= lr * weight_decay * p                      (decoupled; 2-D weights only)
//! m  = beta1 m + (1 - beta1) g                   (as torch: m + (1 - beta1) (g - m))
//! v  = beta2 v + (1 - beta2) g^2
//! p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```

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
