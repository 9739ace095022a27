//! A training run's output folder (`rft`, `dapo`, `rl`): what it may hold when a run starts,
//! what `--overwrite` removes, the options a `--resume` must repeat, and the starting model
//! `--model preset:NAME` writes into it.
//!
//! ```text
//! start         OUT empty or absent      OUT holds anything
//!               (or only base-model/)
//! (no flag)     run                      refused: name what is there, suggest the two flags
//! --overwrite   run                      remove what swerve writes there (list below), keep the
//!                                        rest (a data file, notes), then run
//! --resume      run from the beginning   continue from the latest checkpoint, if its recorded
//!                                        options equal this run's (else refused, naming each
//!                                        difference); without one, start over
//! ```
//!
//! What swerve writes under OUT, and all `--overwrite` ever removes: `config.toml`,
//! `metrics.jsonl`, `iterations.jsonl`, `reward.png`, `tb/` (TensorBoard's event files),
//! `base-model/`, `final/`, `handoff/`, `step-N/`, `iteration-N/`, and the `.NAME.partial`
//! folders of checkpoints being written.
//!
//! `config.toml` is the run's resolved configuration (every flag's final value, `--config`
//! file, command line and defaults: [`crate::cli::ResolvedConfig`]), written once OUT is ready
//! and, on `--resume`, after the check below has passed (so a refused resume leaves the run's
//! own). It is a record, not a second check: what a resume must repeat is checked once, against
//! the options each checkpoint recorded ([`RecordedOptions`]), which the same flags produce.

use crate::config::ModelConfig;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// How a run treats what is already in its output folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStart {
    /// OUT must be empty or absent.
    Fresh,
    /// Continue the run in OUT.
    Resume,
    /// Remove what swerve wrote in OUT first.
    Overwrite,
}

/// `name` is something a training command writes under OUT.
fn written_by_swerve(name: &str) -> bool {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let checkpoint_name = |n: &str| {
        matches!(n, "final" | "handoff")
            || n.strip_prefix("step-")
                .or_else(|| n.strip_prefix("iteration-"))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(
        name,
        "config.toml"
            | "metrics.jsonl"
            | "iterations.jsonl"
            | "reward.png"
            | "tb"
            | "base-model"
            | "final"
            | "handoff"
    ) || numbered("step-")
        || numbered("iteration-")
        || name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".partial"))
            .is_some_and(checkpoint_name)
}

/// The names in `out`, sorted (none when it does not exist).
fn entries(out: &Path) -> Result<Vec<String>> {
    let read = match std::fs::read_dir(out) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", out.display())),
    };
    let mut names = Vec::new();
    for entry in read {
        let entry = entry.with_context(|| format!("cannot read {}", out.display()))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn listed(names: &[String]) -> String {
    const SHOWN: usize = 6;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text += &format!(" and {} more", names.len() - SHOWN);
    }
    text
}

/// Makes `out` ready for a run that starts as `start` says (see the module doc), creating it.
/// `Resume` leaves everything in place: the caller restores the checkpoint and trims its logs.
pub fn prepare(out: &Path, start: RunStart) -> Result<()> {
    let names = entries(out)?;
    match start {
        // A `base-model/` alone is reused (when it is the preset asked for: `resolve_model`).
        RunStart::Fresh if names.iter().any(|n| n != "base-model") => bail!(
            "{} is not empty ({}): pass --resume to continue the run in it, --overwrite to delete \
             what swerve wrote there, or choose another output folder",
            out.display(),
            listed(&names)
        ),
        RunStart::Overwrite => {
            let (ours, theirs): (Vec<String>, Vec<String>) =
                names.into_iter().partition(|n| written_by_swerve(n));
            for name in &ours {
                let path = out.join(name);
                let removed = if path.is_dir() && !path.is_symlink() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed
                    .with_context(|| format!("--overwrite: cannot remove {}", path.display()))?;
            }
            if !ours.is_empty() {
                eprintln!(
                    "--overwrite: removed {} from {}",
                    listed(&ours),
                    out.display()
                );
            }
            if !theirs.is_empty() {
                eprintln!(
                    "--overwrite: kept {} in {} (not written by swerve)",
                    listed(&theirs),
                    out.display()
                );
            }
        }
        _ => {}
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))
}

/// Writes `text`, the run's resolved configuration, to `OUT/config.toml`.
pub fn write_config(out: &Path, text: &str) -> Result<()> {
    let path = out.join("config.toml");
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The options a resumed run must repeat, by flag name (`lr`, `batch-size`, ...), in the order
/// they were added. Stored in every checkpoint's `trainer_state.json` under `"options"`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordedOptions(Map<String, Value>);

impl RecordedOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `flag` (without the dashes) with `value`; `None` is recorded as `null`. The value is
    /// kept as it reads back from its JSON text (serde_json's float parsing may differ from the
    /// number printed by the last bit), so a recorded value equals itself after a round trip.
    /// Give f32 options through [`decimal`].
    pub fn with(mut self, flag: &str, value: impl serde::Serialize) -> Self {
        let text = serde_json::to_string(&value).expect("options are plain values");
        let value = serde_json::from_str(&text).expect("serde_json reads what it wrote");
        self.0.insert(flag.to_string(), value);
        self
    }

    pub fn to_json(&self) -> Value {
        Value::Object(self.0.clone())
    }

    /// Refuses to continue the run whose `trainer_state.json` is `saved` (in checkpoint
    /// `checkpoint`) with these options unless every recorded option is equal; the error names
    /// each difference, the run's value first.
    pub fn check_resume(&self, saved: &Value, checkpoint: &Path) -> Result<()> {
        let state = checkpoint.join("trainer_state.json");
        let Some(old) = saved.get("options").and_then(Value::as_object) else {
            bail!(
                "{} records no options (an older swerve wrote it), so --resume cannot check that \
                 this run repeats them: start a new run (--overwrite), or train from its weights \
                 with --model {}",
                state.display(),
                checkpoint.display()
            );
        };
        let shown = |v: Option<&Value>| match v {
            None => "(not recorded)".to_string(),
            Some(Value::Null) => "(not set)".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        let mut differences = Vec::new();
        let mut flags: Vec<&String> = old.keys().collect();
        flags.extend(self.0.keys().filter(|k| !old.contains_key(*k)));
        for flag in flags {
            let (was, now) = (old.get(flag), self.0.get(flag));
            if was != now {
                differences.push(format!(
                    "  --{flag}: {} in the run, {} now",
                    shown(was),
                    shown(now)
                ));
            }
        }
        if !differences.is_empty() {
            let out = checkpoint.parent().unwrap_or(checkpoint);
            let config = out.join("config.toml");
            let repeat = if config.is_file() {
                format!(
                    " (`--config {} --resume` repeats them all)",
                    config.display()
                )
            } else {
                String::new()
            };
            bail!(
                "--resume: this run's options differ from those of the run in {} (recorded in \
                 {}):\n{}\nrepeat the run's options to continue it{repeat}, or start a new run \
                 (--overwrite or another output folder)",
                out.display(),
                state.display(),
                differences.join("\n")
            );
        }
        Ok(())
    }
}

/// An f32 option as the decimal it was given as (`0.1`, not `0.10000000149011612`).
pub fn decimal(v: f32) -> f64 {
    v.to_string().parse().expect("an f32 prints as a number")
}

/// What `--model` names, as recorded: `preset:NAME` as given, a folder as its absolute path (so
/// a resume from another working directory matches).
pub fn model_source(model: &Path) -> String {
    match model.to_str().filter(|m| m.starts_with("preset:")) {
        Some(preset) => preset.to_string(),
        None => std::fs::canonicalize(model)
            .unwrap_or_else(|_| model.to_path_buf())
            .display()
            .to_string(),
    }
}

/// The starting model folder for `--model`: a folder as given; `preset:NAME` is written to
/// `OUT/base-model` the first time and reused after, but only when the model there has the
/// preset's architecture (a run of another preset left it otherwise: an error, never a silent
/// reuse).
pub fn resolve_model(model: &Path, out: &Path) -> Result<PathBuf> {
    if let Some(name) = model.to_str().and_then(|m| m.strip_prefix("preset:")) {
        let base = out.join("base-model");
        if base.join("config.json").is_file() {
            let wanted = if name == "toy" {
                crate::model::toy::config()
            } else {
                crate::model::synthetic::preset(name)
                    .with_context(|| format!("--model {}", model.display()))?
                    .0
            };
            let found = ModelConfig::from_dir(&base)?;
            let differences = config_differences(&found, &wanted);
            if !differences.is_empty() {
                bail!(
                    "{} holds another model than --model {} asks for ({}): pass --overwrite to \
                     replace it, or choose another output folder",
                    base.display(),
                    model.display(),
                    differences.join(", ")
                );
            }
        }
    }
    crate::model::model_arg::resolve_model_arg(model, out)
}

/// `field: found vs wanted` for each architecture field that differs.
fn config_differences(found: &ModelConfig, wanted: &ModelConfig) -> Vec<String> {
    let fields = |c: &ModelConfig| {
        [
            ("hidden_size", c.hidden_size.to_string()),
            ("intermediate_size", c.intermediate_size.to_string()),
            ("num_hidden_layers", c.num_hidden_layers.to_string()),
            ("num_attention_heads", c.num_attention_heads.to_string()),
            ("num_key_value_heads", c.num_key_value_heads.to_string()),
            ("head_dim", c.head_dim.to_string()),
            ("vocab_size", c.vocab_size.to_string()),
            (
                "max_position_embeddings",
                c.max_position_embeddings.to_string(),
            ),
            ("tie_word_embeddings", c.tie_word_embeddings.to_string()),
            ("rms_norm_eps", c.rms_norm_eps.to_string()),
            ("rope", format!("{:?}", c.rope)),
        ]
    };
    fields(found)
        .into_iter()
        .zip(fields(wanted))
        .filter(|(f, w)| f.1 != w.1)
        .map(|((name, f), (_, w))| format!("{name} {f} there, {w} asked"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_swerve_names_count_as_written_by_swerve() {
        for name in [
            "config.toml",
            "metrics.jsonl",
            "iterations.jsonl",
            "reward.png",
            "tb",
            "base-model",
            "final",
            "handoff",
            "step-000002",
            "iteration-12",
            ".step-000004.partial",
            ".final.partial",
        ] {
            assert!(written_by_swerve(name), "{name}");
        }
        for name in [
            "data.jsonl",
            "step-",
            "step-1a",
            "steps",
            "notes.txt",
            ".partial",
            ".x.partial",
            "trajectories.jsonl",
            "config.tom",
            "my-config.toml",
        ] {
            assert!(!written_by_swerve(name), "{name}");
        }
    }

    #[test]
    fn prepare_refuses_used_folders_and_overwrite_keeps_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        prepare(&out, RunStart::Fresh).unwrap();
        assert!(out.is_dir());
        std::fs::create_dir_all(out.join("base-model")).unwrap();
        prepare(&out, RunStart::Fresh).unwrap();
        std::fs::create_dir_all(out.join("step-000002")).unwrap();
        std::fs::write(out.join("step-000002/x"), "x").unwrap();
        std::fs::write(out.join("metrics.jsonl"), "{}\n").unwrap();
        std::fs::create_dir_all(out.join("tb")).unwrap();
        std::fs::write(out.join("tb/events.out.tfevents.1.host.2"), "x").unwrap();
        std::fs::write(out.join("data.jsonl"), "{}\n").unwrap();
        let error = prepare(&out, RunStart::Fresh).unwrap_err().to_string();
        assert!(
            error.contains("not empty (base-model, data.jsonl, metrics.jsonl, step-000002, tb)")
                && error.contains("--resume")
                && error.contains("--overwrite"),
            "{error}"
        );
        prepare(&out, RunStart::Resume).unwrap();
        assert!(out.join("metrics.jsonl").is_file());
        write_config(&out, "lr = 1.0\n").unwrap();
        prepare(&out, RunStart::Overwrite).unwrap();
        assert_eq!(entries(&out).unwrap(), vec!["data.jsonl".to_string()]);
    }

    #[test]
    fn a_resume_names_every_difference_with_both_values() {
        let saved = RecordedOptions::new()
            .with("lr", 0.01)
            .with("weight-decay", decimal(0.1))
            .with("batch-size", 4)
            .with("tis-cap", None::<f32>)
            .with("gone", "x");
        let state = json!({"step": 2, "options": saved.to_json()});
        let checkpoint = Path::new("/runs/a/step-000002");
        saved.check_resume(&state, checkpoint).unwrap();
        let now = RecordedOptions::new()
            .with("lr", 0.02)
            .with("weight-decay", decimal(0.2))
            .with("batch-size", 4)
            .with("tis-cap", Some(decimal(2.0)))
            .with("new", 1);
        let error = now
            .check_resume(&state, checkpoint)
            .unwrap_err()
            .to_string();
        for line in [
            "--lr: 0.01 in the run, 0.02 now",
            "--tis-cap: (not set) in the run, 2.0 now",
            "--weight-decay: 0.1 in the run, 0.2 now",
            "--gone: x in the run, (not recorded) now",
            "--new: (not recorded) in the run, 1 now",
        ] {
            assert!(error.contains(line), "{line} in {error}");
        }
        assert!(!error.contains("batch-size"), "{error}");
        let old = json!({"step": 2});
        let error = now.check_resume(&old, checkpoint).unwrap_err().to_string();
        assert!(error.contains("records no options"), "{error}");
    }
}
