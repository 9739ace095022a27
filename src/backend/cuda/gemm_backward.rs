//! The backward of a linear layer on cuBLASLt ([`Gemm::linear_backward`]): `d_x += d_out W`
//! (bf16, an activation gradient), `d_weight += d_out^T x` and `d_bias += colsum(d_out)` (fp32:
//! parameter gradients accumulate across micro-batches without bf16 rounding). The column sum is a
//! GEMM with a vector of ones (deterministic, no atomics). These are backward-only products: their
//! algorithms are the heuristic's per problem ([`Pinning::PerProblem`]; gemm.rs's module doc).

use super::gemm::{Gemm, Pinning, RowMajorGemm};
use super::tensor::{CudaTensor, DeviceDType};
use anyhow::{ensure, Result};

impl Gemm {
    /// The backward of [`Gemm::linear`] (`out = x W^T + b`): `d_x += d_out W` (bf16),
    /// `d_weight += d_out^T x` and `d_bias += colsum(d_out)` (fp32). Every operand keeps its
    /// forward shape: x `[T, k]`, W `[n, k]`, d_out `[T, n]` (any leading dims viewed flat).
    pub fn linear_backward(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        d_out: &CudaTensor,
        d_x: &mut CudaTensor,
        d_weight: &mut CudaTensor,
        d_bias: Option<&mut CudaTensor>,
    ) -> Result<()> {
        let (t, n, k) = check_linear_backward(x, weight, d_out, d_x, d_weight)?;
        // SAFETY (all three): the sizes were checked against the tensors above.
        unsafe {
            // d_x[T, k] += d_out[T, n] W[n, k]
            self.row_major(RowMajorGemm {
                m: t,
                n: k,
                k: n,
                a: d_out.ptr(),
                lda: n,
                trans_a: false,
                b: weight.ptr(),
                ldb: k,
                trans_b: false,
                out: d_x.ptr(),
                ldo: k,
                out_f32: false,
                alpha: 1.0,
                beta: 1.0,
                pin: Pinning::PerProblem,
            })?;
            // d_weight[n, k] += d_out^T[n, T] x[T, k]
            self.row_major(RowMajorGemm {
                m: n,
                n: k,
                k: t,
                a: d_out.ptr(),
                lda: n,
                trans_a: true,
                b: x.ptr(),
                ldb: k,
                trans_b: false,
                out: d_weight.ptr(),
                ldo: k,
                out_f32: true,
                alpha: 1.0,
                beta: 1.0,
                pin: Pinning::PerProblem,
            })?;
        }
        if let Some(d_bias) = d_bias {
            self.bias_backward(d_out, t, n, d_bias)?;
        }
        Ok(())
    }

    /// `d_bias[n] += colsum(d_out [T, n])` (f32), as a GEMM with a row of ones.
    fn bias_backward(
        &self,
        d_out: &CudaTensor,
        t: usize,
        n: usize,
        d_bias: &mut CudaTensor,
    ) -> Result<()> {
        ensure!(
            d_bias.dtype() == DeviceDType::F32 && d_bias.len() == n,
            "linear_backward: d_bias {:?} {:?} for {n} outputs (f32 expected)",
            d_bias.shape(),
            d_bias.dtype()
        );
        let ones = self.ones(t)?;
        // d_bias[1, n] += ones[1, T] d_out[T, n]
        // SAFETY: `ones` holds at least T values; the other sizes were checked by the caller.
        unsafe {
            self.row_major(RowMajorGemm {
                m: 1,
                n,
                k: t,
                a: ones,
                lda: t,
                trans_a: false,
                b: d_out.ptr(),
                ldb: n,
                trans_b: false,
                out: d_bias.ptr(),
                ldo: n,
                out_f32: true,
                alpha: 1.0,
                beta: 1.0,
                pin: Pinning::PerProblem,
            })?;
        }
        Ok(())
    }
}

/// Checks [`Gemm::linear_backward`]'s dtypes (activation gradients bf16, parameter gradients
/// f32) and sizes; returns `(T, n, k)` for x `[T, k]` and W `[n, k]`.
fn check_linear_backward(
    x: &CudaTensor,
    weight: &CudaTensor,
    d_out: &CudaTensor,
    d_x: &CudaTensor,
    d_weight: &CudaTensor,
) -> Result<(usize, usize, usize)> {
    for (what, t, dtype) in [
        ("x", x, DeviceDType::Bf16),
        ("weight", weight, DeviceDType::Bf16),
        ("d_out", d_out, DeviceDType::Bf16),
        ("d_x", d_x, DeviceDType::Bf16),
        ("d_weight", d_weight, DeviceDType::F32),
    ] {
        ensure!(
            t.dtype() == dtype,
            "linear_backward: {what} is {:?}, expected {dtype:?} (activation gradients are bf16, \
             parameter gradients f32)",
            t.dtype()
        );
    }
    ensure!(
        weight.shape().len() == 2,
        "linear_backward: weight {:?}",
        weight.shape()
    );
    let (n, k) = (weight.shape()[0], weight.shape()[1]);
    ensure!(
        k > 0 && n > 0 && !x.is_empty() && x.len().is_multiple_of(k),
        "linear_backward: x {:?} against weight {:?}",
        x.shape(),
        weight.shape()
    );
    let t = x.len() / k;
    ensure!(
        d_out.len() == t * n && d_x.len() == x.len() && d_weight.len() == weight.len(),
        "linear_backward: d_out {:?}, d_x {:?}, d_weight {:?} for x {:?}, weight {:?}",
        d_out.shape(),
        d_x.shape(),
        d_weight.shape(),
        x.shape(),
        weight.shape()
    );
    Ok((t, n, k))
}
