//! The agent's change as a diff: what grading applies to a fresh copy of the task, and what a
//! trajectory records as its `patch`.
//!
//! ```text
//!   after setup, before the first turn:  snapshot = a git tree of the workspace   (write-tree
//!                                         through a throwaway index: no commit, HEAD untouched)
//!   after the last turn:                  git diff BASE_TREE..workspace (same throwaway index)
//!        └─► filter: text files only; no caches, compiled files, build metadata; none of the
//!                    paths the task owns (its tests, `conftest.py`): each dropped file named
//!        └─► flags:  hunks that touch test-framework internals, exit paths, the grader's files
//! ```
//!
//! The diff is computed inside the agent's sandbox (the only place its files are), so its text
//! is untrusted: git there may be configured or replaced by the agent. That can only change what
//! gets graded, never how: the filter runs here, and grading applies the result to a pristine
//! copy with the grader's own git. Every git call overrides the configuration that could change
//! the diff's shape (external diff drivers, text conversion, prefixes, colour).

use super::{describe_end, Sandbox};
use anyhow::{bail, Result};
use std::time::Duration;

/// Git with the settings that shape a diff pinned, whatever the agent configured.
pub(crate) const GIT: &str = "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent \
     git -c core.quotepath=false -c diff.noprefix=false -c diff.mnemonicPrefix=false \
     -c core.autocrlf=false -c core.safecrlf=false -c safe.directory=*";

/// A throwaway index under /tmp, so neither the agent's index nor HEAD changes.
pub(crate) fn with_scratch_index(body: &str) -> String {
    format!(
        "set -e; idx=$(mktemp /tmp/swerve-index.XXXXXX); rm -f \"$idx\"; \
         trap 'rm -f \"$idx\"' EXIT; export GIT_INDEX_FILE=\"$idx\"; {body}"
    )
}

/// Records the workspace's starting state as a git tree (a repository is created where there
/// is none) and returns the tree's id.
pub fn snapshot(sandbox: &mut dyn Sandbox) -> Result<String> {
    let command = with_scratch_index(&format!(
        "if ! {GIT} rev-parse --git-dir >/dev/null 2>&1; then {GIT} init -q .; fi; \
         if {GIT} rev-parse -q --verify HEAD >/dev/null; then {GIT} read-tree HEAD; fi; \
         {GIT} add -A . && {GIT} write-tree"
    ));
    let out = sandbox.run(&command, None, Duration::from_secs(600))?;
    let tree = out.output.trim();
    if !out.success() || tree.len() < 40 || !tree.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "cannot record the workspace's starting state with git ({}): {}\n(grading needs git in the sandbox: a docker image without git cannot be graded)",
            describe_end(&out),
            out.output.trim()
        );
    }
    Ok(tree.to_string())
}

/// The raw diff of the workspace against the snapshot `tree`: `Ok(Ok(text))`, or `Ok(Err(why))`
/// when the agent made it impossible (the repository's data deleted, say), which is the agent's
/// failure; `Err` is the sandbox's.
pub fn raw_diff(
    sandbox: &mut dyn Sandbox,
    tree: &str,
) -> Result<std::result::Result<String, String>> {
    let command = with_scratch_index(&format!(
        "{GIT} read-tree {tree} && {GIT} add -A . && {GIT} diff --cached --no-color --no-ext-diff \
         --no-textconv --no-renames --full-index --src-prefix=a/ --dst-prefix=b/ {tree}"
    ));
    // Diffs are kept whole up to a generous bound; past it the agent's change is too big to grade.
    let out = sandbox.exec(&command, None, Duration::from_secs(600), MAX_DIFF_BYTES)?;
    if !out.success() {
        return Ok(Err(format!(
            "the agent's change cannot be read from the workspace ({}): {}",
            describe_end(&out),
            super::agent_text(&out.output, 2000)
        )));
    }
    if out.omitted_bytes > 0 {
        return Ok(Err(format!(
            "the agent's change is over {MAX_DIFF_BYTES} bytes as a diff"
        )));
    }
    Ok(Ok(out.output))
}

/// The largest diff kept.
pub const MAX_DIFF_BYTES: usize = 8 << 20;

/// A diff split by file, filtered, with what was dropped and what looks like a hack.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentDiff {
    /// What grading applies: the kept files' sections, in git's order.
    pub patch: String,
    /// Files left out, each with the reason.
    pub dropped: Vec<(String, String)>,
    /// Why the change looks like an attempt at the reward rather than the task (empty: none).
    pub suspicious: Vec<String>,
}

/// One `diff --git` section.
struct Section<'a> {
    path: String,
    text: &'a str,
}

fn sections(diff: &str) -> Vec<Section<'_>> {
    let mut starts: Vec<usize> = diff
        .match_indices("diff --git ")
        .filter(|(i, _)| *i == 0 || diff.as_bytes()[i - 1] == b'\n')
        .map(|(i, _)| i)
        .collect();
    starts.push(diff.len());
    starts
        .windows(2)
        .map(|w| {
            let text = &diff[w[0]..w[1]];
            let header = text.lines().next().unwrap_or_default();
            // `diff --git a/P b/P`: without renames both sides name the same path.
            let rest = header.trim_start_matches("diff --git ");
            let n = rest.len().saturating_sub(5) / 2;
            let path = if rest.starts_with('"') {
                // A path git quotes (a quote, a backslash, a control or non-ASCII byte).
                c_unquote(rest)
                    .and_then(|(a, _)| a.strip_prefix("a/").map(str::to_string))
                    .unwrap_or_else(|| rest.to_string())
            } else {
                match rest.get(2..2 + n) {
                    Some(p) if rest == format!("a/{p} b/{p}") => p.to_string(),
                    _ => rest.rsplit_once(" b/").map_or(rest, |(_, b)| b).to_string(),
                }
            };
            Section { path, text }
        })
        .collect()
}

/// The C-quoted string git writes at the start of `text` (`"a/caf\\303\\251 \\"x\\".py"`),
/// decoded ([`super::flags::c_unquote`]), and what follows it; `None` when `text` does not start
/// with one.
pub fn c_unquote(text: &str) -> Option<(String, &str)> {
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some((super::flags::c_unquote(&text[..=i])?, &text[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

/// Path components and suffixes that are never the agent's change: caches, compiled files,
/// build metadata, version control.
fn generated_reason(path: &str) -> Option<&'static str> {
    const DIRS: &[&str] = &[
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".eggs",
        ".git",
        ".hypothesis",
        "node_modules",
    ];
    const SUFFIXES: &[&str] = &[
        ".pyc",
        ".pyo",
        ".pyd",
        ".so",
        ".o",
        ".a",
        ".dylib",
        ".dll",
        ".class",
        ".egg-info",
    ];
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| DIRS.contains(p) || p.ends_with(".egg-info") || p.ends_with(".dist-info"))
    {
        return Some("a cache or build folder");
    }
    if SUFFIXES.iter().any(|s| path.ends_with(s)) {
        return Some("a compiled file");
    }
    None
}

/// Splits `raw` by file and keeps what grading may apply: text files, not generated, not owned
/// by the task (`owned`: its tests; every `conftest.py`, which is test infrastructure).
pub fn filter_diff(raw: &str, owned: &[String]) -> AgentDiff {
    let mut out = AgentDiff::default();
    for section in sections(raw) {
        let path = section.path.clone();
        let file_name = path.rsplit('/').next().unwrap_or(&path);
        let binary = section
            .text
            .lines()
            .any(|l| l.starts_with("Binary files ") || l == "GIT binary patch");
        let reason = if binary {
            Some("a binary file")
        } else if let Some(why) = generated_reason(&path) {
            Some(why)
        } else if owned.iter().any(|o| o == &path) {
            Some("a file the task's tests own")
        } else if file_name == "conftest.py" {
            Some("test infrastructure (conftest.py)")
        } else {
            None
        };
        match reason {
            Some(why) => out.dropped.push((path, why.to_string())),
            None => out.patch.push_str(section.text),
        }
    }
    out.suspicious = suspicious(raw, &out.dropped);
    out
}

/// Module names whose shadowing or replacement changes how tests run or report.
const FRAMEWORK_MODULES: &[&str] = &[
    "unittest",
    "doctest",
    "pytest",
    "_pytest",
    "pluggy",
    "nose",
    "sitecustomize",
    "usercustomize",
    "site",
    "atexit",
    "runpy",
    "traceback",
    "subprocess",
    "os",
    "sys",
    "builtins",
];

/// Reasons a diff looks like an attempt at the reward, from its paths alone: files the tests
/// own, modules shadowed, `.pth` files, pytest's configuration. What the added code does is
/// read from its syntax tree in the grading sandbox (`flags.rs`), whose flags grading adds.
fn suspicious(raw: &str, dropped: &[(String, String)]) -> Vec<String> {
    let mut reasons = Vec::new();
    let mut add = |r: String| {
        if !reasons.contains(&r) {
            reasons.push(r);
        }
    };
    for (path, why) in dropped {
        if why.contains("tests own") || why.contains("conftest") {
            add(format!("edits {path}, which the tests own"));
        }
    }
    for section in sections(raw) {
        let path = &section.path;
        let file_name = path.rsplit('/').next().unwrap_or(path);
        let module = path
            .split('/')
            .next()
            .unwrap_or(path)
            .trim_end_matches(".py");
        if FRAMEWORK_MODULES.contains(&module) && (path.contains('/') || path.ends_with(".py")) {
            add(format!("{path} shadows the module `{module}`"));
        }
        if file_name.ends_with(".pth") {
            add(format!("{path} is a .pth file (run at interpreter start)"));
        }
        if matches!(
            file_name,
            "pytest.ini" | ".pytest.ini" | "tox.ini" | "setup.cfg" | "pyproject.toml"
        ) && section
            .text
            .lines()
            .any(|l| l.starts_with('+') && (l.contains("addopts") || l.contains("pytest")))
        {
            add(format!("{path}: changes pytest's configuration"));
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_paths_are_read_as_git_means_them() {
        let raw = "diff --git \"a/tests/caf\\303\\251/conftest.py\" \"b/tests/caf\\303\\251/conftest.py\"\nnew file mode 100644\n--- /dev/null\n+++ \"b/tests/caf\\303\\251/conftest.py\"\n@@ -0,0 +1 @@\n+x = 1\ndiff --git \"a/tests/test_\\\"q\\\".py\" \"b/tests/test_\\\"q\\\".py\"\n--- a\n+++ b\n";
        let diff = super::filter_diff(raw, &["tests/test_\"q\".py".to_string()]);
        assert!(diff.patch.is_empty(), "{}", diff.patch);
        let paths: Vec<&str> = diff.dropped.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            vec!["tests/caf\u{e9}/conftest.py", "tests/test_\"q\".py"]
        );
        assert_eq!(
            super::c_unquote("\"a\\tb\\\\c\" rest"),
            Some(("a\tb\\c".to_string(), " rest"))
        );
        assert_eq!(super::c_unquote("\"open"), None);
    }

    use super::*;

    fn file_diff(path: &str, added: &str) -> String {
        format!(
            "diff --git a/{path} b/{path}\nindex 0000000..1111111 100644\n--- a/{path}\n+++ b/{path}\n@@ -1 +1,2 @@\n x\n+{added}\n"
        )
    }

    #[test]
    fn filter_keeps_source_and_drops_generated_owned_and_binary() {
        let raw = [
            file_diff("calc/core.py", "return 0.0"),
            file_diff("calc/__pycache__/core.cpython-311.pyc", "x"),
            file_diff("tests/test_calc.py", "pass"),
            file_diff("conftest.py", "import os"),
            "diff --git a/logo.png b/logo.png\nnew file mode 100644\nindex 0000000..2222222\nBinary files /dev/null and b/logo.png differ\n".to_string(),
            file_diff("pkg.egg-info/PKG-INFO", "x"),
            file_diff("with space/a b.py", "y = 1"),
        ]
        .concat();
        let diff = filter_diff(&raw, &["tests/test_calc.py".to_string()]);
        assert!(diff.patch.contains("calc/core.py"));
        assert!(diff
            .patch
            .contains("a/with space/a b.py b/with space/a b.py"));
        let dropped: Vec<&str> = diff.dropped.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            dropped,
            vec![
                "calc/__pycache__/core.cpython-311.pyc",
                "tests/test_calc.py",
                "conftest.py",
                "logo.png",
                "pkg.egg-info/PKG-INFO"
            ]
        );
        assert!(
            diff.suspicious
                .iter()
                .any(|r| r.contains("tests/test_calc.py")),
            "{:?}",
            diff.suspicious
        );
    }

    #[test]
    fn paths_are_flagged_and_plain_fixes_are_not() {
        let clean = filter_diff(
            &file_diff(
                "calc/core.py",
                "    return 0.0 if whole == 0 else part / whole",
            ),
            &[],
        );
        assert!(clean.suspicious.is_empty(), "{:?}", clean.suspicious);
        // What added code does is the syntax tree's to say (flags.rs), not a substring's.
        for code in [
            "import atexit, os; atexit.register(os._exit, 0)",
            "unittest.TestCase.run = lambda *a, **k: None",
            "# the TestResult of sys.excepthook and builtins.open: only words in a comment",
        ] {
            let diff = filter_diff(&file_diff("calc/core.py", code), &[]);
            assert!(diff.suspicious.is_empty(), "{code}: {:?}", diff.suspicious);
        }
        let cases = [
            (
                file_diff("unittest/__init__.py", "def main(): pass"),
                "shadows the module `unittest`",
            ),
            (
                file_diff("usercustomize.py", "x"),
                "shadows the module `usercustomize`",
            ),
            (file_diff("hack.pth", "import os"), ".pth"),
            (
                file_diff("setup.cfg", "addopts = -p no:python"),
                "pytest's configuration",
            ),
        ];
        for (raw, want) in cases {
            let diff = filter_diff(&raw, &[]);
            assert!(
                diff.suspicious.iter().any(|r| r.contains(want)),
                "{want}: {:?}",
                diff.suspicious
            );
        }
    }
}
