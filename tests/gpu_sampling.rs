//! `kernels/sampling.cu` against the host sampler (`engine/sampler.rs`), which is the CPU
//! reference's `sample_rows`.
//!
//! - Greedy rows: the same token as the reference (ties to the lowest id) and the logprob the
//!   GPU's own `token_logprobs` gives, bit for bit.
//! - Temperature 1: the logprob is the GPU's `token_logprobs` of the sampled token, bit for bit
//!   (rollout logprob == trainer logprob, DESIGN.md decision 10), and the token's interval of the
//!   f64 CDF contains the draw up to the f32 rounding of the kernel's sums.
//! - Other temperatures: the same interval check, and the logprob of `softmax(z / T)` within f32
//!   rounding of the f64 value.
//! - Limits: a row of -inf / NaN gives token 0 with logprob -inf; +inf logits sample uniformly
//!   among themselves; NaN logits are never sampled. The same draws give the same tokens.
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh. Without one these tests fail, never pass.

mod common;

use common::gpu::gpu;
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::DeviceDType;
use swerve::backend::{Backend, RowDraw};
use swerve::bench::kernels::random_bf16;
use swerve::engine::sampler::SampleRng;

/// The f64 CDF of `softmax(z / T)` just before and just after token `t`.
fn cdf_interval(row: &[f32], temperature: f64, t: usize) -> (f64, f64) {
    let scores: Vec<f64> = row
        .iter()
        .map(|&z| {
            if z.is_nan() {
                f64::NEG_INFINITY
            } else {
                z as f64 / temperature
            }
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let before: f64 = weights[..t].iter().sum();
    (before / total, (before + weights[t]) / total)
}

fn log_softmax_at(row: &[f32], temperature: f64, t: usize) -> f64 {
    let scores: Vec<f64> = row.iter().map(|&z| z as f64 / temperature).collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    scores[t] - max - sum.ln()
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn sample_rows_match_the_host_sampler() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let mut rng = SampleRng::from_seed(7);
    for (case, &(rows, vocab)) in [(37, 151_936), (64, 1000), (5, 3), (1, 1)]
        .iter()
        .enumerate()
    {
        let logits: Vec<f32> = random_bf16(rows * vocab, 2100 + case as u64, 6.0)
            .iter()
            .map(|v| v.to_f32())
            .collect();
        let draws: Vec<RowDraw> = (0..rows)
            .map(|r| RowDraw {
                temperature: [0.0, 1.0, 0.7, 1.3][r % 4],
                uniform: rng.next_f64(),
            })
            .collect();
        let dev = gpu
            .upload_pod(&logits, &[rows, vocab], DeviceDType::F32)
            .unwrap();
        let got = gpu.sample_rows(&dev, &draws).unwrap();
        assert_eq!(
            got,
            gpu.sample_rows(&dev, &draws).unwrap(),
            "same draws, same tokens"
        );
        let reference = cpu
            .sample_rows(&CpuTensor::new(vec![rows, vocab], logits.clone()), &draws)
            .unwrap();
        let trainer = gpu
            .token_logprobs(&dev, &got.iter().map(|&(t, _)| t).collect::<Vec<_>>())
            .unwrap();
        let mut agree = 0;
        for (r, (row, draw)) in logits.chunks_exact(vocab).zip(&draws).enumerate() {
            let (token, logprob) = got[r];
            let what = format!("[{rows}, {vocab}] row {r} (T = {})", draw.temperature);
            assert!((token as usize) < vocab, "{what}: token {token}");
            agree += usize::from(token == reference[r].0);
            if draw.temperature == 0.0 {
                assert_eq!(token, reference[r].0, "{what}: greedy token");
            } else {
                let (lo, hi) = cdf_interval(row, draw.temperature as f64, token as usize);
                let slack = 1e-5;
                assert!(
                    lo - slack <= draw.uniform && draw.uniform <= hi + slack,
                    "{what}: draw {} outside token {token}'s CDF interval [{lo}, {hi})",
                    draw.uniform
                );
            }
            if draw.temperature == 0.0 || draw.temperature == 1.0 {
                assert_eq!(
                    logprob.to_bits(),
                    trainer[r].to_bits(),
                    "{what}: logprob {logprob} vs the GPU trainer's {}",
                    trainer[r]
                );
            } else {
                let exact = log_softmax_at(row, draw.temperature as f64, token as usize);
                assert!(
                    (logprob as f64 - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                    "{what}: logprob {logprob} vs {exact}"
                );
            }
        }
        println!("[{rows}, {vocab}]: {agree}/{rows} tokens equal to the f64 host sampler's");
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn sample_rows_handle_infinite_and_nan_logits() {
    let gpu = gpu();
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let vocab = 700;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    rows.push(vec![f32::NEG_INFINITY; vocab]);
    rows.push(vec![nan; vocab]);
    let mut with_inf = vec![0.5f32; vocab];
    for i in [3, 299, 698] {
        with_inf[i] = inf;
    }
    rows.push(with_inf.clone());
    rows.push(with_inf);
    let mut with_nan = vec![f32::NEG_INFINITY; vocab];
    with_nan[10] = nan;
    with_nan[11] = 2.0;
    with_nan[500] = 2.0;
    rows.push(with_nan.clone());
    rows.push(with_nan);
    let draws = [
        (1.0, 0.5),
        (0.0, 0.0),
        (1.0, 0.99),
        (0.0, 0.0),
        (1.0, 0.999),
        (0.0, 0.0),
    ]
    .map(|(temperature, uniform)| RowDraw {
        temperature,
        uniform,
    });
    let flat: Vec<f32> = rows.concat();
    let dev = gpu
        .upload_pod(&flat, &[rows.len(), vocab], DeviceDType::F32)
        .unwrap();
    let got = gpu.sample_rows(&dev, &draws).unwrap();
    let nothing = (0, f32::NEG_INFINITY);
    assert_eq!(got[0], nothing, "all -inf");
    assert_eq!(got[1], nothing, "all NaN");
    let third = -(3.0f32).ln();
    assert_eq!(got[2].0, 698, "+inf row, draw 0.99: the last +inf token");
    assert!(
        (got[2].1 - third).abs() < 1e-6,
        "+inf row logprob {}",
        got[2].1
    );
    assert_eq!(got[3].0, 3, "+inf row, greedy: the first +inf token");
    assert!(
        (got[3].1 - third).abs() < 1e-6,
        "+inf greedy logprob {}",
        got[3].1
    );
    assert_eq!(
        got[4].0, 500,
        "NaN is never sampled; draw 0.999 takes the last finite token"
    );
    assert!((got[4].1 + 2f32.ln()).abs() < 1e-6, "logprob {}", got[4].1);
    assert_eq!(got[5].0, 11, "greedy ignores NaN, ties to the lowest id");
}

/// -0.0 and +0.0 are equal logits: a greedy tie between them goes to the lowest id, as on the host
/// sampler (`z > best`), whichever sign comes first and whichever threads hold them.
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn greedy_ties_between_signed_zeros_go_to_the_lowest_id() {
    let gpu = gpu();
    let cpu = CpuBackend::new();
    let vocab = 700;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut short = vec![-1.0f32; vocab];
    short[..3].copy_from_slice(&[-0.0, 0.0, -1.0]);
    rows.push(short);
    let mut swapped = vec![-1.0f32; vocab];
    swapped[..3].copy_from_slice(&[0.0, -0.0, -1.0]);
    rows.push(swapped);
    // Far apart: different threads of the block, the negative zero first.
    let mut apart = vec![-3.0f32; vocab];
    apart[600] = -0.0;
    apart[650] = 0.0;
    apart[5] = -0.5;
    rows.push(apart);
    // A row of zeros of both signs only.
    rows.push(
        (0..vocab)
            .map(|i| if i % 3 == 0 { 0.0 } else { -0.0 })
            .collect(),
    );
    rows.push(
        (0..vocab)
            .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
            .collect(),
    );
    let draws: Vec<RowDraw> = rows
        .iter()
        .map(|_| RowDraw {
            temperature: 0.0,
            uniform: 0.0,
        })
        .collect();
    let flat: Vec<f32> = rows.concat();
    let dev = gpu
        .upload_pod(&flat, &[rows.len(), vocab], DeviceDType::F32)
        .unwrap();
    let got = gpu.sample_rows(&dev, &draws).unwrap();
    let host = cpu
        .sample_rows(&CpuTensor::new(vec![rows.len(), vocab], flat), &draws)
        .unwrap();
    let tokens: Vec<u32> = got.iter().map(|&(t, _)| t).collect();
    assert_eq!(tokens, [0, 0, 600, 0, 0], "device greedy tokens");
    assert_eq!(
        tokens,
        host.iter().map(|&(t, _)| t).collect::<Vec<_>>(),
        "device and host sampler"
    );
    // [-0.0, 0.0, -1.0, -1.0 ...]: the token's logprob is the GPU trainer's, bit for bit.
    let trainer = gpu.token_logprobs(&dev, &tokens).unwrap();
    for (r, (&(_, logprob), want)) in got.iter().zip(&trainer).enumerate() {
        assert_eq!(logprob.to_bits(), want.to_bits(), "row {r}");
    }
}
