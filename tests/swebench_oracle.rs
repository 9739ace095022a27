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

use common::swebench::{harness_python_of, oracle_lines, pinned_in, HARNESS, HARNESS_5};
use serde_json::Value;
use std::process::Command;
use swerve::env::logs::{self, LogParser, TestStatus};
use swerve::env::repos;

fn pinned_version() -> String {
    pinned_in(HARNESS[0])
}

/// An interpreter with the pinned harness (installed without its dependencies).
fn harness_python() -> std::path::PathBuf {
    harness_python_of(HARNESS)
}

/// The harness's eval scripts, one JSON object per repository and version.
fn harness_rows() -> Vec<Value> {
    let out = Command::new(harness_python())
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
    differences.extend(install_differences(&rows));
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

/// How an install command of the harness's leaves the package: `Some(true)` a copy in
/// site-packages (`python setup.py install`, `pip install .`), `Some(false)` the tree itself
/// (`pip install -e`, `setup.py develop`), None a form grading does not stand in for.
fn installs_a_copy(command: &str) -> Option<bool> {
    let mut copy = false;
    for part in command
        .split([';', '&'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let words: Vec<&str> = part.split_whitespace().collect();
        let pip = words.windows(2).any(|w| w == ["pip", "install"]);
        if pip && words.iter().any(|w| *w == "-e" || *w == "--editable") {
            continue;
        }
        if part.ends_with("setup.py develop") || part.ends_with("setup.py build") {
            continue;
        }
        if part.ends_with("setup.py install") || pip && words.last() == Some(&".") {
            copy = true;
            continue;
        }
        return None;
    }
    Some(copy)
}

/// The harness re-runs each specification's install after the patch; grading stands in for it
/// (`src/env/grading/installed.rs`): nothing to do where the install is editable, the change
/// carried into the copy where it copies. Every install is one of the two, and those that copy
/// are the repositories docs/grading.md names.
fn install_differences(rows: &[Value]) -> Vec<String> {
    const COPYING: &[&str] = &["django/django", "matplotlib/matplotlib", "psf/requests"];
    let mut out = Vec::new();
    for row in rows {
        let repo = row["repo"].as_str().unwrap();
        let at = format!("{repo} {}", row["version"].as_str().unwrap());
        let Some(install) = row["install"].as_str() else {
            continue;
        };
        match installs_a_copy(install) {
            None => out.push(format!(
                "{at}: an install grading does not stand in for: `{install}`"
            )),
            Some(true) if !COPYING.contains(&repo) => out.push(format!(
                "{at}: installs a copy (`{install}`), not listed in docs/grading.md"
            )),
            _ => {}
        }
    }
    let copying = |repo: &str, version: &str| {
        rows.iter()
            .find(|r| r["repo"] == repo && r["version"] == version)
            .and_then(|r| installs_a_copy(r["install"].as_str()?))
    };
    // The forms the departures table names, as the harness has them.
    for (repo, version, copy) in [
        ("django/django", "2.2", true),
        ("django/django", "3.0", false),
        ("matplotlib/matplotlib", "2.2", true),
        ("psf/requests", "2.0", true),
        ("scikit-learn/scikit-learn", "1.3", false),
    ] {
        if copying(repo, version) != Some(copy) {
            out.push(format!(
                "{repo} {version}: expected an install that copies: {copy}"
            ));
        }
    }
    out
}

/// Logs shaped as each runner prints them: pytest's `-rA` summary (parametrised ids, a path
/// option, a class, every status, a skip's `[N]` location), the same in colour and in the older
/// `id STATUS` form, Django's verbose runner (a docstring's line, output between a test and its
/// `ok`, every outcome), sympy's runner (every letter it prints).
const PYTEST_LOG: &str =
    "============================= test session starts ==============================
platform linux -- Python 3.9.20, pytest-7.4.4, pluggy-1.5.0
rootdir: /testbed
collected 10 items

tests/test_a.py ..F.sxX.E.                                                [100%]

=================================== FAILURES ===================================
___________________________________ test_two ___________________________________

    def test_two():
>       assert 1 == 2
E       assert 1 == 2

tests/test_a.py:5: AssertionError
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_param[1-2]
PASSED tests/test_a.py::test_path[/tmp/work/data.txt]
PASSED tests/test_a.py::TestKind::test_method
PASSED tests/test_a.py::test_button[MouseButton.LEFT]
FAILED tests/test_a.py::test_two - assert 1 == 2
SKIPPED [1] tests/test_a.py:12: no network
XFAIL tests/test_a.py::test_xf - reason: known
XPASS tests/test_a.py::test_xp
ERROR tests/test_a.py::test_e - RuntimeError: boom
============ 1 failed, 5 passed, 1 skipped, 1 xfailed, 1 xpassed, 1 error in 0.12s =============
";

const PYTEST_OLD_LOG: &str = "tests/test_b.py::test_one PASSED
tests/test_b.py::test_two FAILED
tests/test_b.py::test_three SKIPPED
tests/test_b.py::test_four ERROR
";

const DJANGO_LOG: &str =
    "Testing against Django installed in '/testbed/django' with up to 1 processes
test_a (forms_tests.tests.test_forms.FormsTestCase) ... ok
test_b (forms_tests.tests.test_forms.FormsTestCase) ... FAIL
test_c (forms_tests.tests.test_forms.FormsTestCase) ... ERROR
test_d (forms_tests.tests.test_forms.FormsTestCase) ... skipped 'no database'
test_e (forms_tests.tests.test_forms.FormsTestCase) ... expected failure
test_f (forms_tests.tests.test_forms.FormsTestCase) ... unexpected success
test_g (forms_tests.tests.test_forms.FormsTestCase)
A docstring's first line. ... ok
test_h (forms_tests.tests.test_forms.FormsTestCase) ... printed by the test
ok

======================================================================
FAIL: test_b (forms_tests.tests.test_forms.FormsTestCase)
----------------------------------------------------------------------
Traceback (most recent call last):
AssertionError: 1 != 2

----------------------------------------------------------------------
Ran 8 tests in 0.012s

FAILED (failures=1, errors=1, skipped=1, expected failures=1, unexpected successes=1)
";

const SYMPY_LOG: &str = "============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.20-final-0) [CPython]

sympy/core/tests/test_basic.py[6] 
test_a ok
test_b F
test_c E
test_d f
test_e X
test_f s
                                                                          [FAIL]

________________________________________________________________________________
_____________ sympy/core/tests/test_basic.py:test_b _____________
Traceback (most recent call last):
AssertionError

============= tests finished: 1 passed, 1 failed, 1 skipped, 1 expected to fail, 1 expected to fail but passed, 1 exceptions, in 0.10 seconds =============
DO *NOT* COMMIT!
";

/// Where swerve reads a log otherwise than the harness, on purpose (docs/grading.md,
/// "Departures from SWE-bench's harness"), as (what the harness says, what swerve says, why).
fn parse_departure(harness: Option<&str>, swerve: Option<TestStatus>) -> Option<&'static str> {
    match (harness, swerve) {
        // pytest's XPASS and unittest's unexpected success: the harness drops the line (no
        // status of its own), swerve keeps it as XPASS; neither is a pass.
        (None, Some(TestStatus::XPass)) => Some("an unexpected pass is XPASS, not absent"),
        // Django's expected failure: the harness drops it, swerve keeps it as XFAIL (a listed
        // test matches it only where the reference run shows it).
        (None, Some(TestStatus::XFail)) => Some("an expected failure is XFAIL, not absent"),
        // sympy's `f`/`X`/`s`: no status in the harness; swerve reads them as XFAIL, XPASS and
        // skipped, none a pass.
        (None, Some(TestStatus::Skipped)) => Some("a skip is kept as skipped"),
        // seaborn's parser reads only PASSED and FAILED lines; swerve keeps an ERROR.
        (None, Some(TestStatus::Error)) => Some("an error is kept as an error"),
        _ => None,
    }
}

/// Words the harness takes for test ids that name no test (a failure's header, a count):
/// pytest's skip summary (`SKIPPED [1] tests/test_a.py:12: reason`), the first word of Django's
/// `FAIL: test_b (module.Class)` header (the test is read, whole, from its own line), and
/// sympy's traceback header `sympy/core/tests/test_basic.py:test_b` (the test is read from its
/// own `test_b F` line).
fn not_an_id(parser: LogParser, id: &str) -> bool {
    match parser {
        LogParser::Django => !id.contains(' '),
        LogParser::Sympy => id.contains(".py:"),
        _ => id.starts_with('['),
    }
}

fn harness_name(status: TestStatus) -> Option<&'static str> {
    Some(match status {
        TestStatus::Passed => "PASSED",
        TestStatus::Failed => "FAILED",
        TestStatus::Error => "ERROR",
        TestStatus::Skipped => "SKIPPED",
        TestStatus::XFail => "XFAIL",
        _ => return None,
    })
}

/// Every repository the harness parses, each with the logs its runner prints.
fn shaped_logs() -> Vec<(&'static str, String)> {
    let coloured = PYTEST_LOG
        .replace("PASSED ", "\x1b[32mPASSED\x1b[0m ")
        .replace("FAILED ", "\x1b[31mFAILED\x1b[0m ");
    let mut cases: Vec<(&str, String)> = Vec::new();
    for repo in [
        "astropy/astropy",
        "marshmallow-code/marshmallow",
        "matplotlib/matplotlib",
        "mwaskom/seaborn",
        "pallets/flask",
        "psf/requests",
        "pvlib/pvlib-python",
        "pydata/xarray",
        "pydicom/pydicom",
        "pylint-dev/astroid",
        "pylint-dev/pylint",
        "pytest-dev/pytest",
        "pyvista/pyvista",
        "scikit-learn/scikit-learn",
        "sphinx-doc/sphinx",
        "sqlfluff/sqlfluff",
    ] {
        cases.push((repo, PYTEST_LOG.to_string()));
        // Colour and the older verbose form: the runs whose parser is the harness's
        // `pytest_v2` (tox, `-vv`).
        if repos::spec_for(repo, None).unwrap().parser == LogParser::PytestV2 {
            cases.push((repo, PYTEST_OLD_LOG.to_string()));
            cases.push((repo, coloured.clone()));
        }
    }
    cases.push(("django/django", DJANGO_LOG.to_string()));
    cases.push(("sympy/sympy", SYMPY_LOG.to_string()));
    cases
}

/// The harness's own parser's reading of each case: {id: status} per case.
fn harness_readings(cases: &[(&str, String)]) -> Vec<Value> {
    let input: Vec<Value> = cases
        .iter()
        .map(|(repo, log)| serde_json::json!({"repo": repo, "log": log}))
        .collect();
    oracle_lines(&harness_python(), "parse", &input)
}

/// `tests/swebench_oracle.py MODE` run by `python` on `input` as JSON lines: one JSON value
/// read back per line in.

#[test]
fn swerves_log_parsers_read_shaped_logs_as_the_harness_parsers_do() {
    let cases = shaped_logs();
    let readings = harness_readings(&cases);
    let mut differences = Vec::new();
    for ((repo, log), reading) in cases.iter().zip(&readings) {
        let spec = repos::spec_for(repo, None).unwrap();
        let ours = logs::parse_log(spec.parser, log);
        let theirs = reading["statuses"].as_object().unwrap();
        let mut ids: Vec<String> = theirs.keys().cloned().collect();
        ids.extend(ours.keys().cloned());
        for id in ids {
            if not_an_id(spec.parser, &id) {
                continue;
            }
            let harness = theirs.get(&id).and_then(Value::as_str).or_else(|| {
                theirs
                    .iter()
                    .find(|(k, _)| logs::canonical_id(k) == logs::canonical_id(&id))
                    .and_then(|(_, v)| v.as_str())
            });
            let swerve = logs::lookup(&ours, &id);
            if harness == swerve.and_then(harness_name)
                || parse_departure(harness, swerve).is_some()
            {
                continue;
            }
            // Django's test with a docstring: its line names the test, the next the docstring's
            // first line and the outcome; the harness reads the docstring only, swerve both (a
            // list may name it either way).
            let docstring = spec.parser == LogParser::Django && log.lines().any(|l| l.trim() == id);
            if harness.is_none() && docstring {
                continue;
            }
            let line = format!(
                "{repo} ({}): {id}: harness {harness:?}, swerve {swerve:?}",
                spec.parser
            );
            if !differences.contains(&line) {
                differences.push(line);
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{} readings differ from SWE-bench's harness {}:\n{}",
        differences.len(),
        pinned_version(),
        differences.join("\n")
    );
}

/// `--swebench-rules 4|5` against each harness version's own grading functions (4.1.0 and
/// 5.0.2): one FAIL_TO_PASS and one PASS_TO_PASS test in every status the harness reads, or
/// missing. Where the reference fix's run shows the same statuses, swerve's verdict is the
/// harness's for every pair; where the reference passes both, swerve never resolves what the
/// harness does not, and differs only where a skip or an XFAIL is involved (the code under test
/// can raise them itself: docs/grading.md's departures).
#[test]
fn skip_and_xfail_rules_are_each_harness_versions_own() {
    use swerve::env::grading::{decide, Observation, Reference};
    use swerve::env::task::{HarnessRules, TestPlan};
    let statuses = [
        Some("PASSED"),
        Some("FAILED"),
        Some("ERROR"),
        Some("SKIPPED"),
        Some("XFAIL"),
        None,
    ];
    let pairs: Vec<(Option<&str>, Option<&str>)> = statuses
        .iter()
        .flat_map(|&a| statuses.iter().map(move |&b| (a, b)))
        .collect();
    let (x, y) = ("t.py::test_x", "t.py::test_y");
    for (rules, harness) in [(HarnessRules::V4, HARNESS), (HarnessRules::V5, HARNESS_5)] {
        let cases: Vec<Value> = pairs
            .iter()
            .map(|(a, b)| {
                let mut map = serde_json::Map::new();
                for (id, status) in [(x, a), (y, b)] {
                    if let Some(status) = status {
                        map.insert(id.to_string(), Value::from(*status));
                    }
                }
                serde_json::json!({"f2p": [x], "p2p": [y], "statuses": map})
            })
            .collect();
        let harness_says: Vec<bool> = oracle_lines(&harness_python_of(harness), "rules", &cases)
            .iter()
            .map(|v| v["resolved"] == Value::Bool(true))
            .collect();
        let plan = TestPlan {
            overlay: None,
            test_patch: None,
            base_commit: None,
            command: "pytest -rA".into(),
            parser: LogParser::Pytest,
            fail_to_pass: vec![x.into()],
            pass_to_pass: vec![y.into()],
            safe_path: true,
            rules,
        };
        let observe = |log: &str| Observation::from_log(LogParser::Pytest, log, Some(1));
        let passing = Reference {
            observation: observe(&format!("PASSED {x}\nPASSED {y}\n")),
            is_fix: true,
        };
        for ((a, b), harness_resolved) in pairs.iter().zip(harness_says) {
            let log: String = [(x, a), (y, b)]
                .iter()
                .filter_map(|(id, s)| s.map(|s| format!("{s} {id}\n")))
                .collect();
            let observed = observe(&log);
            let same = Reference {
                observation: observed.clone(),
                is_fix: true,
            };
            let at = format!("--swebench-rules {rules}, FAIL_TO_PASS {a:?}, PASS_TO_PASS {b:?}");
            let with_same = decide(&plan, &observed, Some(&same)).verdict.resolved;
            assert_eq!(with_same, harness_resolved, "{at}, the reference the same");
            let with_passing = decide(&plan, &observed, Some(&passing)).verdict.resolved;
            assert!(
                !with_passing || harness_resolved,
                "{at}: more lenient than the harness"
            );
            let departs = [a, b]
                .iter()
                .any(|s| matches!(s, Some("SKIPPED" | "XFAIL")));
            assert!(with_passing == harness_resolved || departs, "{at}");
        }
    }
}
