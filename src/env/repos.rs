//! How SWE-bench's harness runs each repository's tests: the command, the log parser, and how
//! the test patch's files become the command's test directives (re-derived from the harness's
//! specs and `get_test_directives`, SWE-bench 2024-2025).
//!
//! ```text
//!   django/django   export LANG=... ; ./tests/runtests.py --verbosity 2 --settings=test_sqlite
//!                   --parallel 1 forms_tests.tests.test_forms      (tests/x/y.py -> x.y)
//!   sympy/sympy     PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C
//!                   --verbose sympy/core/tests/test_basic.py
//!   pytest repos    pytest -rA tests/test_x.py
//! ```
//!
//! Directives come from the `diff --git` headers' `b/` paths of the test patch, files with a
//! data extension left out (`.json`, `.txt`, `.png`, ...): never the FAIL_TO_PASS ids, so long
//! lists never reach a command line.
//!
//! Checked against the harness itself: tests/swebench_oracle.rs has the pinned harness write its
//! eval script for every Python repository and version it knows and compares the test command,
//! the exports before it and the directives with this table. Its constants assign `TEST_PYTEST`
//! twice; the value in force is `pytest -rA` (not `--no-header -rA --tb=no -p no:cacheprovider`,
//! which pytest before 6.0 refuses and which hides the `-rA` lines some lists were read from).

use super::logs::LogParser;

/// One repository's (and version's) test setup.
#[derive(Clone, Debug, PartialEq)]
pub struct RepoSpec {
    /// The test command without directives (any environment exports first, `; `-separated).
    pub test_cmd: String,
    pub parser: LogParser,
    pub directives: Directives,
    /// PYTHONSAFEPATH suits the runner (false: it imports from its own folder).
    pub safe_path: bool,
}

/// How the test patch's files name the tests to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directives {
    /// The files' paths as they are.
    Files,
    /// Django's test labels: `tests/` and `.py` dropped, `/` as `.`.
    DjangoModules,
}

const PYTEST: &str = "pytest -rA";
const ASTROPY_OLD_PYTEST: &str = "pytest -rA -vv -o console_output_style=classic --tb=no";
const DJANGO: &str = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1";
const DJANGO_NO_PARALLEL: &str = "./tests/runtests.py --verbosity 2";
const SEABORN: &str = "pytest --no-header -rA";
const SPHINX: &str = "tox --current-env -epy39 -v --";
const SYMPY: &str =
    "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose";

/// Extensions of test-patch files that are data, not tests (SWE-bench's list).
const NON_TEST_EXTS: &[&str] = &[
    ".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml",
];

/// The environment Django's older versions' evaluation exports before its tests (1.7-2.2).
const DJANGO_ENV_OLD: &str = "export LANG=en_US.UTF-8; export LC_ALL=en_US.UTF-8; \
    export PYTHONIOENCODING=utf8; export LANGUAGE=en_US:en";
/// Django 3.0-3.2's: the locale generated, then exported.
const DJANGO_ENV_3: &str = "sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen; \
    export LANG=en_US.UTF-8; export LANGUAGE=en_US:en; export LC_ALL=en_US.UTF-8";

/// The spec SWE-bench's harness uses for `repo` (`owner/name`) at `version`; None for a
/// repository it does not know. An unknown or absent version gets the repository's newest form.
pub fn spec_for(repo: &str, version: Option<&str>) -> Option<RepoSpec> {
    let version = version.unwrap_or("");
    let files = |cmd: &str, parser| RepoSpec {
        test_cmd: cmd.to_string(),
        parser,
        directives: Directives::Files,
        safe_path: true,
    };
    Some(match repo {
        "astropy/astropy" => {
            let old = ["0.1", "0.2", "0.3", "0.4", "1.1", "1.2", "1.3"].contains(&version);
            files(
                if old { ASTROPY_OLD_PYTEST } else { PYTEST },
                LogParser::PytestV2,
            )
        }
        "django/django" => RepoSpec {
            test_cmd: django_command(version),
            parser: LogParser::Django,
            directives: Directives::DjangoModules,
            safe_path: false,
        },
        "matplotlib/matplotlib" => files(PYTEST, LogParser::Matplotlib),
        "mwaskom/seaborn" => files(SEABORN, LogParser::Seaborn),
        "psf/requests" | "pylint-dev/pylint" | "pydicom/pydicom" => {
            files(PYTEST, LogParser::PytestOptions)
        }
        "scikit-learn/scikit-learn" => files(PYTEST, LogParser::PytestV2),
        "sphinx-doc/sphinx" => files(SPHINX, LogParser::PytestV2),
        // bin/test imports its neighbour bin/get_sympy.py.
        "sympy/sympy" => RepoSpec {
            safe_path: false,
            ..files(SYMPY, LogParser::Sympy)
        },
        "pallets/flask"
        | "pydata/xarray"
        | "pytest-dev/pytest"
        | "pylint-dev/astroid"
        | "marshmallow-code/marshmallow"
        | "pvlib/pvlib-python"
        | "pyvista/pyvista"
        | "sqlfluff/sqlfluff" => files(PYTEST, LogParser::Pytest),
        _ => return None,
    })
}

fn django_command(version: &str) -> String {
    let old = ["1.7", "1.8", "1.9", "1.10", "1.11", "2.0", "2.1", "2.2"];
    let runner = if version == "1.9" {
        DJANGO_NO_PARALLEL
    } else {
        DJANGO
    };
    if old.contains(&version) {
        format!("{DJANGO_ENV_OLD}; {runner}")
    } else if ["3.0", "3.1", "3.2"].contains(&version) {
        format!("{DJANGO_ENV_3}; {runner}")
    } else {
        runner.to_string()
    }
}

impl RepoSpec {
    /// The whole command: `test_cmd` then the test patch's directives, each shell-quoted.
    pub fn command(&self, test_patch: Option<&str>) -> String {
        with_directives(&self.test_cmd, test_patch, self.directives)
    }
}

/// `test_cmd` followed by the directives of `test_patch` (none without a patch).
pub fn with_directives(test_cmd: &str, test_patch: Option<&str>, style: Directives) -> String {
    let mut command = test_cmd.to_string();
    for directive in test_patch
        .map(|p| test_directives(p, style))
        .unwrap_or_default()
    {
        command.push(' ');
        command.push_str(&super::shell_quote(&directive));
    }
    command
}

/// The test patch's test files as `style` names them, in patch order, data files left out.
pub fn test_directives(test_patch: &str, style: Directives) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, b) in patch_paths(test_patch) {
        let Some(path) = b else { continue };
        if NON_TEST_EXTS.iter().any(|ext| path.ends_with(ext)) {
            continue;
        }
        let directive = match style {
            Directives::Files => path,
            Directives::DjangoModules => {
                let p = path.strip_suffix(".py").unwrap_or(&path);
                let p = p.strip_prefix("tests/").unwrap_or(p);
                p.replace('/', ".")
            }
        };
        if !out.contains(&directive) {
            out.push(directive);
        }
    }
    out
}

/// The `a/` and `b/` paths of each `diff --git a/X b/Y` header (a side missing when the
/// header does not have it).
pub fn patch_paths(patch: &str) -> Vec<(Option<String>, Option<String>)> {
    patch
        .lines()
        .filter_map(|l| l.strip_prefix("diff --git "))
        .map(|l| match l.rsplit_once(" b/") {
            Some((a, b)) => (
                a.strip_prefix("a/").map(str::to_string),
                Some(b.to_string()),
            ),
            None => (None, None),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DJANGO_PATCH: &str = "diff --git a/tests/forms_tests/tests/test_forms.py b/tests/forms_tests/tests/test_forms.py\n--- a/tests/forms_tests/tests/test_forms.py\n+++ b/tests/forms_tests/tests/test_forms.py\n@@ -1 +1 @@\n-x\n+y\ndiff --git a/tests/forms_tests/templates/x.json b/tests/forms_tests/templates/x.json\nnew file mode 100644\n--- /dev/null\n+++ b/tests/forms_tests/templates/x.json\n@@ -0,0 +1 @@\n+{}\ndiff --git a/tests/auth_tests/test_views.py b/tests/auth_tests/test_views.py\n";

    #[test]
    fn django_directives_are_dotted_modules_without_data_files() {
        let spec = spec_for("django/django", Some("4.0")).unwrap();
        assert_eq!(
            spec.command(Some(DJANGO_PATCH)),
            "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 'forms_tests.tests.test_forms' 'auth_tests.test_views'"
        );
        assert_eq!(spec.parser, LogParser::Django);
        assert!(!spec.safe_path);
        let old = spec_for("django/django", Some("1.9")).unwrap();
        assert!(old.test_cmd.starts_with("export LANG=en_US.UTF-8;"));
        assert!(old
            .test_cmd
            .ends_with("; ./tests/runtests.py --verbosity 2"));
        assert!(spec_for("django/django", Some("3.1"))
            .unwrap()
            .test_cmd
            .contains("locale-gen; export LANG"));
    }

    #[test]
    fn every_verified_repository_has_a_spec() {
        let patch =
            "diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py\n";
        let sympy = spec_for("sympy/sympy", Some("1.12")).unwrap();
        assert_eq!(
            sympy.command(Some(patch)),
            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose 'sympy/core/tests/test_basic.py'"
        );
        assert_eq!((sympy.parser, sympy.safe_path), (LogParser::Sympy, false));
        let want = [
            ("astropy/astropy", LogParser::PytestV2),
            ("django/django", LogParser::Django),
            ("matplotlib/matplotlib", LogParser::Matplotlib),
            ("mwaskom/seaborn", LogParser::Seaborn),
            ("pallets/flask", LogParser::Pytest),
            ("psf/requests", LogParser::PytestOptions),
            ("pydata/xarray", LogParser::Pytest),
            ("pylint-dev/pylint", LogParser::PytestOptions),
            ("pytest-dev/pytest", LogParser::Pytest),
            ("scikit-learn/scikit-learn", LogParser::PytestV2),
            ("sphinx-doc/sphinx", LogParser::PytestV2),
            ("sympy/sympy", LogParser::Sympy),
        ];
        for (repo, parser) in want {
            assert_eq!(spec_for(repo, None).unwrap().parser, parser, "{repo}");
        }
        assert_eq!(
            spec_for("sphinx-doc/sphinx", Some("7.2")).unwrap().test_cmd,
            "tox --current-env -epy39 -v --"
        );
        assert_eq!(
            spec_for("astropy/astropy", Some("1.3")).unwrap().test_cmd,
            ASTROPY_OLD_PYTEST
        );
        assert_eq!(
            spec_for("astropy/astropy", Some("5.0")).unwrap().test_cmd,
            PYTEST
        );
        assert_eq!(spec_for("someone/else", None), None);
    }

    #[test]
    fn patch_paths_read_both_sides() {
        let patch = "diff --git a/old name.py b/new name.py\nrename from old name.py\ndiff --git a/t/x.py b/t/x.py\n";
        assert_eq!(
            patch_paths(patch),
            vec![
                (Some("old name.py".into()), Some("new name.py".into())),
                (Some("t/x.py".into()), Some("t/x.py".into()))
            ]
        );
    }
}
