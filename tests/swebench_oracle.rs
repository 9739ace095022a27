//! SWE-bench's own harness as the oracle for swerve's table of repositories (issue 35): for
//! every Python repository and version in the pinned harness's specifications
//! (tests/requirements-swebench-nodeps.txt), what swerve runs (the test command, the exports
//! before it, the test directives of a test patch) must be what the eval script the harness
//! writes for a synthetic instance of that repository and version runs, except for the
//! departures listed here and in docs/grading.md.
//!
//! Needs Python 3 and the pinned harness, provisioned as tests/common/python.rs says (the
//! harness installed without its dependencies; tests/swebench_oracle.py stands in for the ones
//! writing an eval script never calls).

mod common;

use common::python::PythonEnv;
use serde_json::Value;
use std::process::Command;
use swerve::env::repos;

fn pinned_version() -> String {
    let text =
        std::fs::read_to_string(common::root().join("tests/requirements-swebench-nodeps.txt"))
            .unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("swebench=="))
        .expect("tests/requirements-swebench-nodeps.txt pins swebench")
        .to_string()
}

/// The harness's eval scripts, one JSON object per repository and version.
fn harness_rows() -> Vec<Value> {
    let version = pinned_version();
    let python = PythonEnv {
        venv: format!("swebench-{version}-venv"),
        requirements: &["requirements-swebench.txt"],
        no_deps: &["requirements-swebench-nodeps.txt"],
        check: format!(
            "import importlib.metadata as m, sys, unidiff; sys.exit(m.version('swebench') != {version:?})"
        ),
    }
    .python();
    let out = Command::new(&python)
        .arg(common::root().join("tests/swebench_oracle.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tests/swebench_oracle.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// What swerve deliberately runs otherwise than the harness, by repository (docs/grading.md,
/// "Departures from SWE-bench's harness"): none in the test command, its exports or its
/// directives.
const DEPARTURES: &[(&str, &str)] = &[];

#[test]
fn swerves_commands_are_the_harness_commands_for_every_repository_and_version() {
    let rows = harness_rows();
    assert!(
        rows.len() > 200,
        "the harness listed only {} repository versions",
        rows.len()
    );
    let mut differences = Vec::new();
    let mut repositories = std::collections::BTreeSet::new();
    for row in &rows {
        let repo = row["repo"].as_str().unwrap();
        let version = row["version"].as_str().unwrap();
        repositories.insert(repo.to_string());
        if DEPARTURES.iter().any(|(r, _)| *r == repo) {
            continue;
        }
        let at = format!("{repo} {version}");
        let Some(spec) = repos::spec_for(repo, Some(version)) else {
            differences.push(format!("{at}: not in swerve's table"));
            continue;
        };
        // The harness runs its exports as lines of the eval script, then the test command
        // with the directives; swerve joins them with `; `.
        let mut expected = strings(&row["eval_commands"]);
        expected.push(row["test_cmd"].as_str().unwrap().to_string());
        let expected = expected.join("; ");
        if spec.test_cmd != expected {
            differences.push(format!(
                "{at}: swerve runs `{}`, the harness `{expected}`",
                spec.test_cmd
            ));
        }
        let patch = row["test_patch"].as_str().unwrap();
        let directives = repos::test_directives(patch, spec.directives);
        let want = strings(&row["directives"]);
        if directives != want {
            differences.push(format!(
                "{at}: directives {directives:?}, the harness's {want:?}"
            ));
        }
        // The harness's eval script runs exactly its test command and directives.
        let line = format!("{} {}", row["test_cmd"].as_str().unwrap(), want.join(" "));
        assert_eq!(
            row["command"].as_str(),
            Some(line.trim_end()),
            "{at}: {}",
            row["script"]
        );
    }
    assert!(
        differences.is_empty(),
        "{} differences from SWE-bench's harness {}:\n{}",
        differences.len(),
        pinned_version(),
        differences.join("\n")
    );
    // Every repository of SWE-bench Verified is among those compared.
    for repo in [
        "astropy/astropy",
        "django/django",
        "matplotlib/matplotlib",
        "mwaskom/seaborn",
        "pallets/flask",
        "psf/requests",
        "pydata/xarray",
        "pylint-dev/pylint",
        "pytest-dev/pytest",
        "scikit-learn/scikit-learn",
        "sphinx-doc/sphinx",
        "sympy/sympy",
    ] {
        assert!(
            repositories.contains(repo),
            "{repo} is not in the harness's specifications"
        );
    }
}
