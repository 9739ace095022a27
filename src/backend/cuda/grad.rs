//! [`BackendGrad`] on the GPU: the backward of every forward op, the fused LM-head loss and the
//! optimizer's element-wise work, over the kernels of `kernels/*.cu` and cuBLASLt.
//!
//! Dtypes (the CPU reference is all f32; here):
//!
//! | tensor | dtype | why |
//! | --- | --- | --- |
//! | activations, their gradients (`d_x`, `d_q`, `d_gate`, `d_hidden`, ...) | bf16 | as the forward's activations; each `+=` rounds once |
//! | parameter gradients (`Qwen2Model::zero_grads`) | f32 | summed over micro-batches without bf16 rounding |
//! | master weights, AdamW moments | f32 | RL-SPEC |
//! | compute weights | bf16 | refreshed from the masters by `copy_weights` after each step |
//! | attention `lse` | f32 | `[T, heads]` |
//!
//! Determinism: no floating-point atomics anywhere here. The embedding backward groups token
//! rows by id on the host; RMSNorm's weight gradient and the sum of squares reduce fixed
//! partials in a fixed order; cuBLASLt is deterministic for a fixed plan.

use super::backend::{pod_vec, CudaBackend};
use super::pointwise::SUM_SQUARES_BLOCKS;
use super::tensor::{CudaTensor, DeviceDType};
use crate::backend::adamw::AdamWStep;
use crate::backend::grad::BackendGrad;
use crate::backend::loss::RowStats;
use crate::backend::Rotary;
use anyhow::{bail, ensure, Context, Result};
use cudarc::driver::result as driver;

impl BackendGrad for CudaBackend {
    fn fill_zero(&self, x: &mut CudaTensor) -> Result<()> {
        self.fill_bytes(x, 0)
    }

    fn add_into(&self, dst: &mut CudaTensor, src: &CudaTensor) -> Result<()> {
        self.device.add_into(dst, src)
    }

    fn attention_with_lse(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut CudaTensor,
        lse: &mut CudaTensor,
    ) -> Result<()> {
        self.flash_attention_with_lse(q, k, v, cu_seqlens, softmax_scale, out, lse)
    }

    fn embedding_backward(
        &self,
        d_out: &CudaTensor,
        ids: &[u32],
        d_table: &mut CudaTensor,
    ) -> Result<()> {
        self.device.embedding_bwd(d_out, ids, d_table, |values| {
            self.upload_pod(values, &[values.len()], DeviceDType::U32)
        })
    }

    fn rmsnorm_backward(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        d_out: &CudaTensor,
        d_x: &mut CudaTensor,
        d_weight: &mut CudaTensor,
    ) -> Result<()> {
        let (blocks, _) = self.device.rmsnorm_bwd_grid(x.rows().max(1));
        let mut partial = self.alloc(&[blocks, x.cols().max(1)], DeviceDType::F32)?;
        self.device
            .rmsnorm_bwd(x, weight, eps, d_out, d_x, d_weight, &mut partial)
    }

    fn linear_backward(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        d_out: &CudaTensor,
        d_x: &mut CudaTensor,
        d_weight: &mut CudaTensor,
        d_bias: Option<&mut CudaTensor>,
    ) -> Result<()> {
        self.gemm
            .linear_backward(x, weight, d_out, d_x, d_weight, d_bias)
    }

    fn rope_backward(
        &self,
        d_q: &mut CudaTensor,
        d_k: &mut CudaTensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()> {
        self.with_rope_tables(positions, rotary, |positions, inv_freq| {
            self.device.rope_bwd(
                d_q,
                d_k,
                positions,
                inv_freq,
                rotary.attention_scaling as f32,
            )
        })
    }

    fn swiglu_backward(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        d_out: &CudaTensor,
        d_gate: &mut CudaTensor,
        d_up: &mut CudaTensor,
    ) -> Result<()> {
        self.device.swiglu_bwd(gate, up, d_out, d_gate, d_up)
    }

    fn attention_backward(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        out: &CudaTensor,
        lse: &CudaTensor,
        d_out: &CudaTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        d_q: &mut CudaTensor,
        d_k: &mut CudaTensor,
        d_v: &mut CudaTensor,
    ) -> Result<()> {
        self.flash_attention_backward(
            q,
            k,
            v,
            out,
            lse,
            d_out,
            cu_seqlens,
            softmax_scale,
            d_q,
            d_k,
            d_v,
        )
    }

    fn lm_head_stats(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        targets: &[u32],
    ) -> Result<Vec<RowStats>> {
        self.lm_head_stats_tiled(hidden, weight, targets, self.loss_tiles())
    }

    fn lm_head_loss_grad(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        targets: &[u32],
        lse: &[f64],
        coef: &[f64],
        d_hidden: &mut CudaTensor,
        d_weight: &mut CudaTensor,
    ) -> Result<()> {
        self.lm_head_loss_grad_tiled(
            hidden,
            weight,
            targets,
            lse,
            coef,
            d_hidden,
            d_weight,
            self.loss_tiles(),
        )
    }

    fn sum_of_squares(&self, x: &CudaTensor) -> Result<f64> {
        let mut partials = self.alloc(&[SUM_SQUARES_BLOCKS], DeviceDType::F64)?;
        let blocks = self.device.sum_squares_partials(x, &mut partials)?;
        if blocks == 0 {
            return Ok(0.0);
        }
        let values: Vec<f64> = pod_vec(&self.read_bytes(&partials)?);
        Ok(values[..blocks].iter().sum())
    }

    fn adamw_update(
        &self,
        master: &mut CudaTensor,
        grad: &CudaTensor,
        exp_avg: &mut CudaTensor,
        exp_avg_sq: &mut CudaTensor,
        step: &AdamWStep,
    ) -> Result<()> {
        self.device.adamw(master, grad, exp_avg, exp_avg_sq, step)
    }

    fn copy_weights(&self, src: &CudaTensor, dst: &mut CudaTensor) -> Result<()> {
        ensure!(
            src.len() == dst.len(),
            "copy_weights: {:?} into {:?}",
            src.shape(),
            dst.shape()
        );
        if src.dtype() != dst.dtype() {
            return self.device.convert(src, dst);
        }
        if !matches!(src.dtype(), DeviceDType::Bf16 | DeviceDType::F32) {
            bail!("copy_weights of a {:?} tensor", src.dtype());
        }
        if src.num_bytes() > 0 {
            // SAFETY: both tensors hold `num_bytes` bytes (same length and dtype).
            unsafe {
                driver::memcpy_dtod_async(
                    dst.ptr(),
                    src.ptr(),
                    src.num_bytes(),
                    self.device.stream.cu_stream(),
                )
            }
            .context("copy_weights: device copy")?;
        }
        Ok(())
    }

    fn upload_f32(&self, shape: &[usize], values: &[f32]) -> Result<CudaTensor> {
        ensure!(
            shape.iter().product::<usize>() == values.len(),
            "upload_f32: {} values for shape {shape:?}",
            values.len()
        );
        self.upload_pod(values, shape, DeviceDType::F32)
    }
}
