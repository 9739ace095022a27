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
//! leaves a half-written checkpoint under a real name. Tensors are whole whatever the
//! tensor-parallel degree of the run: its ranks' pieces are gathered one tensor at a time as it
//! is written, and a resume at any degree reads each rank's slices of the mapped file.

use crate::model::params::ParamShard;
use crate::model::weights::{Checkpoint, SafetensorsWriter};
use crate::tensor::DType;
use anyhow::{bail, Context, Result};
use half::bf16;
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

/// A checkpoint folder written tensor by tensor (one tensor in memory at a time, whatever the
/// model's size): [`CheckpointWriter::begin`] copies the model's files and writes both
/// safetensors headers into `OUT/.NAME.partial/`, [`CheckpointWriter::put`] adds each parameter's
/// master (also as the bf16 model weight) and moments in parameter order, and
/// [`CheckpointWriter::finish`] writes `trainer_state.json` and renames the folder into place.
pub struct CheckpointWriter {
    dir: PathBuf,
    partial: PathBuf,
    model: SafetensorsWriter,
    optimizer: SafetensorsWriter,
}

impl CheckpointWriter {
    /// Starts `dir` (replacing an older one of the same name when finished) for the parameters
    /// `tensors` (HF name, whole shape), copying `source_model_dir`'s config and tokenizer files.
    pub fn begin(
        dir: &Path,
        source_model_dir: &Path,
        tensors: &[(String, Vec<usize>)],
    ) -> Result<Self> {
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
        let started = (|| {
            copy_model_files(&partial, source_model_dir)?;
            let model_header: Vec<_> = tensors
                .iter()
                .map(|(n, shape)| (n.clone(), DType::BF16, shape.clone()))
                .collect();
            let optimizer_header: Vec<_> = tensors
                .iter()
                .flat_map(|(n, shape)| {
                    OPTIMIZER_PARTS.map(|part| (format!("{part}.{n}"), DType::F32, shape.clone()))
                })
                .collect();
            Ok((
                SafetensorsWriter::create(&partial.join("model.safetensors"), &model_header)?,
                SafetensorsWriter::create(
                    &partial.join("optimizer.safetensors"),
                    &optimizer_header,
                )?,
            ))
        })();
        match started {
            Ok((model, optimizer)) => Ok(Self {
                dir: dir.to_path_buf(),
                partial,
                model,
                optimizer,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&partial);
                Err(e)
            }
        }
    }

    /// The next parameter (in the order given to [`Self::begin`]): its f32 master, written
    /// rounded to bf16 into the model and whole into the optimizer state, and its moments. A
    /// master holding NaN or Inf is refused.
    pub fn put(
        &mut self,
        name: &str,
        master: &[f32],
        exp_avg: &[f32],
        exp_avg_sq: &[f32],
    ) -> Result<()> {
        if master.iter().any(|v| !v.is_finite()) {
            bail!("refusing to checkpoint {name}: it holds NaN or Inf");
        }
        let weight: Vec<bf16> = master.iter().map(|&v| bf16::from_f32(v)).collect();
        self.model.write(name, bytemuck::cast_slice(&weight))?;
        for (part, values) in OPTIMIZER_PARTS.iter().zip([master, exp_avg, exp_avg_sq]) {
            self.optimizer
                .write(&format!("{part}.{name}"), bytemuck::cast_slice(values))?;
        }
        Ok(())
    }

    /// Completes the folder: `trainer_state.json`, then the rename into place.
    pub fn finish(self, trainer_state: &Value) -> Result<()> {
        let (dir, partial) = (self.dir.clone(), self.partial.clone());
        let written = (|| {
            self.model.finish()?;
            self.optimizer.finish()?;
            let path = partial.join("trainer_state.json");
            std::fs::write(&path, serde_json::to_string_pretty(trainer_state)? + "\n")
                .with_context(|| format!("cannot write {}", path.display()))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot replace {}", dir.display()))?;
        }
        std::fs::rename(&partial, &dir)
            .with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))
    }

    /// Gives up: removes the half-written folder.
    pub fn abandon(self) {
        let _ = std::fs::remove_dir_all(&self.partial);
    }
}

/// The optimizer state's parts, in the order the file holds each parameter's.
const OPTIMIZER_PARTS: [&str; 3] = ["master", "exp_avg", "exp_avg_sq"];

/// `config.json` and the tokenizer files of the model trained from (the embedded Qwen2.5
/// tokenizer's when it has none: what it ran with).
fn copy_model_files(dir: &Path, source_model_dir: &Path) -> Result<()> {
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
        for (file, bytes) in crate::tokenizer::embedded_qwen25_files() {
            let path = dir.join(file);
            std::fs::write(&path, bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(())
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

/// A checkpoint's optimizer state, mapped: each rank reads the slices of its part of the model.
pub struct OptimizerFile {
    path: PathBuf,
    file: Checkpoint,
}

impl OptimizerFile {
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("optimizer.safetensors");
        Ok(Self {
            file: Checkpoint::open_file(&path)?,
            path,
        })
    }

    /// `(master, exp_avg, exp_avg_sq)` of parameter `name`, this rank's slice (`shard`) of each.
    pub fn read(&self, name: &str, shard: &ParamShard) -> Result<[Vec<f32>; 3]> {
        let read = |part: &str| -> Result<Vec<f32>> {
            let key = format!("{part}.{name}");
            let whole = self
                .file
                .tensor(&key, &shard.full_shape)
                .with_context(|| format!("{}: optimizer state", self.path.display()))?;
            if whole.dtype != DType::F32 {
                bail!(
                    "{}: {key} is {}, expected F32",
                    self.path.display(),
                    whole.dtype.name()
                );
            }
            let mine = match &shard.split {
                None => whole,
                Some((dim, range)) => whole.slice(*dim, range.clone())?,
            };
            Ok(mine.to_f32_vec())
        };
        Ok(OPTIMIZER_PARTS
            .map(read)
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .expect("three parts"))
    }
}
