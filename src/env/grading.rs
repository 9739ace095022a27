//! Grading in a fresh environment, as SWE-bench's harness grades: the agent's change applied to
//! a pristine copy of the task, the task's tests restored over it, the tests run in a hardened
//! way with the grader's canaries among them, and the verdict read from the runner's own record
//! of each test, the log only as a cross-check.
//!
//! ```text
//!   agent sandbox ──► diff (diff.rs) ──► closed (every agent process gone)
//!   fresh sandbox (Environment::start: the task's starting state, setup run)
//!     1. the starting tree recorded (git); the image's pytest plugins listed; the diff applied
//!        (git apply, then patch --fuzz): a diff that does not apply is unresolved
//!     2. what the change may not keep, read back from the sandbox (tree.rs: shadows of owned
//!        modules, conftest.py, .pth, pytest's configuration files, the runner's files) put
//!        back, named in patch_dropped; the rest carried into the copies an install made of
//!        the task's packages in site-packages (installed.rs, located before 1), as the
//!        harness's install after the patch would, without running the change's setup.py
//!     3. the task's tests: the `tests` folder copied over, or the files `test_patch` touches
//!        restored to `base_commit` and the patch applied; canaries appended (canary.rs)
//!     4. the tests run by a script fed on stdin to the sandbox's shell (no file, no argument,
//!        no marker a test can read): __pycache__ removed; HOME an empty folder; user
//!        site-packages off; safe-path mode where the runner allows; the grader's sitecustomize
//!        (standard library first; unittest results recorded) and pytest plugin (results
//!        recorded) from the grader's folder; pytest plugin autoload off, the image's own
//!        plugins loaded by name; the exit status is the sandbox's own process status
//!     5. the runner's record (results.rs) read back in a command of its own; the verdict
//!        (verdict.rs) from it, the log, the exit status and the canaries; where the run is off
//!        the rules in a way a reference run could explain, the reference fix's run (reference.rs,
//!        once per task) decides whether it does
//!   fresh sandbox closed (a failing close is reported, the verdict kept)
//! ```
//!
//! What is guaranteed and what is not: docs/grading.md.

mod canary;
mod installed;
mod ledger;
mod reference;
mod results;
mod tree;
mod verdict;

pub use canary::{Anomaly, Canaries};
pub use verdict::{decide, Channel, Decision, Observation, Reference};

use super::task::{shell_quote, TestPlan};
use super::{describe_end, CommandOutput, Environment, Sandbox, Task};
use crate::rng::{Rng, SplitMix64};
use anyhow::{bail, Result};
use std::time::Duration;

/// The grader's sitecustomize.py.
const SITECUSTOMIZE: &str = include_str!("grader_sitecustomize.py");
/// The grader's pytest plugin.
const PYTEST_PLUGIN: &str = include_str!("grader_pytest_plugin.py");
/// The grader's test-code check, imported by both as `swerve_grader_check`.
const CHECK: &str = include_str!("grader_check.py");
/// Where a record that could help a test comes from, checked by sitecustomize's audit hook,
/// imported by it as `swerve_grader_provenance`.
const PROVENANCE: &str = include_str!("grader_provenance.py");
/// Lying values caught where unittest compares them, installed by both recorders as
/// `swerve_grader_values`.
const VALUES: &str = include_str!("grader_values.py");
/// The plugin's module name (in the grader's folder, on PYTHONPATH).
const PYTEST_PLUGIN_MODULE: &str = "swerve_grader_results";

/// Output kept from the test command: the whole log in practice (per-test lines are read from it).
const GRADING_OUTPUT_BYTES: usize = 64 << 20;
/// The largest runner record read back (past it the record is not trusted).
const RESULTS_BYTES: usize = 64 << 20;

/// What grading found.
#[derive(Clone, Debug, PartialEq)]
pub struct GradeResult {
    pub resolved: bool,
    /// The per-test verdict, when the tests ran.
    pub verdict: Option<super::task::Verdict>,
    /// Why the tests did not run for the agent's sake (its change does not apply).
    pub failure: Option<String>,
    /// The test command's output; its exit status (the sandbox's process status) and timing.
    pub output: CommandOutput,
    /// Paths of the agent's change grading put back (tree.rs), each with the reason.
    pub dropped: Vec<(String, String)>,
    /// What Python's syntax tree shows in the lines the change adds (flags.rs; `no-scanner`,
    /// an image without Python 3, left out).
    pub flags: Vec<super::flags::Flag>,
    /// A cleanup that failed after the verdict (the verdict stands).
    pub cleanup_error: Option<String>,
}

/// The change a grading applies: the agent's diff, or a reference fix.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a> {
    Diff(&'a str),
    /// A solution folder copied over the workspace (swerve's `solution`).
    Folder(&'a std::path::Path),
}

/// Grades `patch` (the agent's filtered diff) on a fresh sandbox of `task`.
pub fn grade_fresh(
    env: &dyn Environment,
    task: &Task,
    plan: &TestPlan,
    patch: &str,
    episode: &str,
) -> Result<GradeResult> {
    let mut sandbox = env.start(task, &format!("{episode}-grade"))?;
    let result = observe_in(sandbox.as_mut(), task, plan, Change::Diff(patch));
    let cleanup_error = sandbox.close().err().map(|e| format!("{e:#}"));
    let (observation, mut result) = match result? {
        Observed::NotApplied(result) => {
            return Ok(GradeResult {
                cleanup_error,
                ..result
            })
        }
        Observed::Ran(observation, result) => (observation, result),
    };
    result.cleanup_error = cleanup_error;
    let mut verdict = decide(plan, &observation, None);
    if verdict.needs_reference {
        let reference = reference::observation(env, task, plan, episode)?;
        verdict = decide(plan, &observation, Some(&reference));
    }
    result.resolved = verdict.verdict.resolved;
    result.verdict = Some(verdict.verdict);
    Ok(result)
}

/// A grading's run, or why it did not run.
pub enum Observed {
    /// The change does not apply: unresolved, with the reason.
    NotApplied(GradeResult),
    /// What the run showed, and the result so far (no verdict yet).
    Ran(Box<Observation>, GradeResult),
}

/// Steps 1-5 of the module's diagram on `sandbox`: `change` applied, the tests run, what they
/// showed.
pub fn observe_in(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    plan: &TestPlan,
    change: Change<'_>,
) -> Result<Observed> {
    let timeout = Duration::from_secs(task.timeout_s);
    let tree = super::diff::snapshot(sandbox)?;
    let patch = match change {
        Change::Diff(patch) => patch,
        Change::Folder(_) => "",
    };
    let activate = task.activate.as_deref().unwrap_or(":");
    let copies = installed::locate(sandbox, task, timeout)?;
    let applied = sandbox.run(&prepare_command(activate), Some(patch.as_bytes()), timeout)?;
    if applied.exit_code == Some(DIFF_DOES_NOT_APPLY) {
        return Ok(Observed::NotApplied(GradeResult {
            resolved: false,
            verdict: None,
            failure: Some(format!(
                "the agent's change does not apply to the task's starting state:\n{}",
                applied.output.trim()
            )),
            output: applied,
            dropped: Vec::new(),
            flags: Vec::new(),
            cleanup_error: None,
        }));
    }
    if !applied.success() {
        bail!(
            "task {}: preparing the grading sandbox failed ({}): {}",
            task.id,
            describe_end(&applied),
            applied.output.trim()
        );
    }
    if let Change::Folder(folder) = change {
        sandbox.copy_in(folder)?;
    }
    let owned = plan.owned_paths()?;
    let (changes, mut dropped) = put_back(sandbox, task, plan, &tree, &owned, timeout)?;
    let (_, not_carried) = installed::carry(sandbox, task, &copies, &changes, timeout)?;
    dropped.extend(not_carried);
    let flags = match change {
        Change::Diff(patch) if !patch.is_empty() => scan(sandbox, task, patch, timeout)?,
        _ => Vec::new(),
    };
    install_tests(sandbox, task, plan, timeout)?;
    let mut rng = SplitMix64::new(nonce_seed());
    let canaries = Canaries::new(&owned, &plan.command, rng.next_u64());
    let installed = install_canaries(sandbox, task, &canaries, timeout)?;
    let results_path = format!(".swerve-grader/r-{:016x}.jsonl", rng.next_u64());
    let script = grader_script(task, plan, &results_path, &copies);
    let run = sandbox.exec(
        "exec sh -s",
        Some(script.as_bytes()),
        timeout + Duration::from_secs(30),
        GRADING_OUTPUT_BYTES,
    )?;
    let record = read_results(sandbox, &results_path, timeout)?;
    let observation = Observation::new(plan, &canaries, &installed, &run, record);
    Ok(Observed::Ran(
        Box::new(observation),
        GradeResult {
            resolved: false,
            verdict: None,
            failure: None,
            output: run,
            dropped,
            flags,
            cleanup_error: None,
        },
    ))
}

/// Step 2: the paths the change may not keep, read from the sandbox and put back. Returns the
/// change's paths (git's status letter and path) and those put back, each with the reason.
fn put_back(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    plan: &TestPlan,
    tree: &str,
    owned: &[String],
    timeout: Duration,
) -> Result<Changes> {
    let listed = sandbox.exec(&tree::changes_command(tree), None, timeout, 16 << 20)?;
    if !listed.success() || listed.omitted_bytes > 0 {
        bail!(
            "task {}: listing the applied change failed ({}): {}",
            task.id,
            describe_end(&listed),
            super::agent_text(&listed.output, 2000)
        );
    }
    let changes = tree::parse_changes(&listed.output);
    let runner = tree::runner_files(task.repo_name.as_deref(), &plan.command);
    let reference = reference::changed_paths(task)?;
    let dropped = tree::protected(&changes, owned, &runner, &reference);
    if dropped.is_empty() {
        return Ok((changes, dropped));
    }
    let out = sandbox.run(&tree::restore_command(tree, &dropped), None, timeout)?;
    if !out.success() {
        bail!(
            "task {}: putting back what the change may not keep failed ({}): {}",
            task.id,
            describe_end(&out),
            out.output.trim()
        );
    }
    Ok((changes, dropped))
}

/// A change's paths with git's status letters, and the paths grading put back with reasons.
type Changes = (Vec<(char, String)>, Vec<(String, String)>);

/// The syntax-tree flags of the lines `patch` adds to Python files, read by the grading
/// sandbox's own Python 3 over the applied change (flags.rs).
fn scan(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    patch: &str,
    timeout: Duration,
) -> Result<Vec<super::flags::Flag>> {
    use super::flags;
    let files: Vec<serde_json::Value> = flags::added_lines(patch)
        .into_iter()
        .map(|(path, lines)| serde_json::json!({"path": path, "lines": lines}))
        .collect();
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let input = serde_json::json!({ "files": files }).to_string();
    let activate = task.activate.as_deref().unwrap_or(":");
    let command = format!(
        "{{ {activate}\n}} >/dev/null 2>&1 </dev/null\n{}",
        flags::flags_command("")
    );
    let input = flags::flags_input(&input);
    let out = sandbox.exec(&command, Some(&input), timeout, 4 << 20)?;
    if !out.success() {
        bail!(
            "task {}: the syntax-tree scan failed ({}): {}",
            task.id,
            describe_end(&out),
            out.output.trim()
        );
    }
    Ok(flags::parse_flags(&out.output)
        .into_iter()
        .filter(|f| f.rule != "no-scanner")
        .collect())
}

/// Step 3's canaries: the indices of the files that got them.
fn install_canaries(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    canaries: &Canaries,
    timeout: Duration,
) -> Result<Vec<usize>> {
    if canaries.files.is_empty() {
        return Ok(Vec::new());
    }
    let out = sandbox.run(&canaries.install_command(), None, timeout)?;
    if !out.success() {
        bail!(
            "task {}: adding the grader's canary tests failed ({}): {}",
            task.id,
            describe_end(&out),
            out.output.trim()
        );
    }
    Ok(out
        .output
        .lines()
        .filter_map(|l| l.strip_prefix("canary ")?.trim().parse().ok())
        .filter(|&i| i < canaries.files.len())
        .collect())
}

/// The runner's record: `Absent` when the file was never written, `Unreadable` when it cannot
/// be trusted (too big).
fn read_results(sandbox: &mut dyn Sandbox, path: &str, timeout: Duration) -> Result<Channel> {
    let q = shell_quote(path);
    let out = sandbox.exec(
        &format!("cd \"$HOME\" && if [ -f {q} ]; then cat {q}; else exit 3; fi"),
        None,
        timeout,
        RESULTS_BYTES,
    )?;
    Ok(match out.exit_code {
        Some(3) => Channel::Absent,
        Some(0) if out.omitted_bytes == 0 => Channel::Written(out.output),
        Some(0) => Channel::Unreadable(format!("over {RESULTS_BYTES} bytes")),
        _ => bail!(
            "reading the runner's record failed ({}): {}",
            describe_end(&out),
            out.output.trim()
        ),
    })
}

/// Exit status of the preparation command when the agent's diff does not apply.
const DIFF_DOES_NOT_APPLY: i32 = 97;

/// Lists the pytest plugins the image itself installed (entry points of group `pytest11`), as
/// `-p` options, before the change is applied: pytest's plugin autoload stays off in the run (an
/// agent-installed plugin never loads) and exactly these are loaded, by entry-point name where
/// pytest takes one (4.4 and later; the module before, or for a name `-p` cannot carry), so a
/// configuration's `-p no:NAME` still blocks them. Printed on one line; nothing where pytest is
/// not installed.
const PYTEST_PLUGINS_SCRIPT: &str = r#"import re, sys
try:
    import pytest
    version = tuple(int(x) for x in re.findall(r"\d+", pytest.__version__)[:2])
except Exception:
    sys.exit(0)
found = []
try:
    try:
        from importlib import metadata
    except ImportError:
        import importlib_metadata as metadata
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == "pytest11":
                found.append((ep.name, ep.value))
except ImportError:
    import pkg_resources
    for ep in pkg_resources.iter_entry_points("pytest11"):
        found.append((ep.name, ep.module_name))
args, word = [], re.compile(r"^[A-Za-z0-9_.-]+$")
for name, value in found:
    by_name = version >= (4, 4) and word.match(name)
    arg = name if by_name else value.split(":")[0].strip()
    if word.match(arg) and arg not in args:
        args.append(arg)
print(" ".join("-p " + a for a in args))
"#;

/// Records the image's pytest plugins ([`PYTEST_PLUGINS_SCRIPT`], with the task's activation,
/// from `/` as pytest's own script would see them) and applies the diff read from stdin.
fn prepare_command(activate: &str) -> String {
    format!(
        r#"set -e
g="$HOME/.swerve-grader"; rm -rf "$g"; mkdir -p "$g/home" "$g/py"
( {{ {activate}
}} >/dev/null 2>&1 </dev/null
  py=$(command -v python || command -v python3) && cd / && "$py" -c {script} ) > "$g/pytest-plugins" 2>/dev/null </dev/null || : > "$g/pytest-plugins"
cat > "$g/agent.patch"
[ -s "$g/agent.patch" ] || exit 0
if git apply --whitespace=nowarn "$g/agent.patch" 2>"$g/apply.err"; then exit 0; fi
if command -v patch >/dev/null 2>&1 && patch --batch --fuzz=5 -p1 -i "$g/agent.patch" >"$g/patch.out" 2>&1; then exit 0; fi
cat "$g/apply.err"; exit {DIFF_DOES_NOT_APPLY}"#,
        script = shell_quote(PYTEST_PLUGINS_SCRIPT)
    )
}

/// Puts the task's tests in place over the agent's change.
fn install_tests(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    plan: &TestPlan,
    timeout: Duration,
) -> Result<()> {
    if let Some(overlay) = &plan.overlay {
        sandbox.copy_in(overlay)?;
    }
    let Some(test_patch) = &plan.test_patch else {
        return Ok(());
    };
    let base = plan.base_commit.as_deref().unwrap_or("HEAD");
    let mut command = format!("set -e; base={}\n", shell_quote(base));
    // Both sides of every header: a file the patch renames or deletes goes back too.
    let mut files: Vec<String> = super::repos::patch_paths(test_patch)
        .into_iter()
        .flat_map(|(a, b)| a.into_iter().chain(b))
        .collect();
    files.sort();
    files.dedup();
    for file in files {
        let q = shell_quote(&file);
        command.push_str(&format!(
            "if git cat-file -e \"$base:\"{q} 2>/dev/null; then git checkout -q \"$base\" -- {q}; else rm -rf -- {q}; fi\n"
        ));
    }
    command.push_str("git apply --whitespace=nowarn -\n");
    let out = sandbox.run(&command, Some(test_patch.as_bytes()), timeout)?;
    if !out.success() {
        bail!(
            "task {} ({}): the test patch does not apply ({}): {}",
            task.id,
            task.origin,
            describe_end(&out),
            out.output.trim()
        );
    }
    Ok(())
}

/// The script the grading sandbox's shell reads on stdin: hardened environment, the grader's
/// Python files, the command (its stdin closed, so nothing of the script is readable from it);
/// the shell's exit status is the command's.
fn grader_script(
    task: &Task,
    plan: &TestPlan,
    results_path: &str,
    copies: &[installed::InstalledCopy],
) -> String {
    let end_of_file = format!(
        "SWERVE_GRADER_EOF_{:016x}",
        SplitMix64::new(nonce_seed()).next_u64()
    );
    let activate = task.activate.as_deref().unwrap_or(":");
    let safe_path = if plan.safe_path {
        "export PYTHONSAFEPATH=1"
    } else {
        "unset PYTHONSAFEPATH"
    };
    let recorder = if plan.parser.records_unittest() {
        "export SWERVE_GRADER_UNITTEST=1"
    } else {
        "unset SWERVE_GRADER_UNITTEST"
    };
    // The owned Python files as installed: the recorders read them as the test process starts
    // and check each test against that text, not against the file as it reads later.
    let owned: Vec<String> = plan
        .owned_paths()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.ends_with(".py"))
        .collect();
    let owned = super::shell_quote(&serde_json::to_string(&owned).unwrap_or_default());
    // Where the change was carried outside the tree: code there is the change's (installed.rs).
    let copies: Vec<&str> = copies.iter().map(|c| c.location.as_str()).collect();
    let copies = super::shell_quote(&serde_json::to_string(&copies).unwrap_or_default());
    format!(
        r#"exec 2>&1
g="$HOME/.swerve-grader"
cat > "$g/py/sitecustomize.py" <<'{end_of_file}'
{SITECUSTOMIZE}
{end_of_file}
cat > "$g/py/{PYTEST_PLUGIN_MODULE}.py" <<'{end_of_file}'
{PYTEST_PLUGIN}
{end_of_file}
cat > "$g/py/swerve_grader_check.py" <<'{end_of_file}'
{CHECK}
{end_of_file}
cat > "$g/py/swerve_grader_provenance.py" <<'{end_of_file}'
{PROVENANCE}
{end_of_file}
cat > "$g/py/swerve_grader_values.py" <<'{end_of_file}'
{VALUES}
{end_of_file}
find . -name __pycache__ -type d -prune -exec rm -rf {{}} + 2>/dev/null
{{ {activate}
}} >/dev/null 2>&1 </dev/null
export SWERVE_GRADER_RESULTS="$HOME/{results_path}" SWERVE_GRADER_OWNED={owned} SWERVE_GRADER_COPIES={copies}
export HOME="$g/home" PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$g/py"
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_PLUGINS={PYTEST_PLUGIN_MODULE} PYTEST_ADDOPTS="$(cat "$g/pytest-plugins" 2>/dev/null)"
unset PYTHONSTARTUP PYTHONHOME PYTHONINSPECT PYTHONUSERBASE PYTHONEXECUTABLE
{safe_path}
{recorder}
{{ {command}
}} </dev/null
"#,
        command = plan.command
    )
}

/// A seed nobody can predict from the task: time and process.
fn nonce_seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::PYTEST_PLUGINS_SCRIPT;
    use std::path::Path;

    /// The `-p` options [`PYTEST_PLUGINS_SCRIPT`] prints with `site` on the path: a stand-in
    /// `pytest` of `version` and two distributions with `pytest11` entry points.
    fn plugin_args(site: &Path, version: &str) -> String {
        std::fs::write(
            site.join("pytest.py"),
            format!("__version__ = {version:?}\n"),
        )
        .unwrap();
        for (dist, entry) in [
            (
                "pytest_doctestplus-1.0",
                "doctestplus = pytest_doctestplus.plugin",
            ),
            (
                "pytest_cov-4.0",
                "pytest_cov = pytest_cov.plugin:Plugin\nbad name = x",
            ),
        ] {
            let info = site.join(format!("{dist}.dist-info"));
            std::fs::create_dir_all(&info).unwrap();
            let name = dist.split('-').next().unwrap();
            std::fs::write(
                info.join("METADATA"),
                format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"),
            )
            .unwrap();
            std::fs::write(
                info.join("entry_points.txt"),
                format!("[pytest11]\n{entry}\n[console_scripts]\nx = y:z\n"),
            )
            .unwrap();
        }
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(PYTEST_PLUGINS_SCRIPT)
            .env("PYTHONPATH", site)
            .current_dir("/")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let mut args: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .split(" -p ")
            .map(|a| a.trim_start_matches("-p ").to_string())
            .collect();
        args.sort();
        args.join(",")
    }

    #[test]
    fn the_images_pytest_plugins_are_listed_by_entry_point_name_or_module() {
        if std::process::Command::new("python3")
            .arg("-c")
            .arg("import importlib.metadata")
            .status()
            .map_or(true, |s| !s.success())
        {
            panic!("python3 with importlib.metadata (3.8 or later) is needed for this test");
        }
        let site = tempfile::tempdir().unwrap();
        // pytest 4.4 and later take an entry point's name (the module for a name with a space);
        // earlier ones the module.
        assert_eq!(
            plugin_args(site.path(), "8.0.1"),
            "doctestplus,pytest_cov,x"
        );
        assert_eq!(
            plugin_args(site.path(), "3.10.1"),
            "pytest_cov.plugin,pytest_doctestplus.plugin,x"
        );
    }
}
