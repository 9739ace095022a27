//! The `swerve-bench` commands, each from its options to printed tables and JSONL records:
//! selecting the backend, building a preset model with random weights, running the measurements
//! of the modules above and reporting them. The binary parses arguments into these options.

mod agent;
mod decode;
mod gemm;
mod kernels;
mod plan;
mod prefill;
mod rl;
mod train;

pub use agent::{agent, AgentOptions};
pub use decode::{decode, DecodeOptions};
pub use gemm::{gemm, GemmOptions};
pub use kernels::kernels;
pub use plan::{plan, print_plan, PlanMode, PlanOptions};
pub use prefill::{prefill, PrefillOptions};
pub use rl::{rl, RlOptions};
pub use train::{train, TrainOptions};

use crate::backend::{Backend, DeviceChoice, Selected};
use crate::config::ModelConfig;
use crate::dist::grid::{run_grid, GridSpec, RankPlace, RankTask};
use crate::dist::{Communicator, Groups};
use crate::model::{synthetic, Qwen2Model};
use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

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

/// How a command's model runs: the preset's tensor-parallel size (above 1: one rank's shapes
/// alone, no collective) and `--tensor-parallel` (the model split over that many ranks).
#[derive(Clone, Copy, Debug)]
struct Parallel {
    preset_tp: usize,
    ranks: usize,
}

impl Parallel {
    /// `--tensor-parallel ranks` for preset `name` (`config`, one rank of `preset_tp`), checked:
    /// at least 1, not with a `-tpN` preset, and a split the model allows.
    fn new(name: &str, config: &ModelConfig, preset_tp: usize, ranks: usize) -> Result<Self> {
        if ranks == 0 {
            bail!("--tensor-parallel must be at least 1");
        }
        if ranks > 1 && preset_tp > 1 {
            bail!(
                "--tensor-parallel {ranks} with preset {name}, which is already one rank of \
                 tensor-parallel {preset_tp} (no collective): split the whole model instead \
                 (preset {} --tensor-parallel {ranks})",
                name.replace(&format!("-tp{preset_tp}"), "")
            );
        }
        config
            .shards(ranks)
            .map_err(|e| anyhow!("--tensor-parallel {ranks}: {e:#}"))?;
        Ok(Self { preset_tp, ranks })
    }

    /// The tensor-parallel size rank 0's shapes are of.
    fn shard_tp(&self) -> usize {
        self.ranks.max(self.preset_tp)
    }

    /// The line above a table: how many ranks ran (rank 0 on `rank_backend`), and which of its
    /// figures (`per_rank`) are one rank's.
    fn title(&self, per_rank: &str, rank_backend: &str) -> String {
        match (self.ranks, self.preset_tp) {
            (1, 1) => "TP 1".to_string(),
            (1, p) => format!("TP 1: one rank of tensor-parallel {p} alone (no collective)"),
            (n, _) => format!(
                "TP {n} ({n} ranks in lockstep, rank 0 on {rank_backend}): rank 0's wall times, \
                 collectives included; {per_rank} per rank"
            ),
        }
    }

    /// ` tp=N` for a JSONL key when the model was split (TP 1 keys stay as they were, so peer
    /// rows still match them).
    fn key_suffix(&self) -> String {
        match self.ranks {
            1 => String::new(),
            n => format!(" tp={n}"),
        }
    }
}

/// This rank's model with the random weights every benchmark uses: alone (`tp` of size 1) the
/// preset's rank-0 shapes ([`random_model`]); otherwise its shard of the whole model, computing
/// with `tp`.
fn rank_model<B: Backend>(
    backend: &B,
    config: ModelConfig,
    preset_tp: usize,
    tp: Arc<dyn Communicator<B>>,
) -> Result<Qwen2Model<B>> {
    if tp.size() == 1 {
        return random_model(backend, config, preset_tp);
    }
    let local = config.shard(tp.size(), tp.rank())?;
    let host = synthetic::random_params(&config, &local, 0x5EED)?;
    Qwen2Model::from_host_params(backend, config, local, &host)?.with_comm(tp)
}

/// Runs `task` on `ranks` tensor-parallel ranks and returns rank 0's output: one rank runs in
/// this thread on `selected`; more run a thread each ([`run_grid`]), each with a backend of
/// `selected`'s kind (a GPU each, or a share of the CPU cores) and its group, in lockstep.
fn on_ranks<T: RankTask>(selected: &Selected, ranks: usize, task: &T) -> Result<T::Output> {
    if ranks == 1 {
        return match selected {
            Selected::Cpu(b) => task.run(b, Groups::solo(), RankPlace::default()),
            Selected::Cuda(b) => task.run(&**b, Groups::solo(), RankPlace::default()),
        };
    }
    let device = match selected {
        Selected::Cpu(_) => DeviceChoice::Cpu,
        Selected::Cuda(b) => {
            // This backend waits idle on rank 0's GPU meanwhile: its cached blocks go back.
            b.release_cached_memory();
            DeviceChoice::Cuda
        }
    };
    let spec = GridSpec {
        tp: ranks,
        ..GridSpec::single()
    };
    Ok(run_grid(device, &spec, task)?.swap_remove(0))
}
