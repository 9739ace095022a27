//! A model being trained: the compute weights, their f32 masters, AdamW's moments and the
//! gradient buffers, kept across optimizer steps. `rft`/`dapo` step it over a data file; the RL
//! loop steps it over each iteration's rollouts and hands its weights to the engine
//! ([`crate::train::handoff`]), and while the rollouts run takes the gradients' memory back and,
//! with [`Learner::offload_optimizer`], keeps the masters and moments in host memory
//! ([`crate::train::offload`]) until the next step.
//!
//! ```text
//!   step(batch):  N_act = the batch's action tokens (all-reduced over data-parallel replicas)
//!                 for each micro-batch of this replica (packed up to micro_batch_tokens, dealt
//!                 round-robin over the replicas):
//!                     forward (checkpointed) ─ fused loss / N_act ─ backward (gradients add up)
//!                 replicated parameters' gradients summed over the tensor-parallel ranks;
//!                 gradients summed over the replicas
//!                 AdamW on the masters this replica owns (clipped by the global norm; skipped on
//!                 NaN/Inf) ─ refresh their compute weights ─ broadcast them to the replicas
//! ```
//!
//! Parallelism (SPMD: every rank runs the same calls): a learner is one tensor-parallel rank's
//! shard of the model ([`Groups::tp`]) in one data-parallel replica ([`Groups::dp`], the ranks
//! holding the same shard in the other replicas). ZeRO-1: each parameter tensor's master and
//! moments live on one replica only (tensors dealt to replicas by size), which updates it and
//! broadcasts the new compute weights. The global gradient norm counts a tensor several ranks
//! hold (norms; KV heads shared by ranks) once.

use crate::backend::grad::BackendGrad;
pub use crate::dist::Groups;

use crate::dist::{Communicator, ReduceOp};
use crate::model::params::ParamShard;
use crate::model::{PackedBatch, Qwen2Model, Qwen2Params};
use crate::train::checkpoint::{CheckpointWriter, OptimizerFile};
use crate::train::data::{self, TrainSequence};
use crate::train::loss::{LossRows, Objective};
use crate::train::offload::HostOptimizerState;
use crate::train::optimizer::{AdamW, AdamWConfig};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub struct Learner<'b, B: BackendGrad> {
    pub backend: &'b B,
    pub model: Qwen2Model<B>,
    dp: Arc<dyn Communicator<B>>,
    /// Every parameter's HF name and this rank's slice of it, in checkpoint order.
    shards: Vec<(String, ParamShard)>,
    /// The replica that keeps each parameter's master and moments (ZeRO-1).
    owner: Vec<usize>,
    /// This replica's masters: `Some` for the parameters it owns.
    masters: Vec<Option<B::Tensor>>,
    /// Moments of the owned parameters, in parameter order.
    adamw: AdamW<B::Tensor>,
    /// The masters and moments while they are in host memory ([`Learner::offload_optimizer_state`]):
    /// `masters` is then all `None` and the moments empty, until the next step brings them back.
    offloaded: Option<HostOptimizerState>,
    /// [`Learner::release_training_memory`] moves the optimizer state to host memory too
    /// (`--offload-optimizer`): more room for the rollouts' KV cache, a copy each way per
    /// iteration, the same results.
    pub offload_optimizer: bool,
    /// The step's gradients; `None` between steps once [`Learner::release_gradients`] gave their
    /// memory back (the RL loop does while the rollouts run).
    grads: Option<Qwen2Params<B::Tensor>>,
    /// Whether this rank adds a parameter's squares to the global norm (a tensor several ranks
    /// hold counts once).
    counts_in_norm: Vec<bool>,
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
        let groups = Groups::solo();
        Self::new_in(
            backend,
            model_dir,
            config,
            micro_batch_tokens,
            checkpoint_layers,
            &groups,
        )
    }

    /// [`Self::new`] for one rank of `groups`: loads this rank's shard of `model_dir`, and the
    /// masters and moments of the parameters this replica owns.
    pub fn new_in(
        backend: &'b B,
        model_dir: &Path,
        config: AdamWConfig,
        micro_batch_tokens: usize,
        checkpoint_layers: bool,
        groups: &Groups<B>,
    ) -> Result<Self> {
        if micro_batch_tokens == 0 {
            bail!("--micro-batch-tokens must be positive");
        }
        let model = Qwen2Model::load_shard(backend, model_dir, groups.tp.clone())?;
        let shards = Qwen2Params::<()>::shards(&model.config, &model.local);
        let owner = zero_owners(&shards, groups.dp.size());
        let grads = Some(model.zero_grads(backend)?);
        let mut masters = Vec::with_capacity(shards.len());
        for (i, param) in model.params.iter().enumerate() {
            masters.push(if owner[i] == groups.dp.rank() {
                let mut master = backend.zeros_f32(backend.shape(param))?;
                backend.copy_weights(param, &mut master)?;
                Some(master)
            } else {
                None
            });
        }
        let owned: Vec<&B::Tensor> = masters.iter().flatten().collect();
        let adamw = AdamW::new(backend, config, &owned)?;
        let counts_in_norm = norm_counts(&model);
        Ok(Self {
            backend,
            model,
            dp: groups.dp.clone(),
            shards,
            owner,
            masters,
            adamw,
            offloaded: None,
            offload_optimizer: false,
            grads,
            counts_in_norm,
            checkpoint_layers,
            micro_batch_tokens,
        })
    }

    /// Gives the gradient buffers' memory back (the next step allocates them again): the RL
    /// loop frees them while the rollouts run, for the engine's KV cache.
    pub fn release_gradients(&mut self) {
        if self.grads.take().is_some() {
            self.backend.release_cached_memory();
        }
    }

    /// What the RL loop gives back while the rollouts run: the gradients, and with
    /// [`Learner::offload_optimizer`] the optimizer state's device memory too (moved to host
    /// memory). The next step takes both back.
    pub fn release_training_memory(&mut self) -> Result<()> {
        self.release_gradients();
        if self.offload_optimizer {
            self.offload_optimizer_state()?;
        }
        Ok(())
    }

    /// Moves this replica's masters and moments to host memory, freeing their device memory
    /// (see [`crate::train::offload`]); the next step or restore brings them back. Idempotent.
    pub fn offload_optimizer_state(&mut self) -> Result<()> {
        if self.offloaded.is_none() {
            let host =
                HostOptimizerState::offload(self.backend, &mut self.masters, &mut self.adamw)?;
            self.offloaded = Some(host);
        }
        Ok(())
    }

    /// Whether the optimizer state is in host memory now.
    pub fn optimizer_state_offloaded(&self) -> bool {
        self.offloaded.is_some()
    }

    /// Uploads an offloaded optimizer state again (nothing to do otherwise).
    fn bring_back_optimizer_state(&mut self) -> Result<()> {
        let Some(host) = &self.offloaded else {
            return Ok(());
        };
        let rank = self.dp.rank();
        let shapes: Vec<Option<Vec<usize>>> = self
            .shards
            .iter()
            .zip(&self.owner)
            .map(|((_, shard), &owner)| (owner == rank).then(|| shard.local_shape()))
            .collect();
        host.restore(self.backend, &shapes, &mut self.masters, &mut self.adamw)?;
        self.offloaded = None;
        Ok(())
    }

    /// Optimizer updates applied so far.
    pub fn updates(&self) -> u64 {
        self.adamw.steps_taken
    }

    /// Restores masters, moments and the update count from a checkpoint written by
    /// [`Learner::save`] (at any tensor-parallel degree: each rank reads its slices); returns its
    /// `trainer_state.json`.
    pub fn restore(&mut self, dir: &Path) -> Result<Value> {
        self.bring_back_optimizer_state()?;
        let backend = self.backend;
        let state = crate::train::checkpoint::read_state(dir)?;
        self.adamw.steps_taken = state["updates"]
            .as_u64()
            .context("trainer_state.json: no updates")?;
        let file = OptimizerFile::open(dir)?;
        let mut moments = 0;
        for (i, (name, shard)) in self.shards.iter().enumerate() {
            let Some(master) = self.masters[i].as_mut() else {
                continue;
            };
            let shape = shard.local_shape();
            let [m, exp_avg, exp_avg_sq] = file.read(name, shard)?;
            *master = backend.upload_f32(&shape, &m)?;
            self.adamw.exp_avg[moments] = backend.upload_f32(&shape, &exp_avg)?;
            self.adamw.exp_avg_sq[moments] = backend.upload_f32(&shape, &exp_avg_sq)?;
            moments += 1;
        }
        self.refresh_compute_weights()?;
        Ok(state)
    }

    /// Copies each owned master into its compute weight, then every compute weight from its
    /// owner to the other replicas.
    fn refresh_compute_weights(&mut self) -> Result<()> {
        let backend = self.backend;
        for (i, param) in self.model.params.iter_mut().enumerate() {
            if let Some(master) = &self.masters[i] {
                backend.copy_weights(master, param)?;
            }
            if self.dp.size() > 1 {
                self.dp.broadcast(backend, param, self.owner[i])?;
            }
        }
        Ok(())
    }

    /// Row-form logprobs (`[lp1, lp2, ..., 0]`) of every sequence under the current weights,
    /// through the path [`Self::step`] computes the policy's logprobs with (the training forward
    /// and the fused loss's forward, micro-batches packed the same way): at the first update of
    /// these weights the DAPO ratio is exactly 1 where the backend's rows do not depend on their
    /// neighbours in a pack (the CPU reference), and within the GEMMs' shape-dependent rounding
    /// elsewhere. Data-parallel replicas score every `dp`-th micro-batch and share the rows.
    pub fn logprobs(&self, sequences: &[&TrainSequence]) -> Result<Vec<Vec<f32>>> {
        let lengths: Vec<usize> = sequences.iter().map(|s| s.tokens.len()).collect();
        let micro_batches = data::pack_micro_batches(&lengths, self.micro_batch_tokens);
        let (replica, replicas) = (self.dp.rank(), self.dp.size());
        let mut mine: Vec<f32> = Vec::new();
        for micro in micro_batches.iter().skip(replica).step_by(replicas) {
            let members = &sequences[micro.clone()];
            let tokens: Vec<&[u32]> = members.iter().map(|s| s.tokens.as_slice()).collect();
            let batch = PackedBatch::from_sequences(&tokens);
            let targets: Vec<u32> = members
                .iter()
                .flat_map(|s| s.targets.iter().copied())
                .collect();
            mine.extend(self.model.train_logprobs(self.backend, &batch, &targets)?);
        }
        // Every replica's rows, then the sequences in order (micro-batch m is replica m % dp's).
        let parts: Vec<Vec<f32>> = if replicas == 1 {
            vec![mine]
        } else {
            self.dp
                .all_gather_bytes(bytemuck::cast_slice(&mine))?
                .iter()
                .map(|b| crate::dist::f32s_from_bytes(b))
                .collect()
        };
        let mut next = vec![0usize; replicas];
        let mut out = Vec::with_capacity(sequences.len());
        for (m, micro) in micro_batches.iter().enumerate() {
            let (part, at) = (&parts[m % replicas], &mut next[m % replicas]);
            for i in micro.clone() {
                let mut rows = part[*at..*at + lengths[i]].to_vec();
                *at += lengths[i];
                // The last row has no next token (its target is a placeholder).
                if let Some(last) = rows.last_mut() {
                    *last = 0.0;
                }
                out.push(rows);
            }
        }
        Ok(out)
    }

    /// One optimizer step over `batch` (its `old_logprobs` in row form, empty for RFT). Every
    /// rank of every replica calls it with the same batch and gets the same report.
    pub fn step(
        &mut self,
        batch: &[&TrainSequence],
        old_logprobs: &[&[f32]],
        objective: &Objective,
        lr: f64,
    ) -> Result<StepReport> {
        let backend = self.backend;
        let started = Instant::now();
        self.bring_back_optimizer_state()?;
        match &mut self.grads {
            Some(grads) => {
                for g in grads.iter_mut() {
                    backend.fill_zero(g)?;
                }
            }
            None => self.grads = Some(self.model.zero_grads(backend)?),
        }
        let grads = self.grads.as_mut().expect("allocated above");
        let lengths: Vec<usize> = batch.iter().map(|s| s.tokens.len()).collect();
        let micro_batches = data::pack_micro_batches(&lengths, self.micro_batch_tokens);
        let (replica, replicas) = (self.dp.rank(), self.dp.size());
        let mine: Vec<_> = micro_batches
            .iter()
            .skip(replica)
            .step_by(replicas)
            .cloned()
            .collect();
        // RL-SPEC: N_act is the optimizer batch's, counted over every replica's share first.
        let mut count = [mine
            .iter()
            .flat_map(|m| &batch[m.clone()])
            .map(|s| s.num_action_tokens() as f64)
            .sum::<f64>()];
        self.dp.all_reduce_f64(&mut count, ReduceOp::Sum)?;
        let num_action_tokens = count[0] as usize;
        let mut sums = StepSums::default();
        if num_action_tokens > 0 {
            for micro in mine {
                run_micro_batch(
                    backend,
                    &self.model,
                    &batch[micro.clone()],
                    &old_logprobs[micro],
                    objective,
                    num_action_tokens,
                    self.checkpoint_layers,
                    grads,
                    &mut sums,
                )?;
            }
        }
        sums.reduce_over(&*self.dp)?;
        let report = if sums.loss.is_finite() && num_action_tokens > 0 {
            Some(self.update(lr)?)
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
            "tokens": sums.tokens as u64,
            "clip_frac_low": sums.clipped_low / n_act,
            "clip_frac_high": sums.clipped_high / n_act,
            "ratio_deviation_mean": sums.ratio_deviation / n_act,
            "entropy": sums.entropy / n_act,
            "logprob_gap_max": sums.gap_max,
            "logprob_gap_mean": sums.gap_sum / sums.gap_count.max(1.0),
            "tokens_per_s": sums.tokens / seconds.max(1e-9),
            "skipped": skipped,
        });
        Ok(StepReport {
            metrics,
            loss: sums.loss,
            skipped,
        })
    }

    /// Completes the gradients (replicated parameters over the tensor-parallel ranks, then the
    /// replicas), takes the global norm and updates the owned masters and every compute weight.
    fn update(&mut self, lr: f64) -> Result<crate::train::optimizer::StepReport> {
        let backend = self.backend;
        let all_grads = self.grads.as_mut().expect("the step's gradients");
        self.model.reduce_replicated_grads(backend, all_grads)?;
        if self.dp.size() > 1 {
            for g in all_grads.iter_mut() {
                self.dp.all_reduce_sum_any_order(backend, g)?;
            }
        }
        let grad_norm = global_grad_norm(backend, &self.model, all_grads, &self.counts_in_norm)?;
        let grads: Vec<&B::Tensor> = all_grads.iter().collect();
        let owned_grads: Vec<&B::Tensor> = grads
            .iter()
            .zip(&self.masters)
            .filter(|(_, m)| m.is_some())
            .map(|(g, _)| *g)
            .collect();
        let mut owned_masters: Vec<&mut B::Tensor> = self.masters.iter_mut().flatten().collect();
        let report = self
            .adamw
            .apply(backend, &mut owned_masters, &owned_grads, grad_norm, lr)?;
        if !report.skipped {
            self.refresh_compute_weights()?;
        }
        Ok(report)
    }

    /// Writes masters and moments (resumable) and an HF-layout bf16 model to `dir`: whole
    /// tensors, gathered one at a time from their owning replica and every tensor-parallel rank;
    /// only the writer ([`Groups::is_writer`]) touches the disk. Every rank calls it.
    pub fn save(&self, model_dir: &Path, dir: &Path, state: &Value) -> Result<()> {
        let writer_rank = self.model.comm.rank() == 0 && self.dp.rank() == 0;
        let mut writer = if writer_rank {
            let whole: Vec<(String, Vec<usize>)> = self
                .shards
                .iter()
                .map(|(n, s)| (n.clone(), s.full_shape.clone()))
                .collect();
            Some(CheckpointWriter::begin(dir, model_dir, &whole))
        } else {
            None
        };
        let result = self.write_tensors(writer.as_mut().and_then(|w| w.as_mut().ok()));
        match (writer, result) {
            (None, result) => result,
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(w)), Ok(())) => w.finish(state),
            (Some(Ok(w)), Err(e)) => {
                w.abandon();
                Err(e)
            }
        }
    }

    /// Gathers each parameter's master and moments whole (see [`Self::save`]) and hands them to
    /// `writer` (the writer rank's; `None` elsewhere).
    fn write_tensors(&self, mut writer: Option<&mut CheckpointWriter>) -> Result<()> {
        let tp = &self.model.comm;
        let all_shards: Vec<Vec<(String, ParamShard)>> = self
            .model
            .config
            .shards(tp.size())?
            .iter()
            .map(|local| Qwen2Params::<()>::shards(&self.model.config, local))
            .collect();
        let mut moment = 0;
        for (i, (name, shard)) in self.shards.iter().enumerate() {
            // This shard's three parts on the owning replica, sent to replica 0.
            let mut parts = if self.owner[i] == self.dp.rank() {
                let values = self.optimizer_values(i, moment)?;
                moment += 1;
                bytemuck::cast_slice(&values).to_vec()
            } else {
                Vec::new()
            };
            if self.dp.size() > 1 {
                self.dp.broadcast_bytes(&mut parts, self.owner[i])?;
            }
            let pieces = tp.all_gather_bytes(&parts)?;
            let Some(writer) = writer.as_deref_mut() else {
                continue;
            };
            let numel: usize = shard.full_shape.iter().product();
            let mut whole = vec![vec![0.0f32; numel]; 3];
            for (rank, piece) in pieces.iter().enumerate() {
                let values: Vec<f32> = crate::dist::f32s_from_bytes(piece);
                let rank_shard = &all_shards[rank][i].1;
                let n = values.len() / 3;
                for (part, w) in whole.iter_mut().enumerate() {
                    rank_shard.place(&values[part * n..(part + 1) * n], w);
                }
            }
            writer.put(name, &whole[0], &whole[1], &whole[2])?;
        }
        Ok(())
    }

    /// Owned parameter `i`'s master and moments (the `moment`th owned), concatenated, from the
    /// device or from host memory while offloaded.
    fn optimizer_values(&self, i: usize, moment: usize) -> Result<Vec<f32>> {
        if let Some(host) = &self.offloaded {
            return Ok(host.values(moment));
        }
        let master = self.masters[i].as_ref().context("an owned master")?;
        let parts = [
            master,
            &self.adamw.exp_avg[moment],
            &self.adamw.exp_avg_sq[moment],
        ];
        let mut values = Vec::new();
        for t in parts {
            values.extend(self.backend.to_host(t)?);
        }
        Ok(values)
    }
}

/// The replica that keeps each parameter's optimizer state (ZeRO-1): the largest tensors first,
/// each to the replica with the fewest elements so far (ties: the lowest replica), the same on
/// every rank. Whole tensors, so the shares differ by at most about one tensor. (`bench::plan`
/// counts a replica's share with it.)
pub fn zero_owners(shards: &[(String, ParamShard)], replicas: usize) -> Vec<usize> {
    let size = |i: usize| shards[i].1.local_shape().iter().product::<usize>();
    let mut order: Vec<usize> = (0..shards.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(size(i)));
    let mut load = vec![0usize; replicas];
    let mut owner = vec![0usize; shards.len()];
    for i in order {
        let least = (0..replicas)
            .min_by_key(|&r| (load[r], r))
            .expect("a replica");
        load[least] += size(i);
        owner[i] = least;
    }
    owner
}

/// Per parameter of `model` (checkpoint order), whether this rank adds its gradient's squares to
/// the global norm ([`counts_in_norm`]).
pub fn norm_counts<B: crate::backend::Backend>(model: &Qwen2Model<B>) -> Vec<bool> {
    Qwen2Params::<()>::shards(&model.config, &model.local)
        .iter()
        .map(|(_, shard)| counts_in_norm(shard, &model.config, &model.local))
        .collect()
}

/// The global norm of the gradients of `model`'s tensor-parallel group, once they are complete
/// ([`Qwen2Model::reduce_replicated_grads`]): each rank's counted squares ([`norm_counts`])
/// summed over the group. Every rank of the group calls it and gets the same norm.
pub fn global_grad_norm<B: BackendGrad>(
    backend: &B,
    model: &Qwen2Model<B>,
    grads: &Qwen2Params<B::Tensor>,
    counts: &[bool],
) -> Result<f64> {
    let mut squares = [0.0f64];
    for (g, &counted) in grads.iter().zip(counts) {
        if counted {
            squares[0] += backend.sum_of_squares(g)?;
        }
    }
    model.comm.all_reduce_f64(&mut squares, ReduceOp::Sum)?;
    Ok(squares[0].sqrt())
}

/// Whether this rank adds a tensor's squares to the global gradient norm: the whole tensor is
/// counted once over the tensor-parallel ranks (a replicated norm by rank 0; a KV head several
/// ranks hold by the first of them, whose query heads start its group).
fn counts_in_norm(
    shard: &ParamShard,
    config: &crate::config::ModelConfig,
    local: &crate::config::LocalSizes,
) -> bool {
    match (shard.replicated, &shard.split) {
        (false, _) => true,
        (true, None) => local.tp_rank == 0,
        (true, Some(_)) => {
            let group = config.num_attention_heads / config.num_key_value_heads;
            local.head_start == local.kv_head_start * group
        }
    }
}

pub fn finite_or_null(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// Per-step sums over micro-batches (counts as f64, so replicas sum them in one all-reduce).
#[derive(Default)]
struct StepSums {
    loss: f64,
    action_tokens: f64,
    tokens: f64,
    entropy: f64,
    clipped_low: f64,
    clipped_high: f64,
    ratio_deviation: f64,
    gap_max: f64,
    gap_sum: f64,
    gap_count: f64,
}

impl StepSums {
    /// The sums over every replica's micro-batches (the max for the gap's max).
    fn reduce_over<C: crate::dist::Collectives + ?Sized>(&mut self, dp: &C) -> Result<()> {
        if dp.size() == 1 {
            return Ok(());
        }
        let mut sums = [
            self.loss,
            self.action_tokens,
            self.tokens,
            self.entropy,
            self.clipped_low,
            self.clipped_high,
            self.ratio_deviation,
            self.gap_sum,
            self.gap_count,
        ];
        dp.all_reduce_f64(&mut sums, ReduceOp::Sum)?;
        let mut max = [self.gap_max];
        dp.all_reduce_f64(&mut max, ReduceOp::Max)?;
        [
            self.loss,
            self.action_tokens,
            self.tokens,
            self.entropy,
            self.clipped_low,
            self.clipped_high,
            self.ratio_deviation,
            self.gap_sum,
            self.gap_count,
        ] = sums;
        self.gap_max = max[0];
        Ok(())
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
    sums.action_tokens += out.action_tokens as f64;
    sums.tokens += batch.num_tokens() as f64;
    sums.clipped_low += out.clipped_low as f64;
    sums.clipped_high += out.clipped_high as f64;
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
                    sums.gap_count += 1.0;
                }
            }
        }
        row += s.tokens.len();
    }
    Ok(())
}
