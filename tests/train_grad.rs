//! The CPU training reference against PyTorch float64 autograd (tests/fixtures/generate.py,
//! `train.safetensors`): masked cross-entropy (RFT), DAPO and DAPO with truncated importance
//! sampling losses of a packed batch and every parameter's gradient, for every fixture model;
//! micro-batch splits and activation checkpointing give the same gradients.

mod common;

use common::{fixture_dir, relative_error, FIXTURE_MODELS};
use safetensors::{Dtype, SafeTensors};
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::model::{PackedBatch, Qwen2Model, Qwen2Params};
use swerve::train::loss::{LossOutput, LossRows, Objective};

const MAX_GRAD_ERROR: f64 = 1e-3;
const MAX_LOSS_ERROR: f64 = 1e-5;

/// A fixture's training batch (row form: row r predicts `targets[r]`) and PyTorch's answers.
struct TrainFixture {
    bytes: Vec<u8>,
    batch: PackedBatch,
    targets: Vec<u32>,
    action_mask: Vec<bool>,
    advantages: Vec<f32>,
    old_logprobs: Vec<f32>,
    rollout_logprobs: Vec<f32>,
}

impl TrainFixture {
    fn load(name: &str) -> Self {
        let bytes = std::fs::read(fixture_dir(name).join("train.safetensors")).unwrap();
        let mut f = TrainFixture {
            bytes,
            batch: PackedBatch::default(),
            targets: vec![],
            action_mask: vec![],
            advantages: vec![],
            old_logprobs: vec![],
            rollout_logprobs: vec![],
        };
        let tokens: Vec<u32> = f.ints("tokens").iter().map(|&v| v as u32).collect();
        let cu: Vec<i64> = f.ints("cu_seqlens");
        let sequences: Vec<Vec<u32>> = cu
            .windows(2)
            .map(|w| tokens[w[0] as usize..w[1] as usize].to_vec())
            .collect();
        f.batch = PackedBatch::from_sequences(&sequences);
        f.targets = f.ints("targets").iter().map(|&v| v as u32).collect();
        f.action_mask = f.floats("action_mask").iter().map(|&v| v > 0.0).collect();
        f.advantages = f.floats_f32("advantages");
        f.old_logprobs = f.floats_f32("old_logprobs");
        f.rollout_logprobs = f.floats_f32("rollout_logprobs");
        f
    }

    fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).unwrap()
    }

    fn raw(&self, key: &str, dtype: Dtype) -> Vec<u8> {
        let st = self.tensors();
        let view = st
            .tensor(key)
            .unwrap_or_else(|_| panic!("fixture has no {key}"));
        assert_eq!(view.dtype(), dtype, "{key}");
        view.data().to_vec()
    }

    fn ints(&self, key: &str) -> Vec<i64> {
        self.raw(key, Dtype::I64)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn floats(&self, key: &str) -> Vec<f64> {
        self.raw(key, Dtype::F64)
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn floats_f32(&self, key: &str) -> Vec<f32> {
        self.floats(key).into_iter().map(|v| v as f32).collect()
    }

    fn scalar(&self, key: &str) -> f64 {
        self.floats(key)[0]
    }

    /// A gradient stored in f32, widened.
    fn grad(&self, key: &str) -> Vec<f64> {
        self.raw(key, Dtype::F32)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    }

    fn rows(&self) -> LossRows<'_> {
        LossRows {
            targets: &self.targets,
            action_mask: &self.action_mask,
            advantages: &self.advantages,
            old_logprobs: &self.old_logprobs,
            rollout_logprobs: &self.rollout_logprobs,
        }
    }

    fn dapo(&self, tis: bool) -> Objective {
        Objective::Dapo {
            eps_low: self.scalar("eps_low") as f32,
            eps_high: self.scalar("eps_high") as f32,
            tis_cap: tis.then(|| self.scalar("tis_cap") as f32),
        }
    }
}

fn run(
    backend: &CpuBackend,
    model: &Qwen2Model<CpuBackend>,
    batch: &PackedBatch,
    rows: &LossRows<'_>,
    objective: &Objective,
    num_action_tokens: f64,
    checkpoint_layers: bool,
) -> (LossOutput, Qwen2Params<CpuTensor>) {
    let mut grads = model.zero_grads(backend).unwrap();
    let out = model
        .loss_and_backward(
            backend,
            batch,
            rows,
            objective,
            num_action_tokens,
            checkpoint_layers,
            &mut grads,
        )
        .unwrap();
    (out, grads)
}

fn relative(got: f64, want: f64) -> f64 {
    (got - want).abs() / want.abs().max(1e-30)
}

/// Every parameter's gradient against the fixture's `{prefix}.{hf name}`.
fn check_grads(
    name: &str,
    model: &Qwen2Model<CpuBackend>,
    grads: &Qwen2Params<CpuTensor>,
    f: &TrainFixture,
    prefix: &str,
) {
    let names = Qwen2Params::<()>::expected_tensors(&model.config, &model.local);
    let grads: Vec<&CpuTensor> = grads.iter().collect();
    assert_eq!(names.len(), grads.len());
    let mut worst = (0.0, String::new());
    for ((hf_name, shape), grad) in names.iter().zip(grads) {
        assert_eq!(&grad.shape, shape, "{hf_name}");
        let err = relative_error(&grad.data, &f.grad(&format!("{prefix}.{hf_name}")));
        assert!(
            err <= MAX_GRAD_ERROR,
            "{name} {prefix} {hf_name}: relative error {err:.3e}"
        );
        if err > worst.0 {
            worst = (err, hf_name.clone());
        }
    }
    println!(
        "{name} {prefix}: {} gradients, worst relative error {:.2e} ({})",
        names.len(),
        worst.0,
        worst.1
    );
}

fn check_model(name: &str) {
    let backend = CpuBackend::new();
    let model = Qwen2Model::load(&backend, &fixture_dir(name)).unwrap();
    let f = TrainFixture::load(name);
    let n_act = f.scalar("num_action_tokens");
    let actions = f.action_mask.iter().filter(|&&a| a).count();
    assert!(n_act > actions as f64, "N_act must be the global count");
    check_masked_ce(name, &backend, &model, &f);
    check_dapo(name, &backend, &model, &f, false);
    check_dapo(name, &backend, &model, &f, true);
}

/// Masked cross-entropy (RFT): loss, per-token logprobs and entropies, gradients.
fn check_masked_ce(
    name: &str,
    backend: &CpuBackend,
    model: &Qwen2Model<CpuBackend>,
    f: &TrainFixture,
) {
    let n_act = f.scalar("num_action_tokens");
    let (ce, grads) = run(
        backend,
        model,
        &f.batch,
        &f.rows(),
        &Objective::MaskedCe,
        n_act,
        true,
    );
    let err = relative(ce.loss, f.scalar("ce_loss"));
    println!("{name}: ce loss {:.6} (relative error {err:.1e})", ce.loss);
    assert!(
        err <= MAX_LOSS_ERROR,
        "{name} ce loss {} vs {}",
        ce.loss,
        f.scalar("ce_loss")
    );
    assert_eq!(
        ce.action_tokens,
        f.action_mask.iter().filter(|&&a| a).count()
    );
    let want_logprobs = f.floats("logprobs");
    let want_entropy = f.floats("entropy");
    let worst_logprob = (0..f.targets.len())
        .filter(|&r| f.action_mask[r])
        .map(|r| (ce.logprobs[r] as f64 - want_logprobs[r]).abs())
        .fold(0.0, f64::max);
    println!("{name}: worst action-token logprob error {worst_logprob:.2e}");
    for r in (0..f.targets.len()).filter(|&r| f.action_mask[r]) {
        assert!(
            (ce.logprobs[r] as f64 - want_logprobs[r]).abs() < 1e-4,
            "{name} row {r} logprob"
        );
        assert!(
            (ce.entropy[r] as f64 - want_entropy[r]).abs() < 1e-4,
            "{name} row {r} entropy"
        );
    }
    check_grads(name, model, &grads, f, "ce_grad");
}

/// DAPO with some tokens clipped on each side; with `tis`, each term also times its truncated
/// importance-sampling factor `min(exp(old - rollout), tis_cap)`, capped on some tokens.
///
/// DAPO's sum mixes positive and negative advantages and can nearly cancel (tied: 0.028 from
/// terms of size ~1), so the loss error is relative to the sum of |terms| / N_act that PyTorch
/// computed (`dapo_term_scale`, `dapo_tis_term_scale`): the scale the f32 forward's logprob
/// errors act on (for the CE loss that is |loss| itself).
fn check_dapo(
    name: &str,
    backend: &CpuBackend,
    model: &Qwen2Model<CpuBackend>,
    f: &TrainFixture,
    tis: bool,
) {
    let n_act = f.scalar("num_action_tokens");
    let (kind, loss_key, scale_key, grad_prefix) = if tis {
        (
            "dapo+tis",
            "dapo_tis_loss",
            "dapo_tis_term_scale",
            "dapo_tis_grad",
        )
    } else {
        ("dapo", "dapo_loss", "dapo_term_scale", "dapo_grad")
    };
    if tis {
        let capped = f.scalar("tis_capped");
        let actions = f.action_mask.iter().filter(|&&a| a).count() as f64;
        assert!(
            capped > 0.0 && capped < actions,
            "{name}: the fixture caps {capped} of {actions} TIS factors: needs some of each"
        );
    }
    let (dapo, grads) = run(
        backend,
        model,
        &f.batch,
        &f.rows(),
        &f.dapo(tis),
        n_act,
        true,
    );
    let want = f.scalar(loss_key);
    let err = (dapo.loss - want).abs() / f.scalar(scale_key);
    println!(
        "{name}: {kind} loss {:.6} (error {err:.1e} of the terms' scale), clipped low {} high {}",
        dapo.loss, dapo.clipped_low, dapo.clipped_high
    );
    assert!(
        err <= MAX_LOSS_ERROR,
        "{name} {kind} loss {} vs {want}",
        dapo.loss
    );
    assert_eq!(dapo.clipped_low as f64, f.scalar("clipped_low"), "{name}");
    assert_eq!(dapo.clipped_high as f64, f.scalar("clipped_high"), "{name}");
    assert!(dapo.clipped_low > 0 && dapo.clipped_high > 0);
    check_grads(name, model, &grads, f, grad_prefix);
}

#[test]
fn every_fixture_has_training_gradients() {
    for name in FIXTURE_MODELS {
        assert!(
            fixture_dir(name).join("train.safetensors").exists(),
            "{name}"
        );
    }
}

#[test]
fn tied_gqa4_bf16_gradients_match_pytorch() {
    check_model("tied-gqa4-bf16");
}

#[test]
fn untied_gqa2_odd_f32_gradients_match_pytorch() {
    check_model("untied-gqa2-odd-f32");
}

#[test]
fn yarn4_f16_gradients_match_pytorch() {
    check_model("yarn4-f16");
}

/// The same optimizer batch split into micro-batches (one per sequence, and every packing of
/// consecutive sequences) gives the same loss and gradients as one pass, because every
/// micro-batch divides by the global action-token count; checkpointing changes nothing.
#[test]
fn micro_batch_splits_and_checkpointing_give_the_same_gradients() {
    let name = "untied-gqa2-odd-f32";
    let backend = CpuBackend::new();
    let model = Qwen2Model::load(&backend, &fixture_dir(name)).unwrap();
    let f = TrainFixture::load(name);
    let n_act = f.scalar("num_action_tokens");
    let objective = f.dapo(false);
    let (whole, whole_grads) = run(
        &backend,
        &model,
        &f.batch,
        &f.rows(),
        &objective,
        n_act,
        true,
    );
    let (_, no_checkpoint_grads) = run(
        &backend,
        &model,
        &f.batch,
        &f.rows(),
        &objective,
        n_act,
        false,
    );
    for (a, b) in whole_grads.iter().zip(no_checkpoint_grads.iter()) {
        assert_eq!(a.data, b.data, "checkpointing changed a gradient");
    }

    let num_seqs = f.batch.num_sequences();
    assert!(num_seqs >= 3);
    // Splits: every sequence alone; the first two together then the rest; all but the last.
    let splits: Vec<Vec<std::ops::Range<usize>>> = vec![
        (0..num_seqs).map(|s| s..s + 1).collect(),
        vec![0..2, 2..num_seqs],
        vec![0..num_seqs - 1, num_seqs - 1..num_seqs],
    ];
    for split in splits {
        let mut grads = model.zero_grads(&backend).unwrap();
        let mut loss = 0.0;
        for seqs in &split {
            let rows =
                f.batch.cu_seqlens[seqs.start] as usize..f.batch.cu_seqlens[seqs.end] as usize;
            let sequences: Vec<Vec<u32>> = seqs
                .clone()
                .map(|s| f.batch.tokens[f.batch.sequence_range(s)].to_vec())
                .collect();
            let micro = PackedBatch::from_sequences(&sequences);
            let micro_rows = LossRows {
                targets: &f.targets[rows.clone()],
                action_mask: &f.action_mask[rows.clone()],
                advantages: &f.advantages[rows.clone()],
                old_logprobs: &f.old_logprobs[rows.clone()],
                rollout_logprobs: &f.rollout_logprobs[rows.clone()],
            };
            loss += model
                .loss_and_backward(
                    &backend,
                    &micro,
                    &micro_rows,
                    &objective,
                    n_act,
                    true,
                    &mut grads,
                )
                .unwrap()
                .loss;
        }
        assert!(
            relative(loss, whole.loss) < 1e-6,
            "{split:?}: loss {loss} vs {}",
            whole.loss
        );
        for ((hf_name, _), (got, want)) in
            Qwen2Params::<()>::expected_tensors(&model.config, &model.local)
                .iter()
                .zip(grads.iter().zip(whole_grads.iter()))
        {
            let want: Vec<f64> = want.data.iter().map(|&v| v as f64).collect();
            let err = relative_error(&got.data, &want);
            assert!(err < 1e-5, "{split:?} {hf_name}: relative error {err:.2e}");
        }
    }
}
