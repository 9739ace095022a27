//! `swerve-bench plan`: the per-GPU memory plan of training and rollouts ([`crate::bench::plan`])
//! for a model, a number of GPUs of a given memory and the run's sizes, as tables; where training
//! does not fit with tensor and sequence parallelism alone, the context-parallel degree that
//! would make it fit; in `rl` mode, the KV cache the rollouts win by what the trainer gives back
//! while they run. Nothing runs on a device.

use crate::bench::plan::{
    context_parallel_needed, grouped, kv_tokens_that_fit, largest_training_plan, rollout_plan,
    ColocatedTrainer, MemoryPlan, RolloutSetup, Target, TrainingSetup,
};
use crate::config::ModelConfig;
use crate::model::{synthetic, PagedKv};
use anyhow::{anyhow, bail, Context, Result};
use std::path::PathBuf;

/// Which halves of the RL loop share the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanMode {
    /// The RL loop in one process (DESIGN.md 14): trainer and engine on the same GPUs.
    Rl,
    /// `swerve-train rft`/`dapo` alone.
    Train,
    /// `swerve-serve` alone.
    Serve,
}

impl std::str::FromStr for PlanMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "rl" => Ok(Self::Rl),
            "train" => Ok(Self::Train),
            "serve" => Ok(Self::Serve),
            other => Err(format!(
                "unknown mode {other:?}: expected rl, train or serve"
            )),
        }
    }
}

pub struct PlanOptions {
    /// A `synthetic::preset` name (used when `model` is `None`).
    pub preset: String,
    /// A model folder whose `config.json` is planned for instead of a preset.
    pub model: Option<PathBuf>,
    pub gpus: usize,
    /// Memory of one GPU, GiB.
    pub gpu_memory: f64,
    /// `None`: the GPUs of one 8-GPU node, `gcd(gpus, 8)`.
    pub tp: Option<usize>,
    /// `None`: `gpus / tp`.
    pub dp: Option<usize>,
    /// `None`: the model's context.
    pub context: Option<usize>,
    /// `None`: the context (one sequence a micro-batch).
    pub micro_batch_tokens: Option<usize>,
    pub group: usize,
    /// Tasks whose G rollouts an engine (one model replica) serves at once.
    pub tasks_in_flight: usize,
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub mode: PlanMode,
    /// GiB a GPU loses to what the code does not allocate (CUDA context, modules).
    pub reserve: f64,
    /// SMs of the GPU (the split-KV and RMSNorm-backward grids).
    pub num_sms: usize,
}

const GIB: f64 = (1u64 << 30) as f64;

/// The plan's inputs, validated.
struct Run {
    name: String,
    config: ModelConfig,
    tp: usize,
    dp: usize,
    context: usize,
    tokens: usize,
    capacity: u64,
    target: Target,
}

pub fn plan(options: &PlanOptions) -> Result<()> {
    let run = validate(options)?;
    let (tp, dp) = (run.tp, run.dp);
    println!(
        "swerve-bench plan: {} ({:.2} B parameters) on {} GPU{} of {:.1} GiB: TP {tp} x DP {dp}, context {}",
        run.name,
        run.config.num_parameters() as f64 / 1e9,
        options.gpus,
        if options.gpus == 1 { "" } else { "s" },
        options.gpu_memory,
        grouped(run.context)
    );
    let training = match options.mode {
        PlanMode::Serve => "",
        _ => {
            "; f32 gradients, masters and moments; ZeRO-1 by whole tensors; per-layer \
             activation checkpointing with sequence parallelism"
        }
    };
    println!(
        "assumptions: bf16 weights and activations{training}; every sequence at the full \
         context; the largest rank's shard; GiB = 2^30 bytes"
    );
    if options.mode != PlanMode::Serve {
        let setup = TrainingSetup {
            tp,
            dp,
            tokens: run.tokens,
            colocated_engine: options.mode == PlanMode::Rl,
        };
        let training = largest_training_plan(&run.config, &setup, &run.target)?;
        println!();
        print_plan(&training, run.capacity);
        print_context_parallel(&run, &setup)?;
    }
    if options.mode != PlanMode::Train {
        let setup = RolloutSetup {
            tp,
            dp,
            sequences: options.group * options.tasks_in_flight,
            context: run.context,
            step_tokens: options.max_num_batched_tokens,
            max_num_seqs: options.max_num_seqs,
            block_size: crate::kvcache::DEFAULT_BLOCK_SIZE,
            colocated_trainer: match options.mode {
                PlanMode::Rl => ColocatedTrainer::GradientsReleased,
                _ => ColocatedTrainer::Absent,
            },
        };
        let rollouts = rollout_plan(&run.config, &setup, &run.target, 0)?;
        println!();
        print_plan(&rollouts, run.capacity);
        print_sequences_that_fit(&run, &setup, &rollouts)?;
        if options.mode == PlanMode::Rl {
            print_colocated_capacity(&run, &setup)?;
        }
    }
    Ok(())
}

/// Every flag checked, each error naming its flag.
fn validate(options: &PlanOptions) -> Result<Run> {
    let (name, config) = match &options.model {
        Some(dir) => (
            dir.display().to_string(),
            ModelConfig::from_dir(dir).context("--model")?,
        ),
        None => {
            let (config, _) = synthetic::preset(&options.preset).context("--preset")?;
            (options.preset.clone(), config)
        }
    };
    let gpus = options.gpus;
    if gpus == 0 {
        bail!("--gpus must be at least 1");
    }
    let memory = options.gpu_memory;
    if !(memory.is_finite() && memory > 0.0) {
        bail!("--gpu-memory must be a positive number of GiB, found {memory}");
    }
    if !(options.reserve.is_finite() && options.reserve >= 0.0 && options.reserve < memory) {
        bail!(
            "--reserve must be a number of GiB from 0 to below --gpu-memory, found {}",
            options.reserve
        );
    }
    let tp = options.tp.unwrap_or_else(|| gcd(gpus, 8));
    if tp == 0 || !gpus.is_multiple_of(tp) {
        bail!("--tp {tp} does not divide --gpus {gpus}");
    }
    config
        .shard(tp, 0)
        .map_err(|e| anyhow!("--tp {tp}: {e:#}"))?;
    let dp = options.dp.unwrap_or(gpus / tp);
    if dp * tp != gpus {
        bail!(
            "--tp {tp} x --dp {dp} is {} GPUs, not --gpus {gpus}",
            dp * tp
        );
    }
    let max_context = config.max_context();
    let context = options.context.unwrap_or(max_context);
    if context == 0 || context > max_context {
        bail!(
            "--context {context} must be from 1 to the model's {max_context} positions{}",
            if context > max_context {
                " (a `-yarn4` preset or a config with YaRN rope_scaling reaches 4 x)"
            } else {
                ""
            }
        );
    }
    let micro = options.micro_batch_tokens.unwrap_or(context);
    for (flag, value) in [
        ("--micro-batch-tokens", micro),
        ("--group", options.group),
        ("--tasks-in-flight", options.tasks_in_flight),
        ("--max-num-batched-tokens", options.max_num_batched_tokens),
        ("--max-num-seqs", options.max_num_seqs),
        ("--num-sms", options.num_sms),
    ] {
        if value == 0 {
            bail!("{flag} must be positive");
        }
    }
    Ok(Run {
        name,
        config,
        tp,
        dp,
        context,
        // A sequence longer than the micro-batch budget runs alone.
        tokens: micro.max(context),
        capacity: (memory * GIB) as u64,
        target: Target::cuda(options.num_sms, (options.reserve * GIB) as u64),
    })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

const NAME: usize = 60;
const COLUMN: usize = 10;

/// The plan as a table: resident parts, each phase's transient parts in a column, the totals,
/// and the peak against the card.
pub fn print_plan(plan: &MemoryPlan, capacity: u64) {
    println!("{}", plan.what);
    println!("  {:<NAME$}{:>COLUMN$}", "resident", "GiB");
    for c in &plan.resident {
        println!("  {:<NAME$}{:>COLUMN$.2}", c.name, gib(c.bytes));
    }
    println!(
        "  {:<NAME$}{:>COLUMN$.2}",
        "resident total",
        gib(plan.resident_bytes())
    );
    let mut names: Vec<&str> = Vec::new();
    for phase in &plan.phases {
        for c in &phase.components {
            if !names.contains(&c.name.as_str()) {
                names.push(&c.name);
            }
        }
    }
    let header: String = plan
        .phases
        .iter()
        .map(|p| format!("{:>COLUMN$}", p.name))
        .collect();
    println!("  {:<NAME$}{header}", "transient, by phase");
    for name in names {
        let cells: String = plan
            .phases
            .iter()
            .map(|p| match p.components.iter().find(|c| c.name == name) {
                Some(c) => format!("{:>COLUMN$.2}", gib(c.bytes)),
                None => format!("{:>COLUMN$}", "-"),
            })
            .collect();
        println!("  {name:<NAME$}{cells}");
    }
    let totals: String = plan
        .phases
        .iter()
        .map(|p| format!("{:>COLUMN$.2}", gib(plan.resident_bytes() + p.bytes())))
        .collect();
    println!("  {:<NAME$}{totals}", "total");
    let (phase, peak) = plan.peak();
    let verdict = if peak <= capacity {
        format!("fits ({:.1} GiB to spare)", gib(capacity - peak))
    } else {
        format!("does not fit ({:.1} GiB over)", gib(peak - capacity))
    };
    println!(
        "peak: {}, {:.1} of {:.1} GiB: {verdict}",
        phase.name,
        gib(peak),
        gib(capacity)
    );
}

/// Where training does not fit: the context-parallel degree that would, from the plan's own
/// numbers.
fn print_context_parallel(run: &Run, setup: &TrainingSetup) -> Result<()> {
    match context_parallel_needed(&run.config, setup, &run.target, run.capacity) {
        Ok(None) => Ok(()),
        Ok(Some(cp)) => {
            let (before, after) = cp.activations;
            println!(
                "needs context parallelism {}: activations {:.1} GiB -> {:.1} GiB (TP {} x CP {} x DP {}; peak {:.1} GiB; not implemented yet)",
                cp.cp,
                gib(before),
                gib(after),
                run.tp,
                cp.cp,
                cp.dp,
                gib(cp.plan.peak().1)
            );
            Ok(())
        }
        Err(e) => {
            println!("context parallelism would not make it fit: {e:#}");
            Ok(())
        }
    }
}

/// How many sequences at the full context the cache could hold beside everything else.
fn print_sequences_that_fit(run: &Run, setup: &RolloutSetup, plan: &MemoryPlan) -> Result<()> {
    let one = RolloutSetup {
        sequences: 1,
        ..*setup
    };
    let two = RolloutSetup {
        sequences: 2,
        ..*setup
    };
    let per_sequence = plan_kv(&rollout_plan(&run.config, &two, &run.target, 0)?)
        - plan_kv(&rollout_plan(&run.config, &one, &run.target, 0)?);
    let others = plan.peak().1 - plan_kv(plan);
    let room = run.capacity.saturating_sub(others);
    println!(
        "at most {} sequences of {} tokens fit beside the rest ({:.2} GiB of KV each a GPU)",
        room / per_sequence.max(1),
        grouped(run.context),
        gib(per_sequence)
    );
    Ok(())
}

fn plan_kv(plan: &MemoryPlan) -> u64 {
    plan.resident_named("KV cache")
}

/// The KV cache the colocated rollouts hold a GPU, by what the trainer keeps meanwhile: each
/// row's gain over the row above is what giving that part back wins.
fn print_colocated_capacity(run: &Run, setup: &RolloutSetup) -> Result<()> {
    use ColocatedTrainer::*;
    let local = run.config.shard(run.tp, 0)?;
    let elem = run.target.activation_bytes as usize;
    let per_token = PagedKv::<()>::bytes_per_token(&run.config, &local, elem) as u64;
    println!("KV cache of the colocated rollouts a GPU, by what the trainer keeps while they run:");
    let mut above: Option<u64> = None;
    for kept in [KeepsEverything, GradientsReleased, OptimizerOffloaded] {
        let setup = RolloutSetup {
            colocated_trainer: kept,
            ..*setup
        };
        let plan = rollout_plan(&run.config, &setup, &run.target, 0)?;
        let tokens = kv_tokens_that_fit(&plan, run.capacity, per_token, setup.block_size);
        let gain = match above {
            Some(a) => format!(" (+{})", grouped(tokens.saturating_sub(a) as usize)),
            None => String::new(),
        };
        let what = match kept {
            KeepsEverything => "trainer keeps gradients and optimizer state",
            GradientsReleased => "gradients given back (rl's default)",
            _ => "and the optimizer state offloaded (--offload-optimizer)",
        };
        println!(
            "  {what:<56}{:>11} tokens{gain}: {} sequences of {}",
            grouped(tokens as usize),
            tokens / run.context as u64,
            grouped(run.context)
        );
        above = Some(tokens);
    }
    Ok(())
}
