//! The report's input: which episode sets a run folder holds, and its trajectory lines read one
//! at a time, each checked, with errors that name `file:line` and the field.
//!
//! ```text
//!   OUT/trajectories.jsonl  (+ rollout.json or eval.json)   `rollout`, `eval`: one set
//!   OUT/rollouts/iteration-N.jsonl  (+ iterations.jsonl)     `rl --save-rollouts`: a set per
//!                                                            iteration (0: the RFT phase)
//! ```

use crate::agent::episode::GradingRecord;
use crate::jsonl::{at, read_objects, ObjectLines};
use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One file of episodes: a rollout folder's, or one iteration's of an `rl` run.
#[derive(Clone, Debug)]
pub struct EpisodeSet {
    /// The report's folder for it: `rollout`, `eval`, `trajectories` or `iteration-000003`.
    pub name: String,
    pub path: PathBuf,
    /// The `rl` iteration the episodes are from.
    pub iteration: Option<usize>,
    /// What the run wrote about the set: its `rollout.json`/`eval.json`, or its line of
    /// `iterations.jsonl`.
    pub summary: Option<Value>,
}

/// What a run folder holds for the report.
pub struct RunInputs {
    pub out: PathBuf,
    pub sets: Vec<EpisodeSet>,
}

/// The episode sets of the run folder `out` (see the module's diagram), in iteration order.
pub fn find_inputs(out: &Path) -> Result<RunInputs> {
    if !out.is_dir() {
        bail!(
            "{}: no such folder (expected the OUT folder of `swerve-train rollout`, `eval` or `rl`)",
            out.display()
        );
    }
    let mut sets = Vec::new();
    let trajectories = out.join("trajectories.jsonl");
    if trajectories.is_file() {
        sets.push(rollout_set(out, trajectories)?);
    }
    let rollouts = out.join("rollouts");
    if rollouts.is_dir() {
        sets.extend(iteration_sets(out, &rollouts)?);
    }
    if sets.is_empty() {
        if out.join("iterations.jsonl").is_file() {
            bail!(
                "{}: an `rl` run that kept no episodes: rerun it with --save-rollouts to have each \
                 iteration's episodes written to {}/iteration-N.jsonl",
                out.display(),
                rollouts.display()
            );
        }
        bail!(
            "{}: no episodes: expected trajectories.jsonl (`swerve-train rollout` or `eval`) or \
             rollouts/iteration-N.jsonl (`swerve-train rl --save-rollouts`)",
            out.display()
        );
    }
    Ok(RunInputs {
        out: out.to_path_buf(),
        sets,
    })
}

/// `OUT/trajectories.jsonl`, named by the summary beside it.
fn rollout_set(out: &Path, path: PathBuf) -> Result<EpisodeSet> {
    for name in ["rollout", "eval"] {
        let summary_path = out.join(format!("{name}.json"));
        if summary_path.is_file() {
            return Ok(EpisodeSet {
                name: name.to_string(),
                path,
                iteration: None,
                summary: Some(read_json(&summary_path)?),
            });
        }
    }
    Ok(EpisodeSet {
        name: "trajectories".into(),
        path,
        iteration: None,
        summary: None,
    })
}

/// `OUT/rollouts/iteration-N.jsonl`, each with its line of `OUT/iterations.jsonl` if it has one.
fn iteration_sets(out: &Path, rollouts: &Path) -> Result<Vec<EpisodeSet>> {
    let lines_path = out.join("iterations.jsonl");
    let lines = if lines_path.is_file() {
        read_objects(&lines_path)?
    } else {
        Vec::new()
    };
    let entries = std::fs::read_dir(rollouts)
        .with_context(|| format!("cannot list {}", rollouts.display()))?;
    let mut sets = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", rollouts.display()))?;
        let file_name = entry.file_name();
        let Some(number) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix("iteration-")?.strip_suffix(".jsonl"))
        else {
            continue; // a `.partial` left by a killed run, or someone else's file
        };
        let iteration: usize = number.parse().map_err(|_| {
            anyhow!(
                "{}: expected iteration-N.jsonl with N a number",
                entry.path().display()
            )
        })?;
        let summary = lines
            .iter()
            .rev()
            .find(|(_, l)| l["iteration"].as_u64() == Some(iteration as u64))
            .map(|(_, l)| l.clone());
        sets.push(EpisodeSet {
            name: format!("iteration-{iteration:06}"),
            path: entry.path(),
            iteration: Some(iteration),
            summary,
        });
    }
    sets.sort_by_key(|s| s.iteration);
    Ok(sets)
}

/// A whole JSON file (a run's summary).
pub fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

/// One trajectory line, as `rollout`, `eval` and `rl --save-rollouts` write it
/// ([`crate::agent::episode::Episode::to_json`], plus `advantage` and `kept` from `rl`).
#[derive(Clone, Debug, Default)]
pub struct EpisodeLine {
    /// Where it was read: `file:line`.
    pub place: String,
    /// Its line in the file (1-based).
    pub line_no: usize,
    pub task: String,
    pub sample: usize,
    pub seed: Option<u64>,
    pub reward: f64,
    pub resolved: bool,
    pub turns: usize,
    pub format_errors: usize,
    /// `submitted`, `max_turns`, `context_full` or `error`.
    pub finish: String,
    /// The infrastructure's failure, for `finish: error`.
    pub error: Option<String>,
    pub weight_version: Option<(u64, u64)>,
    pub infra_retries: usize,
    pub patch: Option<String>,
    /// Files the diff left out, with why.
    pub patch_dropped: Vec<(String, String)>,
    pub suspicious: bool,
    pub suspicious_reasons: Vec<String>,
    pub grading: Option<GradingRecord>,
    pub tokens: Vec<u32>,
    pub action_mask: Vec<u8>,
    pub messages: Vec<Value>,
    /// `rl`: the group advantage (`None` where the episode was dropped).
    pub advantage: Option<f64>,
    /// `rl`: whether the episode was trained on.
    pub kept: Option<bool>,
}

/// `obj[key]` as a `T`; `None` when absent or null; an error naming `place` and the key when it
/// has another type.
fn field<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    key: &str,
    place: &str,
) -> Result<Option<T>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => T::deserialize(value)
            .map(Some)
            .map_err(|e| anyhow!("{place}: `{key}`: {e}")),
    }
}

/// [`field`] that must be there.
fn required<T: DeserializeOwned>(obj: &Map<String, Value>, key: &str, place: &str) -> Result<T> {
    field(obj, key, place)?.ok_or_else(|| {
        anyhow!("{place}: no `{key}`: not a trajectory line of `swerve-train rollout`, `eval` or `rl --save-rollouts`")
    })
}

impl EpisodeLine {
    /// Reads and checks the line `line_no` of `path`.
    pub fn parse(path: &Path, line_no: usize, value: &Value) -> Result<Self> {
        let place = at(path, line_no);
        let obj = value
            .as_object()
            .ok_or_else(|| anyhow!("{place}: expected a JSON object"))?;
        let p = place.as_str();
        let weight_version: Option<[u64; 2]> = field(obj, "weight_version", p)?;
        let line = Self {
            task: required(obj, "task", p)?,
            sample: required(obj, "sample", p)?,
            seed: field(obj, "seed", p)?,
            reward: required(obj, "reward", p)?,
            resolved: required(obj, "resolved", p)?,
            turns: required(obj, "turns", p)?,
            format_errors: field(obj, "format_errors", p)?.unwrap_or(0),
            finish: required(obj, "finish", p)?,
            error: field(obj, "error", p)?,
            weight_version: weight_version.map(|[a, b]| (a, b)),
            infra_retries: field(obj, "infra_retries", p)?.unwrap_or(0),
            patch: field(obj, "patch", p)?,
            patch_dropped: field(obj, "patch_dropped", p)?.unwrap_or_default(),
            suspicious: field(obj, "suspicious", p)?.unwrap_or(false),
            suspicious_reasons: field(obj, "suspicious_reasons", p)?.unwrap_or_default(),
            grading: field(obj, "grading", p)?,
            tokens: field(obj, "tokens", p)?.unwrap_or_default(),
            action_mask: field(obj, "action_mask", p)?.unwrap_or_default(),
            messages: field(obj, "messages", p)?.unwrap_or_default(),
            advantage: field(obj, "advantage", p)?,
            kept: field(obj, "kept", p)?,
            place,
            line_no,
        };
        line.check()?;
        Ok(line)
    }

    /// What the fields must agree on.
    fn check(&self) -> Result<()> {
        let place = &self.place;
        if self.tokens.len() != self.action_mask.len() {
            bail!(
                "{place}: {} tokens but {} action_mask entries (one each)",
                self.tokens.len(),
                self.action_mask.len()
            );
        }
        if let Some(i) = self.action_mask.iter().position(|&m| m > 1) {
            bail!(
                "{place}: action_mask[{i}] is {}: expected 0 or 1",
                self.action_mask[i]
            );
        }
        if !self.reward.is_finite() {
            bail!("{place}: `reward` is not a finite number");
        }
        for (i, message) in self.messages.iter().enumerate() {
            let role = message.get("role").and_then(Value::as_str);
            if role.is_none() {
                bail!("{place}: messages[{i}] has no string `role`");
            }
        }
        Ok(())
    }
}

/// The episodes of a file, one line at a time.
pub struct EpisodeLines {
    lines: ObjectLines,
}

impl EpisodeLines {
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            lines: ObjectLines::open(path)?,
        })
    }

    /// The next episode; `None` at the end of the file.
    pub fn next_episode(&mut self) -> Result<Option<EpisodeLine>> {
        match self.lines.next_object()? {
            None => Ok(None),
            Some((line_no, value)) => {
                EpisodeLine::parse(self.lines.path(), line_no, &value).map(Some)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good_line() -> Value {
        json!({"group": "t", "task": "t", "sample": 0, "seed": 7, "reward": 0.5, "resolved": true,
            "turns": 2, "format_errors": 1, "finish": "submitted", "tokens": [1, 2, 3],
            "action_mask": [0, 1, 1], "messages": [{"role": "user", "content": "hi"}],
            "patch": "diff", "suspicious": true, "suspicious_reasons": ["exit"],
            "patch_dropped": [["a.pyc", "compiled"]], "weight_version": [1, 2],
            "advantage": null, "kept": false})
    }

    fn parse(value: &Value) -> Result<EpisodeLine> {
        EpisodeLine::parse(Path::new("/runs/x/trajectories.jsonl"), 3, value)
    }

    #[test]
    fn a_line_reads_with_every_field() {
        let line = parse(&good_line()).unwrap();
        assert_eq!(line.place, "/runs/x/trajectories.jsonl:3");
        assert_eq!((line.task.as_str(), line.sample, line.turns), ("t", 0, 2));
        assert_eq!(line.weight_version, Some((1, 2)));
        assert_eq!(line.patch_dropped, [("a.pyc".into(), "compiled".into())]);
        assert!(line.suspicious && line.advantage.is_none() && line.kept == Some(false));
    }

    #[test]
    fn bad_lines_name_the_file_line_and_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"task": "t"}), "trajectories.jsonl:3: no `sample`"),
            (
                {
                    let mut v = good_line();
                    v["reward"] = json!("high");
                    v
                },
                "trajectories.jsonl:3: `reward`: invalid type: string",
            ),
            (
                {
                    let mut v = good_line();
                    v["action_mask"] = json!([0, 1]);
                    v
                },
                "3 tokens but 2 action_mask entries",
            ),
            (
                {
                    let mut v = good_line();
                    v["action_mask"] = json!([0, 2, 1]);
                    v
                },
                "action_mask[1] is 2",
            ),
            (
                {
                    let mut v = good_line();
                    v["messages"] = json!([{"content": "x"}]);
                    v
                },
                "messages[0] has no string `role`",
            ),
            (json!([1]), "trajectories.jsonl:3: expected a JSON object"),
        ];
        for (value, want) in cases {
            let error = format!("{:#}", parse(&value).unwrap_err());
            assert!(error.contains(want), "{error} lacks {want}");
        }
    }

    #[test]
    fn sets_are_found_in_rollout_and_rl_folders() {
        let dir = tempfile::tempdir().unwrap();
        let error = find_inputs(dir.path()).err().unwrap().to_string();
        assert!(error.contains("no episodes"), "{error}");
        std::fs::write(dir.path().join("iterations.jsonl"), "{\"iteration\": 1}\n").unwrap();
        let error = find_inputs(dir.path()).err().unwrap().to_string();
        assert!(error.contains("--save-rollouts"), "{error}");
        let rollouts = dir.path().join("rollouts");
        std::fs::create_dir(&rollouts).unwrap();
        for n in [10, 2] {
            std::fs::write(rollouts.join(format!("iteration-{n:06}.jsonl")), "").unwrap();
        }
        std::fs::write(rollouts.join("iteration-000011.jsonl.partial"), "").unwrap();
        std::fs::write(dir.path().join("trajectories.jsonl"), "").unwrap();
        std::fs::write(dir.path().join("rollout.json"), "{\"resolved\": 1}").unwrap();
        let found = find_inputs(dir.path()).unwrap();
        let names: Vec<&str> = found.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["rollout", "iteration-000002", "iteration-000010"]);
        assert_eq!(found.sets[0].summary.as_ref().unwrap()["resolved"], 1);
        std::fs::write(dir.path().join("rollout.json"), "{\"resolved\": ").unwrap();
        let error = format!("{:#}", find_inputs(dir.path()).err().unwrap());
        assert!(error.contains("rollout.json: not valid JSON"), "{error}");
        let error = format!("{:#}", find_inputs(&dir.path().join("nope")).err().unwrap());
        assert!(error.contains("nope: no such folder"), "{error}");
    }
}
