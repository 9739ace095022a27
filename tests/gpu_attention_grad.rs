//! The CUDA flash-attention backward (`kernels/flash_attn.cu`, `CudaBackend::
//! flash_attention_backward`) and the forward that saves the logsumexp, against the CPU reference
//! (`CpuBackend` as `BackendGrad`), on fresh random inputs: ragged packed lengths around the
//! 64-query and 128-key tiles (an empty sequence, one token, 4099 tokens), GQA 1:1, 2:1, 4:1, 5:1,
//! 6:1, 7:1 (at head dim 128 too: Qwen2.5-7B's ratio), 8:1, head dims 16, 32, 64, 128.
//!
//! - The forward's `out` and `lse` are poisoned (NaN bytes) before the launch, and so is the pooled
//!   memory the backward's scratch is about to reuse: an unwritten element cannot pass.
//! - The gradients are pre-filled with random values: the kernels must add (`+=`), not overwrite.
//! - Tolerance (DESIGN.md), row by row (each token and head): the largest error against the
//!   reference is at most twice that row's error of a naive computation, plus half an output ulp.
//!   The forward: transformers' eager bf16 attention, against f64 attention. The backward: scalar
//!   loops in the precision of the backward's contract (`naive_backward`: fp32 products and
//!   softmax from the given lse, D from the given bf16 O, dS and P rounded to bf16 as operands,
//!   one rounding into the pre-filled gradient), against the CPU reference backward.
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh. Without one these tests fail, never pass.

mod common;

use common::gpu::{
    attention_f64, check_within_naive, gpu, naive_attention, poisoned, random, round_bf16, Rows,
};
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::backend::pod_vec;
use swerve::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use swerve::backend::{Backend, BackendGrad};
use swerve::bench::kernels::max_abs_diff;

/// (sequence lengths packed together, heads, kv_heads, head_dim).
type Case = (&'static [u32], usize, usize, usize);

const CASES: [Case; 13] = [
    (&[1], 4, 1, 64),                // one token, 4:1
    (&[7, 129, 0, 64], 8, 4, 128),   // an empty sequence, 2:1
    (&[4099], 2, 2, 128),            // 33 key tiles, 65 query tiles, 1:1
    (&[127, 128, 129, 1], 7, 1, 64), // around the tiles, 7:1
    (&[200, 5], 6, 3, 16),           // 2:1, hd 16
    (&[65, 300], 8, 2, 32),          // 4:1, hd 32
    (&[300, 77], 14, 2, 32),         // 7:1, hd 32
    (&[129, 1, 256], 4, 4, 16),      // 1:1, hd 16
    // The Qwen2.5 family's GQA groups at small sizes: 7:1 at hd 128 (7B's 28 / 4 heads), one kv
    // head and two (131 keys: two key tiles), and groups 5, 6, 8.
    (&[37, 1, 20], 7, 1, 128),
    (&[20, 131], 14, 2, 128),
    (&[45, 3], 10, 2, 64), // 5:1
    (&[33, 16], 6, 1, 32), // 6:1
    (&[50, 2], 8, 1, 16),  // 8:1
];

fn cu_seqlens(lens: &[u32]) -> Vec<u32> {
    let mut cu = vec![0u32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    cu
}

/// A naive backward in the precision of the backward's contract: given what the kernel is given
/// (q, k, v, the forward's bf16 output `out` and its fp32 `lse`, dO, all as bf16 values), scalar
/// loops compute S = q k in f32, P = exp(scale S - lse) in f32, dP = dO v in f32,
/// D = rowsum(dO * out) in f32, dS = P (dP - D) rounded to bf16 (the operand precision of the
/// products that follow), dQ += dS k and dK += dS^T q (the GQA group summed) in f32, dV += bf16(P)
/// dO in f32; then each gradient `+=` scale-and-round once into the pre-filled bf16 values.
///
/// Not transformers' eager autograd (bf16 scores, D = sum(dP P) from its own P): per row, the
/// error of dQ and dK on rows of a few keys is dominated by one or two scalar terms (O's bf16
/// rounding through D, a score's rounding through P), and a computation with other such terms is
/// a second independent draw, whose luckiest rows would set bounds the kernel cannot meet.
#[allow(clippy::too_many_arguments)]
fn naive_backward(
    out: &[f32],
    lse: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_out: &[f32],
    cu: &[u32],
    heads: usize,
    kv_heads: usize,
    hd: usize,
    prefill: [&[f32]; 3],
) -> [Vec<f32>; 3] {
    let scale = 1.0 / (hd as f32).sqrt();
    let group = heads / kv_heads;
    let mut dq = vec![0.0f32; q.len()];
    let mut dk = vec![0.0f32; k.len()];
    let mut dv = vec![0.0f32; v.len()];
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    for w in cu.windows(2) {
        let (start, end) = (w[0] as usize, w[1] as usize);
        for h in 0..heads {
            let g = h / group;
            let kv_at = |j: usize| (j * kv_heads + g) * hd;
            for i in start..end {
                let at = (i * heads + h) * hd;
                let (qi, doi) = (&q[at..at + hd], &d_out[at..at + hd]);
                let d_row = dot(doi, &out[at..at + hd]);
                let l = lse[i * heads + h];
                for j in start..=i {
                    let (kj, vj) = (&k[kv_at(j)..kv_at(j) + hd], &v[kv_at(j)..kv_at(j) + hd]);
                    let p = (scale * dot(qi, kj) - l).exp();
                    let ds = round_bf16(p * (dot(doi, vj) - d_row));
                    let pb = round_bf16(p);
                    for d in 0..hd {
                        dq[at + d] += ds * kj[d];
                        dk[kv_at(j) + d] += ds * qi[d];
                        dv[kv_at(j) + d] += pb * doi[d];
                    }
                }
            }
        }
    }
    let add = |pre: &[f32], grad: &[f32], factor: f32| -> Vec<f32> {
        pre.iter()
            .zip(grad)
            .map(|(a, b)| round_bf16(a + factor * b))
            .collect()
    };
    [
        add(prefill[0], &dq, scale),
        add(prefill[1], &dk, scale),
        add(prefill[2], &dv, 1.0),
    ]
}

/// [`check_within_naive`] row by row (one row per token and head), where a row whose naive result
/// is exact (a sequence's first token: out = v, and dS = 0 so dQ adds nothing) must be exact
/// too, element by element, with one allowance: the kernel's dS is dP - D, two fp32 sums of the
/// same products in different orders, so about 1e-6 rather than 0; added to a bf16 pre-fill, that
/// can move the rounding by one bf16 step, but only where half a step is that small.
fn check_against_naive(what: &str, got: &[f32], reference: &[f32], naive: &[f32], rows: Rows) {
    const FP32_NOISE: f32 = 1e-5;
    check_within_naive(
        what,
        got,
        reference,
        naive,
        rows.with_exact_noise(FP32_NOISE),
    );
}

/// Fills pooled buffers of the backward's scratch sizes with NaN bytes and frees them, so that the
/// backward's own allocations (same size classes) start out poisoned.
fn poison_scratch(gpu: &CudaBackend, tokens: usize, heads: usize, hd: usize) {
    let bufs = [
        poisoned(gpu, &[heads, tokens], DeviceDType::F32),
        poisoned(gpu, &[heads, tokens], DeviceDType::F32),
        poisoned(gpu, &[tokens, heads, hd], DeviceDType::F32),
    ];
    gpu.device.synchronize().unwrap();
    drop(bufs);
}

struct Run {
    out: Vec<f32>,
    lse: Vec<f32>,
    grads: [Vec<f32>; 3],
}

/// GPU forward with lse, then the backward into the pre-filled gradients.
#[allow(clippy::too_many_arguments)]
fn run_gpu(
    gpu: &CudaBackend,
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    d_out: &CudaTensor,
    cu: &[u32],
    prefill: [&[f32]; 3],
) -> Run {
    let (t, heads, hd) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = poisoned(gpu, q.shape(), DeviceDType::Bf16);
    let mut lse = poisoned(gpu, &[t, heads], DeviceDType::F32);
    gpu.flash_attention_with_lse(q, k, v, cu, scale, &mut out, &mut lse)
        .unwrap();
    let upload = |values: &[f32], shape: &[usize]| {
        let bf: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
        gpu.upload_pod(&bf, shape, DeviceDType::Bf16).unwrap()
    };
    let mut d_q = upload(prefill[0], q.shape());
    let mut d_k = upload(prefill[1], k.shape());
    let mut d_v = upload(prefill[2], v.shape());
    poison_scratch(gpu, t, heads, hd);
    gpu.flash_attention_backward(
        q, k, v, &out, &lse, d_out, cu, scale, &mut d_q, &mut d_k, &mut d_v,
    )
    .unwrap();
    Run {
        out: gpu.to_host(&out).unwrap(),
        lse: pod_vec(&gpu.read_bytes(&lse).unwrap()),
        grads: [
            gpu.to_host(&d_q).unwrap(),
            gpu.to_host(&d_k).unwrap(),
            gpu.to_host(&d_v).unwrap(),
        ],
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn attention_backward_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(lens, heads, kv_heads, hd)) in CASES.iter().enumerate() {
        let cu = cu_seqlens(lens);
        let t = *cu.last().unwrap() as usize;
        let seed = 3000 + 10 * i as u64;
        let (q, q_cpu) = random(&gpu, &[t, heads, hd], seed, 2.0);
        let (k, k_cpu) = random(&gpu, &[t, kv_heads, hd], seed + 1, 2.0);
        let (v, v_cpu) = random(&gpu, &[t, kv_heads, hd], seed + 2, 1.0);
        let (d_out, d_out_cpu) = random(&gpu, &[t, heads, hd], seed + 3, 1.0);
        // Pre-filled gradients (bf16 values), on both sides.
        let (_, pre_q) = random(&gpu, &[t, heads, hd], seed + 4, 0.25);
        let (_, pre_k) = random(&gpu, &[t, kv_heads, hd], seed + 5, 0.25);
        let (_, pre_v) = random(&gpu, &[t, kv_heads, hd], seed + 6, 0.25);
        let case = HostCase {
            what: format!("lens {lens:?} heads {heads}/{kv_heads} hd {hd}"),
            cu,
            heads: (heads, kv_heads, hd),
            q: q_cpu,
            k: k_cpu,
            v: v_cpu,
            d_out: d_out_cpu,
            prefill: [pre_q, pre_k, pre_v],
        };
        let got = run_gpu(&gpu, &q, &k, &v, &d_out, &case.cu, case.prefill());
        let (out_ref, lse_ref, refs) = case.cpu_reference(&cpu);
        case.check_forward(&got, &out_ref, &lse_ref);
        case.check_backward(&got, &refs);
    }
}

/// One case's host inputs (bf16 values as f32): q, k, v, the output's gradient and the
/// gradients' pre-fill, over the packed sequences `cu`.
struct HostCase {
    what: String,
    cu: Vec<u32>,
    /// (heads, kv heads, head dim).
    heads: (usize, usize, usize),
    q: CpuTensor,
    k: CpuTensor,
    v: CpuTensor,
    d_out: CpuTensor,
    prefill: [CpuTensor; 3],
}

impl HostCase {
    fn prefill(&self) -> [&[f32]; 3] {
        let [q, k, v] = &self.prefill;
        [&q.data[..], &k.data[..], &v.data[..]]
    }

    fn rows(&self) -> (Rows, Rows) {
        let (heads, kv_heads, hd) = self.heads;
        (Rows::heads(heads, hd), Rows::heads(kv_heads, hd))
    }

    /// Reference: the CPU backend (f32, logsumexp in f64), same pre-fill: out, lse, and d_q,
    /// d_k, d_v.
    fn cpu_reference(&self, cpu: &CpuBackend) -> (CpuTensor, CpuTensor, [CpuTensor; 3]) {
        let (heads, _, hd) = self.heads;
        let (t, cu) = (*self.cu.last().unwrap() as usize, &self.cu);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out_ref = cpu.zeros(&[t, heads, hd]).unwrap();
        let mut lse_ref = CpuTensor::new(vec![t, heads], vec![0.0; t * heads]);
        cpu.attention_with_lse(
            &self.q,
            &self.k,
            &self.v,
            cu,
            scale,
            &mut out_ref,
            &mut lse_ref,
        )
        .unwrap();
        let mut refs = self.prefill.clone();
        let [rq, rk, rv] = &mut refs;
        cpu.attention_backward(
            &self.q,
            &self.k,
            &self.v,
            &out_ref,
            &lse_ref,
            &self.d_out,
            cu,
            scale,
            rq,
            rk,
            rv,
        )
        .unwrap();
        (out_ref, lse_ref, refs)
    }

    /// The forward: the CPU's and the kernel's out within twice the naive bf16 error against
    /// f64 attention, and the kernel's lse against the CPU's.
    fn check_forward(&self, got: &Run, out_ref: &CpuTensor, lse_ref: &CpuTensor) {
        let (what, cu) = (&self.what, &self.cu);
        let (heads, kv_heads, hd) = self.heads;
        let (qd, kd, vd) = (&self.q.data, &self.k.data, &self.v.data);
        let naive_out = naive_attention(qd, kd, vd, cu, heads, kv_heads, hd);
        let exact_out = attention_f64(qd, kd, vd, cu, heads, kv_heads, hd);
        let (q_rows, _) = self.rows();
        check_against_naive(
            &format!("cpu out {what}"),
            &out_ref.data,
            &exact_out,
            &naive_out,
            q_rows,
        );
        check_against_naive(
            &format!("out {what}"),
            &got.out,
            &exact_out,
            &naive_out,
            q_rows,
        );
        let lse_err = got
            .lse
            .iter()
            .zip(&lse_ref.data)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
            .fold(
                0.0f32,
                |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) },
            );
        println!("lse {what}: worst relative error {lse_err:.3e}");
        assert!(lse_err < 1e-4, "lse {what}: off by {lse_err} (relative)");
    }

    /// The backward: each gradient within twice the naive error against the CPU reference's.
    fn check_backward(&self, got: &Run, refs: &[CpuTensor; 3]) {
        let what = &self.what;
        let (heads, kv_heads, hd) = self.heads;
        // The backward's own inputs: the forward's output and lse as the kernel received them.
        let naive = naive_backward(
            &got.out,
            &got.lse,
            &self.q.data,
            &self.k.data,
            &self.v.data,
            &self.d_out.data,
            &self.cu,
            heads,
            kv_heads,
            hd,
            self.prefill(),
        );
        let (q_rows, kv_rows) = self.rows();
        for (n, name) in ["d_q", "d_k", "d_v"].iter().enumerate() {
            check_against_naive(
                &format!("{name} {what}"),
                &got.grads[n],
                &refs[n].data,
                &naive[n],
                if n == 0 { q_rows } else { kv_rows },
            );
        }
    }
}

/// dK and dV are summed in registers in a fixed order (bitwise reproducible); dQ's fp32 atomics
/// may add in any order, so two runs agree to rounding only.
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn attention_backward_dk_dv_are_reproducible() {
    let gpu = gpu();
    let (lens, heads, kv_heads, hd) = (&[1000u32, 37][..], 28, 4, 128);
    let cu = cu_seqlens(lens);
    let t = *cu.last().unwrap() as usize;
    let (q, _) = random(&gpu, &[t, heads, hd], 4000, 2.0);
    let (k, _) = random(&gpu, &[t, kv_heads, hd], 4001, 2.0);
    let (v, _) = random(&gpu, &[t, kv_heads, hd], 4002, 1.0);
    let (d_out, _) = random(&gpu, &[t, heads, hd], 4003, 1.0);
    let zeros_q = vec![0.0f32; t * heads * hd];
    let zeros_kv = vec![0.0f32; t * kv_heads * hd];
    let prefill = [&zeros_q[..], &zeros_kv[..], &zeros_kv[..]];
    let a = run_gpu(&gpu, &q, &k, &v, &d_out, &cu, prefill);
    let b = run_gpu(&gpu, &q, &k, &v, &d_out, &cu, prefill);
    assert!(a.grads[1] == b.grads[1], "d_k differs between two runs");
    assert!(a.grads[2] == b.grads[2], "d_v differs between two runs");
    let size = a.grads[0].iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let diff = max_abs_diff(&a.grads[0], &b.grads[0]);
    println!("d_q: run-to-run difference {diff:.3e} of max {size:.3e}");
    assert!(diff <= size / 128.0, "d_q differs by {diff} between runs");
    assert!(a.grads.iter().all(|g| g.iter().any(|&x| x != 0.0)));
}

/// Every backward kernel loads and fits on this card with its shared memory and registers (one
/// block of 256 threads per SM at least).
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn attention_backward_kernels_load_and_fit() {
    use cudarc::driver::sys::CUfunction_attribute;
    use swerve::backend::cuda::attention_grad::backward_variant;
    let gpu = gpu();
    for hd in [16, 32, 64, 128] {
        let (name, smem) = backward_variant(hd).unwrap();
        let f = gpu.device.function("flash_attn", name).unwrap();
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .unwrap();
        let blocks = f
            .occupancy_max_active_blocks_per_multiprocessor(256, smem as usize, None)
            .unwrap();
        println!("{name}: {smem} B shared memory, {blocks} block(s) per SM");
        assert!(blocks >= 1, "{name} cannot run: {smem} B of shared memory");
    }
    for name in ["flash_attn_bwd_preprocess", "flash_attn_bwd_dq_add"] {
        gpu.device.function("flash_attn", name).unwrap();
    }
}

/// Shapes and dtypes are checked before anything is launched, with the operand named.
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn attention_backward_refuses_mismatched_operands() {
    let gpu = gpu();
    let (t, heads, kv_heads, hd) = (10, 4, 2, 64);
    let cu = [0u32, 4, 10];
    let (q, _) = random(&gpu, &[t, heads, hd], 4100, 1.0);
    let (k, _) = random(&gpu, &[t, kv_heads, hd], 4101, 1.0);
    let (v, _) = random(&gpu, &[t, kv_heads, hd], 4102, 1.0);
    let (out, _) = random(&gpu, &[t, heads, hd], 4103, 1.0);
    let (d_out, _) = random(&gpu, &[t, heads, hd], 4104, 1.0);
    let lse_wrong = gpu.alloc(&[heads, t], DeviceDType::F32).unwrap();
    let (mut d_q, _) = random(&gpu, &[t, heads, hd], 4105, 1.0);
    let (mut d_k, _) = random(&gpu, &[t, kv_heads, hd], 4106, 1.0);
    let (mut d_v, _) = random(&gpu, &[t, kv_heads, hd], 4107, 1.0);
    let err = gpu
        .flash_attention_backward(
            &q, &k, &v, &out, &lse_wrong, &d_out, &cu, 0.125, &mut d_q, &mut d_k, &mut d_v,
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("lse has shape [4, 10], expected [10, 4]"),
        "{err}"
    );
    let lse = gpu.alloc(&[t, heads], DeviceDType::F32).unwrap();
    let err = gpu
        .flash_attention_backward(
            &q, &k, &v, &out, &lse, &d_out, &cu, 0.125, &mut d_k, &mut d_q, &mut d_v,
        )
        .unwrap_err();
    assert!(err.to_string().contains("d_q has shape"), "{err}");
}
