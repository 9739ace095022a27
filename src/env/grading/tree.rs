//! What the agent's change may not keep in the grading sandbox, read from the sandbox itself
//! after the change is applied (git's `--name-status -z`: exact bytes, never a quoted form):
//!
//! ```text
//!   owned test files, every conftest.py, every .pth,     restored to the starting state
//!   pytest's configuration files (pytest.ini, tox.ini,
//!     setup.cfg, pyproject.toml: at any depth),
//!   the __init__.py of the owned tests' packages
//!   anything imported in place of an owned module:       (removed where the start had none)
//!     tests/test_x/... or a tests/test_x symlink           a package or link of its name
//!     tests/test_x.so, tests/test_x.cpython-311.pyc        a compiled module of its name
//!     tests.py, tests.so (for tests/**)                    a module shadowing an owned folder
//!     a file or symlink at tests (an owned folder)
//!   the runner: Django's tests/runtests.py and its       restored, unless the reference fix
//!     settings module, sympy's bin/test and its runner,    itself changes them
//!     tox.ini for tox, any file the test command names
//! ```

use crate::env::diff::{with_scratch_index, GIT};
use crate::env::shell_quote;

/// The shell command printing the changes against `tree` as `STATUS\0PATH\0...`.
pub fn changes_command(tree: &str) -> String {
    with_scratch_index(&format!(
        "{GIT} read-tree {tree} && {GIT} add -A . && {GIT} diff --cached --name-status -z --no-renames {tree}"
    ))
}

/// `(status letter, path)` pairs from [`changes_command`]'s output.
pub fn parse_changes(output: &str) -> Vec<(char, String)> {
    let fields: Vec<&str> = output.split('\0').collect();
    fields
        .chunks(2)
        .filter_map(|pair| match pair {
            [status, path] if !path.is_empty() => Some((
                status.trim().chars().next().unwrap_or('M'),
                path.to_string(),
            )),
            _ => None,
        })
        .collect()
}

/// The runner's files for a task (workdir-relative): the table's per repository, the files the
/// command names, the settings module a Django-style `--settings=` names.
pub fn runner_files(repo: Option<&str>, command: &str) -> Vec<String> {
    let mut files: Vec<String> = match repo {
        Some("django/django") => vec!["tests/runtests.py".into()],
        Some("sympy/sympy") => vec![
            "bin/test".into(),
            "bin/get_sympy.py".into(),
            "sympy/testing/runtests.py".into(),
            "sympy/testing/pytest.py".into(),
            "sympy/utilities/runtests.py".into(),
            "sympy/utilities/pytest.py".into(),
        ],
        _ => Vec::new(),
    };
    for word in command.split(|c: char| c.is_whitespace() || c == ';' || c == '&' || c == '|') {
        let word = word.trim_matches(|c| c == '\'' || c == '"');
        if let Some(module) = word.strip_prefix("--settings=") {
            let path = module.replace('.', "/");
            files.push(format!("{path}.py"));
            files.push(format!("tests/{path}.py"));
        } else if word == "tox" {
            files.push("tox.ini".into());
        } else if !word.starts_with('-') && word.contains('/') || word.ends_with(".py") {
            files.push(word.trim_start_matches("./").to_string());
        }
    }
    files.sort();
    files.dedup();
    files
}

/// The files pytest reads its configuration from, at any depth (the first found walking up from
/// the tests' folder is the one read). pytest reads them where the task has them, so a change
/// to any of them is put back (unless the reference fix changes it too).
const PYTEST_CONFIG: &[&str] = &[
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
];

/// The changed paths grading puts back, each with the reason (for `patch_dropped`).
/// `owned`: the task's test files; `runner`: [`runner_files`]; `reference`: paths the task's
/// reference fix changes (its runner changes are allowed).
pub fn protected(
    changes: &[(char, String)],
    owned: &[String],
    runner: &[String],
    reference: &[String],
) -> Vec<(String, String)> {
    let owned_modules: Vec<&str> = owned
        .iter()
        .filter(|p| p.ends_with(".py"))
        .map(|s| s.as_str())
        .collect();
    let mut out = Vec::new();
    for (_, path) in changes {
        let name = path.rsplit('/').next().unwrap_or(path);
        let stem = name.split('.').next().unwrap_or(name);
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        let reason = if owned.iter().any(|o| o == path) {
            Some("a file the task's tests own".to_string())
        } else if name == "conftest.py" {
            Some("test infrastructure (conftest.py)".to_string())
        } else if name == "__init__.py"
            && !reference.iter().any(|r| r == path)
            && (owned_modules
                .iter()
                .any(|o| o.rsplit_once('/').map_or("", |(d, _)| d) == parent)
                || (matches!(
                    parent.rsplit('/').next(),
                    Some("tests" | "test" | "testing")
                ) && owned_modules
                    .iter()
                    .any(|o| o.starts_with(&format!("{parent}/")))))
        {
            Some("the package of the task's tests (runs before them)".to_string())
        } else if PYTEST_CONFIG.contains(&name) && !reference.iter().any(|r| r == path) {
            Some("pytest's configuration (read in place, as the task has it)".to_string())
        } else if name.ends_with(".pth") {
            Some("a .pth file (runs code at interpreter start)".to_string())
        } else if let Some(module) = owned_modules
            .iter()
            .find(|o| shadows(path, parent, stem, o))
        {
            Some(format!("would be imported in place of the task's {module}"))
        } else if runner.iter().any(|r| r == path) && !reference.iter().any(|r| r == path) {
            Some("the test runner's own file".to_string())
        } else {
            None
        };
        if let Some(why) = reason {
            out.push((path.clone(), why));
        }
    }
    out
}

/// Whether `path` (in folder `parent`, first name part `stem`) would be imported in place of
/// the owned module `owned` (`dir/name.py`) or one of its packages.
fn shadows(path: &str, parent: &str, stem: &str, owned: &str) -> bool {
    let module = &owned[..owned.len() - 3];
    // A package, link or compiled module of the module's own name.
    if path == module || path.starts_with(&format!("{module}/")) {
        return true;
    }
    let (dir, name) = module.rsplit_once('/').unwrap_or(("", module));
    if parent == dir && stem == name && path != owned {
        return true;
    }
    // A module (or file, or link) in place of one of the module's folders.
    let mut ancestor = String::new();
    for part in dir.split('/').filter(|p| !p.is_empty()) {
        let above = ancestor.clone();
        if !ancestor.is_empty() {
            ancestor.push('/');
        }
        ancestor.push_str(part);
        if path == ancestor
            || (parent == above && stem == part && !path.starts_with(&format!("{ancestor}/")))
        {
            return true;
        }
    }
    false
}

/// The shell command putting `paths` back as they were in `tree` (removed where `tree` has
/// none).
pub fn restore_command(tree: &str, paths: &[(String, String)]) -> String {
    let mut body = String::from("set -e\n");
    for (path, _) in paths {
        let q = shell_quote(path);
        body.push_str(&format!(
            "rm -rf -- {q}\nif {GIT} cat-file -e {tree}:{q} 2>/dev/null; then {GIT} checkout {tree} -- {q}; fi\n"
        ));
    }
    with_scratch_index(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(paths: &[&str]) -> Vec<(char, String)> {
        paths.iter().map(|p| ('A', p.to_string())).collect()
    }

    #[test]
    fn shadows_of_owned_modules_and_the_runner_are_put_back() {
        let owned = vec!["tests/test_x.py".to_string(), "tests/data.json".to_string()];
        let runner = runner_files(
            Some("django/django"),
            "./tests/runtests.py --verbosity 2 --settings=test_sqlite x.y",
        );
        assert!(runner.contains(&"tests/runtests.py".to_string()));
        assert!(runner.contains(&"tests/test_sqlite.py".to_string()));
        let kept = [
            "pkg/core.py",
            "tests/test_y.py",
            "tests/helpers.py",
            "README.md",
            "tests_extra.txt",
        ];
        let dropped = [
            "tests/test_x/__init__.py",
            "tests/test_x",
            "tests/test_x.cpython-311-x86_64-linux-gnu.so",
            "tests/test_x.pyc",
            "tests.py",
            "tests",
            "sub/conftest.py",
            "pkg/zz.pth",
            "tests/runtests.py",
            "tests/test_sqlite.py",
            "tests/test_x.py",
            "tests/__init__.py",
            "setup.cfg",
            "tests/pytest.ini",
            "sub/pyproject.toml",
            "tox.ini",
            ".pytest.ini",
        ];
        let all: Vec<&str> = kept.iter().chain(&dropped).copied().collect();
        let got: Vec<String> = protected(&changed(&all), &owned, &runner, &[])
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            got,
            dropped.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        );
        // The reference fix changes the runner: the agent may too.
        let got = protected(
            &changed(&["tests/runtests.py"]),
            &owned,
            &runner,
            &["tests/runtests.py".to_string()],
        );
        assert!(got.is_empty());
        // pytest's configuration is read where the task has it: put back, unless the reference
        // fix changes it too.
        let got = protected(
            &changed(&["setup.cfg", "pyproject.toml"]),
            &owned,
            &[],
            &["setup.cfg".to_string()],
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].0 == "pyproject.toml" && got[0].1.contains("pytest's configuration"));
        assert_eq!(
            parse_changes("M\0a b/\"q\".py\0A\0tests/t\u{e9}st.py\0"),
            vec![
                ('M', "a b/\"q\".py".to_string()),
                ('A', "tests/t\u{e9}st.py".to_string())
            ]
        );
        let sympy = runner_files(
            Some("sympy/sympy"),
            "PYTHONWARNINGS='x' bin/test -C --verbose sympy/core/tests/test_basic.py",
        );
        assert!(
            sympy.contains(&"bin/test".to_string())
                && sympy.contains(&"sympy/core/tests/test_basic.py".to_string())
        );
    }
}
