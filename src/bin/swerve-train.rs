//! swerve-train: training-side commands. `score` computes per-token logprobs of given token
//! sequences; `tokenize` shows a data file as the trainer tokenizes it; `rft` (masked
//! cross-entropy on successful trajectories) and `dapo` (the clipped policy-gradient step on
//! rollout groups) train, as ../shared/RL-SPEC.md specifies; `rollout` and `eval` run agent
//! episodes on coding tasks in sandboxes; `rl` runs the whole loop; `report` writes a run's
//! episodes as HTML pages. This file only parses arguments: each command is a function of the
//! library.

use anyhow::Result;
use clap::Subcommand;
#[path = "swerve_train_cli/envs.rs"]
mod envs;
#[path = "swerve_train_cli/sandbox_args.rs"]
mod sandbox_args;
use sandbox_args::SandboxArgs;
use std::path::PathBuf;
use swerve::agent::command::{run_agent, AgentRunOptions};
use swerve::agent::episode::EpisodeConfig;
use swerve::backend::DeviceChoice;
use swerve::cli::numbers::{
    eps_low_f32, non_negative_f32, non_negative_f64, positive_f32, positive_f64,
};
use swerve::cli::{ConfigSpec, Parsed, ResolvedConfig};
use swerve::rl::report::ReportOptions;
use swerve::rl::{RlDefaults, RlOptions};
use swerve::train::optimizer::LrSchedule;
use swerve::train::run_dir::{decimal, RunStart};
use swerve::train::trainer::{Algorithm, OldLogprobs, Parallel, TrainOptions};

/// `rft`'s default `--lr` (RL-SPEC: the paper's RFT).
const RFT_LR: f64 = 5e-6;
/// `dapo`'s default `--lr` and `--eps-high` (DAPO's own).
const DAPO_LR: f64 = 1e-6;
const DAPO_EPS_HIGH: f32 = 0.28;

/// The commands that take `--config FILE.toml` (src/cli/, docs/config.md); `--resume` and
/// `--overwrite` say how to treat OUT, so OUT/config.toml leaves them out.
const CONFIG: ConfigSpec = ConfigSpec {
    subcommands: &["rl", "rollout", "eval", "rft", "dapo"],
    not_recorded: &["resume", "overwrite"],
};

#[derive(clap::Parser)]
#[command(
    name = "swerve-train",
    version,
    about = "swerve's training-side commands"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// GEMMs with one configuration per shape class for every batch size, so that a rollout's
    /// logprobs equal the trainer's bit for bit on GPUs (docs/training.md, "Exact on-policy logprobs");
    /// `false`: cuBLASLt's per-shape choice (faster decode, logprobs within rounding).
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set)]
    exact_logprobs: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Per-token logprobs of given token sequences: input lines {"tokens": [...]}, output lines
    /// {"logprobs": [null, lp1, ...]} with lp_t = log p(tokens[t] | tokens[<t]).
    Score {
        /// Model folder: config.json plus model.safetensors or a sharded index.
        #[arg(long)]
        model: PathBuf,
        #[command(flatten)]
        files: JsonlFiles,
        /// Most tokens packed into one forward pass (a longer sequence runs alone).
        #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
        batch_tokens: u64,
        #[command(flatten)]
        device: DeviceArgs,
        /// Tensor-parallel ranks, a thread (and GPU) each: the model split over them.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        tensor_parallel: u64,
    },
    /// A data file as the trainer tokenizes it: input lines {"text": ...} or {"messages": [...],
    /// "tools": [...]}, output lines {"tokens": [...], "action_mask": [...]}.
    Tokenize {
        /// Folder with tokenizer.json (and tokenizer_config.json for the chat template); a model
        /// folder or a swerve checkpoint works.
        #[arg(long)]
        tokenizer: PathBuf,
        #[command(flatten)]
        files: JsonlFiles,
    },
    /// Rejection fine-tuning: masked cross-entropy on the action tokens of successful
    /// trajectories (token lines or chat `messages`).
    Rft {
        #[command(flatten)]
        args: TrainArgs,
    },
    /// DAPO: the clipped token-level policy-gradient objective over rollout groups.
    Dapo {
        #[command(flatten)]
        args: TrainArgs,
        #[command(flatten)]
        clip: ClipArgs,
        /// logp_old: `recompute` scores the data with the starting weights before the first
        /// update; `rollout` uses the data's `logprobs`.
        #[arg(long, default_value = "recompute", value_parser = ["recompute", "rollout"])]
        old_logprobs: String,
    },
    /// Agent episodes on coding tasks in sandboxes; writes OUT/trajectories.jsonl (RL-SPEC's
    /// format plus task, resolved, turns, finish and the chat form; `rft` and `dapo` read it) and
    /// OUT/rollout.json.
    Rollout {
        #[command(flatten)]
        args: AgentArgs,
        /// Write only resolved trajectories (RFT data).
        #[arg(long)]
        only_resolved: bool,
    },
    /// The whole method: rollouts, rewards, DAPO, weights back to the engine, iterated
    /// (RL-SPEC.md). Defaults are the paper's stage 1; `--tasks builtin:toy` brings the toy
    /// task's own schedule. Writes OUT/iterations.jsonl, OUT/metrics.jsonl, OUT/reward.png and
    /// OUT/iteration-N checkpoints.
    Rl {
        // Boxed: the largest variant by far (clippy's large_enum_variant).
        #[command(flatten)]
        args: Box<RlArgs>,
    },
    /// Resolved rate, pass@1 and pass@k (unbiased), mean turns and a per-task table; writes
    /// OUT/eval.json and OUT/trajectories.jsonl.
    Eval {
        #[command(flatten)]
        args: AgentArgs,
    },
    /// Environment housekeeping: `envs prepare` (the images a task file needs).
    Envs {
        #[command(subcommand)]
        command: envs::EnvsCommand,
    },
    /// Static HTML pages of a run's episodes (docs/report.md): per task the group's rewards,
    /// turns and finish reasons; each episode as its conversation, grading, diff and tokens.
    Report {
        /// The run folder: the OUT of `rollout` or `eval` (trajectories.jsonl), or of `rl
        /// --save-rollouts` (rollouts/iteration-N.jsonl).
        run: PathBuf,
        /// Where the pages go (default RUN/report); an earlier report there is replaced.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Folder with the tokenizer.json to decode token ids with (default: the run's own
        /// model's, found from what the run records).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
}

/// `--device`, shared by every command that runs a model.
#[derive(clap::Args)]
struct DeviceArgs {
    /// Where the model runs (the trainer and the rollout engine alike): auto (the GPU when there
    /// is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
}

/// `--tensor-parallel` and `--data-parallel`, for the training commands.
#[derive(clap::Args)]
struct ParallelArgs {
    /// Tensor-parallel ranks per model replica, a thread (and GPU) each: the model's heads, MLP
    /// columns and vocabulary split over them (Megatron layout, sequence-parallel training).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    tensor_parallel: u64,
    /// Data-parallel replicas in this process (each of --tensor-parallel ranks): micro-batches
    /// dealt over them, gradients summed, optimizer state sharded (ZeRO-1). A multi-process
    /// launch (torchrun, Slurm: docs/parallelism.md, "Multi-node training") multiplies them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    data_parallel: u64,
}

impl ParallelArgs {
    fn parallel(&self) -> Parallel {
        Parallel {
            tensor: self.tensor_parallel as usize,
            data: self.data_parallel as usize,
        }
    }
}

/// A JSON-lines input and output, shared by `score` and `tokenize` (the command's description
/// gives both formats).
#[derive(clap::Args)]
struct JsonlFiles {
    /// Input file: JSON lines, in the format the command's description gives; read one line at
    /// a time.
    #[arg(long)]
    input: PathBuf,
    /// Where to write one output line per input line (written whole or not at all).
    #[arg(long)]
    output: PathBuf,
}

/// The starting model of `rft`, `dapo` and `rl`.
#[derive(clap::Args)]
struct StartModelArgs {
    /// Starting model folder: config.json, safetensors, tokenizer files; or `preset:NAME`, the
    /// random-weight model of a swerve-bench preset (`preset:default`: the embedded default;
    /// `preset:toy`: the toy task's model, for `--tasks builtin:toy`), written to
    /// OUT/base-model and reused only when it is that preset's.
    #[arg(long)]
    model: PathBuf,
}

/// The output folder of `rft`, `dapo` and `rl`, and what to do with what is in it.
#[derive(clap::Args)]
struct RunDirArgs {
    /// Output folder: metrics, checkpoints (step-N/ or iteration-N/, final/), OUT/base-model for
    /// a preset model. It must be empty or absent, unless --resume or --overwrite.
    #[arg(long)]
    out: PathBuf,
    /// Continue the run in OUT from its latest checkpoint. Refused, naming each difference, when
    /// an option the checkpoint recorded (data, objective, schedule, batch size, seed, model, ...;
    /// docs/training.md, "Output folders and resuming") differs.
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// Delete what swerve wrote in OUT (metrics, checkpoints, base-model; nothing else) and start
    /// a new run there.
    #[arg(long)]
    overwrite: bool,
}

impl RunDirArgs {
    fn start(&self) -> RunStart {
        match (self.resume, self.overwrite) {
            (true, _) => RunStart::Resume,
            (false, true) => RunStart::Overwrite,
            (false, false) => RunStart::Fresh,
        }
    }
}

/// AdamW and micro-batching, shared by `rft`, `dapo` and `rl`.
#[derive(clap::Args)]
struct OptimizerArgs {
    /// Decoupled AdamW weight decay on 2-D weights (at least 0).
    #[arg(long, default_value_t = 0.1, value_parser = non_negative_f32)]
    weight_decay: f32,
    /// Global gradient-norm clipping (0: off).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_f64)]
    grad_clip: f64,
    /// Most tokens packed into one micro-batch (a longer trajectory runs alone); changes memory,
    /// not the step.
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u64).range(1..))]
    micro_batch_tokens: u64,
}

/// DAPO's clip ranges and truncated importance sampling, shared by `dapo` and `rl`.
#[derive(clap::Args)]
struct ClipArgs {
    /// Lower clip range, in [0, 1): rho below 1 - eps_low stops pushing down (A < 0).
    #[arg(long, default_value_t = 0.2, value_parser = eps_low_f32)]
    eps_low: f32,
    /// Upper clip range (at least 0): rho above 1 + eps_high stops pushing up (A > 0). Default:
    /// 0.28 for dapo; 0.3 for rl (stage 1; stage 2 used 0.26).
    #[arg(long, value_parser = non_negative_f32)]
    eps_high: Option<f32>,
    /// Truncated importance sampling: each token's term times min(exp(old - rollout), C), C > 0.
    #[arg(long, value_parser = positive_f32)]
    tis_cap: Option<f32>,
}

/// Options shared by `rollout` and `eval`.
#[derive(clap::Args)]
struct AgentArgs {
    /// Model folder or `preset:NAME` (written to OUT/base-model). Scripted policies need none:
    /// they use the model's tokenizer, or the embedded Qwen2.5 one.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Task file (JSON lines; docs/rollouts.md, "Tasks") or `builtin:NAME` (built in: python-bugs).
    #[arg(long)]
    tasks: String,
    /// Output folder.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Episodes per task (G: the group whose rewards give each other's advantages).
    #[arg(long, default_value_t = 10)]
    group: usize,
    /// Turns (assistant replies) per episode at most; T_max of the turn penalty.
    #[arg(long, default_value_t = 40)]
    max_turns: usize,
    /// L_thr of the turn penalty: episodes of this many turns or more lose reward.
    #[arg(long, default_value_t = 10)]
    turn_threshold: usize,
    /// A flagged change's reward: keep, zero (the resolved term dropped) or penalty (and 1 less).
    #[arg(long, default_value = "keep")]
    suspicious_reward: swerve::agent::reward::SuspiciousReward,
    /// The SWE-bench harness version (4 or 5) whose rules decide a listed test that skips
    /// (docs/grading.md, "Departures from SWE-bench's harness").
    #[arg(long, default_value = "5")]
    swebench_rules: swerve::env::HarnessRules,
    /// Context limit per episode in tokens (default: the model's context, at most 65536).
    #[arg(long)]
    max_context: Option<usize>,
    /// Tokens one reply may have at most (a longer one is cut and is a format error).
    #[arg(long, default_value_t = 4096)]
    max_turn_tokens: usize,
    /// Bytes of one tool result shown to the agent (cut in the middle beyond).
    #[arg(long, default_value_t = 16384)]
    observation_bytes: usize,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Sequences the in-process engine generates at once (its batch limit); also the number of
    /// sandboxes unless --sandboxes says otherwise.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seeds every episode's sampling (with the task id and sample index).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// model, oracle (applies the task's solution), noop (submits at once) or replay:FILE.
    #[arg(long, default_value = "model")]
    policy: String,
    /// A running swerve-serve (http://HOST:PORT) to sample from instead of an in-process engine.
    #[arg(long)]
    server: Option<String>,
    /// Bearer key for --server.
    #[arg(long)]
    api_key: Option<String>,
    /// Only the first N tasks of the file.
    #[arg(long)]
    limit_tasks: Option<usize>,
    #[command(flatten)]
    device: DeviceArgs,
}

impl AgentArgs {
    fn options(&self, only_resolved: bool, resolved_config: Option<String>) -> AgentRunOptions {
        AgentRunOptions {
            model: self.model.clone(),
            tasks: self.tasks.clone(),
            out: self.out.clone(),
            group: self.group,
            episode: EpisodeConfig {
                max_turns: self.max_turns,
                turn_threshold: self.turn_threshold,
                max_context: self.max_context.unwrap_or(65_536),
                max_turn_tokens: self.max_turn_tokens,
                observation_bytes: self.observation_bytes,
                infra_retries: self.sandbox.infra_retries,
                suspicious_reward: self.suspicious_reward,
            },
            max_context: self.max_context,
            env: self.sandbox.env,
            limits: self.sandbox.limits(),
            sandbox_binds: self.sandbox.sandbox_bind.clone(),
            docker_image: self.sandbox.image.clone(),
            docker_cli: self.sandbox.docker_cli.clone(),
            kubernetes: self.sandbox.kubernetes.options(),
            concurrency: self.concurrency,
            workers: self.sandbox.workers(self.concurrency),
            seed: self.seed,
            policy: self.policy.clone(),
            server: self.server.clone(),
            api_key: self.api_key.clone(),
            device: self.device.device,
            only_resolved,
            limit_tasks: self.limit_tasks,
            swebench_rules: self.swebench_rules,
            resolved_config,
        }
    }
}

/// `rl`'s options; unset ones take `RlDefaults::for_tasks` (stage 1, or the toy's).
#[derive(clap::Args)]
struct RlArgs {
    #[command(flatten)]
    model: StartModelArgs,
    /// Task file or `builtin:NAME` (python-bugs, toy).
    #[arg(long)]
    tasks: String,
    #[command(flatten)]
    run_dir: RunDirArgs,
    /// Iterations to run (stage 1: 100; the toy: 60); a resumed run may raise it.
    #[arg(long)]
    iterations: Option<usize>,
    /// Tasks rolled out per iteration (stage 1: 300; the toy: 8).
    #[arg(long)]
    tasks_per_iteration: Option<usize>,
    /// Rollouts per task (G; stage 1: 10; the toy: 16).
    #[arg(long)]
    group: Option<usize>,
    /// Trajectories per optimizer step (several steps per iteration; stage 1: 128; the toy: 32).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Peak learning rate of the DAPO steps (stage 1: 1e-6; the toy: 1e-3).
    #[arg(long, value_parser = positive_f64)]
    lr: Option<f64>,
    /// Optimizer steps of linear warmup, counted from DAPO's first step (RFT's steps do not
    /// count; stage 1: 10; the toy: 0).
    #[arg(long)]
    warmup_steps: Option<u64>,
    #[command(flatten)]
    optimizer: OptimizerArgs,
    #[command(flatten)]
    clip: ClipArgs,
    /// Turns (assistant replies) per episode at most; T_max of the turn penalty.
    #[arg(long)]
    max_turns: Option<usize>,
    /// L_thr of the turn penalty: episodes of this many turns or more lose reward.
    #[arg(long)]
    turn_threshold: Option<usize>,
    /// A flagged change's reward: keep, zero (the resolved term dropped) or penalty (and 1 less).
    #[arg(long, default_value = "keep")]
    suspicious_reward: swerve::agent::reward::SuspiciousReward,
    /// The SWE-bench harness version (4 or 5) whose rules decide a listed test that skips.
    #[arg(long, default_value = "5")]
    swebench_rules: swerve::env::HarnessRules,
    /// Context limit per episode (131072 with a YaRN model: stage 2).
    #[arg(long)]
    max_context: Option<usize>,
    /// Tokens one reply may have at most (a longer one is cut and is a format error).
    #[arg(long)]
    max_turn_tokens: Option<usize>,
    /// Bytes of one tool result shown to the agent (cut in the middle beyond).
    #[arg(long, default_value_t = 16384)]
    observation_bytes: usize,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Sequences the in-process engine generates at once (its batch limit; default 64); also
    /// the number of sandboxes unless --sandboxes says otherwise.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Seeds everything random: the task order, each episode's sampling, the batches.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Checkpoint every N iterations (and after the last).
    #[arg(long, default_value_t = 10)]
    save_every: usize,
    /// First collect K rollouts per task with the base model and RFT on the resolved ones.
    #[arg(long)]
    rft_first: Option<usize>,
    /// Skip the RFT phase the toy schedule has.
    #[arg(long)]
    no_rft_first: bool,
    /// Peak learning rate of the RFT phase, which decays by cosine to 0 over the phase's own
    /// steps (stage 1: 5e-6; the toy: 1e-3).
    #[arg(long, value_parser = positive_f64)]
    rft_lr: Option<f64>,
    /// Optimizer steps of linear warmup at the start of the RFT phase (stage 1: 10; the toy: 0).
    #[arg(long)]
    rft_warmup_steps: Option<u64>,
    /// Trajectories per RFT optimizer step (stage 1: 64; the toy: 32).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    rft_batch_size: Option<u64>,
    /// Epochs over the RFT phase's resolved rollouts.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    rft_epochs: u64,
    /// Write every iteration's episodes with their advantages to OUT/rollouts/iteration-N.jsonl
    /// (the `rollout` format plus `advantage` and `kept`; large at long context).
    #[arg(long)]
    save_rollouts: bool,
    /// Sample from a running swerve-serve (http://HOST:PORT), reloaded after each iteration.
    #[arg(long)]
    server: Option<String>,
    /// Bearer key for --server.
    #[arg(long)]
    api_key: Option<String>,
    #[command(flatten)]
    device: DeviceArgs,
    /// Tensor-parallel ranks of the learner and of the rollout engine, a thread (and GPU) each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    tensor_parallel: u64,
    /// Move the optimizer state (f32 masters and AdamW moments) to host memory while the
    /// rollouts run and back before the next step: more GPU memory for the KV cache, a copy each
    /// way per iteration, the same results.
    #[arg(long)]
    offload_optimizer: bool,
    /// Seconds from the start of each iteration's rollouts (and the RFT phase's) after which no
    /// episode starts and unfinished ones are stopped and dropped from training (counted as
    /// `dropped.deadline` in iterations.jsonl): stragglers never hold up the iteration.
    #[arg(long, value_parser = positive_f64)]
    rollout_deadline: Option<f64>,
}

impl RlArgs {
    fn options(&self, resolved_config: Option<String>) -> RlOptions {
        let d = RlDefaults::for_tasks(&self.tasks);
        let episode = EpisodeConfig {
            max_turns: self.max_turns.unwrap_or(d.max_turns),
            turn_threshold: self.turn_threshold.unwrap_or(d.turn_threshold),
            max_context: self.max_context.unwrap_or(65_536),
            max_turn_tokens: self.max_turn_tokens.unwrap_or(d.max_turn_tokens),
            observation_bytes: self.observation_bytes,
            infra_retries: self.sandbox.infra_retries,
            suspicious_reward: self.suspicious_reward,
        };
        RlOptions {
            agent: AgentRunOptions {
                model: Some(self.model.model.clone()),
                tasks: self.tasks.clone(),
                out: self.run_dir.out.clone(),
                group: self.group.unwrap_or(d.group),
                episode,
                max_context: self.max_context,
                env: self.sandbox.env,
                limits: self.sandbox.limits(),
                sandbox_binds: self.sandbox.sandbox_bind.clone(),
                docker_image: self.sandbox.image.clone(),
                docker_cli: self.sandbox.docker_cli.clone(),
                kubernetes: self.sandbox.kubernetes.options(),
                concurrency: self.concurrency.unwrap_or(d.concurrency),
                workers: self
                    .sandbox
                    .workers(self.concurrency.unwrap_or(d.concurrency)),
                seed: self.seed,
                policy: "model".into(),
                server: self.server.clone(),
                api_key: self.api_key.clone(),
                device: self.device.device,
                only_resolved: false,
                limit_tasks: None,
                swebench_rules: self.swebench_rules,
                resolved_config,
            },
            iterations: self.iterations.unwrap_or(d.iterations),
            tasks_per_iteration: self.tasks_per_iteration.unwrap_or(d.tasks_per_iteration),
            batch_size: self.batch_size.unwrap_or(d.batch_size),
            lr: self.lr.unwrap_or(d.lr),
            warmup_steps: self.warmup_steps.unwrap_or(d.warmup_steps),
            weight_decay: self.optimizer.weight_decay,
            grad_clip: (self.optimizer.grad_clip > 0.0).then_some(self.optimizer.grad_clip),
            eps_low: self.clip.eps_low,
            eps_high: self.clip.eps_high.unwrap_or(d.eps_high),
            tis_cap: self.clip.tis_cap,
            micro_batch_tokens: self.optimizer.micro_batch_tokens as usize,
            save_every: self.save_every,
            start: self.run_dir.start(),
            rft_first: if self.no_rft_first {
                None
            } else {
                self.rft_first.or(d.rft_first)
            },
            rft_lr: self.rft_lr.unwrap_or(d.rft_lr),
            rft_warmup_steps: self.rft_warmup_steps.unwrap_or(d.rft_warmup_steps),
            rft_batch_size: self.rft_batch_size.map_or(d.rft_batch_size, |n| n as usize),
            rft_epochs: self.rft_epochs as usize,
            save_rollouts: self.save_rollouts,
            tensor_parallel: self.tensor_parallel as usize,
            offload_optimizer: self.offload_optimizer,
            rollout_deadline: self.rollout_deadline,
        }
    }
}

/// Options shared by `rft` and `dapo`.
#[derive(clap::Args)]
struct TrainArgs {
    #[command(flatten)]
    model: StartModelArgs,
    /// Training data, JSON lines (RL-SPEC.md "Data formats"), read one line at a time.
    #[arg(long)]
    data: PathBuf,
    #[command(flatten)]
    run_dir: RunDirArgs,
    /// Peak learning rate (default: 5e-6 for rft, 1e-6 for dapo).
    #[arg(long, value_parser = positive_f64)]
    lr: Option<f64>,
    /// Learning rate after warmup: constant, or cosine towards 0 at the last step.
    #[arg(long, default_value = "constant")]
    lr_schedule: LrSchedule,
    /// Optimizer steps of linear warmup from 0 to --lr.
    #[arg(long, default_value_t = 0)]
    warmup_steps: u64,
    #[command(flatten)]
    optimizer: OptimizerArgs,
    /// Trajectories per optimizer step (after dropping zero-advantage ones).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: u64,
    /// Passes over the data.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    /// Stop after this many optimizer steps (also the cosine schedule's length).
    #[arg(long)]
    steps: Option<u64>,
    /// Longest trajectory accepted; longer ones are an error (default: the model's context).
    #[arg(long)]
    max_seq_len: Option<usize>,
    /// Write a resumable checkpoint every N steps.
    #[arg(long)]
    save_every: Option<u64>,
    /// Keep every layer's activations instead of recomputing them in the backward.
    #[arg(long)]
    no_activation_checkpointing: bool,
    /// Seeds the trajectory order of each epoch.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    parallel: ParallelArgs,
}

impl TrainArgs {
    fn options(
        &self,
        algorithm: Algorithm,
        default_lr: f64,
        resolved_config: Option<String>,
    ) -> TrainOptions {
        TrainOptions {
            model: self.model.model.clone(),
            data: self.data.clone(),
            out: self.run_dir.out.clone(),
            algorithm,
            lr: self.lr.unwrap_or(default_lr),
            lr_schedule: self.lr_schedule,
            warmup_steps: self.warmup_steps,
            weight_decay: self.optimizer.weight_decay,
            grad_clip: (self.optimizer.grad_clip > 0.0).then_some(self.optimizer.grad_clip),
            batch_size: self.batch_size as usize,
            micro_batch_tokens: self.optimizer.micro_batch_tokens as usize,
            epochs: self.epochs as usize,
            steps: self.steps,
            max_seq_len: self.max_seq_len,
            save_every: self.save_every,
            start: self.run_dir.start(),
            checkpoint_layers: !self.no_activation_checkpointing,
            seed: self.seed,
            progress: true,
            parallel: self.parallel.parallel(),
            resolved_config,
        }
    }
}

fn main() -> Result<()> {
    if let Some(banner) = swerve::backend::cuda::emulation_banner() {
        eprintln!("{banner}");
    }
    let Parsed {
        cli,
        resolved,
        subcommand,
    } = swerve::cli::parse_or_exit::<Cli>(&CONFIG);
    if swerve::parse_only::requested()? {
        let command = subcommand.unwrap_or_default();
        println!("swerve-train {command}: the arguments parse");
        return Ok(());
    }
    let config = match resolved {
        Some(mut resolved) => {
            fill_computed_defaults(&mut resolved, &cli.command)?;
            Some(resolved.to_toml())
        }
        None => None,
    };
    swerve::backend::cuda::gemm::set_exact_logprobs(cli.exact_logprobs);
    match cli.command {
        Command::Score {
            model,
            files,
            batch_tokens,
            device,
            tensor_parallel,
        } => {
            swerve::train::score::run(
                device.device,
                &model,
                &files.input,
                &files.output,
                batch_tokens as usize,
                tensor_parallel as usize,
            )?;
        }
        Command::Tokenize { tokenizer, files } => {
            swerve::train::tokenize::run(&tokenizer, &files.input, &files.output)?;
        }
        Command::Rft { args } => {
            let options = args.options(Algorithm::Rft, RFT_LR, config);
            swerve::train::trainer::run(args.device.device, &options)?;
        }
        Command::Dapo {
            args,
            clip,
            old_logprobs,
        } => {
            let algorithm = Algorithm::Dapo {
                eps_low: clip.eps_low,
                eps_high: clip.eps_high.unwrap_or(DAPO_EPS_HIGH),
                old_logprobs: if old_logprobs == "rollout" {
                    OldLogprobs::Rollout
                } else {
                    OldLogprobs::Recompute
                },
                tis_cap: clip.tis_cap,
            };
            let options = args.options(algorithm, DAPO_LR, config);
            swerve::train::trainer::run(args.device.device, &options)?;
        }
        Command::Rollout {
            args,
            only_resolved,
        } => {
            run_agent(&args.options(only_resolved, config), "rollout")?;
        }
        Command::Rl { args } => {
            swerve::rl::run_on_device(args.device.device, &args.options(config))?
        }
        Command::Eval { args } => {
            run_agent(&args.options(false, config), "eval")?;
        }
        Command::Envs { command } => envs::run(&command)?,
        Command::Report {
            run,
            out,
            tokenizer,
        } => {
            let written = swerve::rl::report::write_report(&ReportOptions {
                run,
                html_dir: out,
                tokenizer,
            })?;
            eprintln!(
                "wrote {} episode pages; open {}",
                written.episode_pages,
                written.index.display()
            );
        }
    }
    Ok(())
}

/// The values the commands give flags that have no clap default (they depend on the command or
/// on `--tasks`), so that OUT/config.toml has every value the run uses.
fn fill_computed_defaults(resolved: &mut ResolvedConfig, command: &Command) -> Result<()> {
    match command {
        Command::Rft { .. } => resolved.fill_unset(serde_json::json!({ "lr": RFT_LR })),
        Command::Dapo { .. } => resolved.fill_unset(serde_json::json!({
            "lr": DAPO_LR,
            "eps-high": decimal(DAPO_EPS_HIGH),
        })),
        Command::Rl { args } => resolved.fill_unset(RlDefaults::for_tasks(&args.tasks)),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "swerve_train_cli/config_examples.rs"]
mod config_examples;

#[cfg(test)]
#[path = "swerve_train_cli/help_text.rs"]
mod help_text;
