//! Attention-backward rows of `swerve-bench kernels`: the whole
//! [`CudaBackend::flash_attention_backward`] (preprocess, main kernel, dQ add) at the attention
//! shapes, against the GEMM ceiling. FLOPs: 2.5 times the forward's (FlashAttention's convention:
//! the backward's five T x T x head_dim products against the forward's two). The error is checked
//! against f64 on sampled rows: dQ rows at the tile edges of every sequence, and the dK, dV rows of
//! the last sequence's final keys (which only a few queries see, so their reference is cheap).

use super::{max_abs_diff, time_ms, upload_random, AttentionShape, Ceilings, KernelRow};
use crate::backend::cuda::{CudaBackend, DeviceDType};
use crate::backend::Backend;
use anyhow::{ensure, Result};

/// Host copies of one problem's inputs.
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

/// `p_j` and `ds_j = p_j (dp_j - D)` (unscaled) of query row `row`, head `h`, over the keys
/// `seq_start ..= row`, in f64.
fn row_probs(
    x: &Inputs,
    shape: &AttentionShape,
    seq_start: usize,
    row: usize,
    h: usize,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (hd, heads, kv_heads) = (shape.head_dim, shape.heads, shape.kv_heads);
    let g = h / (heads / kv_heads);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let q_row = &x.q[(row * heads + h) * hd..][..hd];
    let do_row = &x.d_out[(row * heads + h) * hd..][..hd];
    let at = |j: usize| (j * kv_heads + g) * hd;
    let scores: Vec<f64> = (seq_start..=row)
        .map(|j| scale * dot(q_row, &x.k[at(j)..][..hd]))
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    let p: Vec<f64> = scores.iter().map(|s| (s - max).exp() / sum).collect();
    let dp: Vec<f64> = (seq_start..=row)
        .map(|j| dot(do_row, &x.v[at(j)..][..hd]))
        .collect();
    let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum(); // rowsum(dO * O)
    let ds = p.iter().zip(&dp).map(|(p, dp)| p * (dp - delta)).collect();
    (p, ds)
}

/// Largest |got - f64 reference| over the sampled rows of d_q, d_k, d_v.
fn sampled_error(x: &Inputs, shape: &AttentionShape, grads: [&[f32]; 3], scale: f64) -> f32 {
    let AttentionShape {
        seqs,
        len,
        heads,
        kv_heads,
        head_dim: hd,
    } = *shape;
    let group = heads / kv_heads;
    let mut err = 0.0f32;
    let mut compare = |got: &[f32], want: &[f64]| {
        let want: Vec<f32> = want.iter().map(|&w| w as f32).collect();
        err = err.max(max_abs_diff(got, &want));
    };
    for s in 0..seqs {
        let start = s * len;
        for offset in [0, 1, 63, 64, 127, 128, len / 2, len - 1] {
            let row = start + offset.min(len - 1);
            for h in [0, heads / 2, heads - 1] {
                let (_, ds) = row_probs(x, shape, start, row, h, scale);
                let g = h / group;
                let mut want = vec![0.0f64; hd];
                for (n, j) in (start..=row).enumerate() {
                    for (w, kv) in want.iter_mut().zip(&x.k[(j * kv_heads + g) * hd..][..hd]) {
                        *w += scale * ds[n] * *kv as f64;
                    }
                }
                compare(&grads[0][(row * heads + h) * hd..][..hd], &want);
            }
        }
    }
    // dK, dV of the last sequence's keys len-1 and len-33, kv heads 0 and the last.
    let start = (seqs - 1) * len;
    for key in [start + len - 1, start + len - 33] {
        for g in [0, kv_heads - 1] {
            let (mut dk, mut dv) = (vec![0.0f64; hd], vec![0.0f64; hd]);
            for h in g * group..(g + 1) * group {
                for row in key..start + len {
                    let (p, ds) = row_probs(x, shape, start, row, h, scale);
                    let n = key - start;
                    let q_row = &x.q[(row * heads + h) * hd..][..hd];
                    let do_row = &x.d_out[(row * heads + h) * hd..][..hd];
                    for d in 0..hd {
                        dk[d] += scale * ds[n] * q_row[d] as f64;
                        dv[d] += p[n] * do_row[d] as f64;
                    }
                }
            }
            let at = (key * kv_heads + g) * hd;
            compare(&grads[1][at..][..hd], &dk);
            compare(&grads[2][at..][..hd], &dv);
        }
    }
    err
}

/// The flash-attention backward at one shape, from the GPU forward's `out` and `lse`.
pub fn attention_backward(
    backend: &CudaBackend,
    shape: AttentionShape,
    ceilings: &Ceilings,
) -> Result<KernelRow> {
    let AttentionShape {
        seqs,
        len,
        heads,
        kv_heads,
        head_dim,
    } = shape;
    let t = seqs * len;
    let q = upload_random(backend, &[t, heads, head_dim], 1100, 1.0)?;
    let k = upload_random(backend, &[t, kv_heads, head_dim], 1101, 1.0)?;
    let v = upload_random(backend, &[t, kv_heads, head_dim], 1102, 1.0)?;
    let d_out = upload_random(backend, &[t, heads, head_dim], 1103, 1.0)?;
    let cu: Vec<u32> = (0..=seqs).map(|s| (s * len) as u32).collect();
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut out = backend.alloc(&[t, heads, head_dim], DeviceDType::Bf16)?;
    let mut lse = backend.alloc(&[t, heads], DeviceDType::F32)?;
    backend.flash_attention_with_lse(&q, &k, &v, &cu, scale, &mut out, &mut lse)?;
    let mut d_q = backend.zeros(&[t, heads, head_dim])?;
    let mut d_k = backend.zeros(&[t, kv_heads, head_dim])?;
    let mut d_v = backend.zeros(&[t, kv_heads, head_dim])?;
    // One input set is several times L2 (q and d_out alone: 2 T heads hd bf16), so no rotation.
    // The timed runs keep accumulating into the gradients (random data: they stay finite).
    let mut run = || {
        backend.flash_attention_backward(
            &q, &k, &v, &out, &lse, &d_out, &cu, scale, &mut d_q, &mut d_k, &mut d_v,
        )
    };
    let ms = time_ms(&backend.device, 10, |_| run())?;

    for g in [&mut d_q, &mut d_k, &mut d_v] {
        backend.fill_bytes(g, 0)?;
    }
    backend.flash_attention_backward(
        &q, &k, &v, &out, &lse, &d_out, &cu, scale, &mut d_q, &mut d_k, &mut d_v,
    )?;
    let inputs = Inputs {
        q: backend.to_host(&q)?,
        k: backend.to_host(&k)?,
        v: backend.to_host(&v)?,
        d_out: backend.to_host(&d_out)?,
    };
    let grads = [
        backend.to_host(&d_q)?,
        backend.to_host(&d_k)?,
        backend.to_host(&d_v)?,
    ];
    let err = sampled_error(
        &inputs,
        &shape,
        [&grads[0], &grads[1], &grads[2]],
        scale as f64,
    );
    ensure!(
        err.is_finite(),
        "attention backward {}: non-finite gradient",
        shape.key()
    );
    let tflops = 2.5 * shape.flops() / (ms * 1e-3) / 1e12;
    Ok(KernelRow {
        kernel: format!("flash_attn_bwd_hd{head_dim}"),
        shape: shape.key(),
        median_us: ms * 1e3,
        gb_per_s: None,
        tflops: Some(tflops),
        of_ceiling: tflops / ceilings.gemm_tflops,
        max_abs_error: err,
    })
}

/// The shapes the issue names: causal, head dim 128, GQA 28/4, 8k and 16k tokens (one sequence),
/// which are the forward table's first two (same keys, so the peers' rows join on them).
pub const ATTENTION_BACKWARD_SHAPES: [AttentionShape; 2] =
    [super::ATTENTION_SHAPES[0], super::ATTENTION_SHAPES[1]];

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference helpers on a problem small enough to check by hand: one query row over two
    /// keys with equal scores gives p = 1/2 each, and ds sums to zero (softmax's Jacobian).
    #[test]
    fn row_probs_are_a_softmax_and_its_gradient() {
        let shape = AttentionShape {
            seqs: 1,
            len: 2,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
        };
        let x = Inputs {
            q: vec![0.0, 0.0, 1.0, 0.0],
            k: vec![1.0, 0.0, 1.0, 0.0],
            v: vec![1.0, 0.0, 0.0, 1.0],
            d_out: vec![0.0, 0.0, 1.0, 2.0],
        };
        let (p, ds) = row_probs(&x, &shape, 0, 1, 0, 1.0);
        assert!((p[0] - 0.5).abs() < 1e-12 && (p[1] - 0.5).abs() < 1e-12);
        // dp = [1, 2], D = 1.5: ds = [0.5 * -0.5, 0.5 * 0.5].
        assert!((ds[0] + 0.25).abs() < 1e-12 && (ds[1] - 0.25).abs() < 1e-12);
    }

    #[test]
    fn backward_shapes_are_the_issues() {
        for s in ATTENTION_BACKWARD_SHAPES {
            assert_eq!((s.heads, s.kv_heads, s.head_dim), (28, 4, 128));
            assert!(super::super::ATTENTION_SHAPES
                .iter()
                .any(|f| f.key() == s.key()));
        }
        let keys: Vec<String> = ATTENTION_BACKWARD_SHAPES.iter().map(|s| s.key()).collect();
        assert_eq!(
            keys,
            [
                "seqs=1 len=8192 heads=28/4 d=128",
                "seqs=1 len=16384 heads=28/4 d=128"
            ]
        );
    }
}
