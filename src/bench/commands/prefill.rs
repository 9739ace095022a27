//! `swerve-bench prefill` (the default command): prefill tokens/s and model TFLOP/s of one
//! sequence at each length, on a preset model with random weights, alone or split over
//! `--tensor-parallel` ranks.

use super::{append_jsonl, on_ranks, rank_model, Parallel};
use crate::backend::{select, BackendGrad, DeviceChoice, Selected};
use crate::bench::PrefillRow;
use crate::config::ModelConfig;
use crate::dist::grid::{RankPlace, RankTask};
use crate::dist::Groups;
use crate::model::synthetic;
use anyhow::{bail, Result};
use std::path::PathBuf;

pub struct PrefillOptions {
    /// A `synthetic::preset` name.
    pub preset: String,
    pub device: DeviceChoice,
    /// Sequence lengths, each timed alone.
    pub seq_lens: Vec<usize>,
    /// Timed runs per length (after one warm-up); the median is reported.
    pub reps: usize,
    /// Ranks the model is split over (1: one rank).
    pub tensor_parallel: usize,
    /// Also append one JSON record per row to this file.
    pub jsonl: Option<PathBuf>,
}

pub fn prefill(options: &PrefillOptions) -> Result<()> {
    if options.seq_lens.is_empty() || options.seq_lens.contains(&0) {
        bail!("--seq-lens needs positive lengths");
    }
    let (config, preset_tp) = synthetic::preset(&options.preset)?;
    let parallel = Parallel::new(&options.preset, &config, preset_tp, options.tensor_parallel)?;
    if let Some(&too_long) = options.seq_lens.iter().find(|&&n| n > config.max_context()) {
        bail!(
            "--seq-lens {too_long} exceeds the model's context of {}",
            config.max_context()
        );
    }
    let (backend, line) = select(options.device)?;
    println!("{line}");
    if let Selected::Cpu(_) = backend {
        // Every rank is in this process: the ranks together hold the whole model.
        let param_bytes = config.num_parameters() / preset_tp * 4;
        if let Some(available) = crate::sysmem::available_memory_bytes() {
            if param_bytes > available / 2 {
                bail!(
                    "preset {} needs {:.1} GiB of f32 weights on the CPU backend but only {:.1} GiB is available; \
                     presets this large are for GPU runs",
                    options.preset,
                    param_bytes as f64 / (1u64 << 30) as f64,
                    available as f64 / (1u64 << 30) as f64
                );
            }
        }
    }
    let local = config.local_sizes(parallel.shard_tp())?;
    println!(
        "model: preset {} ({} layers, hidden {}, heads {}/{} kv, vocab {}, tp {} rank 0), random weights",
        options.preset,
        config.num_hidden_layers,
        config.hidden_size,
        local.heads_local,
        local.kv_heads_local,
        local.vocab_local,
        parallel.shard_tp()
    );
    let task = PrefillRank {
        config: &config,
        preset_tp,
        options,
    };
    let (rows, rank_backend) = on_ranks(&backend, parallel.ranks, &task)?;
    println!("{}", parallel.title("TFLOP/s", &rank_backend));
    crate::bench::print_prefill_table(&rows);
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "table": "prefill",
                    "impl": "swerve",
                    "key": format!("preset={} len={}{}", options.preset, r.seq_len, parallel.key_suffix()),
                    "median_ms": r.median_seconds * 1e3,
                    "tflops": r.tflops,
                    "tokens_per_s": r.tokens_per_second,
                    "tensor_parallel": parallel.ranks,
                    "note": rank_backend,
                })
            })
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}

/// One rank of the prefill: its model, the timed prefills (in lockstep with the other ranks);
/// the rows and the rank's backend.
struct PrefillRank<'a> {
    config: &'a ModelConfig,
    preset_tp: usize,
    options: &'a PrefillOptions,
}

impl RankTask for PrefillRank<'_> {
    type Output = (Vec<PrefillRow>, String);

    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        _place: RankPlace,
    ) -> Result<Self::Output> {
        let model = rank_model(backend, self.config.clone(), self.preset_tp, groups.tp)?;
        let rows =
            crate::bench::prefill(backend, &model, &self.options.seq_lens, self.options.reps)?;
        Ok((rows, backend.name()))
    }
}
