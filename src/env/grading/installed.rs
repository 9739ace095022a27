//! The change carried into installed copies of the task's packages (step 2 of the module's
//! diagram), in place of the harness's install after the patch.
//!
//! SWE-bench's harness runs the repository's install again after the patch. Where that install
//! is editable (`pip install -e .`, most repositories), the tests import the work tree and a
//! change to Python code needs nothing more. Where it copies (`python setup.py install`:
//! Django 1.4-2.2, matplotlib 1.0-2.2; `pip install .`: requests), a runner may import the copy
//! in site-packages: Django's `tests/runtests.py` puts `tests/`, not the tree, on the path, so
//! without the install its tests would run the unchanged copy, and even the reference fix would
//! fail. Running that install would run the change's `setup.py`, code of the agent's, with the
//! sandbox user's rights before any of the grader's hooks exist, free to rewrite the test
//! framework on disk; so grading does what the copying install does to the package's files,
//! without running anything of the change:
//!
//! ```text
//!   before the change is applied (the image's interpreter, the tree off its path):
//!     tree package `django/` (root, src/ or lib/)  ──►  imported from .../site-packages/Django.egg/django
//!   after it is applied and grading put back what it may not keep:
//!     each changed path under django/  ──►  the same path in the copy: written, or removed;
//!                                           its compiled forms dropped; never through a link
//! ```
//!
//! Names a test framework or the interpreter's start-up owns are never written to, nor anything
//! outside site-packages. What stays a departure (docs/grading.md): a change to compiled code (C,
//! Cython) is tested unbuilt, and setup.py's own effects (entry points, generated files) are not
//! reproduced.

use crate::env::{describe_end, shell_quote, Sandbox, Task};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::time::Duration;

/// The locating and carrying script (`locate WORKDIR` | `carry`).
const SCRIPT: &str = include_str!("../grader_installed.py");

/// A package of the work tree that the image's interpreter imports from a copy.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InstalledCopy {
    /// The import name (`django`).
    pub name: String,
    /// Its path in the work tree (`django`, `src/requests`, `six.py`).
    pub tree: String,
    /// Where the interpreter imports it from (absolute, links resolved).
    pub location: String,
}

/// The interpreter (after the task's activation) running [`SCRIPT`] with `args`, from `/`.
fn python_command(activate: &str, flags: &str, args: &str) -> String {
    format!(
        "w=$PWD\n{{ {activate}\n}} >/dev/null 2>&1 </dev/null\npy=$(command -v python || command -v python3) || exit 0\ncd / && exec \"$py\" {flags} -c {script} {args}",
        script = shell_quote(SCRIPT)
    )
}

/// Finds the copies, before the change is applied. An image without Python, or whose Python
/// cannot run the script (Python 2), has none.
pub fn locate(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    timeout: Duration,
) -> Result<Vec<InstalledCopy>> {
    let activate = task.activate.as_deref().unwrap_or(":");
    let out = sandbox.exec(
        &python_command(activate, "-I", "locate \"$w\" 2>/dev/null </dev/null"),
        None,
        timeout,
        1 << 20,
    )?;
    if out.timed_out {
        bail!(
            "task {}: finding the installed copies of the task's packages timed out ({})",
            task.id,
            describe_end(&out)
        );
    }
    if !out.success() {
        return Ok(Vec::new());
    }
    Ok(out
        .output
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// Carries the changed paths (`(status, path)` from git's list, tree-relative) that lie under a
/// copied package into its copy. Returns the number written and each path left as it was (a
/// link, a folder, a path the copy cannot take) with the reason, for `patch_dropped`.
pub fn carry(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    copies: &[InstalledCopy],
    changes: &[(char, String)],
    timeout: Duration,
) -> Result<(usize, Vec<(String, String)>)> {
    let under = |path: &str| {
        copies
            .iter()
            .any(|c| path == c.tree || path.starts_with(&format!("{}/", c.tree)))
    };
    let changes: Vec<Value> = changes
        .iter()
        .filter(|(_, path)| under(path))
        .map(|(status, path)| json!([status.to_string(), path]))
        .collect();
    if changes.is_empty() {
        return Ok((0, Vec::new()));
    }
    let activate = task.activate.as_deref().unwrap_or(":");
    let request = json!({"copies": copies, "changes": changes}).to_string();
    let command = python_command(activate, "-I -S", "carry \"$w\" 2>&1");
    let out = sandbox.exec(&command, Some(request.as_bytes()), timeout, 1 << 20)?;
    let carried = out
        .output
        .lines()
        .find_map(|l| l.strip_prefix("carried ")?.trim().parse::<usize>().ok());
    match carried {
        Some(n) if out.success() => Ok((
            n,
            out.output
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l.strip_prefix("skipped ")?).ok())
                .map(|v| {
                    let text = |k: &str| v[k].as_str().unwrap_or("").to_string();
                    let why = format!("not carried into the installed copy: {}", text("why"));
                    (text("path"), why)
                })
                .collect(),
        )),
        _ => bail!(
            "task {}: carrying the change into the installed copies of its packages failed ({}): {}",
            task.id,
            describe_end(&out),
            crate::env::agent_text(&out.output, 2000)
        ),
    }
}

#[cfg(test)]
#[path = "installed_tests.rs"]
mod tests;
