//! swerve-train: training-side commands. `score` computes per-token logprobs of given token
//! sequences; `tokenize` shows a data file as the trainer tokenizes it; `rft` (masked
//! cross-entropy on successful trajectories) and `dapo` (the clipped policy-gradient step on
//! rollout groups) train, as ../shared/RL-SPEC.md specifies.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use swerve::backend::{select, Backend, DeviceChoice, Selected};
use swerve::model::Qwen2Model;
use swerve::train::optimizer::LrSchedule;
use swerve::train::trainer::{train, Algorithm, OldLogprobs, TrainOptions};

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
        #[arg(long, default_value_t = 0.2)]
        eps_low: f32,
        /// Upper clip range: rho above 1 + eps_high stops pushing up (A > 0).
        #[arg(long, default_value_t = 0.28)]
        eps_high: f32,
        /// logp_old: `recompute` scores the data with the starting weights before the first
        /// update; `rollout` uses the data's `logprobs`.
        #[arg(long, default_value = "recompute", value_parser = ["recompute", "rollout"])]
        old_logprobs: String,
        /// Truncated importance sampling: each token's term times min(exp(old - rollout), C).
        #[arg(long)]
        tis_cap: Option<f32>,
    },
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
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, default_value = "constant")]
    lr_schedule: LrSchedule,
    #[arg(long, default_value_t = 0)]
    warmup_steps: u64,
    /// Decoupled AdamW weight decay on 2-D weights.
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f32,
    /// Global gradient-norm clipping (0: off).
    #[arg(long, default_value_t = 1.0)]
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
    /// Where training runs. Only the CPU reference trains so far.
    #[arg(long, default_value = "cpu")]
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
