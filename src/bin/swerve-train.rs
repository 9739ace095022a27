//! swerve-train: training-side commands. `score` computes per-token logprobs of given token
//! sequences; `tokenize` shows a data file as the trainer tokenizes it; `rft` and `dapo` arrive
//! with the training issue.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use swerve::backend::{select, Backend, DeviceChoice, Selected};
use swerve::model::Qwen2Model;

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
