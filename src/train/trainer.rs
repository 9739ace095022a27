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
use crate::train::checkpoint;
use crate::train::data::{self, TrainSequence};
use crate::train::learner::Learner;
use crate::train::loss::Objective;
use crate::train::optimizer::{lr_at, AdamWConfig, LrSchedule};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

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
    use crate::rng::{Rng, SplitMix64, GOLDEN_GAMMA};
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed ^ epoch.wrapping_mul(GOLDEN_GAMMA) ^ 0x5EED).shuffle(&mut order);
    order
}

/// The starting model folder for `--model` (see [`crate::model::synthetic::resolve_model_arg`]).
pub fn resolve_model(model: &Path, out: &Path) -> Result<PathBuf> {
    crate::model::synthetic::resolve_model_arg(model, out)
}

pub fn train<B: BackendGrad>(backend: &B, opts: &TrainOptions) -> Result<TrainSummary> {
    if opts.batch_size == 0 || opts.micro_batch_tokens == 0 || opts.epochs == 0 {
        bail!("--batch-size, --micro-batch-tokens and --epochs must be positive");
    }
    let config = AdamWConfig {
        weight_decay: opts.weight_decay,
        max_grad_norm: opts.grad_clip,
        ..AdamWConfig::default()
    };
    let mut learner = Learner::new(
        backend,
        &opts.model,
        config,
        opts.micro_batch_tokens,
        opts.checkpoint_layers,
    )?;
    let max_seq_len = opts
        .max_seq_len
        .unwrap_or(learner.model.config.max_context());
    let is_dapo = matches!(opts.algorithm, Algorithm::Dapo { .. });
    let trajectories = data::read_trajectories(
        &opts.data,
        &opts.model,
        learner.model.config.vocab_size,
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
    let objective = objective_of(&opts.algorithm);
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
                    learner.logprobs(&sequences.iter().collect::<Vec<_>>())?
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
    let mut first_step = 1;
    if opts.resume {
        if let Some(dir) = checkpoint::latest(&opts.out)? {
            let state = learner.restore(&dir)?;
            let step = state["step"]
                .as_u64()
                .context("trainer_state.json: no step")?;
            first_step = step + 1;
            truncate_metrics(&opts.out.join("metrics.jsonl"), step)?;
            eprintln!("resuming after step {step} from {}", dir.display());
        }
    }

    let mut summary = TrainSummary::default();
    let metrics_path = opts.out.join("metrics.jsonl");
    let show_progress = opts.progress && std::io::stderr().is_terminal();
    for step in first_step..=total_steps {
        let epoch = (step - 1) / steps_per_epoch;
        let position = ((step - 1) % steps_per_epoch) as usize;
        let order = epoch_order(sequences.len(), opts.seed, epoch);
        let batch: Vec<usize> = order
            .iter()
            .skip(position * opts.batch_size)
            .take(opts.batch_size)
            .copied()
            .collect();
        let members: Vec<&TrainSequence> = batch.iter().map(|&i| &sequences[i]).collect();
        let olds: Vec<&[f32]> = batch.iter().map(|&i| old_logprobs[i].as_slice()).collect();
        let lr = lr_at(
            opts.lr_schedule,
            opts.lr,
            opts.warmup_steps,
            total_steps,
            step,
        );
        let report = learner.step(&members, &olds, &objective, lr)?;
        let mut metrics = json!({"step": step});
        for (k, v) in report.metrics.as_object().expect("an object") {
            metrics[k] = v.clone();
        }
        append_line(&metrics_path, &metrics)?;
        if report.skipped {
            summary.skipped_steps += 1;
            eprintln!(
                "step {step}: skipped (loss {}, gradient norm {}): NaN or Inf, or no action tokens",
                metrics["loss"], metrics["grad_norm"]
            );
        } else {
            summary.first_loss.get_or_insert(report.loss);
            summary.last_loss = Some(report.loss);
        }
        if show_progress {
            eprint!(
                "\rstep {step}/{total_steps}  loss {:.4}  grad norm {}  {:.0} tokens/s   ",
                report.loss,
                metrics["grad_norm"],
                metrics["tokens_per_s"].as_f64().unwrap_or(0.0)
            );
        }
        summary.steps = step;
        let state = json!({"step": step, "updates": learner.updates(), "epoch": epoch, "batch_in_epoch": position, "total_steps": total_steps, "seed": opts.seed});
        if opts.save_every.is_some_and(|n| n > 0 && step % n == 0) {
            let dir = opts.out.join(format!("step-{step:06}"));
            learner.save(&opts.model, &dir, &state)?;
        }
    }
    if show_progress {
        eprintln!();
    }
    let state = json!({"step": summary.steps, "updates": learner.updates(), "total_steps": total_steps, "seed": opts.seed});
    summary.final_dir = opts.out.join("final");
    learner.save(&opts.model, &summary.final_dir, &state)?;
    Ok(summary)
}

/// The loss an algorithm trains with.
pub fn objective_of(algorithm: &Algorithm) -> Objective {
    match *algorithm {
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
    }
}

pub fn append_line(path: &std::path::Path, value: &Value) -> Result<()> {
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
