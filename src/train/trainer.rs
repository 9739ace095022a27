//! `swerve-train rft` and `dapo`: the training loop over [`BackendGrad`].
//!
//! ```text
//! read data ─ (dapo) group advantages, drop A = 0 ─ (dapo) old logprobs: recompute with the
//! starting weights, or the data's rollout logprobs
//! for each optimizer step (batch = `batch_size` trajectories, epoch order shuffled by a seed):
//!     N_act = the batch's action tokens (before any split)
//!     for each micro-batch (packed up to `micro_batch_tokens`):
//!         forward (checkpointed) ─ fused loss / N_act ─ backward, gradients accumulate
//!     AdamW on the f32 masters (clipped; skipped on NaN/Inf) ─ refresh compute weights
//!     append metrics.jsonl; every `save_every` steps a checkpoint with resume state
//! ```
//!
//! Step `s` always trains the same trajectories (epoch `(s-1) / steps_per_epoch`, position
//! `(s-1) % steps_per_epoch` of that epoch's seeded order), so `--resume` needs only the step,
//! the masters and the moments to continue exactly as an uninterrupted run.

use crate::backend::grad::BackendGrad;
use crate::model::{PackedBatch, Qwen2Model, Qwen2Params};
use crate::train::checkpoint::{self, NamedTensor, OptimizerState};
use crate::train::data::{self, TrainSequence};
use crate::train::loss::{LossRows, Objective};
use crate::train::optimizer::{lr_at, AdamW, AdamWConfig, LrSchedule};
use crate::train::score::score_sequences;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where DAPO's `logp_old` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldLogprobs {
    /// The trainer scores every trajectory with the starting weights before the first update.
    Recompute,
    /// The data's `logprobs` (the sampler's).
    Rollout,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    Rft,
    Dapo {
        eps_low: f32,
        eps_high: f32,
        old_logprobs: OldLogprobs,
        tis_cap: Option<f32>,
    },
}

#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub model: PathBuf,
    pub data: PathBuf,
    pub out: PathBuf,
    pub algorithm: Algorithm,
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    pub warmup_steps: u64,
    pub weight_decay: f32,
    /// Global-norm clipping; `None`: off.
    pub grad_clip: Option<f64>,
    /// Trajectories per optimizer step (after dropping zero-advantage ones).
    pub batch_size: usize,
    pub micro_batch_tokens: usize,
    pub epochs: usize,
    /// Stop after this many optimizer steps (default: every epoch's batches).
    pub steps: Option<u64>,
    /// Longest trajectory accepted (default: the model's context).
    pub max_seq_len: Option<usize>,
    pub save_every: Option<u64>,
    pub resume: bool,
    /// Activation checkpointing per layer.
    pub checkpoint_layers: bool,
    /// Seeds each epoch's trajectory order.
    pub seed: u64,
    /// A progress line on stderr (when it is a terminal).
    pub progress: bool,
}

#[derive(Clone, Debug, Default)]
pub struct TrainSummary {
    pub steps: u64,
    pub skipped_steps: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub final_dir: PathBuf,
}

/// The trajectory indices of epoch `epoch`, shuffled by a SplitMix64 stream seeded from
/// `(seed, epoch)` (Fisher-Yates), the same on every machine.
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut state = seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// Per-step sums over micro-batches.
#[derive(Default)]
struct StepSums {
    loss: f64,
    action_tokens: usize,
    tokens: usize,
    entropy: f64,
    clipped_low: usize,
    clipped_high: usize,
    ratio_deviation: f64,
    gap_max: f64,
    gap_sum: f64,
    gap_count: usize,
}

/// The starting model folder for `--model` (see [`crate::model::synthetic::resolve_model_arg`]).
pub fn resolve_model(model: &Path, out: &Path) -> Result<PathBuf> {
    crate::model::synthetic::resolve_model_arg(model, out)
}

pub fn train<B: BackendGrad>(backend: &B, opts: &TrainOptions) -> Result<TrainSummary> {
    if opts.batch_size == 0 || opts.micro_batch_tokens == 0 || opts.epochs == 0 {
        bail!("--batch-size, --micro-batch-tokens and --epochs must be positive");
    }
    let mut model = Qwen2Model::load(backend, &opts.model)?;
    let max_seq_len = opts.max_seq_len.unwrap_or(model.config.max_context());
    let is_dapo = matches!(opts.algorithm, Algorithm::Dapo { .. });
    let trajectories = data::read_trajectories(
        &opts.data,
        &opts.model,
        model.config.vocab_size,
        max_seq_len,
        !is_dapo,
    )?;
    let advantages = if is_dapo {
        data::group_advantages(&trajectories)?
    } else {
        vec![1.0; trajectories.len()]
    };
    let sequences: Vec<TrainSequence> = trajectories
        .iter()
        .zip(&advantages)
        .filter(|(_, &a)| a != 0.0)
        .map(|(t, &a)| TrainSequence::from_trajectory(t, a))
        .collect();
    if sequences.is_empty() {
        bail!(
            "{}: every trajectory has zero advantage (all groups' rewards are equal)",
            opts.data.display()
        );
    }
    let objective = match opts.algorithm {
        Algorithm::Rft => Objective::MaskedCe,
        Algorithm::Dapo {
            eps_low,
            eps_high,
            tis_cap,
            ..
        } => Objective::Dapo {
            eps_low,
            eps_high,
            tis_cap,
        },
    };
    // Old logprobs (row form), from the starting weights also on resume.
    let old_logprobs = match opts.algorithm {
        Algorithm::Rft => vec![Vec::new(); sequences.len()],
        Algorithm::Dapo {
            old_logprobs,
            tis_cap,
            ..
        } => {
            let needs_rollout = old_logprobs == OldLogprobs::Rollout || tis_cap.is_some();
            if let Some(s) = sequences
                .iter()
                .find(|s| needs_rollout && !s.has_rollout_logprobs)
            {
                bail!(
                    "{}: --old-logprobs rollout and --tis-cap need the data's `logprobs`",
                    s.location
                );
            }
            match old_logprobs {
                OldLogprobs::Rollout => sequences
                    .iter()
                    .map(|s| s.rollout_logprobs.clone())
                    .collect(),
                OldLogprobs::Recompute => {
                    recompute_logprobs(backend, &model, &sequences, opts.micro_batch_tokens)?
                }
            }
        }
    };

    let steps_per_epoch = sequences.len().div_ceil(opts.batch_size) as u64;
    let total_steps = opts
        .steps
        .unwrap_or(u64::MAX)
        .min(steps_per_epoch * opts.epochs as u64);
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let names_and_shapes = Qwen2Params::<()>::expected_tensors(&model.config, &model.local);

    // f32 masters and AdamW moments; from a checkpoint on --resume.
    let mut masters = model.zero_grads(backend)?;
    for (master, param) in masters.iter_mut().zip(model.params.iter()) {
        backend.copy_weights(param, master)?;
    }
    let config = AdamWConfig {
        weight_decay: opts.weight_decay,
        max_grad_norm: opts.grad_clip,
        ..AdamWConfig::default()
    };
    let mut adamw = AdamW::new(backend, config, &masters.iter().collect::<Vec<_>>())?;
    let mut first_step = 1;
    if opts.resume {
        if let Some(dir) = checkpoint::latest(&opts.out)? {
            let (state, saved) = checkpoint::load(&dir, &names_and_shapes)?;
            let step = state["step"]
                .as_u64()
                .context("trainer_state.json: no step")?;
            adamw.steps_taken = state["updates"]
                .as_u64()
                .context("trainer_state.json: no updates")?;
            let tensors = masters
                .iter_mut()
                .zip(adamw.exp_avg.iter_mut().zip(adamw.exp_avg_sq.iter_mut()));
            for (i, (master, (m, v))) in tensors.enumerate() {
                let shape = backend.shape(master).to_vec();
                *master = backend.upload_f32(&shape, &saved.masters[i].values)?;
                *m = backend.upload_f32(&shape, &saved.exp_avg[i])?;
                *v = backend.upload_f32(&shape, &saved.exp_avg_sq[i])?;
            }
            for (master, param) in masters.iter().zip(model.params.iter_mut()) {
                backend.copy_weights(master, param)?;
            }
            first_step = step + 1;
            truncate_metrics(&opts.out.join("metrics.jsonl"), step)?;
            eprintln!("resuming after step {step} from {}", dir.display());
        }
    }

    let mut grads = model.zero_grads(backend)?;
    let mut summary = TrainSummary::default();
    let metrics_path = opts.out.join("metrics.jsonl");
    let show_progress = opts.progress && std::io::stderr().is_terminal();
    for step in first_step..=total_steps {
        let started = Instant::now();
        let epoch = (step - 1) / steps_per_epoch;
        let position = ((step - 1) % steps_per_epoch) as usize;
        let order = epoch_order(sequences.len(), opts.seed, epoch);
        let batch: Vec<usize> = order
            .iter()
            .skip(position * opts.batch_size)
            .take(opts.batch_size)
            .copied()
            .collect();
        for g in grads.iter_mut() {
            backend.fill_zero(g)?;
        }
        let num_action_tokens: usize = batch
            .iter()
            .map(|&i| sequences[i].num_action_tokens())
            .sum();
        let mut sums = StepSums::default();
        if num_action_tokens > 0 {
            let lengths: Vec<usize> = batch.iter().map(|&i| sequences[i].tokens.len()).collect();
            for micro in data::pack_micro_batches(&lengths, opts.micro_batch_tokens) {
                let members: Vec<&TrainSequence> = batch[micro.clone()]
                    .iter()
                    .map(|&i| &sequences[i])
                    .collect();
                let olds: Vec<&[f32]> = batch[micro]
                    .iter()
                    .map(|&i| old_logprobs[i].as_slice())
                    .collect();
                run_micro_batch(
                    backend,
                    &model,
                    &members,
                    &olds,
                    &objective,
                    num_action_tokens,
                    opts.checkpoint_layers,
                    &mut grads,
                    &mut sums,
                )?;
            }
        }
        let lr = lr_at(
            opts.lr_schedule,
            opts.lr,
            opts.warmup_steps,
            total_steps,
            step,
        );
        let loss_ok = sums.loss.is_finite() && num_action_tokens > 0;
        let report = if loss_ok {
            let grad_refs: Vec<&B::Tensor> = grads.iter().collect();
            let report = adamw.step(
                backend,
                &mut masters.iter_mut().collect::<Vec<_>>(),
                &grad_refs,
                lr,
            )?;
            if !report.skipped {
                for (master, param) in masters.iter().zip(model.params.iter_mut()) {
                    backend.copy_weights(master, param)?;
                }
            }
            Some(report)
        } else {
            None
        };
        let skipped = report.is_none_or(|r| r.skipped);
        let seconds = started.elapsed().as_secs_f64();
        let n_act = num_action_tokens.max(1) as f64;
        let metrics = json!({
            "step": step,
            "loss": finite_or_null(sums.loss),
            "grad_norm": report.map_or(Value::Null, |r| finite_or_null(r.grad_norm)),
            "lr": lr,
            "trajectories": batch.len(),
            "action_tokens": num_action_tokens,
            "tokens": sums.tokens,
            "clip_frac_low": sums.clipped_low as f64 / n_act,
            "clip_frac_high": sums.clipped_high as f64 / n_act,
            "ratio_deviation_mean": sums.ratio_deviation / n_act,
            "entropy": sums.entropy / n_act,
            "logprob_gap_max": sums.gap_max,
            "logprob_gap_mean": sums.gap_sum / sums.gap_count.max(1) as f64,
            "tokens_per_s": sums.tokens as f64 / seconds.max(1e-9),
            "skipped": skipped,
        });
        append_line(&metrics_path, &metrics)?;
        if skipped {
            summary.skipped_steps += 1;
            eprintln!(
                "step {step}: skipped (loss {}, gradient norm {}): NaN or Inf, or no action tokens",
                metrics["loss"], metrics["grad_norm"]
            );
        } else {
            summary.first_loss.get_or_insert(sums.loss);
            summary.last_loss = Some(sums.loss);
        }
        if show_progress {
            eprint!(
                "\rstep {step}/{total_steps}  loss {:.4}  grad norm {:.3}  {:.0} tokens/s   ",
                sums.loss,
                report.map_or(f64::NAN, |r| r.grad_norm),
                sums.tokens as f64 / seconds.max(1e-9)
            );
        }
        summary.steps = step;
        let state = json!({"step": step, "updates": adamw.steps_taken, "epoch": epoch, "batch_in_epoch": position, "total_steps": total_steps, "seed": opts.seed});
        if opts.save_every.is_some_and(|n| n > 0 && step % n == 0) {
            let dir = opts.out.join(format!("step-{step:06}"));
            save(
                backend,
                &masters,
                &adamw,
                &names_and_shapes,
                &opts.model,
                &dir,
                &state,
            )?;
        }
    }
    if show_progress {
        eprintln!();
    }
    let state = json!({"step": summary.steps, "updates": adamw.steps_taken, "total_steps": total_steps, "seed": opts.seed});
    summary.final_dir = opts.out.join("final");
    save(
        backend,
        &masters,
        &adamw,
        &names_and_shapes,
        &opts.model,
        &summary.final_dir,
        &state,
    )?;
    Ok(summary)
}

fn finite_or_null(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// One micro-batch: pack, forward, loss, backward (gradients accumulate), sums for metrics.
#[allow(clippy::too_many_arguments)]
fn run_micro_batch<B: BackendGrad>(
    backend: &B,
    model: &Qwen2Model<B>,
    members: &[&TrainSequence],
    old_logprobs: &[&[f32]],
    objective: &Objective,
    num_action_tokens: usize,
    checkpoint_layers: bool,
    grads: &mut Qwen2Params<B::Tensor>,
    sums: &mut StepSums,
) -> Result<()> {
    let batch = PackedBatch::from_sequences(
        &members
            .iter()
            .map(|s| s.tokens.as_slice())
            .collect::<Vec<_>>(),
    );
    let concat = |f: &dyn Fn(&TrainSequence) -> &[f32]| -> Vec<f32> {
        members.iter().flat_map(|s| f(s).iter().copied()).collect()
    };
    let targets: Vec<u32> = members
        .iter()
        .flat_map(|s| s.targets.iter().copied())
        .collect();
    let action_mask: Vec<bool> = members
        .iter()
        .flat_map(|s| s.action_mask.iter().copied())
        .collect();
    let advantages: Vec<f32> = members
        .iter()
        .flat_map(|s| std::iter::repeat_n(s.advantage, s.tokens.len()))
        .collect();
    let rollout = concat(&|s| s.rollout_logprobs.as_slice());
    let old: Vec<f32> = old_logprobs
        .iter()
        .flat_map(|o| o.iter().copied())
        .collect();
    let rows = LossRows {
        targets: &targets,
        action_mask: &action_mask,
        advantages: &advantages,
        old_logprobs: &old,
        rollout_logprobs: &rollout,
    };
    let out = model.loss_and_backward(
        backend,
        &batch,
        &rows,
        objective,
        num_action_tokens as f64,
        checkpoint_layers,
        grads,
    )?;
    sums.loss += out.loss;
    sums.action_tokens += out.action_tokens;
    sums.tokens += batch.num_tokens();
    sums.clipped_low += out.clipped_low;
    sums.clipped_high += out.clipped_high;
    sums.ratio_deviation += out.ratio_deviation_sum;
    let mut row = 0;
    for s in members {
        for r in 0..s.tokens.len() {
            if s.action_mask[r] {
                sums.entropy += out.entropy[row + r] as f64;
                if s.has_rollout_logprobs && !old.is_empty() {
                    let gap = (old[row + r] - s.rollout_logprobs[r]).abs() as f64;
                    sums.gap_max = sums.gap_max.max(gap);
                    sums.gap_sum += gap;
                    sums.gap_count += 1;
                }
            }
        }
        row += s.tokens.len();
    }
    Ok(())
}

/// Row-form logprobs of every sequence under the model's current weights.
fn recompute_logprobs<B: BackendGrad>(
    backend: &B,
    model: &Qwen2Model<B>,
    sequences: &[TrainSequence],
    batch_tokens: usize,
) -> Result<Vec<Vec<f32>>> {
    let tokens: Vec<Vec<u32>> = sequences.iter().map(|s| s.tokens.clone()).collect();
    let mut out = vec![Vec::new(); sequences.len()];
    score_sequences(backend, model, &tokens, batch_tokens, |i, logprobs| {
        // Token form [None, lp1, lp2, ...] -> row form [lp1, lp2, ..., 0].
        let mut rows: Vec<f32> = logprobs[1..].iter().map(|lp| lp.unwrap_or(0.0)).collect();
        rows.push(0.0);
        out[i] = rows;
        Ok(())
    })?;
    Ok(out)
}

fn save<B: BackendGrad>(
    backend: &B,
    masters: &Qwen2Params<B::Tensor>,
    adamw: &AdamW<B::Tensor>,
    names_and_shapes: &[(String, Vec<usize>)],
    model_dir: &std::path::Path,
    dir: &std::path::Path,
    state: &Value,
) -> Result<()> {
    let mut host = OptimizerState {
        masters: Vec::new(),
        exp_avg: Vec::new(),
        exp_avg_sq: Vec::new(),
    };
    for (i, (master, (name, shape))) in masters.iter().zip(names_and_shapes).enumerate() {
        let values = backend.to_host(master)?;
        if values.iter().any(|v| !v.is_finite()) {
            bail!("refusing to checkpoint {name}: it holds NaN or Inf");
        }
        host.masters.push(NamedTensor {
            name: name.clone(),
            shape: shape.clone(),
            values,
        });
        host.exp_avg.push(backend.to_host(&adamw.exp_avg[i])?);
        host.exp_avg_sq.push(backend.to_host(&adamw.exp_avg_sq[i])?);
    }
    checkpoint::save(dir, model_dir, &host, state)
}

fn append_line(path: &std::path::Path, value: &Value) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    writeln!(file, "{value}").with_context(|| format!("cannot write {}", path.display()))
}

/// Keeps the metrics lines of steps up to `last_step` (a resumed run rewrites the rest).
fn truncate_metrics(path: &std::path::Path, last_step: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= last_step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(path, kept).with_context(|| format!("cannot rewrite {}", path.display()))
}
