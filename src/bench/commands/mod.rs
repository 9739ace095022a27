//! The `swerve-bench` commands, each from its options to printed tables and JSONL records:
//! selecting the backend, building a preset model with random weights, running the measurements
//! of the modules above and reporting them. The binary parses arguments into these options.

mod agent;
mod decode;
mod kernels;
mod plan;
mod prefill;
mod rl;
mod train;

pub use agent::{agent, AgentOptions};
pub use decode::{decode, DecodeOptions};
pub use kernels::kernels;
pub use plan::{plan, print_plan, PlanMode, PlanOptions};
pub use prefill::{prefill, PrefillOptions};
pub use rl::{rl, RlOptions};
pub use train::{train, TrainOptions};

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::model::{synthetic, Qwen2Model};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Appends one JSON value per line to `path` (created if missing).
fn append_jsonl(path: &Path, records: &[serde_json::Value]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {} for appending", path.display()))?;
    for r in records {
        writeln!(file, "{r}").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `given`, or `default` where the flag was not given (an empty list).
fn or_default(given: &[usize], default: &[usize]) -> Vec<usize> {
    if given.is_empty() {
        default.to_vec()
    } else {
        given.to_vec()
    }
}

/// The preset's rank-0 model of tensor-parallel size `tp_size` on `backend`, with the random
/// weights every benchmark uses (seed 0x5EED).
fn random_model<B: Backend>(
    backend: &B,
    config: ModelConfig,
    tp_size: usize,
) -> Result<Qwen2Model<B>> {
    let local = config.local_sizes(tp_size)?;
    let host = synthetic::random_params(&config, &local, 0x5EED)?;
    Qwen2Model::from_host_params(backend, config, local, &host)
}
