//! Grading in a fresh environment, as SWE-bench's harness grades: the agent's change applied to
//! a pristine copy of the task, the task's tests restored over it, the tests run in a hardened
//! way, and the verdict read test by test from the log.
//!
//! ```text
//!   agent sandbox ──► diff (diff.rs) ──► closed (every agent process gone)
//!   fresh sandbox (Environment::start: the task's starting state, setup run)
//!     1. the pristine pytest configuration saved to the grader's folder; the diff applied
//!        (git apply, then patch --fuzz): a diff that does not apply is unresolved, not an error
//!     2. the task's tests: the `tests` folder copied over, or the files `test_patch` touches
//!        restored to `base_commit` (removed where they are new) and the patch applied
//!     3. the grader's script (fed on stdin, run by the sandbox's own shell):
//!          __pycache__ removed; HOME an empty folder; user site-packages off (PYTHONNOUSERSITE);
//!          safe-path mode (PYTHONSAFEPATH, where the runner allows); the grader's sitecustomize
//!          (standard library first, the workspace after site-packages); pytest plugin autoload
//!          off and pytest reading only the grader's copy of the pristine configuration
//!          (`-c`, `--rootdir`, `--confcutdir`); the task's environment activated;
//!          `>>>>> swerve tests start NONCE` ... the command ... `>>>>> swerve tests end NONCE N`
//!     4. the log between the markers judged by the task's parser (TestPlan::judge)
//!   fresh sandbox closed (a failing close is reported, the verdict kept)
//! ```
//!
//! What this rules out: anything the agent left outside its diff (processes, `$HOME`, user
//! site-packages, `.pth` files, compiled files, caches, replaced binaries in its container),
//! shadowing the standard library, pytest configuration and `conftest.py` changes, and forged
//! exit codes (verdicts come from per-test lines). What it cannot: the code under test runs in
//! the test process, so a diff can still patch the framework from inside or print lines shaped
//! like results; such diffs are flagged (`diff.rs`, `suspicious`).

use super::task::{shell_quote, TestPlan};
use super::{describe_end, CommandOutput, Environment, Sandbox, Task};
use crate::rng::{Rng, SplitMix64};
use anyhow::{bail, Result};
use std::time::Duration;

/// The grader's sitecustomize.py.
const SITECUSTOMIZE: &str = include_str!("grader_sitecustomize.py");

/// Output kept from the test command: the whole log in practice (per-test lines are read from it).
const GRADING_OUTPUT_BYTES: usize = 64 << 20;

/// What grading found.
#[derive(Clone, Debug, PartialEq)]
pub struct GradeResult {
    pub resolved: bool,
    /// The per-test verdict, when the tests ran.
    pub verdict: Option<super::task::Verdict>,
    /// Why the tests did not run for the agent's sake (its change does not apply).
    pub failure: Option<String>,
    /// The test command's output between the grader's markers (or all of it when they are
    /// missing); exit code and timing of the whole grading command.
    pub output: CommandOutput,
    /// A cleanup that failed after the verdict (the verdict stands).
    pub cleanup_error: Option<String>,
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
    let result = grade_in(sandbox.as_mut(), task, plan, patch);
    let cleanup_error = sandbox.close().err().map(|e| format!("{e:#}"));
    let mut result = result?;
    result.cleanup_error = cleanup_error;
    Ok(result)
}

fn grade_in(
    sandbox: &mut dyn Sandbox,
    task: &Task,
    plan: &TestPlan,
    patch: &str,
) -> Result<GradeResult> {
    let timeout = Duration::from_secs(task.timeout_s);
    let applied = sandbox.run(&prepare_command(), Some(patch.as_bytes()), timeout)?;
    if applied.exit_code == Some(DIFF_DOES_NOT_APPLY) {
        return Ok(GradeResult {
            resolved: false,
            verdict: None,
            failure: Some(format!(
                "the agent's change does not apply to the task's starting state:\n{}",
                applied.output.trim()
            )),
            output: applied,
            cleanup_error: None,
        });
    }
    if !applied.success() {
        bail!(
            "task {}: preparing the grading sandbox failed ({}): {}",
            task.id,
            describe_end(&applied),
            applied.output.trim()
        );
    }
    install_tests(sandbox, task, plan, timeout)?;
    let nonce = format!("{:016x}", SplitMix64::new(nonce_seed()).next_u64());
    let script = grader_script(task, plan, &nonce);
    let run = sandbox.exec(
        "s=$(mktemp /tmp/swerve-grade.XXXXXX) && cat > \"$s\" && exec sh \"$s\"",
        Some(script.as_bytes()),
        timeout + Duration::from_secs(30),
        GRADING_OUTPUT_BYTES,
    )?;
    let (log, exit_code) = between_markers(&run.output, &nonce);
    let verdict = plan.judge(&log, exit_code);
    let mut output = run;
    output.output = log;
    output.exit_code = exit_code;
    Ok(GradeResult {
        resolved: verdict.resolved,
        verdict: Some(verdict),
        failure: None,
        output,
        cleanup_error: None,
    })
}

/// Exit status of the preparation command when the agent's diff does not apply.
const DIFF_DOES_NOT_APPLY: i32 = 97;

/// Saves the pristine pytest configuration (the first file pytest would read at the workdir's
/// root, or an empty one) and applies the diff read from stdin.
fn prepare_command() -> String {
    format!(
        r#"set -e
g="$HOME/.swerve-grader"; rm -rf "$g"; mkdir -p "$g/cfg" "$g/home" "$g/py"
for f in pytest.ini .pytest.ini pyproject.toml tox.ini setup.cfg; do
  [ -f "$f" ] || continue
  case "$f" in
    pyproject.toml) grep -q '^\[tool\.pytest\.ini_options\]' "$f" || continue ;;
    tox.ini) grep -q '^\[pytest\]' "$f" || continue ;;
    setup.cfg) grep -q '^\[tool:pytest\]' "$f" || continue ;;
  esac
  cp "$f" "$g/cfg/$f"; break
done
[ -n "$(ls -A "$g/cfg")" ] || printf '[pytest]\n' > "$g/cfg/pytest.ini"
cat > "$g/agent.patch"
[ -s "$g/agent.patch" ] || exit 0
if git apply --whitespace=nowarn "$g/agent.patch" 2>"$g/apply.err"; then exit 0; fi
if command -v patch >/dev/null 2>&1 && patch --batch --fuzz=5 -p1 -i "$g/agent.patch" >"$g/patch.out" 2>&1; then exit 0; fi
cat "$g/apply.err"; exit {DIFF_DOES_NOT_APPLY}"#
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

/// The script the grading sandbox's shell runs: hardened environment, markers, the command.
pub fn grader_script(task: &Task, plan: &TestPlan, nonce: &str) -> String {
    let end_of_file = format!("SWERVE_GRADER_EOF_{nonce}");
    let activate = task.activate.as_deref().unwrap_or(":");
    let safe_path = if plan.safe_path {
        "export PYTHONSAFEPATH=1"
    } else {
        "unset PYTHONSAFEPATH"
    };
    format!(
        r#"exec 2>&1
g="$HOME/.swerve-grader"
cat > "$g/py/sitecustomize.py" <<'{end_of_file}'
{SITECUSTOMIZE}
{end_of_file}
find . -name __pycache__ -type d -prune -exec rm -rf {{}} + 2>/dev/null
cfg="$g/cfg/$(ls "$g/cfg" | head -n 1)"
{activate}
export HOME="$g/home" PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$g/py"
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_ADDOPTS="-c $cfg --rootdir=$PWD --confcutdir=$PWD -p no:cacheprovider"
unset PYTHONSTARTUP PYTHONHOME PYTHONINSPECT PYTHONUSERBASE PYTHONEXECUTABLE
{safe_path}
echo ">>>>> swerve tests start {nonce}"
{command}
echo ">>>>> swerve tests end {nonce} $?"
"#,
        command = plan.command
    )
}

/// The log between the markers and the test command's exit status (`None`: no end marker, the
/// command was killed).
pub fn between_markers(output: &str, nonce: &str) -> (String, Option<i32>) {
    let start = format!(">>>>> swerve tests start {nonce}\n");
    let end = format!(">>>>> swerve tests end {nonce} ");
    let Some(s) = output.find(&start) else {
        return (output.to_string(), None);
    };
    let body = &output[s + start.len()..];
    // The nonce is unknown to the code under test, so the marker counts wherever it is (a
    // runner that leaves a line open puts it mid-line).
    match body.rfind(&end) {
        Some(e) => {
            let code = body[e + end.len()..]
                .lines()
                .next()
                .and_then(|l| l.trim().parse().ok());
            (body[..e].to_string(), code)
        }
        None => (body.to_string(), None),
    }
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
    use super::*;

    #[test]
    fn markers_frame_the_log_and_carry_the_exit_status() {
        let out = "setup noise\n>>>>> swerve tests start ab\nok 1\n>>>>> swerve tests end zz 0\n>>>>> swerve tests end ab 1\n";
        let (log, code) = between_markers(out, "ab");
        assert_eq!(log, "ok 1\n>>>>> swerve tests end zz 0\n");
        assert_eq!(code, Some(1));
        // A line left open by the runner: the marker still ends the log.
        let (log, code) = between_markers(
            ">>>>> swerve tests start ab\ntest_x ... >>>>> swerve tests end ab 0\n",
            "ab",
        );
        assert_eq!((log.as_str(), code), ("test_x ... ", Some(0)));
        let (log, code) = between_markers(">>>>> swerve tests start ab\nkilled mid-run", "ab");
        assert_eq!((log.as_str(), code), ("killed mid-run", None));
        let (log, code) = between_markers("no markers", "ab");
        assert_eq!((log.as_str(), code), ("no markers", None));
    }
}
