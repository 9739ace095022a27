//! A model being trained: the compute weights, their f32 masters, AdamW's moments and the
//! gradient buffers, kept across optimizer steps. `rft`/`dapo` step it over a data file; the RL
//! loop steps it over each iteration's rollouts and hands its weights to the engine.
//!
//! ```text
//!   step(batch):  N_act = the batch's action tokens (before any split)
//!                 for each micro-batch (packed up to micro_batch_tokens):
//!                     forward (checkpointed) ─ fused loss / N_act ─ backward (gradients add up)
//!                 AdamW on the masters (clipped; skipped on NaN/Inf) ─ refresh compute weights
//! ```

use crate::backend::grad::BackendGrad;
use crate::model::{PackedBatch, Qwen2Model, Qwen2Params};
use crate::tensor::HostTensor;
use crate::train::checkpoint::{self, NamedTensor, OptimizerState};
use crate::train::data::{self, TrainSequence};
use crate::train::loss::{LossRows, Objective};
use crate::train::optimizer::{AdamW, AdamWConfig};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

pub struct Learner<'b, B: BackendGrad> {
    pub backend: &'b B,
    pub model: Qwen2Model<B>,
    masters: Qwen2Params<B::Tensor>,
    adamw: AdamW<B::Tensor>,
    grads: Qwen2Params<B::Tensor>,
    names_and_shapes: Vec<(String, Vec<usize>)>,
    /// Recompute each layer's activations in the backward instead of keeping them.
    pub checkpoint_layers: bool,
    pub micro_batch_tokens: usize,
}

/// What one optimizer step did.
pub struct StepReport {
    /// The step's metrics line (RL-SPEC.md "Metrics"), `step` not set.
    pub metrics: Value,
    pub loss: f64,
    /// No update was applied (NaN/Inf, or no action tokens).
    pub skipped: bool,
}

impl<'b, B: BackendGrad> Learner<'b, B> {
    /// Loads `model_dir`; masters start as the loaded weights, moments at zero.
    pub fn new(
        backend: &'b B,
        model_dir: &Path,
        config: AdamWConfig,
        micro_batch_tokens: usize,
        checkpoint_layers: bool,
    ) -> Result<Self> {
        if micro_batch_tokens == 0 {
            bail!("--micro-batch-tokens must be positive");
        }
        let model = Qwen2Model::load(backend, model_dir)?;
        let mut masters = model.zero_grads(backend)?;
        for (master, param) in masters.iter_mut().zip(model.params.iter()) {
            backend.copy_weights(param, master)?;
        }
        let adamw = AdamW::new(backend, config, &masters.iter().collect::<Vec<_>>())?;
        let grads = model.zero_grads(backend)?;
        let names_and_shapes = Qwen2Params::<()>::expected_tensors(&model.config, &model.local);
        Ok(Self {
            backend,
            model,
            masters,
            adamw,
            grads,
            names_and_shapes,
            checkpoint_layers,
            micro_batch_tokens,
        })
    }

    /// Optimizer updates applied so far.
    pub fn updates(&self) -> u64 {
        self.adamw.steps_taken
    }

    /// Restores masters, moments and the update count from a checkpoint written by
    /// [`Learner::save`]; returns its `trainer_state.json`.
    pub fn restore(&mut self, dir: &Path) -> Result<Value> {
        let backend = self.backend;
        let (state, saved) = checkpoint::load(dir, &self.names_and_shapes)?;
        self.adamw.steps_taken = state["updates"]
            .as_u64()
            .context("trainer_state.json: no updates")?;
        let tensors = self.masters.iter_mut().zip(
            self.adamw
                .exp_avg
                .iter_mut()
                .zip(self.adamw.exp_avg_sq.iter_mut()),
        );
        for (i, (master, (m, v))) in tensors.enumerate() {
            let shape = backend.shape(master).to_vec();
            *master = backend.upload_f32(&shape, &saved.masters[i].values)?;
            *m = backend.upload_f32(&shape, &saved.exp_avg[i])?;
            *v = backend.upload_f32(&shape, &saved.exp_avg_sq[i])?;
        }
        for (master, param) in self.masters.iter().zip(self.model.params.iter_mut()) {
            backend.copy_weights(master, param)?;
        }
        Ok(state)
    }

    /// Row-form logprobs (`[lp1, lp2, ..., 0]`) of every sequence under the current weights,
    /// through the path [`Self::step`] computes the policy's logprobs with (the training forward
    /// and the fused loss's forward, micro-batches packed the same way): at the first update of
    /// these weights the DAPO ratio is exactly 1 where the backend's rows do not depend on their
    /// neighbours in a pack (the CPU reference), and within the GEMMs' shape-dependent rounding
    /// elsewhere.
    pub fn logprobs(&self, sequences: &[&TrainSequence]) -> Result<Vec<Vec<f32>>> {
        let lengths: Vec<usize> = sequences.iter().map(|s| s.tokens.len()).collect();
        let mut out = Vec::with_capacity(sequences.len());
        for micro in data::pack_micro_batches(&lengths, self.micro_batch_tokens) {
            let members = &sequences[micro];
            let tokens: Vec<&[u32]> = members.iter().map(|s| s.tokens.as_slice()).collect();
            let batch = PackedBatch::from_sequences(&tokens);
            let targets: Vec<u32> = members
                .iter()
                .flat_map(|s| s.targets.iter().copied())
                .collect();
            let logprobs = self.model.train_logprobs(self.backend, &batch, &targets)?;
            for i in 0..members.len() {
                let mut rows = logprobs[batch.sequence_range(i)].to_vec();
                // The last row has no next token (its target is a placeholder).
                if let Some(last) = rows.last_mut() {
                    *last = 0.0;
                }
                out.push(rows);
            }
        }
        Ok(out)
    }

    /// One optimizer step over `batch` (its `old_logprobs` in row form, empty for RFT).
    pub fn step(
        &mut self,
        batch: &[&TrainSequence],
        old_logprobs: &[&[f32]],
        objective: &Objective,
        lr: f64,
    ) -> Result<StepReport> {
        let backend = self.backend;
        let started = Instant::now();
        for g in self.grads.iter_mut() {
            backend.fill_zero(g)?;
        }
        let num_action_tokens: usize = batch.iter().map(|s| s.num_action_tokens()).sum();
        let mut sums = StepSums::default();
        if num_action_tokens > 0 {
            let lengths: Vec<usize> = batch.iter().map(|s| s.tokens.len()).collect();
            for micro in data::pack_micro_batches(&lengths, self.micro_batch_tokens) {
                run_micro_batch(
                    backend,
                    &self.model,
                    &batch[micro.clone()],
                    &old_logprobs[micro],
                    objective,
                    num_action_tokens,
                    self.checkpoint_layers,
                    &mut self.grads,
                    &mut sums,
                )?;
            }
        }
        let loss_ok = sums.loss.is_finite() && num_action_tokens > 0;
        let report = if loss_ok {
            let grad_refs: Vec<&B::Tensor> = self.grads.iter().collect();
            let report = self.adamw.step(
                backend,
                &mut self.masters.iter_mut().collect::<Vec<_>>(),
                &grad_refs,
                lr,
            )?;
            if !report.skipped {
                for (master, param) in self.masters.iter().zip(self.model.params.iter_mut()) {
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
        Ok(StepReport {
            metrics,
            loss: sums.loss,
            skipped,
        })
    }

    /// The compute weights as host tensors, in the checkpoint's order and names: what the
    /// engine loads for the next rollouts (bit for bit what the trainer computes with).
    pub fn compute_weights(&self) -> Result<Qwen2Params<HostTensor<'static>>> {
        let backend = self.backend;
        let mut values = self.model.params.iter().map(|p| backend.to_host(p));
        Qwen2Params::try_build(&self.model.config, &self.model.local, |_, shape, _| {
            let v = values.next().expect("one tensor per parameter")?;
            Ok(HostTensor::from_f32(shape.to_vec(), &v))
        })
    }

    /// The compute weights' device memory (one span per parameter, checkpoint order), once all
    /// queued work is done; `None` on a host backend.
    pub fn compute_weight_spans(&self) -> Result<Option<Vec<crate::backend::DeviceSpan>>> {
        let mut spans = Vec::new();
        for param in self.model.params.iter() {
            match self.backend.device_span(param)? {
                Some(span) => spans.push(span),
                None => return Ok(None),
            }
        }
        Ok(Some(spans))
    }

    /// Writes masters and moments (resumable) and an HF-layout bf16 model to `dir`.
    pub fn save(&self, model_dir: &Path, dir: &Path, state: &Value) -> Result<()> {
        let backend = self.backend;
        let mut host = OptimizerState {
            masters: Vec::new(),
            exp_avg: Vec::new(),
            exp_avg_sq: Vec::new(),
        };
        for (i, (master, (name, shape))) in
            self.masters.iter().zip(&self.names_and_shapes).enumerate()
        {
            let values = backend.to_host(master)?;
            if values.iter().any(|v| !v.is_finite()) {
                bail!("refusing to checkpoint {name}: it holds NaN or Inf");
            }
            host.masters.push(NamedTensor {
                name: name.clone(),
                shape: shape.clone(),
                values,
            });
            host.exp_avg.push(backend.to_host(&self.adamw.exp_avg[i])?);
            host.exp_avg_sq
                .push(backend.to_host(&self.adamw.exp_avg_sq[i])?);
        }
        checkpoint::save(dir, model_dir, &host, state)
    }
}

pub fn finite_or_null(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
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
