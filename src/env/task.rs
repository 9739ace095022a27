//! Task files: one coding task a line, in swerve's own format or as SWE-bench / SWE-rebench
//! instances. Every error names `file:line: field`.
//!
//! swerve's format (paths relative to the task file):
//!
//! ```text
//! {"id": "calc-div-zero",                      unique in the file
//!  "repo": "calc-div-zero/repo",                the code in its buggy state (a folder)
//!  "tests": "calc-div-zero/tests",              copied over the workspace root before grading
//!  "problem_statement": "...",                  what the agent is told
//!  "test_command": "python3 -m unittest -q tests.test_calc",   exit 0 = resolved
//!  "setup": ["pip install -e ."],               optional, run in the sandbox before the episode
//!  "solution": "calc-div-zero/solution",        optional, files of a correct fix (oracle policy)
//!  "timeout_s": 120,                            optional grading timeout (default 300)
//!  "image": "python:3.11-slim"}                 optional, the docker environment's image
//! ```
//!
//! A SWE-bench line (`instance_id`, `problem_statement`, `test_patch`, `FAIL_TO_PASS`,
//! `PASS_TO_PASS`, the gold `patch` if any (the oracle applies it), and an image: `image_name` / `docker_image`, else SWE-bench's own naming
//! `swebench/sweb.eval.x86_64.<id with "__" as "_1776_">:latest`) lives in its image's `/testbed`
//! and is graded by applying `test_patch` and running the listed tests (`test_cmd` or
//! SWE-rebench's `install_config.test_cmd`, else `pytest -rA`): resolved when that exits 0.

use crate::jsonl;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Grading timeout when a task names none.
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// Where a task's code comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum RepoSource {
    /// A folder copied fresh into every episode's workspace.
    Folder(PathBuf),
    /// Already inside the task's container image, at `workdir` (SWE-bench: `/testbed`).
    InImage { workdir: String },
    /// No repository: the toy number-guessing game, played in process ([`super::toy`]).
    Toy { hidden: i64, low: i64, high: i64 },
}

/// How an episode is graded once it ends.
#[derive(Clone, Debug, PartialEq)]
pub enum Grading {
    /// Copy `tests`' contents over the workspace root, run `test_command`: exit 0 = resolved.
    TestsFolder {
        tests: PathBuf,
        test_command: String,
    },
    /// SWE-bench: apply `test_patch` (it wins over the agent's edits to those files), then run
    /// `test_command` followed by every FAIL_TO_PASS and PASS_TO_PASS test id.
    SweBench {
        test_patch: String,
        fail_to_pass: Vec<String>,
        pass_to_pass: Vec<String>,
        test_command: String,
    },
    /// Run `test_command` as the workspace stands (the toy's `check`).
    Command { test_command: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub id: String,
    pub problem_statement: String,
    pub repo: RepoSource,
    pub grading: Grading,
    /// Shell commands run in the sandbox, in order, before the episode starts.
    pub setup: Vec<String>,
    /// A folder of fixed files (workspace layout), for the oracle policy.
    pub solution: Option<PathBuf>,
    /// A SWE-bench line's gold `patch`, for the oracle policy.
    pub gold_patch: Option<String>,
    /// Grading's time limit.
    pub timeout_s: u64,
    /// The container image for the docker environment.
    pub image: Option<String>,
    /// `file:line` the task came from, for messages.
    pub origin: String,
}

impl Task {
    /// The shell command grading runs, the test ids included.
    pub fn grading_command(&self) -> String {
        match &self.grading {
            Grading::TestsFolder { test_command, .. } | Grading::Command { test_command } => {
                test_command.clone()
            }
            Grading::SweBench {
                fail_to_pass,
                pass_to_pass,
                test_command,
                ..
            } => {
                let mut command = test_command.clone();
                for id in fail_to_pass.iter().chain(pass_to_pass) {
                    command.push(' ');
                    command.push_str(&shell_quote(id));
                }
                command
            }
        }
    }
}

/// `s` as one single-quoted shell word.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Reads a task file (either format, line by line). Ids must be unique; folders must exist.
pub fn load_tasks(path: &Path) -> Result<Vec<Task>> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut tasks = Vec::new();
    let mut seen = HashSet::new();
    for (line_no, value) in jsonl::read_objects(path)? {
        let at = jsonl::at(path, line_no);
        let task = if value.get("instance_id").is_some() {
            parse_swe_bench(&value, &at)?
        } else if value.get("toy").is_some() {
            parse_toy(&value, &at)?
        } else {
            parse_native(&value, base, &at)?
        };
        if !seen.insert(task.id.clone()) {
            bail!("{at}: id: {:?} is used by an earlier line", task.id);
        }
        tasks.push(task);
    }
    if tasks.is_empty() {
        bail!("{}: no tasks in the file", path.display());
    }
    Ok(tasks)
}

const NATIVE_FIELDS: &[&str] = &[
    "id",
    "repo",
    "tests",
    "problem_statement",
    "test_command",
    "setup",
    "solution",
    "timeout_s",
    "image",
];

fn parse_native(value: &Value, base: &Path, at: &str) -> Result<Task> {
    let obj = value.as_object().expect("read_objects gives objects");
    if let Some(unknown) = obj.keys().find(|k| !NATIVE_FIELDS.contains(&k.as_str())) {
        bail!(
            "{at}: {unknown}: unknown field (a task has {})",
            NATIVE_FIELDS.join(", ")
        );
    }
    let id = required_str(value, "id", at)?;
    if id.is_empty() || id.contains('/') || id.contains(char::is_whitespace) {
        bail!("{at}: id: {id:?} must be non-empty, without `/` or spaces");
    }
    let folder = |field: &str| -> Result<PathBuf> {
        let rel = required_str(value, field, at)?;
        let dir = base.join(&rel);
        if !dir.is_dir() {
            bail!("{at}: {field}: {} is not a folder", dir.display());
        }
        Ok(dir)
    };
    let repo = folder("repo")?;
    let tests = folder("tests")?;
    let solution = match value.get("solution") {
        None | Some(Value::Null) => None,
        Some(_) => Some(folder("solution")?),
    };
    let test_command = required_str(value, "test_command", at)?;
    if test_command.trim().is_empty() {
        bail!("{at}: test_command: empty");
    }
    Ok(Task {
        problem_statement: required_str(value, "problem_statement", at)?,
        repo: RepoSource::Folder(repo),
        grading: Grading::TestsFolder {
            tests,
            test_command,
        },
        setup: string_list(value, "setup", at)?,
        solution,
        gold_patch: None,
        timeout_s: timeout(value, at)?,
        image: optional_str(value, "image", at)?,
        origin: at.to_string(),
        id,
    })
}

fn parse_swe_bench(value: &Value, at: &str) -> Result<Task> {
    let id = required_str(value, "instance_id", at)?;
    let image = match optional_str(value, "image_name", at)? {
        Some(image) => image,
        None => match optional_str(value, "docker_image", at)? {
            Some(image) => image,
            None => format!(
                "swebench/sweb.eval.x86_64.{}:latest",
                id.replace("__", "_1776_").to_lowercase()
            ),
        },
    };
    let test_command = match optional_str(value, "test_cmd", at)? {
        Some(cmd) => cmd,
        None => match value.pointer("/install_config/test_cmd") {
            Some(Value::String(cmd)) => cmd.clone(),
            // SWE-rebench sometimes lists several; they run in order.
            Some(Value::Array(cmds)) => cmds
                .iter()
                .map(|c| {
                    c.as_str().map(str::to_string).ok_or_else(|| {
                        anyhow!("{at}: install_config.test_cmd: expected strings, found {c}")
                    })
                })
                .collect::<Result<Vec<_>>>()?
                .join(" && "),
            None | Some(Value::Null) => "pytest -rA".to_string(),
            Some(other) => {
                bail!("{at}: install_config.test_cmd: expected a string, found {other}")
            }
        },
    };
    let fail_to_pass = test_list(value, "FAIL_TO_PASS", at)?;
    if fail_to_pass.is_empty() {
        bail!("{at}: FAIL_TO_PASS: no tests, so nothing could tell a fix from no fix");
    }
    let workdir = optional_str(value, "workdir", at)?.unwrap_or_else(|| "/testbed".into());
    Ok(Task {
        problem_statement: required_str(value, "problem_statement", at)?,
        repo: RepoSource::InImage { workdir },
        grading: Grading::SweBench {
            test_patch: required_str(value, "test_patch", at)?,
            fail_to_pass,
            pass_to_pass: test_list(value, "PASS_TO_PASS", at)?,
            test_command,
        },
        setup: string_list(value, "setup", at)?,
        solution: None,
        gold_patch: optional_str(value, "patch", at)?.filter(|p| !p.trim().is_empty()),
        timeout_s: timeout(value, at)?,
        image: Some(image),
        origin: at.to_string(),
        id,
    })
}

/// `{"id", "problem_statement", "toy": {"hidden", "low", "high"}}`: a number to guess.
fn parse_toy(value: &Value, at: &str) -> Result<Task> {
    let id = required_str(value, "id", at)?;
    let int = |field: &str| -> Result<i64> {
        value["toy"]
            .get(field)
            .and_then(Value::as_i64)
            .ok_or_else(|| anyhow!("{at}: toy.{field}: expected an integer"))
    };
    let (hidden, low, high) = (int("hidden")?, int("low")?, int("high")?);
    if !(low <= hidden && hidden <= high) {
        bail!("{at}: toy: hidden {hidden} is not within [{low}, {high}]");
    }
    Ok(Task {
        problem_statement: required_str(value, "problem_statement", at)?,
        repo: RepoSource::Toy { hidden, low, high },
        grading: Grading::Command {
            test_command: "check".into(),
        },
        setup: Vec::new(),
        solution: None,
        gold_patch: None,
        timeout_s: timeout(value, at)?,
        image: None,
        origin: at.to_string(),
        id,
    })
}

fn required_str(value: &Value, field: &str, at: &str) -> Result<String> {
    match value.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => bail!("{at}: {field}: missing"),
        Some(other) => bail!("{at}: {field}: expected a string, found {other}"),
    }
}

fn optional_str(value: &Value, field: &str, at: &str) -> Result<Option<String>> {
    match value.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => bail!("{at}: {field}: expected a string, found {other}"),
    }
}

fn string_list(value: &Value, field: &str, at: &str) -> Result<Vec<String>> {
    match value.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow!("{at}: {field}[{i}]: expected a string, found {item}"))
            })
            .collect(),
        Some(other) => bail!("{at}: {field}: expected a list of strings, found {other}"),
    }
}

/// SWE-bench stores test lists as JSON text inside a string; SWE-rebench as arrays.
fn test_list(value: &Value, field: &str, at: &str) -> Result<Vec<String>> {
    match value.get(field) {
        Some(Value::String(text)) => {
            let parsed: Value = serde_json::from_str(text)
                .with_context(|| format!("{at}: {field}: a string that is not a JSON list"))?;
            let wrapped = serde_json::json!({ field: parsed });
            string_list(&wrapped, field, at)
        }
        None => bail!("{at}: {field}: missing"),
        Some(_) => string_list(value, field, at),
    }
}

fn timeout(value: &Value, at: &str) -> Result<u64> {
    match value.get("timeout_s") {
        None | Some(Value::Null) => Ok(DEFAULT_TIMEOUT_S),
        Some(v) => match v.as_u64() {
            Some(t) if (1..=86_400).contains(&t) => Ok(t),
            _ => bail!("{at}: timeout_s: expected whole seconds from 1 to 86400, found {v}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn native_lines_resolve_paths_and_defaults() {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["t/repo", "t/tests", "t/solution"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let path = write(
            dir.path(),
            "tasks.jsonl",
            r#"{"id": "t", "repo": "t/repo", "tests": "t/tests", "problem_statement": "fix", "test_command": "true", "solution": "t/solution", "setup": ["echo hi"]}"#,
        );
        let tasks = load_tasks(&path).unwrap();
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].repo, RepoSource::Folder(dir.path().join("t/repo")));
        assert_eq!(tasks[0].solution, Some(dir.path().join("t/solution")));
        assert_eq!(tasks[0].setup, vec!["echo hi".to_string()]);
        assert_eq!(tasks[0].timeout_s, DEFAULT_TIMEOUT_S);
        assert_eq!(tasks[0].grading_command(), "true");
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("r")).unwrap();
        let cases = [
            (r#"{"id": "a", "repo": "r", "tests": "missing", "problem_statement": "p", "test_command": "t"}"#, ":1: tests: "),
            (r#"{"id": "a", "repo": "r", "tests": "r", "problem_statement": 3, "test_command": "t"}"#, ":1: problem_statement: expected a string"),
            (r#"{"id": "a", "repo": "r", "tests": "r", "problem_statement": "p", "test_command": "t", "timeout_s": 0}"#, ":1: timeout_s:"),
            (r#"{"id": "a", "repo": "r", "tests": "r", "problem_statement": "p", "test_command": "t", "tset": 1}"#, ":1: tset: unknown field"),
            (r#"{"id": "a b", "repo": "r", "tests": "r", "problem_statement": "p", "test_command": "t"}"#, ":1: id:"),
            ("{\"id\": \"a\", \"repo\": \"r\", \"tests\": \"r\", \"problem_statement\": \"p\", \"test_command\": \"t\"}\n{\"id\": \"a\", \"repo\": \"r\", \"tests\": \"r\", \"problem_statement\": \"p\", \"test_command\": \"t\"}", ":2: id: \"a\" is used"),
            (r#"{"instance_id": "x__y-1", "problem_statement": "p", "test_patch": "", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"}"#, ":1: FAIL_TO_PASS: no tests"),
            (r#"{"instance_id": "x__y-1", "problem_statement": "p", "test_patch": "", "FAIL_TO_PASS": "[1]", "PASS_TO_PASS": "[]"}"#, ":1: FAIL_TO_PASS[0]: expected a string"),
        ];
        for (text, want) in cases {
            let path = write(dir.path(), "bad.jsonl", text);
            let err = format!("{:#}", load_tasks(&path).unwrap_err());
            assert!(err.contains(want), "{text}\n  gave: {err}\n  want: {want}");
            assert!(err.contains("bad.jsonl"), "{err}");
        }
    }

    #[test]
    fn swe_bench_lines_name_their_image_and_tests() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "swe.jsonl",
            r#"{"instance_id": "astropy__astropy-12907", "problem_statement": "p", "test_patch": "diff", "FAIL_TO_PASS": "[\"tests/test_a.py::test_x\"]", "PASS_TO_PASS": "[\"tests/test_a.py::test_it's\"]"}
{"instance_id": "o__r-2", "problem_statement": "p", "test_patch": "diff", "FAIL_TO_PASS": ["t1"], "PASS_TO_PASS": [], "docker_image": "swerebench/o-r:2", "install_config": {"test_cmd": "pytest -q"}}"#,
        );
        let tasks = load_tasks(&path).unwrap();
        assert_eq!(
            tasks[0].image.as_deref(),
            Some("swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest")
        );
        assert_eq!(
            tasks[0].grading_command(),
            r#"pytest -rA 'tests/test_a.py::test_x' 'tests/test_a.py::test_it'\''s'"#
        );
        assert_eq!(tasks[1].image.as_deref(), Some("swerebench/o-r:2"));
        assert_eq!(tasks[1].grading_command(), "pytest -q 't1'");
        assert_eq!(
            tasks[1].repo,
            RepoSource::InImage {
                workdir: "/testbed".into()
            }
        );
    }
}
