//! The training half of the CUDA backend (`BackendGrad`) against the CPU reference, op by op:
//! every backward kernel (embedding, RMSNorm, RoPE, SwiGLU, linear), AdamW bit for bit, and the
//! reductions and conversions. The fused LM-head loss is in gpu_grad_loss.rs, whole-model
//! gradients and `swerve-train` on the device in gpu_grad_model.rs.
//!
//! Tolerance (DESIGN.md): at most twice the error of a naive same-precision computation (written
//! out here as PyTorch's bf16 autograd would do it: bf16 results of each op), against the f32/f64
//! CPU reference. Gradients accumulate (`+=`), so accumulated outputs start from random values
//! rather than NaN poison (an overwrite or a skipped element fails just the same); outputs that
//! are overwritten (conversions) are poisoned.
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh (or the emulated device: `SWERVE_EMU=1
//! cargo test --release --test 'gpu_*'`). Without one these tests fail, never pass.

mod common;

use common::gpu::{
    check_within_naive, gpu, poisoned, random, random_f32, round_bf16, values, Rows,
};
use swerve::backend::cpu::CpuBackend;
use swerve::backend::cuda::DeviceDType;
use swerve::backend::grad::BackendGrad;
use swerve::backend::{Backend, Rotary};
use swerve::train::optimizer::{adamw_update_slice, AdamWStep};

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn embedding_backward_is_the_cpu_sum_bit_for_bit() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(tokens, vocab, d)) in [(1, 10, 896), (257, 50, 3584), (33, 1000, 100), (5, 3, 1)]
        .iter()
        .enumerate()
    {
        let ids = common::tokens(11 + i as u64, tokens, vocab as u64);
        let (d_out, d_out_cpu) = random(&gpu, &[tokens, d], 20 + i as u64, 1.0);
        let (mut table, mut table_cpu) = random_f32(&gpu, &[vocab, d], 30 + i as u64, 0.5);
        gpu.embedding_backward(&d_out, &ids, &mut table).unwrap();
        cpu.embedding_backward(&d_out_cpu, &ids, &mut table_cpu)
            .unwrap();
        assert_eq!(
            gpu.to_host(&table).unwrap(),
            table_cpu.data,
            "embedding backward [{tokens}, {d}] over {vocab} rows"
        );
    }
    // An id outside the table is an error, not a write out of bounds.
    let (d_out, _) = random(&gpu, &[2, 8], 1, 1.0);
    let mut table = gpu.zeros_f32(&[4, 8]).unwrap();
    let err = gpu
        .embedding_backward(&d_out, &[1, 4], &mut table)
        .unwrap_err();
    assert!(format!("{err:#}").contains("token id 4"), "{err:#}");
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn rmsnorm_backward_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let eps = 1e-6f32;
    for (i, &(rows, cols)) in [
        (1, 896),
        (7, 3584),
        (129, 8192),
        (4099, 896),
        (33, 100),
        (5, 1),
        (64, 1544),
    ]
    .iter()
    .enumerate()
    {
        let s = 40 + 10 * i as u64;
        let (x, x_c) = random(&gpu, &[rows, cols], s, 3.0);
        let (w, w_c) = random(&gpu, &[cols], s + 1, 1.5);
        let (dy, dy_c) = random(&gpu, &[rows, cols], s + 2, 1.0);
        let (mut dx, mut dx_c) = random(&gpu, &[rows, cols], s + 3, 0.5);
        let (mut dw, mut dw_c) = random_f32(&gpu, &[cols], s + 4, 0.5);
        let (dx0, dw0) = (dx_c.data.clone(), dw_c.data.clone());
        gpu.rmsnorm_backward(&x, &w, eps, &dy, &mut dx, &mut dw)
            .unwrap();
        cpu.rmsnorm_backward(&x_c, &w_c, eps, &dy_c, &mut dx_c, &mut dw_c)
            .unwrap();
        // Naive bf16 autograd: g = bf16(dy w), the norm's backward in f32, rounded; d_w from the
        // bf16 normalised input.
        let (mut naive_dx, mut naive_dw) = (dx0, dw0);
        for r in 0..rows {
            let xr = &x_c.data[r * cols..][..cols];
            let dyr = &dy_c.data[r * cols..][..cols];
            let mean_sq = xr.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            let inv = 1.0 / (mean_sq + eps).sqrt();
            let g: Vec<f32> = dyr
                .iter()
                .zip(&w_c.data)
                .map(|(a, b)| round_bf16(a * b))
                .collect();
            let mean_gx = g.iter().zip(xr).map(|(a, b)| a * b).sum::<f32>() / cols as f32;
            for c in 0..cols {
                let grad = round_bf16(inv * g[c] - xr[c] * inv * inv * inv * mean_gx);
                naive_dx[r * cols + c] = round_bf16(naive_dx[r * cols + c] + grad);
                naive_dw[c] += dyr[c] * round_bf16(xr[c] * inv);
            }
        }
        check_within_naive(
            &format!("rmsnorm_backward d_x [{rows}, {cols}]"),
            &gpu.to_host(&dx).unwrap(),
            &dx_c.data,
            &naive_dx,
            Rows::bf16(cols),
        );
        check_within_naive(
            &format!("rmsnorm_backward d_weight [{rows}, {cols}]"),
            &gpu.to_host(&dw).unwrap(),
            &dw_c.data,
            &naive_dw,
            Rows::f32(cols),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn rope_backward_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(tokens, heads, kv_heads, head_dim, yarn)) in [
        (1, 4, 1, 64, false),
        (129, 28, 4, 128, false),
        (4099, 14, 2, 64, true),
        (7, 6, 3, 16, false),
    ]
    .iter()
    .enumerate()
    {
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|j| 1.0 / 1e6f64.powf(2.0 * j as f64 / head_dim as f64))
            .collect();
        let rotary = Rotary {
            inv_freq: inv_freq.clone(),
            attention_scaling: if yarn { 1.1386 } else { 1.0 },
        };
        let positions: Vec<u32> = (0..tokens as u32)
            .map(|t| (t * 31 + 120_000 * (i as u32 % 2)) % 131_072)
            .collect();
        let (mut dq, mut dq_c) = random(&gpu, &[tokens, heads, head_dim], 80 + i as u64, 2.0);
        let (mut dk, mut dk_c) = random(&gpu, &[tokens, kv_heads, head_dim], 90 + i as u64, 2.0);
        let (q_in, k_in) = (dq_c.data.clone(), dk_c.data.clone());
        gpu.rope_backward(&mut dq, &mut dk, &positions, &rotary)
            .unwrap();
        cpu.rope_backward(&mut dq_c, &mut dk_c, &positions, &rotary)
            .unwrap();
        // Naive: f32 angles (as transformers), outputs rounded to bf16.
        let naive = |x: &[f32]| -> Vec<f32> {
            let per_token = x.len() / tokens;
            let mut out = x.to_vec();
            for (t, &pos) in positions.iter().enumerate() {
                for head in out[t * per_token..(t + 1) * per_token].chunks_exact_mut(head_dim) {
                    for j in 0..half {
                        let angle = pos as f32 * inv_freq[j] as f32;
                        let s = rotary.attention_scaling as f32;
                        let (c, sn) = (angle.cos() * s, angle.sin() * s);
                        let (a, b) = (head[j], head[j + half]);
                        head[j] = round_bf16(a * c + b * sn);
                        head[j + half] = round_bf16(b * c - a * sn);
                    }
                }
            }
            out
        };
        let what = format!("rope_backward [{tokens}, {heads}/{kv_heads}, {head_dim}]");
        check_within_naive(
            &format!("{what} d_q"),
            &gpu.to_host(&dq).unwrap(),
            &dq_c.data,
            &naive(&q_in),
            Rows::heads(heads, head_dim),
        );
        check_within_naive(
            &format!("{what} d_k"),
            &gpu.to_host(&dk).unwrap(),
            &dk_c.data,
            &naive(&k_in),
            Rows::heads(kv_heads, head_dim),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn swiglu_backward_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &n) in [1usize, 7, 8, 1000, 4099 * 3 + 5].iter().enumerate() {
        let s = 120 + 10 * i as u64;
        let (gate, gate_c) = random(&gpu, &[n], s, 4.0);
        let (up, up_c) = random(&gpu, &[n], s + 1, 2.0);
        let (dy, dy_c) = random(&gpu, &[n], s + 2, 1.0);
        let (mut dg, mut dg_c) = random(&gpu, &[n], s + 3, 0.5);
        let (mut du, mut du_c) = random(&gpu, &[n], s + 4, 0.5);
        let (dg0, du0) = (dg_c.data.clone(), du_c.data.clone());
        gpu.swiglu_backward(&gate, &up, &dy, &mut dg, &mut du)
            .unwrap();
        cpu.swiglu_backward(&gate_c, &up_c, &dy_c, &mut dg_c, &mut du_c)
            .unwrap();
        let (mut naive_dg, mut naive_du) = (dg0, du0);
        for j in 0..n {
            let g = gate_c.data[j];
            let sig = 1.0 / (1.0 + (-g).exp());
            let silu = round_bf16(g * sig);
            let d_silu = round_bf16(dy_c.data[j] * up_c.data[j]);
            naive_du[j] = round_bf16(naive_du[j] + round_bf16(dy_c.data[j] * silu));
            naive_dg[j] =
                round_bf16(naive_dg[j] + round_bf16(d_silu * sig * (1.0 + g * (1.0 - sig))));
        }
        check_within_naive(
            &format!("swiglu_backward d_gate [{n}]"),
            &gpu.to_host(&dg).unwrap(),
            &dg_c.data,
            &naive_dg,
            Rows::bf16(n),
        );
        check_within_naive(
            &format!("swiglu_backward d_up [{n}]"),
            &gpu.to_host(&du).unwrap(),
            &du_c.data,
            &naive_du,
            Rows::bf16(n),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn linear_backward_matches_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(t, k, n, bias)) in [
        (1, 896, 128, true),
        (37, 100, 24, true),
        (300, 64, 72, false),
        (513, 896, 1152, true),
        (4, 8, 8, true),
    ]
    .iter()
    .enumerate()
    {
        let s = 200 + 10 * i as u64;
        let (x, x_c) = random(&gpu, &[t, k], s, 1.0);
        let (w, w_c) = random(&gpu, &[n, k], s + 1, 0.5);
        let (dy, dy_c) = random(&gpu, &[t, n], s + 2, 1.0);
        let (mut dx, mut dx_c) = random(&gpu, &[t, k], s + 3, 0.5);
        let (mut dw, mut dw_c) = random_f32(&gpu, &[n, k], s + 4, 0.5);
        let (mut db, mut db_c) = random_f32(&gpu, &[n], s + 5, 0.5);
        let (dx0, dw0, db0) = (dx_c.data.clone(), dw_c.data.clone(), db_c.data.clone());
        gpu.linear_backward(&x, &w, &dy, &mut dx, &mut dw, bias.then_some(&mut db))
            .unwrap();
        cpu.linear_backward(
            &x_c,
            &w_c,
            &dy_c,
            &mut dx_c,
            &mut dw_c,
            bias.then_some(&mut db_c),
        )
        .unwrap();
        // Naive: bf16 products (f32 accumulation, one rounding), added to the accumulators.
        let mut naive_dx = dx0;
        for r in 0..t {
            for c in 0..k {
                let sum: f32 = (0..n)
                    .map(|j| dy_c.data[r * n + j] * w_c.data[j * k + c])
                    .sum();
                naive_dx[r * k + c] = round_bf16(naive_dx[r * k + c] + round_bf16(sum));
            }
        }
        let mut naive_dw = dw0;
        for j in 0..n {
            for c in 0..k {
                let sum: f32 = (0..t)
                    .map(|r| dy_c.data[r * n + j] * x_c.data[r * k + c])
                    .sum();
                naive_dw[j * k + c] += round_bf16(sum);
            }
        }
        let what = format!("linear_backward [{t}, {k}] x [{n}, {k}]");
        check_within_naive(
            &format!("{what} d_x"),
            &gpu.to_host(&dx).unwrap(),
            &dx_c.data,
            &naive_dx,
            Rows::bf16(k),
        );
        check_within_naive(
            &format!("{what} d_weight"),
            &gpu.to_host(&dw).unwrap(),
            &dw_c.data,
            &naive_dw,
            Rows::f32(k),
        );
        if bias {
            let naive_db: Vec<f32> = (0..n)
                .map(|j| db0[j] + round_bf16((0..t).map(|r| dy_c.data[r * n + j]).sum::<f32>()))
                .collect();
            check_within_naive(
                &format!("{what} d_bias"),
                &gpu.to_host(&db).unwrap(),
                &db_c.data,
                &naive_db,
                Rows::f32(n),
            );
        } else {
            assert_eq!(gpu.to_host(&db).unwrap(), db0, "{what}: d_bias untouched");
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn adamw_equals_the_cpu_reference_bit_for_bit() {
    let gpu = gpu();
    for &n in &[1024usize, 4099 * 3 + 1] {
        for &weight_decay in &[0.1f32, 0.0] {
            let mut master = values(n, 1, 1.0);
            let mut m = vec![0.0f32; n];
            let mut v = vec![0.0f32; n];
            let mut master_d = gpu.upload_f32(&[n], &master).unwrap();
            let mut m_d = gpu.zeros_f32(&[n]).unwrap();
            let mut v_d = gpu.zeros_f32(&[n]).unwrap();
            for (step, grad_scale) in [(1u64, 1.0f32), (2, 0.5), (3, 0.25)] {
                let grad = values(n, 10 + step, 3.0);
                let grad_d = gpu.upload_f32(&[n], &grad).unwrap();
                let s = AdamWStep {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay,
                    step,
                    grad_scale,
                };
                adamw_update_slice(&mut master, &grad, &mut m, &mut v, &s);
                gpu.adamw_update(&mut master_d, &grad_d, &mut m_d, &mut v_d, &s)
                    .unwrap();
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&gpu.to_host(&master_d).unwrap()),
                    bits(&master),
                    "master n {n} step {step}"
                );
                assert_eq!(
                    bits(&gpu.to_host(&m_d).unwrap()),
                    bits(&m),
                    "exp_avg n {n} step {step}"
                );
                assert_eq!(
                    bits(&gpu.to_host(&v_d).unwrap()),
                    bits(&v),
                    "exp_avg_sq n {n} step {step}"
                );
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn reductions_and_conversions_are_exact() {
    let gpu = gpu();
    // Sum of squares (f64) of f32 and bf16 tensors, large and ragged.
    for &n in &[1usize, 1000, 1_000_003] {
        let v = values(n, n as u64, 3.0);
        let want: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let f32_t = gpu.upload_f32(&[n], &v).unwrap();
        let got = gpu.sum_of_squares(&f32_t).unwrap();
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "sum_of_squares f32 [{n}]: {got} vs {want}"
        );
        let (bf16_t, _) = random(&gpu, &[n], n as u64, 3.0);
        let got = gpu.sum_of_squares(&bf16_t).unwrap();
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "sum_of_squares bf16 [{n}]: {got} vs {want}"
        );
    }
    for &n in &[8usize, 4099] {
        // f32 -> bf16 is round-to-nearest-even, bf16 -> f32 and same-dtype copies exact.
        let v: Vec<f32> = values(n, 3, 5.0)
            .iter()
            .zip(values(n, 4, 0.01))
            .map(|(a, b)| a + b)
            .collect();
        let src = gpu.upload_f32(&[n], &v).unwrap();
        let mut dst = poisoned(&gpu, &[n], DeviceDType::Bf16);
        gpu.copy_weights(&src, &mut dst).unwrap();
        let want: Vec<f32> = v.iter().map(|&x| round_bf16(x)).collect();
        assert_eq!(gpu.to_host(&dst).unwrap(), want, "f32 -> bf16 [{n}]");
        let mut back = poisoned(&gpu, &[n], DeviceDType::F32);
        gpu.copy_weights(&dst, &mut back).unwrap();
        assert_eq!(gpu.to_host(&back).unwrap(), want, "bf16 -> f32 [{n}]");
        let mut same = poisoned(&gpu, &[n], DeviceDType::F32);
        gpu.copy_weights(&src, &mut same).unwrap();
        assert_eq!(gpu.to_host(&same).unwrap(), v, "f32 -> f32 [{n}]");
        // add_into: bf16 += bf16 rounds the f32 sum once; f32 += f32 is the f32 sum.
        let (mut a, a_c) = random(&gpu, &[n], 5, 2.0);
        let (b, b_c) = random(&gpu, &[n], 6, 2.0);
        gpu.add_into(&mut a, &b).unwrap();
        let want: Vec<f32> = a_c
            .data
            .iter()
            .zip(&b_c.data)
            .map(|(x, y)| round_bf16(x + y))
            .collect();
        assert_eq!(gpu.to_host(&a).unwrap(), want, "add_into bf16 [{n}]");
        let mut acc = gpu.upload_f32(&[n], &v).unwrap();
        gpu.add_into(&mut acc, &src).unwrap();
        let want: Vec<f32> = v.iter().map(|x| x + x).collect();
        assert_eq!(gpu.to_host(&acc).unwrap(), want, "add_into f32 [{n}]");
        // bf16 += f32 (add_f32_into_bf16): the f32 sum, rounded once.
        let (mut mixed, mixed_c) = random(&gpu, &[n], 7, 2.0);
        gpu.add_into(&mut mixed, &src).unwrap();
        let want: Vec<f32> = mixed_c
            .data
            .iter()
            .zip(&v)
            .map(|(x, y)| round_bf16(x + y))
            .collect();
        assert_eq!(
            gpu.to_host(&mixed).unwrap(),
            want,
            "add_into f32 into bf16 [{n}]"
        );
        gpu.fill_zero(&mut acc).unwrap();
        assert!(gpu.to_host(&acc).unwrap().iter().all(|&x| x == 0.0));
    }
}
