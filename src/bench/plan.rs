//! The memory plan of one GPU (`swerve-bench plan`): what training and rollouts hold at once on
//! one rank, component by component, in bytes, from the model's config and the run's sizes: pure
//! functions, read off the code that allocates (the byte counts name where they come from).
//!
//! Training, one tensor-parallel rank of one data-parallel replica, per micro-batch of `T` tokens
//! (padded to a multiple of `tp`; `rows = T / tp` under sequence parallelism):
//!
//! ```text
//!  resident   weights (this rank's shard)  f32 gradients  f32 masters + 2 moments (ZeRO-1: this
//!             replica's whole tensors, `train::learner::zero_owners`)  [+ the engine's weights when
//!             colocated with rollouts: its KV cache is released while the trainer runs]
//!  loss       kept inputs L x [rows, d], final hidden [T, d] + its norm's input, d_hidden [T, d],
//!             the fused loss's tiles (`LossTiles::scratch_bytes` on CUDA)
//!  recompute  top layer recomputed from its kept input (`Qwen2Model::recompute_layer`): the
//!             layer's buffers (local heads and MLP columns, gathered [T, d] norm outputs, lse;
//!             they move into its activations), the stream's delta, the x_in / x_mid copies
//!  MLP bwd    the recomputed activations, d_all + d_normed [T, d], d_mine, and d_act, d_gate,
//!             d_up [T, I/tp] (`mlp_backward`), at the reduce-scatter of d_normed
//!  attn bwd   the same but d_attn, d_q [T, h, hd], d_k, d_v [T, g, hd] and, on CUDA, flash
//!             backward's f32 dq accumulator, lse and delta
//! ```
//!
//! The forward is not a phase of its own: at each of its moments the recompute of the top layer
//! holds everything it does (every kept input, the stream, one buffer set, the final hidden
//! states) and more. Backward peaks are at the top layer, whose recompute happens while every
//! kept input still lives.
//!
//! Rollouts, one rank of an engine: its weights, the paged KV cache for `sequences` sequences at
//! the context ([`kv_cache_bytes`]), one engine step of `step_tokens` rows over the cache
//! (`Qwen2Model::forward_paged`: embedding, delta, one layer's buffers, hidden states; the split
//! KV scratch of `WorkPlan`; f32 logits of the sampled rows), the decode buffers of the CUDA graph
//! pool, and when colocated what the trainer keeps meanwhile ([`ColocatedTrainer`]: its weights,
//! and its masters and moments unless `--offload-optimizer` moved them to host memory; the RL
//! loop gives the gradients' memory back). [`kv_tokens_that_fit`] turns a plan into the KV cache
//! a card holds beside the rest.
//!
//! Element sizes are parameters ([`Target`]): bf16 weights and activations on CUDA, f32
//! everything on the CPU reference; gradients, masters, moments and the attention's logsumexp are
//! f32 on both. Collectives: the CPU's are the `Communicator` defaults staged through host memory
//! ([`host_reduce_scatter`]); on a GPU those copies are host memory too (and NCCL works in place),
//! so a GPU plan counts none.

use crate::backend::cuda::gemm::WORKSPACE_BYTES;
use crate::backend::cuda::graphs::BATCH_BUCKETS;
use crate::backend::cuda::loss::LossTiles;
use crate::backend::cuda::paged_attn::WorkPlan;
use crate::backend::cuda::rmsnorm::rmsnorm_bwd_grid;
use crate::backend::loss::{ROW_CHUNK, VOCAB_CHUNK};
use crate::config::{LocalSizes, ModelConfig};
use crate::model::{PagedKv, Qwen2Params};
use crate::train::learner::zero_owners;
use anyhow::{bail, ensure, Result};

/// One named part of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    pub name: String,
    pub bytes: u64,
}

/// What is allocated at one moment on top of the resident state.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub name: &'static str,
    pub components: Vec<Component>,
}

impl Phase {
    pub fn bytes(&self) -> u64 {
        self.components.iter().map(|c| c.bytes).sum()
    }
}

/// One rank's memory: what stays allocated, and the transient parts of each phase.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    /// What the plan is of, for the table's title.
    pub what: String,
    pub resident: Vec<Component>,
    pub phases: Vec<Phase>,
}

impl MemoryPlan {
    pub fn resident_bytes(&self) -> u64 {
        self.resident.iter().map(|c| c.bytes).sum()
    }

    /// The phase with the most bytes, and the total (resident included) then.
    pub fn peak(&self) -> (&Phase, u64) {
        let phase = self
            .phases
            .iter()
            .max_by_key(|p| p.bytes())
            .expect("a plan has a phase");
        (phase, self.resident_bytes() + phase.bytes())
    }

    /// The peak phase's transient bytes (activations and their scratch).
    pub fn peak_transient(&self) -> u64 {
        self.peak().0.bytes()
    }

    /// A resident component's bytes by name prefix (0 when absent).
    pub fn resident_named(&self, prefix: &str) -> u64 {
        self.resident
            .iter()
            .filter(|c| c.name.starts_with(prefix))
            .map(|c| c.bytes)
            .sum()
    }
}

/// Where the plan's bytes live: element sizes and the backend's own scratch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Target {
    /// Bytes per compute-weight element (bf16 on CUDA: 2; f32 on the CPU: 4).
    pub weight_bytes: u64,
    /// Bytes per activation element (`Backend::zeros`: bf16 on CUDA, f32 on the CPU).
    pub activation_bytes: u64,
    pub kind: TargetKind,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TargetKind {
    /// The CPU reference: host memory, host-staged collectives, the reference loss's tiles.
    Cpu,
    /// A GPU of `num_sms` SMs: the loss's `LossTiles::DEFAULT`, flash backward's and the
    /// RMSNorm backward's scratch, the split-KV scratch, cuBLASLt's workspace, and `reserve`
    /// bytes the code does not allocate (CUDA context, modules, the pool's rounding).
    Cuda { num_sms: usize, reserve: u64 },
}

impl Target {
    pub fn cpu() -> Self {
        Self {
            weight_bytes: 4,
            activation_bytes: 4,
            kind: TargetKind::Cpu,
        }
    }

    /// bf16 weights and activations on a GPU of `num_sms` SMs (132 on an H100 or H200 SXM).
    pub fn cuda(num_sms: usize, reserve: u64) -> Self {
        Self {
            weight_bytes: 2,
            activation_bytes: 2,
            kind: TargetKind::Cuda { num_sms, reserve },
        }
    }

    fn is_cpu(&self) -> bool {
        self.kind == TargetKind::Cpu
    }

    /// What every backend object on a GPU holds regardless of the work: cuBLASLt's workspace
    /// (per backend) and the reserve (once).
    fn fixed(&self, backends: u64) -> Vec<Component> {
        match self.kind {
            TargetKind::Cpu => Vec::new(),
            TargetKind::Cuda { reserve, .. } => vec![
                part(
                    "cuBLASLt workspace (one per backend)",
                    backends * WORKSPACE_BYTES as u64,
                ),
                part(
                    "reserve: CUDA context, modules, pool rounding (assumed)",
                    reserve,
                ),
            ],
        }
    }
}

/// `9,089,429,504`: a count for a component's name.
pub fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn part(name: impl Into<String>, bytes: u64) -> Component {
    Component {
        name: name.into(),
        bytes,
    }
}

/// Bytes of `elems` elements of `bytes` each.
fn b(elems: usize, bytes: u64) -> u64 {
    elems as u64 * bytes
}

/// Host bytes a `Communicator::reduce_scatter_rows` of `elems` f32 values holds at its peak on
/// one rank of `tp` (the default, host-staged body): `to_host` (1) and the copy it reduces into
/// (1), then in `all_gather_f32` every rank's bytes cloned out of the exchange (tp), concatenated
/// (tp) and converted back to floats (tp). The exchange's own slots are freed by the time the
/// copies are made (the last reader drops them), so they are not counted.
pub fn host_reduce_scatter(tp: usize, elems: usize) -> u64 {
    if tp == 1 {
        return 0;
    }
    (2 + 3 * tp as u64) * b(elems, 4)
}

/// `Communicator::all_reduce_sum` of `elems` f32 values, host-staged: `to_host` (1), then the
/// gather's clone, concatenation and conversion (3 tp), as in [`host_reduce_scatter`].
pub fn host_all_reduce(tp: usize, elems: usize) -> u64 {
    if tp == 1 {
        return 0;
    }
    (1 + 3 * tp as u64) * b(elems, 4)
}

/// Parameters of one rank's shard.
pub fn local_parameters(config: &ModelConfig, local: &LocalSizes) -> usize {
    Qwen2Params::<()>::shards(config, local)
        .iter()
        .map(|(_, s)| s.local_shape().iter().product::<usize>())
        .sum()
}

/// The largest data-parallel replica's share of one rank's parameters under ZeRO-1 (whole
/// tensors dealt to the replica with the fewest elements so far, `zero_owners`): elements.
pub fn zero_share(config: &ModelConfig, local: &LocalSizes, dp: usize) -> usize {
    let shards = Qwen2Params::<()>::shards(config, local);
    let owners = zero_owners(&shards, dp);
    let mut load = vec![0usize; dp];
    for ((_, shard), owner) in shards.iter().zip(owners) {
        load[owner] += shard.local_shape().iter().product::<usize>();
    }
    load.into_iter().max().unwrap_or(0)
}

/// The paged KV cache of `num_blocks` blocks of `block_size` tokens on one rank (`new_paged_kv`:
/// per layer, K and V pools of `[blocks, block_size, kv_heads_local, head_dim]`).
pub fn kv_cache_bytes(
    config: &ModelConfig,
    local: &LocalSizes,
    num_blocks: usize,
    block_size: usize,
    elem_bytes: u64,
) -> u64 {
    let per_token = PagedKv::<()>::bytes_per_token(config, local, elem_bytes as usize) as u64;
    (num_blocks * block_size) as u64 * per_token
}

/// One layer's activation sizes on one rank, in bytes (see `layer.rs`'s `LayerBuffers`).
struct LayerSizes {
    /// `[rows, d]`: this rank's rows of the residual stream (all `T` without sequence
    /// parallelism).
    r: u64,
    /// `[T, d]`: a gathered norm output, the hidden states.
    n: u64,
    /// `[T, heads_local, head_dim]`.
    q: u64,
    /// `[T, kv_heads_local, head_dim]`.
    kv: u64,
    /// `[T, heads_local]` f32.
    lse: u64,
    /// `[T, intermediate_local]`.
    i: u64,
    /// Sequence parallelism's pair: a norm output on this rank's rows and a row-parallel GEMM's
    /// partial sums over all rows (`[rows, d]` + `[T, d]`), 0 otherwise.
    seq: u64,
}

impl LayerSizes {
    fn new(c: &ModelConfig, l: &LocalSizes, t: usize, sequence: bool, e: u64) -> Self {
        let rows = if sequence { t / l.tp_size } else { t };
        let sp = sequence && l.tp_size > 1;
        Self {
            r: b(rows * c.hidden_size, e),
            n: b(t * c.hidden_size, e),
            q: b(t * l.heads_local * c.head_dim, e),
            kv: b(t * l.kv_heads_local * c.head_dim, e),
            lse: b(t * l.heads_local, 4),
            i: b(t * l.intermediate_local, e),
            seq: if sp {
                b((rows + t) * c.hidden_size, e)
            } else {
                0
            },
        }
    }

    /// One `LayerBuffers` set: normed_attn, q, k, v, attn, (lse), normed_mlp, gate, up, act.
    fn buffers(&self, with_lse: bool) -> u64 {
        let lse = if with_lse { self.lse } else { 0 };
        self.seq + 2 * self.n + 2 * self.q + 2 * self.kv + lse + 3 * self.i
    }
}

/// A training run's shape, for one rank's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainingSetup {
    pub tp: usize,
    pub dp: usize,
    /// Tokens of the largest micro-batch (a sequence longer than `--micro-batch-tokens` runs
    /// alone, so at least the longest sequence).
    pub tokens: usize,
    /// An engine shares the GPU (the RL loop, DESIGN.md 14): its weights stay, its KV cache is
    /// released while the trainer runs.
    pub colocated_engine: bool,
}

/// The training plan of tensor-parallel rank `tp_rank` in the replica with the largest ZeRO-1
/// share.
pub fn training_plan(
    config: &ModelConfig,
    setup: &TrainingSetup,
    target: &Target,
    tp_rank: usize,
) -> Result<MemoryPlan> {
    let TrainingSetup { tp, dp, tokens, .. } = *setup;
    ensure!(dp > 0, "data-parallel size 0");
    ensure!(tokens > 0, "a micro-batch of 0 tokens");
    let local = config.shard(tp, tp_rank)?;
    let params = local_parameters(config, &local);
    let w = target.weight_bytes;
    let share = zero_share(config, &local, dp);
    let mut resident = vec![
        part(
            format!("weights ({} parameters)", grouped(params)),
            b(params, w),
        ),
        part("f32 gradients", b(params, 4)),
        part(
            format!(
                "f32 masters + 2 moments of {} (ZeRO-1 / {dp})",
                grouped(share)
            ),
            b(share, 12),
        ),
    ];
    if setup.colocated_engine {
        resident.push(part(
            "engine's weights (colocated; KV cache released)",
            b(params, w),
        ));
    }
    resident.extend(target.fixed(1 + u64::from(setup.colocated_engine)));
    let t = tokens.next_multiple_of(tp);
    let what = format!(
        "training: micro-batch of {} tokens ({} rows a rank between blocks), TP rank {tp_rank} of {tp}",
        grouped(t),
        grouped(t / tp)
    );
    Ok(MemoryPlan {
        what,
        resident,
        phases: training_phases(config, &local, t, target),
    }
    .with_nonzero_parts())
}

/// The backend's own scratch in a training step, bytes.
struct StepScratch {
    /// The fused loss's working set: `LossTiles::scratch_bytes` on CUDA (the rank's vocabulary
    /// rows), the reference's two `ROW_CHUNK x VOCAB_CHUNK` f32 tiles on the CPU.
    loss_tiles: u64,
    /// `rmsnorm_backward`'s f32 partial weight gradients (CUDA).
    rmsnorm_partial: u64,
    /// Flash backward's lse_log2 and delta `[heads, T]` and dq_accum `[T, heads, head_dim]`,
    /// f32 (CUDA).
    flash: u64,
    /// A reduce-scatter of `[T, d]` staged through host memory (the CPU's collectives).
    staging: u64,
}

fn step_scratch(c: &ModelConfig, l: &LocalSizes, t: usize, target: &Target) -> StepScratch {
    let (d, heads) = (c.hidden_size, l.heads_local);
    match target.kind {
        TargetKind::Cpu => StepScratch {
            loss_tiles: b(2 * ROW_CHUNK * VOCAB_CHUNK, 4),
            rmsnorm_partial: 0,
            flash: 0,
            staging: host_reduce_scatter(l.tp_size, t * d),
        },
        TargetKind::Cuda { num_sms, .. } => StepScratch {
            loss_tiles: LossTiles::DEFAULT.scratch_bytes(t, l.vocab_local, d) as u64,
            rmsnorm_partial: b(rmsnorm_bwd_grid(t / l.tp_size, num_sms).0 * d, 4),
            flash: b(2 * heads * t + t * heads * c.head_dim, 4),
            staging: 0,
        },
    }
}

/// The four phases of [`training_plan`] for a (padded) micro-batch of `t` tokens.
fn training_phases(c: &ModelConfig, l: &LocalSizes, t: usize, target: &Target) -> Vec<Phase> {
    let s = LayerSizes::new(c, l, t, true, target.activation_bytes);
    let x = step_scratch(c, l, t, target);
    let (layers, tp) = (c.num_hidden_layers as u64, l.tp_size);
    let kept = |n: u64| part(format!("kept layer inputs ({n} x [T/{tp}, d])"), n * s.r);
    // Alive from the loss to the end of the backward.
    let outer = vec![
        part(
            "final hidden states [T, d] + the final norm's input",
            s.n + s.r,
        ),
        part("d_hidden [T, d]", s.n),
        host_rows(t, target),
    ];
    // Alive through a layer's backward: the residual gradient, and the recomputed activations
    // (the buffers moved into LayerActivations, sequence pair dropped, + the x_in / x_mid copies).
    let layer = vec![
        part("backward's d_x and d_mine [T/tp, d]", 2 * s.r),
        part(
            "recomputed layer activations (+ x_in, x_mid)",
            s.buffers(true) - s.seq + 2 * s.r,
        ),
    ];
    let grad_scratch = part(
        "layer backward's d_all, d_normed [T, d], d_mine",
        2 * s.n + s.r,
    );
    let staging = part(
        "collective staging (host-staged reduce-scatter of [T, d])",
        x.staging,
    );
    let vocab = grouped(l.vocab_local);
    let phase = |name, parts: &[Vec<Component>]| Phase {
        name,
        components: parts.concat(),
    };
    vec![
        phase(
            "loss",
            &[
                vec![kept(layers)],
                outer.clone(),
                vec![part(
                    format!("fused loss tiles (vocabulary {vocab} a rank)"),
                    x.loss_tiles,
                )],
            ],
        ),
        phase(
            "recompute",
            &[
                vec![kept(layers)],
                outer.clone(),
                layer.clone(),
                vec![part("stream's delta [T/tp, d]", s.r)],
            ],
        ),
        phase(
            "MLP bwd",
            &[
                vec![kept(layers - 1)],
                outer.clone(),
                layer.clone(),
                vec![
                    grad_scratch.clone(),
                    part("d_act, d_gate, d_up [T, I/tp]", 3 * s.i),
                    staging.clone(),
                    part("RMSNorm backward partials (f32)", x.rmsnorm_partial),
                ],
            ],
        ),
        phase(
            "attn bwd",
            &[
                vec![kept(layers - 1)],
                outer,
                layer,
                vec![
                    grad_scratch,
                    part("d_attn, d_q, d_k, d_v", 2 * s.q + 2 * s.kv),
                    part("flash backward's dq accumulator, lse, delta (f32)", x.flash),
                    staging,
                ],
            ],
        ),
    ]
}

/// The CPU step's per-token host arrays (they are host memory on a GPU too, so only the CPU
/// plan counts them): the packed batch's tokens and positions, targets, action mask, advantages,
/// rollout logprobs (21 bytes a token, `run_micro_batch`), the loss's row statistics (32), lse
/// and coef (16) and the reported logprobs and entropies (8, `loss_and_backward`).
fn host_rows(t: usize, target: &Target) -> Component {
    let bytes = if target.is_cpu() { b(t, 77) } else { 0 };
    part("host per-token arrays (batch, loss rows)", bytes)
}

impl MemoryPlan {
    /// Drops zero-byte components (what does not exist on this target or at TP 1).
    fn with_nonzero_parts(mut self) -> Self {
        self.resident.retain(|c| c.bytes > 0);
        for phase in &mut self.phases {
            phase.components.retain(|c| c.bytes > 0);
        }
        self
    }
}

/// The rank whose [`training_plan`] peaks highest (rank 0, whose runs are the longest, unless
/// the KV layout says otherwise).
pub fn largest_training_plan(
    config: &ModelConfig,
    setup: &TrainingSetup,
    target: &Target,
) -> Result<MemoryPlan> {
    let mut best: Option<MemoryPlan> = None;
    for rank in 0..setup.tp.max(1) {
        let plan = training_plan(config, setup, target, rank)?;
        if best.as_ref().is_none_or(|b| plan.peak().1 > b.peak().1) {
            best = Some(plan);
        }
    }
    best.ok_or_else(|| anyhow::anyhow!("tensor-parallel size 0"))
}

/// A rollout engine's shape, for one rank's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolloutSetup {
    pub tp: usize,
    /// Data-parallel replicas of the colocated trainer (its ZeRO-1 share).
    pub dp: usize,
    /// Sequences whose KV the cache holds at once (group x tasks in flight).
    pub sequences: usize,
    /// Tokens of each (the worst case: every sequence at the full context).
    pub context: usize,
    /// Rows of one engine step (`max_num_batched_tokens`).
    pub step_tokens: usize,
    /// Sequences the scheduler runs at once (`max_num_seqs`).
    pub max_num_seqs: usize,
    pub block_size: usize,
    /// What a trainer sharing the GPU (the RL loop) keeps on it during the rollouts.
    pub colocated_trainer: ColocatedTrainer,
}

/// What a trainer sharing the GPUs with the rollouts keeps on them while they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColocatedTrainer {
    /// No trainer: the engine alone (`swerve-serve`).
    Absent,
    /// Everything it trains with: weights, f32 gradients, masters and moments.
    KeepsEverything,
    /// Weights, masters and moments: the RL loop gives the gradients back
    /// (`Trainer::release_training_memory`), `swerve-train rl`'s default.
    GradientsReleased,
    /// Weights only: `--offload-optimizer` moves the masters and moments to host memory too.
    OptimizerOffloaded,
}

/// The rollout plan of tensor-parallel rank `tp_rank`.
pub fn rollout_plan(
    config: &ModelConfig,
    setup: &RolloutSetup,
    target: &Target,
    tp_rank: usize,
) -> Result<MemoryPlan> {
    let RolloutSetup {
        tp,
        sequences,
        context,
        block_size,
        ..
    } = *setup;
    ensure!(
        sequences > 0 && context > 0,
        "{sequences} sequences of {context} tokens"
    );
    ensure!(
        setup.step_tokens > 0 && setup.max_num_seqs > 0 && block_size > 0,
        "{setup:?}"
    );
    let local = config.shard(tp, tp_rank)?;
    let params = local_parameters(config, &local);
    let w = target.weight_bytes;
    let weights = format!("engine's weights ({} parameters)", grouped(params));
    let mut resident = vec![part(weights, b(params, w))];
    resident.extend(colocated_trainer_parts(config, &local, setup, w));
    // One null block besides the sequences' own (`EngineConfig::num_blocks` counts it).
    let blocks = sequences * context.div_ceil(block_size) + 1;
    let per_token =
        PagedKv::<()>::bytes_per_token(config, &local, target.activation_bytes as usize);
    resident.push(part(
        format!(
            "KV cache: {sequences} x {} tokens x {} B (+ null block)",
            grouped(context),
            grouped(per_token)
        ),
        kv_cache_bytes(config, &local, blocks, block_size, target.activation_bytes),
    ));
    let running = sequences.min(setup.max_num_seqs);
    if let TargetKind::Cuda { .. } = target.kind {
        // Pure decode steps replay graphs whose buffers stay in the graph pool; larger batches
        // than the last bucket run eagerly.
        if let Some(&bucket) = BATCH_BUCKETS.iter().find(|&&n| n >= running) {
            let step = EngineStep::Decode { sequences: bucket };
            let decode = step_activations(config, &local, target, step, context)?;
            resident.push(part(
                format!("decode-step buffers (CUDA graph pool, batch {bucket})"),
                decode.iter().map(|c| c.bytes).sum(),
            ));
        }
    }
    let colocated = setup.colocated_trainer != ColocatedTrainer::Absent;
    resident.extend(target.fixed(1 + u64::from(colocated)));
    let rows = setup.step_tokens.min(context);
    let sampled = running.min(rows);
    let what = format!(
        "rollouts: {sequences} sequences of {} tokens, steps of {} rows, TP rank {tp_rank} of {tp}",
        grouped(context),
        grouped(rows)
    );
    let step = EngineStep::Prefill { rows, sampled };
    let step = step_activations(config, &local, target, step, context)?;
    Ok(MemoryPlan {
        what,
        resident,
        phases: vec![Phase {
            name: "step",
            components: step,
        }],
    }
    .with_nonzero_parts())
}

/// What a colocated trainer keeps on one rank during the rollouts (nothing when absent).
fn colocated_trainer_parts(
    config: &ModelConfig,
    local: &LocalSizes,
    setup: &RolloutSetup,
    weight_bytes: u64,
) -> Vec<Component> {
    use ColocatedTrainer::*;
    let params = local_parameters(config, local);
    let mut parts = Vec::new();
    if setup.colocated_trainer == Absent {
        return parts;
    }
    parts.push(part(
        "trainer's weights (colocated)",
        b(params, weight_bytes),
    ));
    if setup.colocated_trainer == KeepsEverything {
        parts.push(part("trainer's f32 gradients (kept)", b(params, 4)));
    }
    if matches!(setup.colocated_trainer, KeepsEverything | GradientsReleased) {
        parts.push(part(
            format!("trainer's masters + 2 moments (ZeRO-1 / {})", setup.dp),
            b(zero_share(config, local, setup.dp), 12),
        ));
    }
    parts
}

/// The KV cache tokens one rank's rollouts could hold on a card of `capacity` bytes beside
/// everything else `plan` (a [`rollout_plan`]) holds at its peak: whole blocks of `block_size`
/// tokens of `bytes_per_token` each (`PagedKv::bytes_per_token`), the null block aside.
pub fn kv_tokens_that_fit(
    plan: &MemoryPlan,
    capacity: u64,
    bytes_per_token: u64,
    block_size: usize,
) -> u64 {
    let others = plan.peak().1 - plan.resident_named("KV cache");
    let block = bytes_per_token * block_size as u64;
    let blocks = capacity.saturating_sub(others) / block.max(1);
    blocks.saturating_sub(1) * block_size as u64
}

/// What one engine step computes.
#[derive(Clone, Copy, Debug)]
enum EngineStep {
    /// `rows` query rows of one sequence at the end of its context (a chunked prefill), and
    /// `sampled` rows through the LM head (other sequences' decode rows share a step's budget).
    Prefill { rows: usize, sampled: usize },
    /// One row for each of `sequences` sequences at the context.
    Decode { sequences: usize },
}

/// One engine step over the paged cache of `context`-token sequences: `run_layers` with nothing
/// kept (the embedding as the residual, the delta, one buffer set without lse, the hidden
/// states), the split-KV scratch, the sampled rows' logits (after the layers' buffers are gone,
/// but counted with them: a small overestimate).
fn step_activations(
    c: &ModelConfig,
    l: &LocalSizes,
    target: &Target,
    step: EngineStep,
    context: usize,
) -> Result<Vec<Component>> {
    let e = target.activation_bytes;
    let (rows, sampled) = match step {
        EngineStep::Prefill { rows, sampled } => (rows, sampled),
        EngineStep::Decode { sequences } => (sequences, sequences),
    };
    let s = LayerSizes::new(c, l, rows, false, e);
    let gathered_logits = if l.tp_size > 1 { c.vocab_size } else { 0 };
    let mut parts = vec![
        part(
            format!("step activations ({} rows)", grouped(rows)),
            3 * s.n + s.buffers(false),
        ),
        part(
            format!("LM-head rows and f32 logits ({sampled} sampled)"),
            b(sampled * c.hidden_size, e) + b(sampled * (l.vocab_local + gathered_logits), 4),
        ),
    ];
    match target.kind {
        TargetKind::Cpu => parts.push(part(
            "collective staging (host-staged all-reduce of [rows, d])",
            host_all_reduce(l.tp_size, rows * c.hidden_size),
        )),
        TargetKind::Cuda { num_sms, .. } => {
            let group = l.heads_local / l.kv_heads_local;
            let (cu_query, context_lens): (Vec<u32>, Vec<u32>) = match step {
                EngineStep::Prefill { rows, .. } => (vec![0, rows as u32], vec![context as u32]),
                EngineStep::Decode { sequences } => (
                    (0..=sequences as u32).collect(),
                    vec![context as u32; sequences],
                ),
            };
            let kv_heads = l.kv_heads_local;
            let plan = WorkPlan::build(&cu_query, &context_lens, group, kv_heads, num_sms, None)?;
            // part_o [scratch_rows, heads, hd] and part_stats [scratch_rows, heads] (max, sum),
            // f32: one row per split row and 512-key segment.
            let scratch = b(plan.scratch_rows * l.heads_local * (c.head_dim + 2), 4);
            parts.push(part("split-KV attention scratch (f32)", scratch));
        }
    }
    Ok(parts)
}

/// The context-parallel degree a training run would need to fit `capacity` bytes a GPU when
/// tensor and sequence parallelism alone do not: each CP rank takes `T / cp` of the micro-batch's
/// tokens (activations and the attention's sequence divided by `cp`), and the GPUs of `dp`
/// replicas regroup into `dp / cp` replicas (the ZeRO-1 share grows). Ring attention's K/V
/// chunks in flight are not counted (not implemented).
#[derive(Clone, Debug, PartialEq)]
pub struct ContextParallel {
    pub cp: usize,
    pub dp: usize,
    /// Peak transient bytes before and after.
    pub activations: (u64, u64),
    /// The plan at that degree.
    pub plan: MemoryPlan,
}

/// `None` when the run fits as it is; an error when no degree dividing `dp` makes it fit.
pub fn context_parallel_needed(
    config: &ModelConfig,
    setup: &TrainingSetup,
    target: &Target,
    capacity: u64,
) -> Result<Option<ContextParallel>> {
    let base = largest_training_plan(config, setup, target)?;
    if base.peak().1 <= capacity {
        return Ok(None);
    }
    for cp in 2..=setup.dp {
        if !setup.dp.is_multiple_of(cp) || setup.tokens.div_ceil(cp) < setup.tp {
            continue;
        }
        let shrunk = TrainingSetup {
            dp: setup.dp / cp,
            tokens: setup.tokens.div_ceil(cp),
            ..*setup
        };
        let plan = largest_training_plan(config, &shrunk, target)?;
        if plan.peak().1 <= capacity {
            return Ok(Some(ContextParallel {
                cp,
                dp: shrunk.dp,
                activations: (base.peak_transient(), plan.peak_transient()),
                plan,
            }));
        }
    }
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let resident = base.resident_bytes();
    if resident >= capacity {
        bail!(
            "the resident state alone ({:.1} GiB: weights, f32 gradients, the ZeRO-1 share) is \
             over the card's {:.1} GiB, and context parallelism divides only the activations",
            gib(resident),
            gib(capacity)
        );
    }
    bail!(
        "no context-parallel degree dividing DP {} fits (the ZeRO-1 share grows as DP shrinks)",
        setup.dp
    )
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
