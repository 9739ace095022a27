//! Task files: one coding task a line, in swerve's own format or as a SWE-bench-family instance
//! (SWE-bench / Verified, SWE-Gym, SWE-bench-extra, SWE-rebench, SWE-smith: [`swe`]). Every
//! error names `file:line: field`.
//!
//! swerve's format (paths relative to the task file):
//!
//! ```text
//! {"id": "calc-div-zero",                      unique in the file
//!  "repo": "calc-div-zero/repo",                the code in its buggy state (a folder)
//!  "tests": "calc-div-zero/tests",              copied over the workspace root before grading
//!  "problem_statement": "...",                  what the agent is told
//!  "test_command": "python3 -m unittest -v tests.test_calc",
//!  "FAIL_TO_PASS": ["test_zero (tests.test_calc.T)"],   optional; with PASS_TO_PASS: the
//!  "PASS_TO_PASS": [],                                  tests that must pass (else: exit 0,
//!                                               a test ran, none failed)
//!  "log_parser": "unittest",                    optional: inferred from a command naming
//!                                               pytest or unittest, else required
//!  "activate": ". venv/bin/activate",           optional shell prefix for every command
//!  "setup": ["pip install -e ."],               optional, run in the sandbox before the episode
//!  "solution": "calc-div-zero/solution",        optional, files of a correct fix (oracle policy)
//!  "timeout_s": 120,                            optional grading timeout (default 300)
//!  "image": "python:3.11-slim"}                 optional, the docker environment's image
//! ```

use super::logs::LogParser;
use crate::jsonl;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

mod swe;

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
    /// The task's tests are put in place and run; the log decides ([`TestPlan::judge`]).
    Tests(TestPlan),
    /// Run `test_command` as the workspace stands (the toy's `check`): exit 0 = resolved.
    Command { test_command: String },
}

/// What grading a task by its tests takes.
#[derive(Clone, Debug, PartialEq)]
pub struct TestPlan {
    /// A folder copied over the workspace root before the tests run (swerve's `tests`).
    pub overlay: Option<PathBuf>,
    /// SWE-bench's `test_patch`, applied after the files it touches are restored to
    /// `base_commit`.
    pub test_patch: Option<String>,
    /// The repository commit the task starts from (`base_commit`), where known.
    pub base_commit: Option<String>,
    /// The whole shell command that runs the tests (test directives included), run in the
    /// workdir.
    pub command: String,
    pub parser: LogParser,
    pub fail_to_pass: Vec<String>,
    pub pass_to_pass: Vec<String>,
    /// Python's safe-path mode (PYTHONSAFEPATH) is on for this command (off for runners that
    /// rely on their own folder on sys.path, e.g. Django's tests/runtests.py, or `python -m`).
    pub safe_path: bool,
    /// Which SWE-bench harness version's rules decide a skipped listed test
    /// (`--swebench-rules`).
    pub rules: HarnessRules,
}

/// The SWE-bench harness version whose rules the judge follows for listed tests that skip
/// (`--swebench-rules 4|5`). Both are applied under swerve's stricter rule that the code under
/// test can raise a skip itself: a skip is excused only where the reference fix's run shows
/// the same test skipped (grading/verdict.rs).
///
/// ```text
///                        harness 4.1   harness 5.0   swerve 4             swerve 5 (default)
///   FAIL_TO_PASS skipped ignored       fails         excused if ref skips  fails
///   PASS_TO_PASS skipped ignored       kept          excused if ref skips  excused if ref skips
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HarnessRules {
    V4,
    #[default]
    V5,
}

impl HarnessRules {
    pub const NAMES: &'static str = "4 or 5";

    pub fn as_str(self) -> &'static str {
        match self {
            HarnessRules::V4 => "4",
            HarnessRules::V5 => "5",
        }
    }

    /// Sets these rules on every task graded by its tests.
    pub fn apply(self, tasks: &mut [Task]) {
        for task in tasks {
            if let Grading::Tests(plan) = &mut task.grading {
                plan.rules = self;
            }
        }
    }
}

impl std::fmt::Display for HarnessRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for HarnessRules {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "4" => Ok(HarnessRules::V4),
            "5" => Ok(HarnessRules::V5),
            other => Err(format!(
                "`{other}` is not a SWE-bench harness version swerve follows (use {})",
                HarnessRules::NAMES
            )),
        }
    }
}

/// What a graded run says about a task (grading/verdict.rs).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    pub resolved: bool,
    /// Tests that passed (the runner's own pass status; the grader's canaries left out).
    pub passed: usize,
    /// Tests that failed, errored or were reported two ways.
    pub failed: usize,
    /// FAIL_TO_PASS/PASS_TO_PASS ids not passing, each with its status ("failed", "error",
    /// "skipped", "xfail", "xpass", "conflicting", "missing").
    pub not_passing: Vec<(String, String)>,
    /// Evidence the test framework was tampered with (a canary off its rule, an exit status
    /// that contradicts the tests): the reward is 0. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tampered: Vec<String>,
    /// Other reasons the run does not count (the runner's record missing, the command killed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl TestPlan {
    /// Paths (relative to the workdir) the task owns: the overlay's files, the test patch's
    /// files (a/ and b/ sides, new files included). The agent's diff never touches them.
    pub fn owned_paths(&self) -> Result<Vec<String>> {
        let mut paths = Vec::new();
        if let Some(overlay) = &self.overlay {
            files_under(overlay, overlay, &mut paths)?;
        }
        if let Some(patch) = &self.test_patch {
            for (a, b) in super::repos::patch_paths(patch) {
                paths.extend(a.into_iter().chain(b));
            }
        }
        paths.sort();
        paths.dedup();
        Ok(paths)
    }
}

/// The files under `dir`, as paths relative to `root` with `/` separators.
pub(crate) fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("reading the folder {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading the folder {}", dir.display()))?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            files_under(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
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
    /// A shell prefix that activates the task's environment, for agent commands and grading
    /// (SWE-bench-family images: their conda `testbed` environment).
    pub activate: Option<String>,
    /// The upstream repository, `owner/name` (SWE-bench's `repo`).
    pub repo_name: Option<String>,
    /// The repository's version as the harness keys its specs (`"3.0"`).
    pub version: Option<String>,
    /// The commit the task's environment was built from (SWE-bench's).
    pub environment_setup_commit: Option<String>,
    /// `file:line` the task came from, for messages.
    pub origin: String,
}

impl Task {
    /// The shell command grading runs (the test plan's, the toy's `check`).
    pub fn test_command(&self) -> &str {
        match &self.grading {
            Grading::Tests(plan) => &plan.command,
            Grading::Command { test_command } => test_command,
        }
    }
}

pub use super::shell_quote;

/// Reads a task file (either format, line by line). Ids must be unique; folders must exist.
pub fn load_tasks(path: &Path) -> Result<Vec<Task>> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut tasks = Vec::new();
    let mut seen = HashSet::new();
    for (line_no, value) in jsonl::read_objects(path)? {
        let at = jsonl::at(path, line_no);
        let task = if value.get("instance_id").is_some() {
            swe::parse(&value, &at)?
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
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "log_parser",
    "activate",
    "setup",
    "solution",
    "timeout_s",
    "image",
];

fn parse_native(value: &Value, base: &Path, at: &str) -> Result<Task> {
    let obj = value
        .as_object()
        .ok_or_else(|| anyhow!("{at}: not an object"))?;
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
    let command = required_str(value, "test_command", at)?;
    if command.trim().is_empty() {
        bail!("{at}: test_command: empty");
    }
    let parser = match optional_str(value, "log_parser", at)? {
        Some(name) => name
            .parse::<LogParser>()
            .map_err(|e| anyhow!("{at}: log_parser: {e}"))?,
        None => infer_parser(&command).ok_or_else(|| {
            anyhow!(
                "{at}: log_parser: missing, and the test_command names neither pytest nor \
                 unittest (name one of {})",
                LogParser::NAMES
            )
        })?,
    };
    let plan = TestPlan {
        overlay: Some(tests),
        test_patch: None,
        base_commit: None,
        safe_path: safe_path_suits(&command),
        command,
        parser,
        fail_to_pass: optional_test_list(value, "FAIL_TO_PASS", at)?,
        pass_to_pass: optional_test_list(value, "PASS_TO_PASS", at)?,
        rules: HarnessRules::default(),
    };
    Ok(Task {
        problem_statement: required_str(value, "problem_statement", at)?,
        repo: RepoSource::Folder(repo),
        grading: Grading::Tests(plan),
        setup: string_list(value, "setup", at)?,
        solution,
        gold_patch: None,
        timeout_s: timeout(value, at)?,
        image: optional_str(value, "image", at)?,
        activate: optional_str(value, "activate", at)?,
        repo_name: None,
        version: None,
        environment_setup_commit: None,
        origin: at.to_string(),
        id,
    })
}

/// The parser a command's runner implies: pytest's or unittest's, else none.
fn infer_parser(command: &str) -> Option<LogParser> {
    if command.contains("pytest") {
        Some(LogParser::Pytest)
    } else if command.contains("unittest") {
        Some(LogParser::Unittest)
    } else {
        None
    }
}

/// Safe-path mode suits `command`: it runs no runner that imports its own folder's neighbours
/// as top-level modules (Django's `tests/runtests.py`, sympy's `bin/test`). `python -m X` keeps
/// it: the grader's sitecustomize puts the working folder on `sys.path` after the standard
/// library and site-packages (src/env/grading.rs), so the package under test still imports but a
/// `pytest.py` or `unittest/` in the workspace shadows nothing.
pub(crate) fn safe_path_suits(command: &str) -> bool {
    !command
        .split_whitespace()
        .any(|w| w.ends_with("runtests.py") || w == "bin/test" || w.ends_with("/bin/test"))
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
        activate: None,
        repo_name: None,
        version: None,
        environment_setup_commit: None,
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

/// A list that may be absent (empty then), as [`test_list`] reads it.
fn optional_test_list(value: &Value, field: &str, at: &str) -> Result<Vec<String>> {
    match value.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(_) => test_list(value, field, at),
    }
}

#[cfg(test)]
mod tests;
