//! The tokenizer a run's token ids are decoded with: the one the run itself used, found from
//! what the run folder records.
//!
//! ```text
//!   --tokenizer DIR                        given: DIR/tokenizer.json (an error if unreadable)
//!   the model the run records              rollout.json / eval.json `model`, or the latest
//!                                          checkpoint's trainer_state.json `options.model`:
//!     null (a scripted policy, no model)     the embedded Qwen2.5 tokenizer, as the run used
//!     preset:NAME                            OUT/base-model
//!     a folder                               its tokenizer (the embedded Qwen2.5 one if it has
//!                                            no tokenizer.json, as the run did)
//!   OUT/base-model, a checkpoint's files   when nothing is recorded
//!   none of these                          the pages say so and show token ids
//! ```

use super::load::{read_json, RunInputs};
use crate::tokenizer::Tokenizer;
use anyhow::{Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tokenizer found, and a sentence saying where it came from or why there is none.
pub struct RunTokenizer {
    pub tokenizer: Option<Tokenizer>,
    pub origin: String,
}

impl RunTokenizer {
    fn found(tokenizer: Tokenizer, origin: String) -> Self {
        Self {
            tokenizer: Some(tokenizer),
            origin,
        }
    }
}

/// The run's tokenizer (see the module's diagram). Only `given` may fail: a tokenizer found in
/// the run folder that does not load is reported on the pages, which then show token ids.
pub fn find_tokenizer(inputs: &RunInputs, given: Option<&Path>) -> Result<RunTokenizer> {
    if let Some(dir) = given {
        let tokenizer =
            Tokenizer::from_dir(dir).with_context(|| format!("--tokenizer {}", dir.display()))?;
        return Ok(RunTokenizer::found(
            tokenizer,
            format!("{} (--tokenizer)", dir.join("tokenizer.json").display()),
        ));
    }
    let out = &inputs.out;
    let (recorded, record_file) = recorded_model(inputs);
    let candidate = match recorded {
        Some(Value::Null) => {
            return Ok(match Tokenizer::qwen25() {
                Ok(t) => RunTokenizer::found(
                    t,
                    format!("the embedded Qwen2.5 tokenizer ({} records no model: a scripted policy used it)", record_file.display()),
                ),
                Err(e) => unloadable("the embedded Qwen2.5 tokenizer", &e),
            })
        }
        Some(Value::String(model)) if model.starts_with("preset:") => Some(out.join("base-model")),
        Some(Value::String(model)) => Some(PathBuf::from(model)),
        _ => None,
    };
    let mut looked = Vec::new();
    for dir in candidate.into_iter().chain(fallback_dirs(out)) {
        if dir.join("config.json").is_file() || dir.join("tokenizer.json").is_file() {
            // As the run loaded it: a model folder without tokenizer.json has the embedded one.
            let origin = if dir.join("tokenizer.json").is_file() {
                dir.join("tokenizer.json").display().to_string()
            } else {
                format!(
                    "the embedded Qwen2.5 tokenizer ({} has no tokenizer.json)",
                    dir.display()
                )
            };
            return Ok(match Tokenizer::for_model_dir(&dir) {
                Ok(t) => RunTokenizer::found(t, origin),
                Err(e) => unloadable(&origin, &e),
            });
        }
        looked.push(dir.display().to_string());
    }
    Ok(RunTokenizer {
        tokenizer: None,
        origin: format!(
            "no tokenizer found (looked in {}): token ids are shown; pass --tokenizer DIR to decode them",
            if looked.is_empty() { "nothing the run records".into() } else { looked.join(", ") }
        ),
    })
}

fn unloadable(what: &str, error: &anyhow::Error) -> RunTokenizer {
    RunTokenizer {
        tokenizer: None,
        origin: format!("{what} does not load ({error:#}): token ids are shown"),
    }
}

/// The `model` the run records, and the file that records it: `rollout.json`/`eval.json` of a
/// rollout folder, or the `options.model` of an `rl` run's latest checkpoint.
fn recorded_model(inputs: &RunInputs) -> (Option<Value>, PathBuf) {
    for set in &inputs.sets {
        if set.iteration.is_none() {
            if let Some(model) = set.summary.as_ref().and_then(|s| s.get("model")) {
                return (
                    Some(model.clone()),
                    inputs.out.join(format!("{}.json", set.name)),
                );
            }
        }
    }
    if let Some(checkpoint) = checkpoints(&inputs.out).pop() {
        let state = checkpoint.join("trainer_state.json");
        if let Ok(value) = read_json(&state) {
            if let Some(model) = value.get("options").and_then(|o| o.get("model")) {
                return (Some(model.clone()), state);
            }
        }
    }
    (None, inputs.out.clone())
}

/// `OUT/iteration-N/` checkpoints, oldest first.
fn checkpoints(out: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("iteration-"))
        })
        .collect();
    found.sort();
    found
}

/// Where a run keeps a tokenizer when it records no model: the preset model it wrote, then its
/// checkpoints (newest first; they carry the starting model's tokenizer files).
fn fallback_dirs(out: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![out.join("base-model")];
    dirs.extend(checkpoints(out).into_iter().rev());
    dirs.push(out.join("final"));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::report::load::EpisodeSet;
    use serde_json::json;

    fn rollout_inputs(out: &Path, summary: Option<Value>) -> RunInputs {
        RunInputs {
            out: out.to_path_buf(),
            sets: vec![EpisodeSet {
                name: "rollout".into(),
                path: out.join("trajectories.jsonl"),
                iteration: None,
                summary,
            }],
        }
    }

    #[test]
    fn the_recorded_model_picks_the_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        // No model recorded, nothing in the folder: none, and the sentence says where it looked.
        let none = find_tokenizer(&rollout_inputs(dir.path(), None), None).unwrap();
        assert!(none.tokenizer.is_none());
        assert!(
            none.origin.contains("base-model") && none.origin.contains("--tokenizer"),
            "{}",
            none.origin
        );
        // A scripted policy's run (model null) used the embedded Qwen2.5 tokenizer.
        let scripted = find_tokenizer(
            &rollout_inputs(dir.path(), Some(json!({"model": null}))),
            None,
        )
        .unwrap();
        assert_eq!(
            scripted.tokenizer.unwrap().token_id("<|im_end|>"),
            Some(151645)
        );
        assert!(
            scripted.origin.contains("embedded Qwen2.5"),
            "{}",
            scripted.origin
        );
        // A model folder without tokenizer.json: the embedded one, as the run loaded it.
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        let summary = json!({"model": model.display().to_string()});
        let found = find_tokenizer(&rollout_inputs(dir.path(), Some(summary)), None).unwrap();
        assert!(found.tokenizer.is_some());
        assert!(
            found.origin.contains("has no tokenizer.json"),
            "{}",
            found.origin
        );
        // A broken tokenizer file is reported, not fatal.
        std::fs::write(model.join("tokenizer.json"), "{").unwrap();
        let summary = json!({"model": model.display().to_string()});
        let broken = find_tokenizer(&rollout_inputs(dir.path(), Some(summary)), None).unwrap();
        assert!(broken.tokenizer.is_none());
        assert!(broken.origin.contains("does not load"), "{}", broken.origin);
        // --tokenizer that cannot be read is an error naming the flag.
        let error = find_tokenizer(&rollout_inputs(dir.path(), None), Some(&model))
            .err()
            .unwrap();
        assert!(format!("{error:#}").contains("--tokenizer"), "{error:#}");
    }
}
