//! swerve-serve: the OpenAI-compatible rollout server. Today it loads and checks a model and
//! reports the backend; the HTTP API arrives with the server issue, and until then it says so
//! and exits with status 2 rather than pretending to serve.

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;
use swerve::backend::{select, Backend, DeviceChoice, Selected};
use swerve::model::Qwen2Model;

#[derive(Parser)]
#[command(
    name = "swerve-serve",
    version,
    about = "swerve's OpenAI-compatible rollout server"
)]
struct Cli {
    /// Model folder: config.json plus model.safetensors or a sharded index.
    #[arg(long)]
    model: PathBuf,
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let (backend, line) = select(cli.device)?;
    eprintln!("{line}");
    match backend {
        Selected::Cpu(b) => load(&b, &cli)?,
        Selected::Cuda(b) => load(&*b, &cli)?,
    }
    eprintln!("swerve-serve: the HTTP server is not built yet; nothing is served");
    std::process::exit(2);
}

fn load<B: Backend>(backend: &B, cli: &Cli) -> Result<()> {
    let model = Qwen2Model::load(backend, &cli.model)?;
    eprintln!(
        "loaded {} ({} layers, hidden {}, {} parameters)",
        cli.model.display(),
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.config.num_parameters()
    );
    Ok(())
}
