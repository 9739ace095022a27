//! Every CUDA kernel against the CPU reference backend, on fresh random inputs of ragged shapes,
//! with outputs poisoned (NaN bytes) before each launch.
//!
//! Tolerance (DESIGN.md): row by row (`common::gpu::within_naive`), a kernel's largest error
//! against the reference must be at most twice that row's error of a naive same-precision
//! computation, written out here in the order transformers uses in bf16 (round after each op),
//! plus half an output ulp; attention is measured against f64. Exact operations (gathers, the
//! residual add, conversions) must match bit for bit.
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh. Without one these tests fail, never pass.

mod common;

use common::gpu::{
    attention_f64, check_within_naive, gpu, naive_attention, poisoned, random, round_bf16, Rows,
};
use half::bf16;
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::backend::pod_vec;
use swerve::backend::cuda::DeviceDType;
use swerve::backend::{Backend, Rotary};
use swerve::bench::kernels::{max_abs_diff, random_bf16};

const ROW_SHAPES: [(usize, usize); 7] = [
    (1, 896),
    (7, 3584),
    (129, 8192),
    (4099, 896),
    (33, 100),
    (5, 1),
    (64, 1544),
];
const EPS: f32 = 1e-6;

fn naive_rmsnorm(x: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols) {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let inv = 1.0 / (mean_sq + EPS).sqrt();
        out.extend(
            row.iter()
                .zip(w)
                .map(|(v, wv)| round_bf16(round_bf16(v * inv) * wv)),
        );
    }
    out
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn rmsnorm_fwd_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(rows, cols)) in ROW_SHAPES.iter().enumerate() {
        let (x, x_cpu) = random(&gpu, &[rows, cols], 100 + i as u64, 3.0);
        let (w, w_cpu) = random(&gpu, &[cols], 200 + i as u64, 1.5);
        let mut out = poisoned(&gpu, &[rows, cols], DeviceDType::Bf16);
        gpu.rmsnorm(&x, &w, EPS, &mut out).unwrap();
        let mut reference = cpu.zeros(&[rows, cols]).unwrap();
        cpu.rmsnorm(&x_cpu, &w_cpu, EPS, &mut reference).unwrap();
        check_within_naive(
            &format!("rmsnorm [{rows}, {cols}]"),
            &gpu.to_host(&out).unwrap(),
            &reference.data,
            &naive_rmsnorm(&x_cpu.data, &w_cpu.data, cols),
            Rows::bf16(cols),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn add_rmsnorm_fwd_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(rows, cols)) in ROW_SHAPES.iter().enumerate() {
        let (mut residual, r_cpu) = random(&gpu, &[rows, cols], 300 + i as u64, 3.0);
        let (delta, d_cpu) = random(&gpu, &[rows, cols], 400 + i as u64, 1.0);
        let (w, w_cpu) = random(&gpu, &[cols], 500 + i as u64, 1.5);
        let mut out = poisoned(&gpu, &[rows, cols], DeviceDType::Bf16);
        gpu.add_rmsnorm(&mut residual, &delta, &w, EPS, &mut out)
            .unwrap();

        // The residual stream is bf16: the sum rounded once, bit for bit.
        let want_residual: Vec<f32> = r_cpu
            .data
            .iter()
            .zip(&d_cpu.data)
            .map(|(r, d)| round_bf16(r + d))
            .collect();
        assert_eq!(
            gpu.to_host(&residual).unwrap(),
            want_residual,
            "[{rows}, {cols}] residual"
        );
        let x = CpuTensor::new(vec![rows, cols], want_residual.clone());
        let mut reference = cpu.zeros(&[rows, cols]).unwrap();
        cpu.rmsnorm(&x, &w_cpu, EPS, &mut reference).unwrap();
        check_within_naive(
            &format!("add_rmsnorm [{rows}, {cols}]"),
            &gpu.to_host(&out).unwrap(),
            &reference.data,
            &naive_rmsnorm(&want_residual, &w_cpu.data, cols),
            Rows::bf16(cols),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn embedding_gathers_rows_exactly() {
    let gpu = gpu();
    for (vocab, d, tokens) in [
        (320, 256, 1),
        (151_936, 896, 4099),
        (300, 96, 7),
        (50, 100, 129),
    ] {
        let (table, table_cpu) = random(&gpu, &[vocab, d], vocab as u64, 1.0);
        let ids: Vec<u32> = (0..tokens as u64)
            .map(|i| ((i * 7919 + 13) % vocab as u64) as u32)
            .collect();
        let mut out = poisoned(&gpu, &[tokens, d], DeviceDType::Bf16);
        gpu.embedding(&table, &ids, &mut out).unwrap();
        let got = gpu.to_host(&out).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            assert_eq!(
                &got[t * d..(t + 1) * d],
                &table_cpu.data[id as usize * d..(id as usize + 1) * d],
                "row {t} (id {id}) of [{vocab}, {d}]"
            );
        }
        let err = gpu
            .embedding(&table, &[vocab as u32], &mut out)
            .unwrap_err();
        assert!(format!("{err}").contains("outside the vocabulary"), "{err}");
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn rope_plain_and_yarn_match_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(tokens, heads, kv_heads, head_dim, yarn)) in [
        (1, 4, 1, 64, false),
        (129, 28, 4, 128, false),
        (4099, 14, 2, 64, true),
        (7, 6, 3, 16, false),
        (33, 8, 8, 128, true),
    ]
    .iter()
    .enumerate()
    {
        let base = 1e6f64;
        let inv_freq: Vec<f64> = (0..head_dim / 2)
            .map(|j| {
                let f = 1.0 / base.powf(2.0 * j as f64 / head_dim as f64);
                if yarn {
                    f / (1.0 + j as f64 / 8.0)
                } else {
                    f
                }
            })
            .collect();
        let rotary = Rotary {
            inv_freq,
            attention_scaling: if yarn { 1.1386 } else { 1.0 },
        };
        // Positions far into a 131k context, not just 0..tokens.
        let positions: Vec<u32> = (0..tokens as u32)
            .map(|t| (t * 31 + 120_000 * (i as u32 % 2)) % 131_072)
            .collect();
        let (mut q, mut q_cpu) = random(&gpu, &[tokens, heads, head_dim], 600 + i as u64, 2.0);
        let (mut k, mut k_cpu) = random(&gpu, &[tokens, kv_heads, head_dim], 700 + i as u64, 2.0);
        let (q_in, k_in) = (q_cpu.data.clone(), k_cpu.data.clone());
        gpu.rope(&mut q, &mut k, &positions, &rotary).unwrap();
        cpu.rope(&mut q_cpu, &mut k_cpu, &positions, &rotary)
            .unwrap();
        // Naive: transformers' fp32 angle (inv_freq * position in f32), outputs rounded to bf16.
        let naive = |x: &[f32], nh: usize| -> Vec<f32> {
            let half = head_dim / 2;
            let mut out = x.to_vec();
            for (t, &p) in positions.iter().enumerate() {
                for h in 0..nh {
                    let row = &mut out[(t * nh + h) * head_dim..][..head_dim];
                    for j in 0..half {
                        let angle = rotary.inv_freq[j] as f32 * p as f32;
                        let (s, c) = angle.sin_cos();
                        let s = round_bf16(s * rotary.attention_scaling as f32);
                        let c = round_bf16(c * rotary.attention_scaling as f32);
                        let (a, b) = (row[j], row[j + half]);
                        row[j] = round_bf16(a * c - b * s);
                        row[j + half] = round_bf16(b * c + a * s);
                    }
                }
            }
            out
        };
        let what = format!("rope [{tokens}, {heads}+{kv_heads}, {head_dim}] yarn={yarn}");
        check_within_naive(
            &format!("{what} q"),
            &gpu.to_host(&q).unwrap(),
            &q_cpu.data,
            &naive(&q_in, heads),
            Rows::heads(heads, head_dim),
        );
        check_within_naive(
            &format!("{what} k"),
            &gpu.to_host(&k).unwrap(),
            &k_cpu.data,
            &naive(&k_in, kv_heads),
            Rows::heads(kv_heads, head_dim),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn swiglu_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(rows, cols)) in [(1, 4864), (7, 200), (129, 18944), (4099, 4864), (3, 5)]
        .iter()
        .enumerate()
    {
        let (gate, gate_cpu) = random(&gpu, &[rows, cols], 800 + i as u64, 6.0);
        let (up, up_cpu) = random(&gpu, &[rows, cols], 900 + i as u64, 2.0);
        let mut out = poisoned(&gpu, &[rows, cols], DeviceDType::Bf16);
        gpu.swiglu(&gate, &up, &mut out).unwrap();
        let mut reference = cpu.zeros(&[rows, cols]).unwrap();
        cpu.swiglu(&gate_cpu, &up_cpu, &mut reference).unwrap();
        let naive: Vec<f32> = gate_cpu
            .data
            .iter()
            .zip(&up_cpu.data)
            .map(|(&g, &u)| round_bf16(round_bf16(g / (1.0 + (-g).exp())) * u))
            .collect();
        check_within_naive(
            &format!("swiglu [{rows}, {cols}]"),
            &gpu.to_host(&out).unwrap(),
            &reference.data,
            &naive,
            Rows::bf16(cols),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn conversions_round_to_nearest_even_exactly() {
    let gpu = gpu();
    for n in [1usize, 7, 8, 4099, 1 << 20] {
        let values: Vec<f32> = random_bf16(n, n as u64, 1.0)
            .iter()
            .enumerate()
            .map(|(i, v)| v.to_f32() * (1.0 + i as f32 * 1e-5) * 3.7)
            .collect();
        let f32_dev = gpu.upload_pod(&values, &[n], DeviceDType::F32).unwrap();
        let mut bf = poisoned(&gpu, &[n], DeviceDType::Bf16);
        gpu.device.convert(&f32_dev, &mut bf).unwrap();
        let got: Vec<bf16> = pod_vec(&gpu.read_bytes(&bf).unwrap());
        let want: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(got, want, "f32 -> bf16, n = {n}");
        let mut back = poisoned(&gpu, &[n], DeviceDType::F32);
        gpu.device.convert(&bf, &mut back).unwrap();
        let back: Vec<f32> = pod_vec(&gpu.read_bytes(&back).unwrap());
        assert_eq!(
            back,
            want.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            "bf16 -> f32, n = {n}"
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn token_logprobs_match_f64() {
    let gpu = gpu();
    for (i, &(rows, vocab)) in [(1, 320), (7, 151_936), (129, 1000), (3, 5)]
        .iter()
        .enumerate()
    {
        let logits: Vec<f32> = random_bf16(rows * vocab, 1100 + i as u64, 12.0)
            .iter()
            .enumerate()
            .map(|(j, v)| v.to_f32() + (j % 97) as f32 * 1e-3)
            .collect();
        let targets: Vec<u32> = (0..rows as u32)
            .map(|r| (r * 7919 + 3) % vocab as u32)
            .collect();
        let dev = gpu
            .upload_pod(&logits, &[rows, vocab], DeviceDType::F32)
            .unwrap();
        let got = gpu.token_logprobs(&dev, &targets).unwrap();
        let (mut reference, mut naive) = (Vec::new(), Vec::new());
        for (row, &target) in logits.chunks_exact(vocab).zip(&targets) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum64: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
            reference.push((row[target as usize] as f64 - max as f64 - sum64.ln()) as f32);
            let sum32: f32 = row.iter().map(|&x| (x - max).exp()).sum();
            naive.push(row[target as usize] - max - sum32.ln());
        }
        let what = format!("token_logprobs [{rows}, {vocab}]");
        let kernel_err = max_abs_diff(&got, &reference);
        let naive_err = max_abs_diff(&naive, &reference);
        println!("{what}: kernel error {kernel_err:.3e}, naive f32 error {naive_err:.3e}");
        // One f32 ulp of the result is the floor when the naive sum happens to be exact.
        let floor = reference.iter().fold(0.0f32, |m, v| m.max(v.abs())) * f32::EPSILON;
        assert!(
            kernel_err <= 2.0 * naive_err.max(floor),
            "{what}: {kernel_err} vs naive {naive_err}"
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn flash_attention_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    // (sequence lengths packed together, heads, kv_heads, head_dim): ragged lengths around the
    // 128-row and 64-key tiles, GQA 1:1, 2:1, 4:1, 7:1, and an empty sequence; then the GQA
    // groups of the Qwen2.5 family at small sizes: 7:1 at head dim 128 (Qwen2.5-7B's 28 / 4,
    // here 7 / 1 and 14 / 2), and groups 5, 6 and 8 (0.5B's 14 / 2 is 7:1 at 64 above).
    let cases: [(&[u32], usize, usize, usize); 11] = [
        (&[1], 4, 1, 64),
        (&[7, 129, 0, 64], 8, 2, 128),
        (&[4099], 4, 4, 128),
        (&[127, 128, 129, 1], 7, 1, 64),
        (&[200, 5], 6, 3, 16),
        (&[65, 300], 4, 2, 32),
        (&[37, 1, 20], 7, 1, 128),
        (&[20, 131], 14, 2, 128),
        (&[45, 3], 5, 1, 64),
        (&[33, 16], 12, 2, 32),
        (&[50, 2], 8, 1, 16),
    ];
    for (i, &(lens, heads, kv_heads, hd)) in cases.iter().enumerate() {
        let mut cu = vec![0u32];
        for &l in lens {
            cu.push(cu.last().unwrap() + l);
        }
        let t = *cu.last().unwrap() as usize;
        let (q, q_cpu) = random(&gpu, &[t, heads, hd], 1200 + i as u64, 2.0);
        let (k, k_cpu) = random(&gpu, &[t, kv_heads, hd], 1300 + i as u64, 2.0);
        let (v, v_cpu) = random(&gpu, &[t, kv_heads, hd], 1400 + i as u64, 1.0);
        let mut out = poisoned(&gpu, &[t, heads, hd], DeviceDType::Bf16);
        let scale = 1.0 / (hd as f32).sqrt();
        gpu.attention(&q, &k, &v, &cu, scale, &mut out).unwrap();
        let mut reference = cpu.zeros(&[t, heads, hd]).unwrap();
        cpu.attention(&q_cpu, &k_cpu, &v_cpu, &cu, scale, &mut reference)
            .unwrap();
        let naive = naive_attention(
            &q_cpu.data,
            &k_cpu.data,
            &v_cpu.data,
            &cu,
            heads,
            kv_heads,
            hd,
        );
        // Row by row against f64 attention; the CPU reference must pass the same bound.
        let exact = attention_f64(
            &q_cpu.data,
            &k_cpu.data,
            &v_cpu.data,
            &cu,
            heads,
            kv_heads,
            hd,
        );
        let what = format!("flash_attn lens {lens:?} heads {heads}/{kv_heads} hd {hd}");
        let rows = Rows::heads(heads, hd);
        check_within_naive(
            &format!("cpu reference {what}"),
            &reference.data,
            &exact,
            &naive,
            rows,
        );
        check_within_naive(&what, &gpu.to_host(&out).unwrap(), &exact, &naive, rows);
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn flash_attention_saves_the_logsumexp() {
    let gpu = gpu();
    let (heads, kv_heads, hd) = (4, 2, 64);
    let cu = [0u32, 100, 300];
    let t = 300;
    let (q, q_cpu) = random(&gpu, &[t, heads, hd], 1500, 2.0);
    let (k, k_cpu) = random(&gpu, &[t, kv_heads, hd], 1501, 2.0);
    let (v, _) = random(&gpu, &[t, kv_heads, hd], 1502, 1.0);
    // The grid's longest sequence comes from the host copy, not from the caller.
    let layout = swerve::backend::cuda::flash_attn::VarlenLayout::upload(&gpu, &cu).unwrap();
    assert_eq!(
        (
            layout.num_seqs(),
            layout.max_seqlen(),
            layout.total_tokens()
        ),
        (2, 200, t)
    );
    let mut out = poisoned(&gpu, &[t, heads, hd], DeviceDType::Bf16);
    let mut lse = poisoned(&gpu, &[t, heads], DeviceDType::F32);
    let scale = 1.0 / (hd as f32).sqrt();
    gpu.device
        .flash_attn_fwd(
            &q, &k, &v, &layout, heads, kv_heads, scale, &mut out, &mut lse,
        )
        .unwrap();
    let got: Vec<f32> = pod_vec(&gpu.read_bytes(&lse).unwrap());
    let mut worst = 0.0f64;
    for w in cu.windows(2) {
        for i in w[0] as usize..w[1] as usize {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let qr = &q_cpu.data[(i * heads + h) * hd..][..hd];
                let scores: Vec<f64> = (w[0] as usize..=i)
                    .map(|j| {
                        let kr = &k_cpu.data[(j * kv_heads + g) * hd..][..hd];
                        scale as f64
                            * qr.iter()
                                .zip(kr)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let want = max + scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
                worst = worst.max((got[i * heads + h] as f64 - want).abs()); // [T, heads]
            }
        }
    }
    // fp32 statistics over at most 200 keys: a few ulps of values around 1..10.
    println!("lse: worst error {worst:.3e}");
    assert!(worst < 1e-4, "logsumexp off by {worst}");
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn linear_matches_f64_with_and_without_bias() {
    let gpu = gpu();
    for (i, &(rows, n, k, bias, f32_out)) in [
        (1, 896, 896, true, false),
        (7, 128, 3584, true, false),
        (129, 4864, 896, false, false),
        (4099, 256, 512, false, false),
        (33, 300, 96, false, true),
        (5, 151_936, 896, false, true),
    ]
    .iter()
    .enumerate()
    {
        let (x, x_cpu) = random(&gpu, &[rows, k], 1600 + i as u64, 1.0);
        let (w, w_cpu) = random(&gpu, &[n, k], 1700 + i as u64, 0.1);
        let (b, b_cpu) = random(&gpu, &[n], 1800 + i as u64, 0.5);
        let dtype = if f32_out {
            DeviceDType::F32
        } else {
            DeviceDType::Bf16
        };
        let mut out = poisoned(&gpu, &[rows, n], dtype);
        gpu.linear(&x, &w, bias.then_some(&b), &mut out).unwrap();
        // Reference in f64. Naive: what one bf16 `mma` step does, in sequence (Fasi et al.,
        // "Numerical behavior of NVIDIA tensor cores", 2021): the 16 products of a k-block
        // summed exactly, then added to the f32 accumulator rounding toward zero (tensor cores
        // truncate; sequential round-to-nearest f32 was 2.6x tighter than cuBLASLt on an H100
        // for k = 896 in f32 output). The bias added in f32, one rounding to the output type.
        let (mut reference, mut naive) =
            (Vec::with_capacity(rows * n), Vec::with_capacity(rows * n));
        for xr in x_cpu.data.chunks_exact(k) {
            for (o, wr) in w_cpu.data.chunks_exact(k).enumerate() {
                let (mut acc, mut exact) = (0.0f32, 0.0f64);
                for (xb, wb) in xr.chunks(16).zip(wr.chunks(16)) {
                    let block: f64 = xb.iter().zip(wb).map(|(a, b)| *a as f64 * *b as f64).sum();
                    acc = add_toward_zero(acc, block);
                    exact += block;
                }
                if bias {
                    acc += b_cpu.data[o];
                    exact += b_cpu.data[o] as f64;
                }
                reference.push(exact as f32);
                naive.push(if f32_out { acc } else { round_bf16(acc) });
            }
        }
        check_within_naive(
            &format!("linear [{rows}, {k}] x [{n}, {k}]^T bias={bias} f32_out={f32_out}"),
            &gpu.to_host(&out).unwrap(),
            &reference,
            &naive,
            if f32_out { Rows::f32(n) } else { Rows::bf16(n) },
        );
    }
}

/// `acc + x` rounded toward zero to f32 (a tensor core's accumulation).
fn add_toward_zero(acc: f32, x: f64) -> f32 {
    let exact = acc as f64 + x;
    let nearest = exact as f32;
    if (nearest as f64).abs() > exact.abs() {
        // Rounded away from zero: step one ulp back toward zero.
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn every_embedded_kernel_family_loads() {
    let gpu = gpu();
    for (family, _) in swerve::backend::cuda::embedded::FATBINS {
        assert!(gpu
            .device
            .function(family, "definitely_not_a_kernel")
            .is_err());
    }
    for (family, name) in [
        ("rmsnorm", "rmsnorm_fwd_bf16"),
        ("rmsnorm", "add_rmsnorm_fwd_bf16"),
        ("embedding", "embedding_fwd_bf16"),
        ("rope", "rope_fwd_bf16"),
        ("swiglu", "swiglu_fwd_bf16"),
        ("convert", "convert_f32_to_bf16"),
        ("convert", "convert_bf16_to_f32"),
        ("logprobs", "token_logprob_stats_f32"),
        ("sampling", "sample_rows_f32"),
        ("flash_attn", "flash_attn_fwd_hd128"),
        ("flash_attn", "flash_attn_fwd_hd64"),
    ] {
        gpu.device.function(family, name).unwrap();
    }
}
