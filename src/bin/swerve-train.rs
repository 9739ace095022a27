//! swerve-train: training-side commands. `score` computes per-token logprobs of given token
//! sequences; `tokenize` shows a data file as the trainer tokenizes it; `rft` (masked
//! cross-entropy on successful trajectories) and `dapo` (the clipped policy-gradient step on
//! rollout groups) train, as ../shared/RL-SPEC.md specifies; `rollout` and `eval` run agent
//! episodes on coding tasks in sandboxes.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use swerve::agent::command::{run_agent, AgentRunOptions};
use swerve::agent::episode::EpisodeConfig;
use swerve::backend::{select, Backend, DeviceChoice, Selected};
use swerve::env::{EnvKind, Limits};
use swerve::model::Qwen2Model;
use swerve::rl::{RlDefaults, RlOptions};
use swerve::train::optimizer::LrSchedule;
use swerve::train::trainer::{train, Algorithm, OldLogprobs, TrainOptions};

/// A hyperparameter must be a finite number: `--lr NaN` is an error here, not a run that
/// silently trains nothing.
fn finite_f64(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(v) => Err(format!("{v} is not a finite number")),
        Err(e) => Err(format!("{text:?} is not a number: {e}")),
    }
}

fn finite_f32(text: &str) -> Result<f32, String> {
    finite_f64(text).map(|v| v as f32)
}

#[derive(Parser)]
#[command(
    name = "swerve-train",
    version,
    about = "swerve's training-side commands"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per-token logprobs of given token sequences: input lines {"tokens": [...]}, output lines
    /// {"logprobs": [null, lp1, ...]} with lp_t = log p(tokens[t] | tokens[<t]).
    Score {
        /// Model folder: config.json plus model.safetensors or a sharded index.
        #[arg(long)]
        model: PathBuf,
        /// JSON lines, one {"tokens": [ids...]} per line.
        #[arg(long)]
        input: PathBuf,
        /// Where to write one {"logprobs": [...]} line per input line.
        #[arg(long)]
        output: PathBuf,
        /// Most tokens packed into one forward pass (a longer sequence runs alone).
        #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
        batch_tokens: u64,
        /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
        #[arg(long, default_value = "auto")]
        device: DeviceChoice,
    },
    /// A data file as the trainer tokenizes it: input lines {"text": ...} or {"messages": [...],
    /// "tools": [...]}, output lines {"tokens": [...], "action_mask": [...]}.
    Tokenize {
        /// Folder with tokenizer.json (and tokenizer_config.json for the chat template); a model
        /// folder works.
        #[arg(long)]
        tokenizer: PathBuf,
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
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
        /// Lower clip range: rho below 1 - eps_low stops pushing down (A < 0).
        #[arg(long, default_value_t = 0.2, value_parser = finite_f32)]
        eps_low: f32,
        /// Upper clip range: rho above 1 + eps_high stops pushing up (A > 0).
        #[arg(long, default_value_t = 0.28, value_parser = finite_f32)]
        eps_high: f32,
        /// logp_old: `recompute` scores the data with the starting weights before the first
        /// update; `rollout` uses the data's `logprobs`.
        #[arg(long, default_value = "recompute", value_parser = ["recompute", "rollout"])]
        old_logprobs: String,
        /// Truncated importance sampling: each token's term times min(exp(old - rollout), C).
        #[arg(long, value_parser = finite_f32)]
        tis_cap: Option<f32>,
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
        #[command(flatten)]
        args: RlArgs,
    },
    /// Resolved rate, pass@1 and pass@k (unbiased), mean turns and a per-task table; writes
    /// OUT/eval.json and OUT/trajectories.jsonl.
    Eval {
        #[command(flatten)]
        args: AgentArgs,
    },
}

/// Where agent commands run and their limits (`rollout`, `eval`, `rl`).
#[derive(clap::Args)]
struct SandboxArgs {
    /// Where commands run: local (bubblewrap) or docker (the task's image).
    #[arg(long, default_value = "local")]
    env: EnvKind,
    /// Wall-clock limit of one agent command, seconds.
    #[arg(long, default_value_t = 120)]
    command_timeout: u64,
    /// Memory per sandboxed process (local) or per container (docker), MiB.
    #[arg(long, default_value_t = 8192)]
    sandbox_memory_mb: u64,
    /// Processes and threads an episode may have at once.
    #[arg(long, default_value_t = 512)]
    sandbox_processes: u64,
    /// A host path bound read-only into the local sandbox (repeatable).
    #[arg(long)]
    sandbox_bind: Vec<PathBuf>,
    /// Image for tasks that name none (docker).
    #[arg(long, default_value = "python:3.11-slim")]
    image: String,
}

impl SandboxArgs {
    fn limits(&self) -> Limits {
        Limits {
            command_timeout: std::time::Duration::from_secs(self.command_timeout.max(1)),
            memory_bytes: self.sandbox_memory_mb << 20,
            processes: self.sandbox_processes,
            ..Limits::default()
        }
    }
}

/// Options shared by `rollout` and `eval`.
#[derive(clap::Args)]
struct AgentArgs {
    /// Model folder or `preset:NAME` (written to OUT/base-model). Scripted policies need none:
    /// they use the model's tokenizer, or the embedded Qwen2.5 one.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Task file (JSON lines; README "Tasks") or `builtin:NAME` (built in: python-bugs).
    #[arg(long)]
    tasks: String,
    /// Output folder.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Episodes per task.
    #[arg(long, default_value_t = 10)]
    group: usize,
    /// Turns (assistant replies) per episode at most; T_max of the turn penalty.
    #[arg(long, default_value_t = 40)]
    max_turns: usize,
    /// L_thr of the turn penalty: episodes of this many turns or more lose reward.
    #[arg(long, default_value_t = 10)]
    turn_threshold: usize,
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
    /// Episodes running at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// model, oracle (applies the task's solution), noop (submits at once) or replay:FILE.
    #[arg(long, default_value = "model")]
    policy: String,
    /// A running swerve-serve (http://HOST:PORT) to sample from instead of an in-process engine.
    #[arg(long)]
    server: Option<String>,
    #[arg(long)]
    api_key: Option<String>,
    /// Only the first N tasks of the file.
    #[arg(long)]
    limit_tasks: Option<usize>,
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
}

impl AgentArgs {
    fn options(&self, only_resolved: bool) -> AgentRunOptions {
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
            },
            max_context: self.max_context,
            env: self.sandbox.env,
            limits: self.sandbox.limits(),
            sandbox_binds: self.sandbox.sandbox_bind.clone(),
            docker_image: self.sandbox.image.clone(),
            concurrency: self.concurrency,
            seed: self.seed,
            policy: self.policy.clone(),
            server: self.server.clone(),
            api_key: self.api_key.clone(),
            device: self.device,
            only_resolved,
            limit_tasks: self.limit_tasks,
        }
    }
}

/// `rl`'s options; unset ones take `RlDefaults::for_tasks` (stage 1, or the toy's).
#[derive(clap::Args)]
struct RlArgs {
    /// Starting model folder or `preset:NAME` (`preset:toy` for `builtin:toy`).
    #[arg(long)]
    model: PathBuf,
    /// Task file or `builtin:NAME` (python-bugs, toy).
    #[arg(long)]
    tasks: String,
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    iterations: Option<usize>,
    #[arg(long)]
    tasks_per_iteration: Option<usize>,
    /// Rollouts per task (G).
    #[arg(long)]
    group: Option<usize>,
    /// Trajectories per optimizer step (several steps per iteration).
    #[arg(long)]
    batch_size: Option<usize>,
    #[arg(long, value_parser = finite_f64)]
    lr: Option<f64>,
    #[arg(long)]
    warmup_steps: Option<u64>,
    #[arg(long, default_value_t = 0.1, value_parser = finite_f32)]
    weight_decay: f32,
    /// Global gradient-norm clipping (0: off).
    #[arg(long, default_value_t = 1.0, value_parser = finite_f64)]
    grad_clip: f64,
    #[arg(long, default_value_t = 0.2, value_parser = finite_f32)]
    eps_low: f32,
    /// Upper clip range (stage 1: 0.3; stage 2: 0.26).
    #[arg(long, value_parser = finite_f32)]
    eps_high: Option<f32>,
    #[arg(long, value_parser = finite_f32)]
    tis_cap: Option<f32>,
    #[arg(long)]
    max_turns: Option<usize>,
    #[arg(long)]
    turn_threshold: Option<usize>,
    /// Context limit per episode (131072 with a YaRN model: stage 2).
    #[arg(long)]
    max_context: Option<usize>,
    #[arg(long)]
    max_turn_tokens: Option<usize>,
    #[arg(long, default_value_t = 16384)]
    observation_bytes: usize,
    #[command(flatten)]
    sandbox: SandboxArgs,
    #[arg(long)]
    concurrency: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Checkpoint every N iterations (and after the last).
    #[arg(long, default_value_t = 10)]
    save_every: usize,
    /// Continue from OUT's latest iteration checkpoint.
    #[arg(long)]
    resume: bool,
    /// First collect K rollouts per task with the base model and RFT on the resolved ones.
    #[arg(long)]
    rft_first: Option<usize>,
    /// Skip the RFT phase the toy schedule has.
    #[arg(long)]
    no_rft_first: bool,
    #[arg(long, value_parser = finite_f64)]
    rft_lr: Option<f64>,
    #[arg(long, default_value_t = 1)]
    rft_epochs: usize,
    #[arg(long, default_value_t = 16384)]
    micro_batch_tokens: usize,
    /// Sample from a running swerve-serve (http://HOST:PORT), reloaded after each iteration.
    #[arg(long)]
    server: Option<String>,
    #[arg(long)]
    api_key: Option<String>,
    /// Where the trainer and the engine run.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
}

impl RlArgs {
    fn options(&self) -> RlOptions {
        let d = RlDefaults::for_tasks(&self.tasks);
        let episode = EpisodeConfig {
            max_turns: self.max_turns.unwrap_or(d.max_turns),
            turn_threshold: self.turn_threshold.unwrap_or(d.turn_threshold),
            max_context: self.max_context.unwrap_or(65_536),
            max_turn_tokens: self.max_turn_tokens.unwrap_or(d.max_turn_tokens),
            observation_bytes: self.observation_bytes,
        };
        RlOptions {
            agent: AgentRunOptions {
                model: Some(self.model.clone()),
                tasks: self.tasks.clone(),
                out: self.out.clone(),
                group: self.group.unwrap_or(d.group),
                episode,
                max_context: self.max_context,
                env: self.sandbox.env,
                limits: self.sandbox.limits(),
                sandbox_binds: self.sandbox.sandbox_bind.clone(),
                docker_image: self.sandbox.image.clone(),
                concurrency: self.concurrency.unwrap_or(d.concurrency),
                seed: self.seed,
                policy: "model".into(),
                server: self.server.clone(),
                api_key: self.api_key.clone(),
                device: self.device,
                only_resolved: false,
                limit_tasks: None,
            },
            iterations: self.iterations.unwrap_or(d.iterations),
            tasks_per_iteration: self.tasks_per_iteration.unwrap_or(d.tasks_per_iteration),
            batch_size: self.batch_size.unwrap_or(d.batch_size),
            lr: self.lr.unwrap_or(d.lr),
            warmup_steps: self.warmup_steps.unwrap_or(d.warmup_steps),
            weight_decay: self.weight_decay,
            grad_clip: (self.grad_clip > 0.0).then_some(self.grad_clip),
            eps_low: self.eps_low,
            eps_high: self.eps_high.unwrap_or(d.eps_high),
            tis_cap: self.tis_cap,
            micro_batch_tokens: self.micro_batch_tokens,
            save_every: self.save_every,
            resume: self.resume,
            rft_first: if self.no_rft_first {
                None
            } else {
                self.rft_first.or(d.rft_first)
            },
            rft_lr: self.rft_lr.unwrap_or(d.rft_lr),
            rft_epochs: self.rft_epochs,
        }
    }
}

/// Options shared by `rft` and `dapo`.
#[derive(clap::Args)]
struct TrainArgs {
    /// Starting model folder: config.json, safetensors, tokenizer files; or `preset:NAME`, the
    /// random-weight model of a swerve-bench preset (`preset:default`: the embedded default),
    /// written to OUT/base-model.
    #[arg(long)]
    model: PathBuf,
    /// Training data, JSON lines (RL-SPEC.md "Data formats").
    #[arg(long)]
    data: PathBuf,
    /// Output folder: metrics.jsonl, step-N/ checkpoints, final/.
    #[arg(long)]
    out: PathBuf,
    /// Peak learning rate (default: 5e-6 for rft, 1e-6 for dapo).
    #[arg(long, value_parser = finite_f64)]
    lr: Option<f64>,
    #[arg(long, default_value = "constant")]
    lr_schedule: LrSchedule,
    #[arg(long, default_value_t = 0)]
    warmup_steps: u64,
    /// Decoupled AdamW weight decay on 2-D weights.
    #[arg(long, default_value_t = 0.1, value_parser = finite_f32)]
    weight_decay: f32,
    /// Global gradient-norm clipping (0: off).
    #[arg(long, default_value_t = 1.0, value_parser = finite_f64)]
    grad_clip: f64,
    /// Trajectories per optimizer step (after dropping zero-advantage ones).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    batch_size: u64,
    /// Most tokens packed into one micro-batch (a longer trajectory runs alone).
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u64).range(1..))]
    micro_batch_tokens: u64,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    /// Stop after this many optimizer steps.
    #[arg(long)]
    steps: Option<u64>,
    /// Longest trajectory accepted; longer ones are an error (default: the model's context).
    #[arg(long)]
    max_seq_len: Option<usize>,
    /// Write a resumable checkpoint every N steps.
    #[arg(long)]
    save_every: Option<u64>,
    /// Continue from the latest OUT/step-N checkpoint.
    #[arg(long)]
    resume: bool,
    /// Keep every layer's activations instead of recomputing them in the backward.
    #[arg(long)]
    no_activation_checkpointing: bool,
    /// Seeds the trajectory order of each epoch.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where training runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
}

impl TrainArgs {
    fn options(&self, algorithm: Algorithm, default_lr: f64) -> TrainOptions {
        TrainOptions {
            model: self.model.clone(),
            data: self.data.clone(),
            out: self.out.clone(),
            algorithm,
            lr: self.lr.unwrap_or(default_lr),
            lr_schedule: self.lr_schedule,
            warmup_steps: self.warmup_steps,
            weight_decay: self.weight_decay,
            grad_clip: (self.grad_clip > 0.0).then_some(self.grad_clip),
            batch_size: self.batch_size as usize,
            micro_batch_tokens: self.micro_batch_tokens as usize,
            epochs: self.epochs as usize,
            steps: self.steps,
            max_seq_len: self.max_seq_len,
            save_every: self.save_every,
            resume: self.resume,
            checkpoint_layers: !self.no_activation_checkpointing,
            seed: self.seed,
            progress: true,
        }
    }
}

fn run_training(device: DeviceChoice, options: &TrainOptions) -> Result<()> {
    let mut options = options.clone();
    options.model = swerve::train::trainer::resolve_model(&options.model, &options.out)?;
    let (backend, line) = select(device)?;
    eprintln!("{line}");
    let summary = match backend {
        Selected::Cpu(b) => train(&b, &options)?,
        Selected::Cuda(b) => train(&*b, &options)?,
    };
    eprintln!(
        "trained {} steps ({} skipped); loss {} -> {}; model in {}",
        summary.steps,
        summary.skipped_steps,
        summary.first_loss.map_or("-".into(), |l| format!("{l:.4}")),
        summary.last_loss.map_or("-".into(), |l| format!("{l:.4}")),
        summary.final_dir.display()
    );
    Ok(())
}

fn main() -> Result<()> {
    if let Some(banner) = swerve::backend::cuda::emulation_banner() {
        eprintln!("{banner}");
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Score {
            model,
            input,
            output,
            batch_tokens,
            device,
        } => {
            let (backend, line) = select(device)?;
            eprintln!("{line}");
            let batch_tokens = batch_tokens as usize;
            let summary = match backend {
                Selected::Cpu(b) => score(&b, &model, &input, &output, batch_tokens)?,
                Selected::Cuda(b) => score(&*b, &model, &input, &output, batch_tokens)?,
            };
            eprintln!(
                "scored {} sequences ({} tokens) in {:.2} s -> {}",
                summary.sequences,
                summary.tokens,
                summary.seconds,
                output.display()
            );
        }
        Command::Tokenize {
            tokenizer,
            input,
            output,
        } => {
            let tokenizer = swerve::tokenizer::Tokenizer::from_dir(&tokenizer)?;
            let (lines, tokens) =
                swerve::train::tokenize::tokenize_file(&tokenizer, &input, &output)?;
            eprintln!(
                "tokenized {lines} lines ({tokens} tokens) -> {}",
                output.display()
            );
        }
        Command::Rft { args } => run_training(args.device, &args.options(Algorithm::Rft, 5e-6))?,
        Command::Dapo {
            args,
            eps_low,
            eps_high,
            old_logprobs,
            tis_cap,
        } => {
            let algorithm = Algorithm::Dapo {
                eps_low,
                eps_high,
                old_logprobs: if old_logprobs == "rollout" {
                    OldLogprobs::Rollout
                } else {
                    OldLogprobs::Recompute
                },
                tis_cap,
            };
            run_training(args.device, &args.options(algorithm, 1e-6))?
        }
        Command::Rollout {
            args,
            only_resolved,
        } => {
            run_agent(&args.options(only_resolved), "rollout")?;
        }
        Command::Rl { args } => {
            let options = args.options();
            let (backend, line) = select(args.device)?;
            eprintln!("{line}");
            match backend {
                Selected::Cpu(b) => swerve::rl::run(&b, &options)?,
                Selected::Cuda(b) => swerve::rl::run(&*b, &options)?,
            }
        }
        Command::Eval { args } => {
            run_agent(&args.options(false), "eval")?;
        }
    }
    Ok(())
}

fn score<B: Backend>(
    backend: &B,
    model_dir: &Path,
    input: &Path,
    output: &Path,
    batch_tokens: usize,
) -> Result<swerve::train::score::ScoreSummary> {
    let model = Qwen2Model::load(backend, model_dir)?;
    swerve::train::score::score_file(backend, &model, input, output, batch_tokens)
}
