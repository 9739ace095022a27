//! SWE-bench-family lines (`instance_id` set), each graded as its harness grades it.
//!
//! ```text
//!   SWE-bench / Verified   FAIL_TO_PASS, PASS_TO_PASS as JSON text; repo, version, base_commit,
//!                          environment_setup_commit, test_patch, patch (the gold fix)
//!   SWE-Gym, -extra        the same, the lists as lists
//!   SWE-rebench            + docker_image / image_name, install_config {test_cmd (a string or
//!                          a list), log_parser}, which win over swerve's table for the line
//!   SWE-smith              no test_patch; instance_id `owner__repo.commit.kind__hash`, repo
//!                          `swesmith/owner__repo.commit`, image_name (one image a repository),
//!                          patch = the change that introduced the bug
//! ```
//!
//! Test command and parser: the line's own (`test_cmd`, `install_config.test_cmd`, `log_parser`,
//! `install_config.log_parser`) > [`repos::spec_for`] > an error naming the line and the repo;
//! a line's own command without a parser gets pytest's. The test patch's files are appended as
//! directives in the repository's style (SWE-bench's `get_test_directives`), never the ids.
//! SWE-smith lines without a command run the whole suite with SWE-smith's Python profile
//! default, `pytest --disable-warnings --color=no --tb=no --verbose` (its verbose lines parsed).
//! The image, when the line names none: `swebench/sweb.eval.x86_64.<id, "__" as "_1776_",
//! lowercased>:latest` (SWE-bench's naming); a SWE-smith line must name its own.
//!
//! Not confirmed: SWE-smith's `patch` is read as the bug's (setup applies it; the oracle has no
//! fix to apply), from its dataset card and papers, not from a run of its harness.

use super::super::repos::{self, Directives};
use super::*;

/// Activates SWE-bench's conda layout (`testbed` environment) where the image has it.
pub const CONDA_ACTIVATE: &str = "if [ -f /opt/miniconda3/bin/activate ]; then \
    . /opt/miniconda3/bin/activate && conda activate testbed; fi";

/// SWE-smith's default Python test command (its repository profiles').
const SWE_SMITH_PYTEST: &str = "pytest --disable-warnings --color=no --tb=no --verbose";

/// The heredoc delimiter embedding a patch in a setup command.
const PATCH_EOF: &str = "SWERVE_PATCH_EOF";

/// A SWE-bench-family line as a task.
pub(super) fn parse(value: &Value, at: &str) -> Result<Task> {
    let id = required_str(value, "instance_id", at)?;
    let repo_name = optional_str(value, "repo", at)?;
    let test_patch = optional_str(value, "test_patch", at)?.filter(|p| !p.trim().is_empty());
    let smith = test_patch.is_none() && is_swe_smith(&id, repo_name.as_deref());
    if test_patch.is_none() && !smith {
        bail!(
            "{at}: test_patch: missing (only a SWE-smith line, id `owner__repo.commit.…` or \
             repo `swesmith/…`, has none)"
        );
    }
    let version = version(value, at)?;
    let fail_to_pass = test_list(value, "FAIL_TO_PASS", at)?;
    if fail_to_pass.is_empty() {
        bail!("{at}: FAIL_TO_PASS: no tests, so nothing could tell a fix from no fix");
    }
    let (command, parser, safe_path) = test_setup(
        value,
        at,
        repo_name.as_deref(),
        version.as_deref(),
        test_patch.as_deref(),
        smith,
    )?;
    let patch = optional_str(value, "patch", at)?.filter(|p| !p.trim().is_empty());
    let mut setup = string_list(value, "setup", at)?;
    let gold_patch = if smith {
        if let Some(bug) = &patch {
            setup.insert(0, apply_command(bug, at)?);
        }
        None
    } else {
        patch
    };
    let workdir = optional_str(value, "workdir", at)?.unwrap_or_else(|| "/testbed".into());
    let plan = TestPlan {
        overlay: None,
        test_patch,
        base_commit: optional_str(value, "base_commit", at)?,
        command,
        parser,
        fail_to_pass,
        pass_to_pass: optional_test_list(value, "PASS_TO_PASS", at)?,
        safe_path,
        rules: Default::default(),
    };
    Ok(Task {
        problem_statement: required_str(value, "problem_statement", at)?,
        repo: RepoSource::InImage { workdir },
        grading: Grading::Tests(plan),
        setup,
        solution: None,
        gold_patch,
        timeout_s: timeout(value, at)?,
        image: Some(image(value, &id, smith, at)?),
        activate: Some(optional_str(value, "activate", at)?.unwrap_or(CONDA_ACTIVATE.into())),
        repo_name,
        version,
        environment_setup_commit: optional_str(value, "environment_setup_commit", at)?,
        origin: at.to_string(),
        id,
    })
}

/// SWE-smith's naming: repo `swesmith/…`, or an id `owner__repo.<commit>.<rest>`.
fn is_swe_smith(id: &str, repo: Option<&str>) -> bool {
    if repo.is_some_and(|r| r.starts_with("swesmith/")) {
        return true;
    }
    let Some((_, rest)) = id.split_once("__") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() >= 3 && parts[1].len() >= 7 && parts[1].chars().all(|c| c.is_ascii_hexdigit())
}

/// `image_name`, else `docker_image`, else SWE-bench's name for the instance (not SWE-smith's).
fn image(value: &Value, id: &str, smith: bool, at: &str) -> Result<String> {
    if let Some(image) = optional_str(value, "image_name", at)? {
        return Ok(image);
    }
    if let Some(image) = optional_str(value, "docker_image", at)? {
        return Ok(image);
    }
    if smith {
        bail!("{at}: image_name: missing (a SWE-smith line names its repository's image)");
    }
    Ok(format!(
        "swebench/sweb.eval.x86_64.{}:latest",
        id.replace("__", "_1776_").to_lowercase()
    ))
}

/// `version` as text (`"3.0"`; a number is read as written).
fn version(value: &Value, at: &str) -> Result<Option<String>> {
    match value.get("version") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => bail!("{at}: version: expected a string, found {other}"),
    }
}

/// The command (directives included), parser and safe-path mode, by the precedence above.
fn test_setup(
    value: &Value,
    at: &str,
    repo: Option<&str>,
    version: Option<&str>,
    test_patch: Option<&str>,
    smith: bool,
) -> Result<(String, LogParser, bool)> {
    let spec = repo.and_then(|r| repos::spec_for(r, version));
    let own_parser = line_parser(value, at)?;
    if let Some(cmd) = line_test_cmd(value, at)? {
        let style = spec.as_ref().map_or(Directives::Files, |s| s.directives);
        let command = repos::with_directives(&cmd, test_patch, style);
        let parser = own_parser
            .or(spec.as_ref().map(|s| s.parser))
            .unwrap_or(LogParser::Pytest);
        return Ok((command, parser, safe_path_suits(&cmd)));
    }
    if let Some(spec) = spec {
        let parser = own_parser.unwrap_or(spec.parser);
        return Ok((spec.command(test_patch), parser, spec.safe_path));
    }
    if smith {
        let parser = own_parser.unwrap_or(LogParser::PytestV2);
        return Ok((SWE_SMITH_PYTEST.to_string(), parser, true));
    }
    bail!(
        "{at}: repo: {:?} is not in swerve's table of SWE-bench repositories, and the line has \
         no test_cmd or install_config.test_cmd to run its tests with",
        repo.unwrap_or("(missing)")
    )
}

/// The line's `test_cmd`, else `install_config.test_cmd` (a list runs in order, `; `-joined).
fn line_test_cmd(value: &Value, at: &str) -> Result<Option<String>> {
    if let Some(cmd) = optional_str(value, "test_cmd", at)? {
        return Ok(Some(cmd));
    }
    match value.pointer("/install_config/test_cmd") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(cmd)) => Ok(Some(cmd.clone())),
        Some(Value::Array(cmds)) => {
            let cmds = cmds
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    c.as_str().map(str::to_string).ok_or_else(|| {
                        anyhow!("{at}: install_config.test_cmd[{i}]: expected a string, found {c}")
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((!cmds.is_empty()).then(|| cmds.join("; ")))
        }
        Some(other) => bail!("{at}: install_config.test_cmd: expected a string, found {other}"),
    }
}

/// The line's `log_parser`, else `install_config.log_parser`.
fn line_parser(value: &Value, at: &str) -> Result<Option<LogParser>> {
    let (field, found) = match optional_str(value, "log_parser", at)? {
        Some(name) => ("log_parser", Some(name)),
        None => match value.pointer("/install_config/log_parser") {
            None | Some(Value::Null) => ("", None),
            Some(Value::String(name)) => ("install_config.log_parser", Some(name.clone())),
            Some(other) => {
                bail!("{at}: install_config.log_parser: expected a string, found {other}")
            }
        },
    };
    found
        .map(|name| name.parse().map_err(|e| anyhow!("{at}: {field}: {e}")))
        .transpose()
}

/// A shell command applying `patch` (embedded as a heredoc) in the workdir.
fn apply_command(patch: &str, at: &str) -> Result<String> {
    if patch.lines().any(|l| l == PATCH_EOF) {
        bail!("{at}: patch: holds the line {PATCH_EOF}, which swerve's setup cannot embed");
    }
    let newline = if patch.ends_with('\n') { "" } else { "\n" };
    Ok(format!(
        "git apply --whitespace=nowarn <<'{PATCH_EOF}'\n{patch}{newline}{PATCH_EOF}"
    ))
}
