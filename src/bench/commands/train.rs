//! `swerve-bench train`: one training step (forward, fused loss, backward, AdamW) on packed
//! tokens of a preset model ([`crate::bench::train`]), alone or split over `--tensor-parallel`
//! ranks (the sequence-parallel step of the learner): tokens/s, model TFLOP/s, and on a GPU the
//! MFU against the measured GEMM rate and the device memory in use.

use super::{append_jsonl, on_ranks, or_default, rank_model, Parallel};
use crate::backend::{select, BackendGrad, CudaBackend, DeviceChoice, Selected};
use crate::bench::kernels::measure_ceilings;
use crate::bench::train::{print_train_table, train_step, TrainRow};
use crate::config::ModelConfig;
use crate::dist::grid::{RankPlace, RankTask};
use crate::dist::Groups;
use crate::model::synthetic;
use anyhow::{bail, Result};
use std::path::PathBuf;

pub struct TrainOptions {
    /// A `synthetic::preset` name of tensor-parallel size 1.
    pub preset: String,
    pub device: DeviceChoice,
    /// Packed tokens per step, one row each (empty: 16384, 32768 on a GPU, 256 on the CPU).
    pub tokens: Vec<usize>,
    /// Tokens per packed sequence (`None`: each step is one sequence).
    pub seq_len: Option<usize>,
    /// Timed steps per size (after one warm-up); the median is reported.
    pub reps: usize,
    /// Ranks the model is split over (1: one rank).
    pub tensor_parallel: usize,
    /// Also append one JSON record per row to this file.
    pub jsonl: Option<PathBuf>,
}

pub fn train(options: &TrainOptions) -> Result<()> {
    let (config, preset_tp) = synthetic::preset(&options.preset)?;
    if preset_tp != 1 {
        bail!(
            "train: preset {} is one rank of tensor-parallel {preset_tp} without its collectives; \
             train the whole model's preset with --tensor-parallel {preset_tp}",
            options.preset
        );
    }
    if options.tokens.contains(&0) || options.seq_len == Some(0) || options.reps == 0 {
        bail!("--tokens, --seq-len and --reps must be positive");
    }
    let parallel = Parallel::new(&options.preset, &config, preset_tp, options.tensor_parallel)?;
    let (backend, line) = select(options.device)?;
    println!("{line}");
    let (sizes, gemm_tflops) = match &backend {
        Selected::Cpu(_) => (or_default(&options.tokens, &[256]), None),
        Selected::Cuda(b) => {
            let ceilings = measure_ceilings(b)?;
            println!(
                "measured bf16 GEMM rate: {:.0} TFLOP/s",
                ceilings.gemm_tflops
            );
            let sizes = or_default(&options.tokens, &[16384, 32768]);
            (sizes, Some(ceilings.gemm_tflops))
        }
    };
    let sequence_parallel = match parallel.ranks {
        1 => String::new(),
        n => format!(", sequence-parallel over {n} ranks"),
    };
    println!(
        "model: preset {} ({} layers, hidden {}), random weights; masked cross-entropy on every token, activation checkpointing on{sequence_parallel}",
        options.preset, config.num_hidden_layers, config.hidden_size
    );
    let task = TrainRank {
        config: &config,
        options,
        sizes: &sizes,
    };
    let (rows, rank_backend, memory) = on_ranks(&backend, parallel.ranks, &task)?;
    println!("{}", parallel.title("TFLOP/s and MFU", &rank_backend));
    print_train_table(&rows, gemm_tflops);
    if let Some((free, total)) = memory {
        println!(
            "device memory in use on rank 0's GPU after the steps (the caching pool's high-water mark included): {:.1} GiB of {:.1} GiB",
            (total - free) as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
    }
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({
                "table": "train", "impl": "swerve",
                "key": format!("preset={} tokens={} seq_len={}{}", options.preset, r.tokens, r.seq_len, parallel.key_suffix()),
                "step_ms": r.step_seconds() * 1e3, "fwd_bwd_ms": r.fwd_bwd_seconds * 1e3,
                "tokens_per_s": r.tokens_per_second, "tflops": r.tflops,
                "mfu": gemm_tflops.map(|g| r.mfu(g)), "tensor_parallel": parallel.ranks,
                "note": rank_backend,
            }))
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}

/// One rank of the train table: its model, the timed steps of each size (in lockstep with the
/// other ranks); the rows, the rank's backend and, on a GPU, its device memory (free, total)
/// once they are done.
struct TrainRank<'a> {
    config: &'a ModelConfig,
    options: &'a TrainOptions,
    sizes: &'a [usize],
}

impl RankTask for TrainRank<'_> {
    type Output = (Vec<TrainRow>, String, Option<(usize, usize)>);

    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        _place: RankPlace,
    ) -> Result<Self::Output> {
        let mut model = rank_model(backend, self.config.clone(), 1, groups.tp)?;
        let rows = self
            .sizes
            .iter()
            .map(|&tokens| {
                let seq_len = self.options.seq_len.unwrap_or(tokens);
                train_step(backend, &mut model, tokens, seq_len, self.options.reps)
            })
            .collect::<Result<Vec<_>>>()?;
        let cuda = (backend as &dyn std::any::Any).downcast_ref::<CudaBackend>();
        let memory = cuda.map(|b| b.device.ctx.mem_get_info()).transpose()?;
        Ok((rows, backend.name(), memory))
    }
}
