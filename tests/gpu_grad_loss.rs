//! The CUDA backend's fused LM-head loss (`fused_lm_head_loss`: LM head, logprob, masked CE or
//! DAPO with and without truncated importance sampling, and their gradients, the logits never
//! stored whole) against the CPU reference and the unfused bf16 computation transformers does,
//! over several tile shapes; bad inputs are errors naming what is wrong.
//!
//! Tolerance (DESIGN.md): at most twice the error of a naive same-precision computation (written
//! out here as PyTorch's bf16 autograd would do it: bf16 results of each op), against the f32/f64
//! CPU reference. The accumulated gradients start from random values, not zeros.
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh (or the emulated device: `SWERVE_EMU=1
//! cargo test --release --test 'gpu_*'`). Without one these tests fail, never pass.

mod common;

use common::gpu::{check_within_naive, gpu, round_bf16, values, Rows};
use common::tokens;
use half::bf16;
use swerve::backend::cuda::loss::LossTiles;
use swerve::backend::cuda::{CudaBackend, DeviceDType};
use swerve::backend::grad::BackendGrad;
use swerve::backend::Backend;
use swerve::train::loss::{lm_head_loss_cpu, token_term, LossOutput, LossRows, Objective};

/// One fused-loss case: its inputs (bf16 values as f32) and rows.
struct LossCase {
    t: usize,
    vocab: usize,
    d: usize,
    hidden: Vec<f32>,
    weight: Vec<f32>,
    targets: Vec<u32>,
    mask: Vec<bool>,
    advantages: Vec<f32>,
    old: Vec<f32>,
    rollout: Vec<f32>,
}

impl LossCase {
    fn new(t: usize, vocab: usize, d: usize, seed: u64) -> Self {
        let hidden = values(t * d, seed, 2.0);
        let weight = values(vocab * d, seed + 1, 0.5);
        let targets = tokens(seed + 2, t, vocab as u64);
        let mask: Vec<bool> = tokens(seed + 3, t, 4).iter().map(|&v| v != 0).collect();
        let advantages: Vec<f32> = tokens(seed + 4, t, 2)
            .iter()
            .map(|&v| if v == 0 { -1.3 } else { 0.8 })
            .collect();
        let mut case = LossCase {
            t,
            vocab,
            d,
            hidden,
            weight,
            targets,
            mask,
            advantages,
            old: vec![],
            rollout: vec![],
        };
        // Old logprobs = the reference's own, perturbed by up to +-0.4 so both clips trigger.
        let out = case.cpu(
            &Objective::MaskedCe,
            &mut vec![0.0; t * d],
            &mut vec![0.0; vocab * d],
        );
        let noise = values(t, seed + 5, 0.4);
        case.old = out
            .logprobs
            .iter()
            .zip(&noise)
            .map(|(l, n)| l + n)
            .collect();
        let noise = values(t, seed + 6, 0.3);
        case.rollout = case.old.iter().zip(&noise).map(|(l, n)| l + n).collect();
        case
    }

    fn rows(&self) -> LossRows<'_> {
        LossRows {
            targets: &self.targets,
            action_mask: &self.mask,
            advantages: &self.advantages,
            old_logprobs: &self.old,
            rollout_logprobs: &self.rollout,
        }
    }

    fn n_act(&self) -> f64 {
        // The global count: more than this call's action rows.
        self.mask.iter().filter(|&&m| m).count() as f64 * 1.5 + 1.0
    }

    fn cpu(&self, objective: &Objective, dh: &mut [f32], dw: &mut [f32]) -> LossOutput {
        lm_head_loss_cpu(
            &self.hidden,
            &self.weight,
            self.d,
            &self.rows(),
            objective,
            self.n_act(),
            dh,
            dw,
        )
        .unwrap()
    }

    /// The unfused bf16 computation (transformers): bf16 logits, f32 softmax, bf16 logits
    /// gradient, bf16 products.
    fn naive(&self, objective: &Objective, dh: &mut [f32], dw: &mut [f32]) -> (Vec<f32>, Vec<f32>) {
        let (t, v, d) = (self.t, self.vocab, self.d);
        let mut logprobs = vec![0.0f32; t];
        let mut entropy = vec![0.0f32; t];
        let mut g = vec![0.0f32; t * v];
        for r in 0..t {
            let h = &self.hidden[r * d..][..d];
            let z: Vec<f32> = (0..v)
                .map(|j| {
                    round_bf16(
                        h.iter()
                            .zip(&self.weight[j * d..][..d])
                            .map(|(a, b)| a * b)
                            .sum(),
                    )
                })
                .collect();
            let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = z.iter().map(|x| (x - m).exp()).sum();
            let lse = m + s.ln();
            logprobs[r] = z[self.targets[r] as usize] - lse;
            entropy[r] = lse - z.iter().map(|x| (x - lse).exp() * x).sum::<f32>();
            if !self.mask[r] {
                continue;
            }
            let c = -token_term(objective, &self.rows(), r, logprobs[r] as f64).d_term_d_logp
                / self.n_act();
            for j in 0..v {
                let onehot = if j == self.targets[r] as usize {
                    1.0
                } else {
                    0.0
                };
                g[r * v + j] = round_bf16(c as f32 * (onehot - (z[j] - lse).exp()));
            }
        }
        for r in 0..t {
            for k in 0..d {
                let sum: f32 = (0..v).map(|j| g[r * v + j] * self.weight[j * d + k]).sum();
                dh[r * d + k] = round_bf16(dh[r * d + k] + round_bf16(sum));
            }
        }
        for j in 0..v {
            for k in 0..d {
                let sum: f32 = (0..t).map(|r| g[r * v + j] * self.hidden[r * d + k]).sum();
                dw[j * d + k] += round_bf16(sum);
            }
        }
        (logprobs, entropy)
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn fused_loss_matches_the_unfused_reference() {
    let gpu = gpu();
    let objectives = [
        Objective::MaskedCe,
        Objective::Dapo {
            eps_low: 0.2,
            eps_high: 0.28,
            tis_cap: None,
        },
        Objective::Dapo {
            eps_low: 0.2,
            eps_high: 0.28,
            tis_cap: Some(2.0),
        },
    ];
    let tiles = [
        LossTiles::DEFAULT,
        LossTiles {
            rows: 16,
            vocab: 128,
        },
        LossTiles { rows: 7, vocab: 61 },
    ];
    for (case_i, &(t, vocab, d)) in [(70, 300, 64), (129, 1000, 96), (3, 17, 8)]
        .iter()
        .enumerate()
    {
        let case = LossCase::new(t, vocab, d, 500 + 10 * case_i as u64);
        for objective in &objectives {
            for tile in &tiles {
                check_fused_loss(&gpu, &case, objective, *tile);
            }
        }
    }
    bad_loss_inputs_are_errors_that_say_what_is_wrong(&gpu);
}

/// One case, objective and tiling: the fused loss's loss, counts, logprobs, entropy and both
/// gradients (accumulated onto small random values) against the CPU reference, within twice the
/// unfused bf16 computation's error.
fn check_fused_loss(gpu: &CudaBackend, case: &LossCase, objective: &Objective, tile: LossTiles) {
    let (t, vocab, d) = (case.t, case.vocab, case.d);
    let what = format!("loss T {t} V {vocab} d {d} {objective:?} {tile:?}");
    let dh0 = values(t * d, 7, 0.01);
    let dw0 = values(vocab * d, 8, 0.01);
    let (mut dh_c, mut dw_c) = (dh0.clone(), dw0.clone());
    let want = case.cpu(objective, &mut dh_c, &mut dw_c);
    let (mut dh_n, mut dw_n) = (dh0.clone(), dw0.clone());
    let (naive_lp, naive_ent) = case.naive(objective, &mut dh_n, &mut dw_n);
    let (got, dh, dw) = run_fused_loss(gpu, case, objective, tile, &dh0, &dw0);
    let scale = (0..t)
        .filter(|&r| case.mask[r])
        .map(|r| {
            token_term(objective, &case.rows(), r, want.logprobs[r] as f64)
                .term
                .abs()
        })
        .sum::<f64>()
        / case.n_act();
    let loss_err = (got.loss - want.loss).abs() / scale;
    println!(
        "{what}: loss {:.6} vs {:.6} (error {loss_err:.1e} of the terms' scale)",
        got.loss, want.loss
    );
    assert!(
        loss_err <= 1e-4,
        "{what}: loss {} vs {}",
        got.loss,
        want.loss
    );
    assert_eq!(got.action_tokens, want.action_tokens, "{what}");
    assert_eq!(got.clipped_low, want.clipped_low, "{what}");
    assert_eq!(got.clipped_high, want.clipped_high, "{what}");
    check_within_naive(
        &format!("{what} logprobs"),
        &got.logprobs,
        &want.logprobs,
        &naive_lp,
        // One value per token, each over the whole vocabulary: one row.
        Rows::f32(t),
    );
    check_within_naive(
        &format!("{what} entropy"),
        &got.entropy,
        &want.entropy,
        &naive_ent,
        Rows::f32(t),
    );
    check_within_naive(
        &format!("{what} d_hidden"),
        &dh,
        &dh_c,
        &dh_n,
        Rows::bf16(d),
    );
    check_within_naive(&format!("{what} d_weight"), &dw, &dw_c, &dw_n, Rows::f32(d));
}

/// The fused loss on the GPU (gradients accumulated onto `dh0`, `dw0`): its output and both
/// gradients, on the host.
fn run_fused_loss(
    gpu: &CudaBackend,
    case: &LossCase,
    objective: &Objective,
    tile: LossTiles,
    dh0: &[f32],
    dw0: &[f32],
) -> (LossOutput, Vec<f32>, Vec<f32>) {
    let (t, vocab, d) = (case.t, case.vocab, case.d);
    let bf = |v: &[f32], shape: &[usize]| {
        let b: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
        gpu.upload_pod(&b, shape, DeviceDType::Bf16).unwrap()
    };
    let hidden = bf(&case.hidden, &[t, d]);
    let weight = bf(&case.weight, &[vocab, d]);
    let mut dh = bf(dh0, &[t, d]);
    let mut dw = gpu.upload_f32(&[vocab, d], dw0).unwrap();
    let got = gpu
        .fused_lm_head_loss(
            &hidden,
            &weight,
            &case.rows(),
            objective,
            case.n_act(),
            &mut dh,
            &mut dw,
            tile,
        )
        .unwrap();
    (got, gpu.to_host(&dh).unwrap(), gpu.to_host(&dw).unwrap())
}

/// Bad inputs are errors that say what is wrong.
fn bad_loss_inputs_are_errors_that_say_what_is_wrong(gpu: &CudaBackend) {
    let hidden = gpu.zeros(&[2, 8]).unwrap();
    let weight = gpu.zeros(&[5, 8]).unwrap();
    let (mut dh, mut dw) = (gpu.zeros(&[2, 8]).unwrap(), gpu.zeros_f32(&[5, 8]).unwrap());
    let rows = LossRows {
        targets: &[1, 5],
        action_mask: &[true, true],
        ..Default::default()
    };
    let err = gpu
        .lm_head_loss(
            &hidden,
            &weight,
            &rows,
            &Objective::MaskedCe,
            2.0,
            &mut dh,
            &mut dw,
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("target id 5"), "{err:#}");
    let mut dw_bf16 = gpu.zeros(&[5, 8]).unwrap();
    let rows = LossRows {
        targets: &[1, 2],
        action_mask: &[true, true],
        ..Default::default()
    };
    let err = gpu
        .lm_head_loss(
            &hidden,
            &weight,
            &rows,
            &Objective::MaskedCe,
            2.0,
            &mut dh,
            &mut dw_bf16,
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("d_weight"), "{err:#}");
}
