//! Checkpoints in HF layout, so transformers and `swerve-serve` load them, plus what `--resume`
//! needs to continue exactly where a run stopped.
//!
//! ```text
//! OUT/step-000010/             (or OUT/final/)
//!   config.json                copied from the starting model
//!   model.safetensors          bf16 weights under their HF names (no lm_head when tied)
//!   tokenizer.json ...         the starting model's tokenizer and generation files, copied (the
//!                              embedded Qwen2.5 tokenizer's when the model has none: what it
//!                              used), so `swerve-train tokenize --tokenizer` and servers read it
//!   optimizer.safetensors      f32 `master.NAME`, `exp_avg.NAME`, `exp_avg_sq.NAME`
//!   trainer_state.json         step, updates taken, data position, and under "options" what a
//!                              `--resume` must repeat (`run_dir::RecordedOptions`)
//! ```
//!
//! A checkpoint is written into `OUT/.NAME.partial/` and renamed into place, so a crash never
//! leaves a half-written checkpoint under a real name.

use crate::model::weights::write_safetensors;
use crate::tensor::HostTensor;
use anyhow::{bail, Context, Result};
use half::bf16;
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Tokenizer, chat-template and generation files copied from the starting model when present.
pub const TOKENIZER_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
];

/// One parameter on the host: HF name, shape, f32 master values.
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// The optimizer's state on the host, tensor by tensor in parameter order.
pub struct OptimizerState {
    pub masters: Vec<NamedTensor>,
    pub exp_avg: Vec<Vec<f32>>,
    pub exp_avg_sq: Vec<Vec<f32>>,
}

/// Writes a checkpoint folder `dir` atomically (replacing an older one of the same name).
pub fn save(
    dir: &Path,
    source_model_dir: &Path,
    state: &OptimizerState,
    trainer_state: &Value,
) -> Result<()> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("bad checkpoint folder {}", dir.display()))?;
    let partial = dir.with_file_name(format!(".{name}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove {}", partial.display()))?;
    }
    std::fs::create_dir_all(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let result = write_contents(&partial, source_model_dir, state, trainer_state);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot replace {}", dir.display()))?;
    }
    std::fs::rename(&partial, dir)
        .with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))
}

fn write_contents(
    dir: &Path,
    source_model_dir: &Path,
    state: &OptimizerState,
    trainer_state: &Value,
) -> Result<()> {
    let copy = |file: &str| -> Result<()> {
        let from = source_model_dir.join(file);
        std::fs::copy(&from, dir.join(file))
            .with_context(|| format!("cannot copy {}", from.display()))?;
        Ok(())
    };
    copy("config.json")?;
    for file in TOKENIZER_FILES {
        if source_model_dir.join(file).is_file() {
            copy(file)?;
        }
    }
    if !source_model_dir.join("tokenizer.json").is_file() {
        // The model runs with the embedded tokenizer: the checkpoint says so in files.
        for (file, bytes) in crate::tokenizer::embedded_qwen25_files() {
            let path = dir.join(file);
            std::fs::write(&path, bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    let weights: Vec<(String, HostTensor<'static>)> = state
        .masters
        .iter()
        .map(|t| {
            let values: Vec<bf16> = t.values.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                t.name.clone(),
                HostTensor::from_bf16(t.shape.clone(), &values),
            )
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &weights)?;
    let mut optimizer = Vec::with_capacity(3 * state.masters.len());
    for (i, t) in state.masters.iter().enumerate() {
        for (prefix, values) in [
            ("master", &t.values),
            ("exp_avg", &state.exp_avg[i]),
            ("exp_avg_sq", &state.exp_avg_sq[i]),
        ] {
            optimizer.push((
                format!("{prefix}.{}", t.name),
                HostTensor::from_f32(t.shape.clone(), values),
            ));
        }
    }
    write_safetensors(&dir.join("optimizer.safetensors"), &optimizer)?;
    let path = dir.join("trainer_state.json");
    std::fs::write(&path, serde_json::to_string_pretty(trainer_state)? + "\n")
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The checkpoint `--resume` continues from: the folder under `out` named `step-N` with the
/// largest `N` that holds a trainer state.
pub fn latest(out: &Path) -> Result<Option<PathBuf>> {
    latest_named(out, "step-")
}

/// The folder under `out` named `PREFIX` + N with the largest N that holds a trainer state.
pub fn latest_named(out: &Path, prefix: &str) -> Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(None);
    };
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in entries {
        let path = entry?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(step) = step {
            if path.join("trainer_state.json").is_file() && best.as_ref().is_none_or(|b| step > b.0)
            {
                best = Some((step, path));
            }
        }
    }
    Ok(best.map(|(_, p)| p))
}

/// A checkpoint's `trainer_state.json`.
pub fn read_state(dir: &Path) -> Result<Value> {
    let path = dir.join("trainer_state.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

/// The checkpoint `rft`/`dapo --resume` continues from, with its trainer state: the latest
/// `step-N` or `final` (a finished run's, or one that saved no `step-N`), whichever recorded the
/// later step.
pub fn latest_with_final(out: &Path) -> Result<Option<(PathBuf, Value)>> {
    let mut best: Option<(u64, PathBuf, Value)> = None;
    let final_dir = out.join("final");
    let candidates = latest(out)?.into_iter().chain(
        final_dir
            .join("trainer_state.json")
            .is_file()
            .then_some(final_dir),
    );
    for dir in candidates {
        let state = read_state(&dir)?;
        let step = state["step"]
            .as_u64()
            .with_context(|| format!("{}/trainer_state.json: no step", dir.display()))?;
        if best.as_ref().is_none_or(|b| step > b.0) {
            best = Some((step, dir, state));
        }
    }
    Ok(best.map(|(_, dir, state)| (dir, state)))
}

/// Reads a checkpoint's trainer state and optimizer tensors, checking every expected parameter
/// (`names_and_shapes`, in order) is there with its shape.
pub fn load(
    dir: &Path,
    names_and_shapes: &[(String, Vec<usize>)],
) -> Result<(Value, OptimizerState)> {
    let trainer_state = read_state(dir)?;
    let opt_path = dir.join("optimizer.safetensors");
    let bytes =
        std::fs::read(&opt_path).with_context(|| format!("cannot read {}", opt_path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{}: not a safetensors file", opt_path.display()))?;
    let read = |key: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let view = st
            .tensor(key)
            .with_context(|| format!("{}: no tensor {key}", opt_path.display()))?;
        if view.shape() != shape || view.dtype() != safetensors::Dtype::F32 {
            bail!(
                "{}: {key} is {:?} {:?}, expected F32 {shape:?}",
                opt_path.display(),
                view.dtype(),
                view.shape()
            );
        }
        Ok(view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let mut state = OptimizerState {
        masters: Vec::new(),
        exp_avg: Vec::new(),
        exp_avg_sq: Vec::new(),
    };
    for (name, shape) in names_and_shapes {
        state.masters.push(NamedTensor {
            name: name.clone(),
            shape: shape.clone(),
            values: read(&format!("master.{name}"), shape)?,
        });
        state.exp_avg.push(read(&format!("exp_avg.{name}"), shape)?);
        state
            .exp_avg_sq
            .push(read(&format!("exp_avg_sq.{name}"), shape)?);
    }
    Ok((trainer_state, state))
}
