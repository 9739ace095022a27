//! The training half of the backend: the backward of every forward op, the fused LM-head loss,
//! and the optimizer's element-wise work.
//!
//! A sub-trait of [`Backend`], so serving code (which needs none of this) is untouched and a
//! backend grows training support separately. The CPU reference is [`super::cpu_grad`].
//!
//! Gradient convention, for every op here: **gradient outputs are accumulated** (`d_x += ...`),
//! never overwritten; the caller zeroes them first ([`BackendGrad::fill_zero`]). One rule serves
//! the branches that meet (q, k and v all read the same normed input; the residual stream gets
//! both the skip path and the norm's gradient; a tied embedding gets the LM head's gradient and
//! the embedding's) and gradient accumulation over micro-batches. The exception is
//! [`BackendGrad::rope_backward`], which rotates gradients in place like the forward.

use super::{Backend, Rotary};
use crate::backend::adamw::AdamWStep;
use crate::backend::loss::{check_rows, finish_rows, LossOutput, LossRows, Objective, RowStats};
use anyhow::{ensure, Result};

pub trait BackendGrad: Backend {
    /// Sets every element to zero.
    fn fill_zero(&self, x: &mut Self::Tensor) -> Result<()>;
    /// `dst += src`, element-wise (same element count).
    fn add_into(&self, dst: &mut Self::Tensor, src: &Self::Tensor) -> Result<()>;

    /// [`Backend::attention`] that also writes each query row's logsumexp of its scaled scores,
    /// `lse: [T, heads]` (f32), which the backward needs.
    #[allow(clippy::too_many_arguments)]
    fn attention_with_lse(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut Self::Tensor,
        lse: &mut Self::Tensor,
    ) -> Result<()>;

    /// `d_table[ids[t]] += d_out[t]` (scatter-add; repeated ids add up; [`super::OTHER_SHARD`]
    /// ids are skipped).
    fn embedding_backward(
        &self,
        d_out: &Self::Tensor,
        ids: &[u32],
        d_table: &mut Self::Tensor,
    ) -> Result<()>;

    /// Backward of `out = rmsnorm(x) * weight`: `d_x += ...`, `d_weight += ...`. The residual form
    /// (`add_rmsnorm`) needs nothing more: pass the residual stream's gradient as `d_x`, and it
    /// collects the norm's gradient on top of the skip path's (pass `x` = the residual after the
    /// add).
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        d_out: &Self::Tensor,
        d_x: &mut Self::Tensor,
        d_weight: &mut Self::Tensor,
    ) -> Result<()>;

    /// Backward of `out = x W^T (+ b)`: `d_x += d_out W`, `d_weight += d_out^T x`,
    /// `d_bias += colsum(d_out)`.
    fn linear_backward(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        d_out: &Self::Tensor,
        d_x: &mut Self::Tensor,
        d_weight: &mut Self::Tensor,
        d_bias: Option<&mut Self::Tensor>,
    ) -> Result<()>;

    /// Backward of [`Backend::rope`], in place: rotates `d_q` and `d_k` by minus each position's
    /// angle (the transpose of the forward rotation, with the same attention scaling).
    fn rope_backward(
        &self,
        d_q: &mut Self::Tensor,
        d_k: &mut Self::Tensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()>;

    /// Backward of `out = silu(gate) * up`: `d_gate += ...`, `d_up += ...`.
    fn swiglu_backward(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        d_out: &Self::Tensor,
        d_gate: &mut Self::Tensor,
        d_up: &mut Self::Tensor,
    ) -> Result<()>;

    /// Backward of causal packed GQA attention from the forward's `out` and `lse`, recomputing
    /// the probabilities one query row at a time (no `T x T` matrix): `d_q`, `d_k`, `d_v` `+=`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        out: &Self::Tensor,
        lse: &Self::Tensor,
        d_out: &Self::Tensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        d_q: &mut Self::Tensor,
        d_k: &mut Self::Tensor,
        d_v: &mut Self::Tensor,
    ) -> Result<()>;

    /// Pass 1 of the fused LM-head loss (`kernels/dapo_loss.cu` on CUDA): logits `hidden W^T`
    /// chunk by chunk, never whole, reduced to each row's [`RowStats`]. `weight` is the whole LM
    /// head or one rank's vocabulary shard; `targets` index into it ([`super::OTHER_SHARD`] for
    /// a target another shard holds). See [`crate::backend::loss`].
    fn lm_head_stats(
        &self,
        hidden: &Self::Tensor,
        weight: &Self::Tensor,
        targets: &[u32],
    ) -> Result<Vec<RowStats>>;

    /// Pass 2: with each row's whole-vocabulary `lse` and `coef = d loss / d logp` (0: the row
    /// is skipped), the logits' gradient tile by tile and `d_hidden += ...`, `d_weight += ...`.
    #[allow(clippy::too_many_arguments)]
    fn lm_head_loss_grad(
        &self,
        hidden: &Self::Tensor,
        weight: &Self::Tensor,
        targets: &[u32],
        lse: &[f64],
        coef: &[f64],
        d_hidden: &mut Self::Tensor,
        d_weight: &mut Self::Tensor,
    ) -> Result<()>;

    /// The fused LM-head loss over a whole LM head: pass 1, the host half
    /// ([`finish_rows`]), pass 2. The per-row logprob and entropy, the objective's loss divided
    /// by `num_action_tokens` (the optimizer batch's, not this call's), and the gradients
    /// `d_hidden += ...`, `d_weight += ...`.
    #[allow(clippy::too_many_arguments)]
    fn lm_head_loss(
        &self,
        hidden: &Self::Tensor,
        weight: &Self::Tensor,
        rows: &LossRows<'_>,
        objective: &Objective,
        num_action_tokens: f64,
        d_hidden: &mut Self::Tensor,
        d_weight: &mut Self::Tensor,
    ) -> Result<LossOutput> {
        let (t, vocab) = (self.shape(hidden)[0], self.shape(weight)[0]);
        check_rows(rows, objective, t, vocab)?;
        ensure!(
            num_action_tokens > 0.0,
            "loss: the global action-token count is {num_action_tokens}"
        );
        let stats = self.lm_head_stats(hidden, weight, rows.targets)?;
        let (out, lse, coef) = finish_rows(&stats, rows, objective, num_action_tokens);
        if coef.iter().any(|&c| c != 0.0) {
            self.lm_head_loss_grad(
                hidden,
                weight,
                rows.targets,
                &lse,
                &coef,
                d_hidden,
                d_weight,
            )?;
        }
        Ok(out)
    }

    /// The fused loss's forward alone: per row, `log p(targets[r])` and the entropy, the numbers
    /// [`Self::lm_head_loss`] reports for the same rows (same kernels, same order), with no
    /// gradient. DAPO's recomputed old logprobs come from here.
    fn lm_head_logprobs(
        &self,
        hidden: &Self::Tensor,
        weight: &Self::Tensor,
        targets: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (t, vocab) = (self.shape(hidden)[0], self.shape(weight)[0]);
        let no_action = vec![false; t];
        let rows = LossRows {
            targets,
            action_mask: &no_action,
            ..Default::default()
        };
        check_rows(&rows, &Objective::MaskedCe, t, vocab)?;
        let stats = self.lm_head_stats(hidden, weight, targets)?;
        let (out, _, _) = finish_rows(&stats, &rows, &Objective::MaskedCe, 1.0);
        Ok((out.logprobs, out.entropy))
    }

    /// Sum of squares of every element (f64), for the global gradient norm.
    fn sum_of_squares(&self, x: &Self::Tensor) -> Result<f64>;
    /// One AdamW update of an f32 master tensor and its moments from its gradient (times
    /// `step.grad_scale`, the clipping factor). See [`crate::backend::adamw`].
    fn adamw_update(
        &self,
        master: &mut Self::Tensor,
        grad: &Self::Tensor,
        exp_avg: &mut Self::Tensor,
        exp_avg_sq: &mut Self::Tensor,
        step: &AdamWStep,
    ) -> Result<()>;
    /// Copies `src` into `dst` of the same shape, converting between the f32 masters and the
    /// compute weights' dtype (bf16 on CUDA) in either direction.
    fn copy_weights(&self, src: &Self::Tensor, dst: &mut Self::Tensor) -> Result<()>;
    /// A tensor kept in f32 (masters, moments) holding `values`.
    fn upload_f32(&self, shape: &[usize], values: &[f32]) -> Result<Self::Tensor>;
}
