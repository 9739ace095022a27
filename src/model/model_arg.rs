//! `--model` arguments: a folder, or `preset:NAME` written once into the run's folder. Above
//! both model writers ([`crate::model::synthetic`] and [`crate::model::toy`]), which the toy's
//! writer itself uses the first of.

use crate::model::synthetic::{preset, write_model_dir};
use crate::model::toy::write_toy_model_dir;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// A `--model` argument as a folder: a folder as given, or `preset:NAME` — the random-weight
/// model of a preset (`preset:default` is the embedded default), written to `OUT/base-model` the
/// first time and reused after (the same preset and seed give the same weights).
pub fn resolve_model_arg(model: &Path, out: &Path) -> Result<std::path::PathBuf> {
    let Some(name) = model.to_str().and_then(|m| m.strip_prefix("preset:")) else {
        return Ok(model.to_path_buf());
    };
    let dir = out.join("base-model");
    if name == "toy" {
        if !dir.join("model.safetensors").is_file() {
            write_toy_model_dir(&dir, 0x5EED)?;
        }
        return Ok(dir);
    }
    let (config, tp_size) = preset(name).with_context(|| format!("--model {}", model.display()))?;
    if tp_size != 1 {
        bail!(
            "--model {}: the preset is one rank of tensor-parallel {tp_size}; this runs TP = 1",
            model.display()
        );
    }
    if !dir.join("model.safetensors").is_file() {
        write_model_dir(&config, 0x5EED, &dir)?;
    }
    Ok(dir)
}
