//! The runner's own record of its tests: the JSON lines the grader's pytest plugin
//! (`grader_pytest_plugin.py`) and unittest hook (`grader_sitecustomize.py`) append to a file
//! named fresh per grading, read back after the run in a command of their own.
//!
//! ```text
//!   {"run": "PID-N", "ev": "start"}                 a test run began (a pytest session, a
//!   {"run": "PID-N", "ev": "test", "id": ID,         unittest result's startTestRun)
//!    "desc": DOC, "status": passed|failed|...,
//!    "code": false, "wrappers": [..],               not its file's code; what wraps it
//!    "call": returned|raised|uncalled|...}          its own function's call, witnessed
//!   {"run": "PID-N", "ev": "collect-error", "id": ID}
//!   {"run": "PID-N", "ev": "end", "exit": N}        the run finished (its session's exit status)
//!   {"run": "PID-N", "ev": "framework",             the test framework's modules or classes
//!    "changed": [NAME, ...]}                        changed mid-run (grader_check.py)
//! ```
//!
//! One grading may hold several runs: the test command's, and runs the tests start themselves
//! (Django's test-runner tests, pytest's `pytester`). The command's run is the first one that
//! ran a canary ([`super::canary`]), else the first that started; it counts only as the
//! command's first process vouches for its lines ([`super::ledger`]).

use crate::env::logs::{self, LogParser, TestStatus};
use serde_json::Value;
use std::collections::BTreeMap;

/// One test run's record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    pub id: String,
    pub started: bool,
    /// Recorded by a process that another graded Python process started (the recorders'
    /// `"descendant"` on the start record): not the command's own.
    pub descendant: bool,
    pub finished: bool,
    /// Every test's status, ids canonical ([`logs::runner_id`]), reports of one id merged.
    pub statuses: BTreeMap<String, TestStatus>,
    /// Files or modules that did not collect (pytest).
    pub collect_errors: Vec<String>,
    /// Tests whose function, as run, is not what their file compiles to (the recorder's
    /// `"code": false`).
    pub code_changed: Vec<String>,
    /// Attributes of the test framework (its modules, their classes, pytest's registered
    /// plugins) that changed while the tests ran.
    pub framework_changed: Vec<String>,
    /// Tests recorded passed whose own function's call, witnessed from the inside, raised or
    /// never happened (the recorder's `"call"`): a failure forgiven on its way out.
    pub forgiven: Vec<String>,
    /// The wrappers around each test's function, outermost first, where it has any (the
    /// recorder's `"wrappers"`: decorators, or something put around the test at run time).
    pub wrappers: BTreeMap<String, Vec<String>>,
    /// Each class test's class and what it inherits from, as run (the recorder's `"bases"`:
    /// `module.Class@file` in method resolution order).
    pub bases: BTreeMap<String, Vec<String>>,
}

/// A record field that is absent (None) or a list of strings; anything else is an error.
fn string_list(value: &Value) -> Result<Option<Vec<String>>, ()> {
    match value {
        Value::Null => Ok(None),
        Value::Array(items) => items
            .iter()
            .map(|l| l.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or(()),
        _ => Err(()),
    }
}

/// How a test function's witnessed call ended (`grader_check.witness`); "unwitnessed": seen by
/// the recorder, not wrapped (a coroutine, a doctest).
const CALLS: [&str; 6] = [
    "returned",
    "raised",
    "deferred",
    "running",
    "uncalled",
    "unwitnessed",
];

/// The runs in `text`, in the order they first appear. A line that is not a record of this
/// shape makes the whole file untrustworthy: `Err` says which.
pub fn parse_runs(parser: LogParser, text: &str) -> Result<Vec<Run>, String> {
    let mut runs: Vec<Run> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || format!("line {}: not a grader record: {:.200}", n + 1, line);
        let value: Value = serde_json::from_str(line).map_err(|_| bad())?;
        let run_id = value["run"].as_str().ok_or_else(bad)?;
        let position = match runs.iter().position(|r| r.id == run_id) {
            Some(p) => p,
            None => {
                runs.push(Run {
                    id: run_id.to_string(),
                    ..Run::default()
                });
                runs.len() - 1
            }
        };
        let run = &mut runs[position];
        match value["ev"].as_str().ok_or_else(bad)? {
            "start" => {
                run.started = true;
                run.descendant |= value["descendant"] == Value::Bool(true);
            }
            "end" => run.finished = true,
            "collect-error" => run
                .collect_errors
                .push(value["id"].as_str().ok_or_else(bad)?.to_string()),
            "framework" => {
                for name in value["changed"].as_array().ok_or_else(bad)? {
                    let name = name.as_str().ok_or_else(bad)?.to_string();
                    if !run.framework_changed.contains(&name) {
                        run.framework_changed.push(name);
                    }
                }
            }
            "test" => {
                let id = value["id"].as_str().ok_or_else(bad)?;
                let status = value["status"]
                    .as_str()
                    .and_then(TestStatus::from_name)
                    .ok_or_else(bad)?;
                let canonical = logs::runner_id(parser, id);
                if value["code"] == Value::Bool(false) && !run.code_changed.contains(&canonical) {
                    run.code_changed.push(canonical.clone());
                }
                let call = match &value["call"] {
                    Value::Null => None,
                    Value::String(call) if CALLS.contains(&call.as_str()) => Some(call.as_str()),
                    _ => return Err(bad()),
                };
                if status == TestStatus::Passed
                    && matches!(
                        call,
                        Some("raised" | "uncalled" | "running" | "unwitnessed")
                    )
                    && !run.forgiven.contains(&canonical)
                {
                    run.forgiven.push(canonical.clone());
                }
                if let Some(links) = string_list(&value["wrappers"]).map_err(|_| bad())? {
                    run.wrappers.insert(canonical.clone(), links);
                }
                if let Some(classes) = string_list(&value["bases"]).map_err(|_| bad())? {
                    run.bases.insert(canonical.clone(), classes);
                }
                logs::record(&mut run.statuses, canonical, status);
                // Django's lists name a test with a docstring by the docstring's first line,
                // as its verbose log prints it (only Django's: elsewhere a docstring could claim
                // another test's id).
                if let Some(desc) = value["desc"]
                    .as_str()
                    .filter(|_| parser == LogParser::Django)
                {
                    let first = desc.lines().next().unwrap_or("").trim();
                    if !first.is_empty() {
                        logs::record(&mut run.statuses, first.to_string(), status);
                    }
                }
            }
            _ => return Err(bad()),
        }
    }
    Ok(runs)
}

/// The runner's record checked against the log: a test the log reports with another status
/// becomes [`TestStatus::Conflict`]; tests only the log reports are left out (anyone can print
/// a line).
pub fn cross_check(
    record: &BTreeMap<String, TestStatus>,
    log: &BTreeMap<String, TestStatus>,
) -> BTreeMap<String, TestStatus> {
    record
        .iter()
        .map(|(id, &status)| {
            let status = match log.get(id) {
                Some(&printed) if printed != status => TestStatus::Conflict,
                _ => status,
            };
            (id.clone(), status)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_split_merged_and_checked_against_the_log() {
        let text = r#"{"run": "1-0", "ev": "start"}
{"run": "1-0", "ev": "test", "id": "test_a (m.T.test_a)", "desc": null, "status": "passed"}
{"run": "2-0", "ev": "start"}
{"run": "2-0", "ev": "test", "id": "test_z (inner.T)", "status": "failed"}
{"run": "1-0", "ev": "test", "id": "test_b (m.T)", "desc": "Checks b.\nMore.", "status": "failed"}
{"run": "1-0", "ev": "test", "id": "test_c (m.T)", "status": "passed"}
{"run": "1-0", "ev": "test", "id": "test_c (m.T.test_c)", "status": "skipped"}
{"run": "1-0", "ev": "end"}
"#;
        let runs = parse_runs(LogParser::Django, text).unwrap();
        assert_eq!(runs.len(), 2);
        let main = &runs[0];
        assert!(main.started && main.finished && !runs[1].finished);
        assert_eq!(main.statuses["test_a (m.T)"], TestStatus::Passed);
        assert_eq!(main.statuses["Checks b."], TestStatus::Failed);
        assert_eq!(main.statuses["test_c (m.T)"], TestStatus::Conflict);
        assert!(!parse_runs(LogParser::Unittest, text).unwrap()[0]
            .statuses
            .contains_key("Checks b."));
        let log = logs::parse_log(
            LogParser::Unittest,
            "test_a (m.T) ... FAIL\ntest_b (m.T) ... FAIL\nforged (m.T) ... ok\n",
        );
        let checked = cross_check(&main.statuses, &log);
        assert_eq!(checked["test_a (m.T)"], TestStatus::Conflict);
        assert_eq!(checked["test_b (m.T)"], TestStatus::Failed);
        assert!(!checked.contains_key("forged (m.T)"));
        assert!(parse_runs(
            LogParser::Unittest,
            "{\"run\": \"1\", \"ev\": \"test\", \"id\": \"x\", \"status\": \"great\"}\n"
        )
        .is_err());
        assert!(parse_runs(LogParser::Unittest, "ok\n").is_err());
    }

    #[test]
    fn witnessed_calls_and_wrappers_are_read() {
        let text = r#"{"run": "1", "ev": "start"}
{"run": "1", "ev": "test", "id": "t.py::a", "status": "passed", "call": "returned"}
{"run": "1", "ev": "test", "id": "t.py::b", "status": "passed", "call": "raised"}
{"run": "1", "ev": "test", "id": "t.py::c", "status": "failed", "call": "raised"}
{"run": "1", "ev": "test", "id": "t.py::d", "status": "passed", "call": "uncalled", "wrappers": ["calc/ops.py:run"]}
{"run": "1", "ev": "test", "id": "t.py::e", "status": "passed", "call": "deferred"}
{"run": "1", "ev": "test", "id": "t.py::f", "status": "passed", "call": "running"}
{"run": "1", "ev": "test", "id": "t.py::K::g", "status": "passed", "bases": ["t.K@t.py", "builtins.object"]}
"#;
        let run = &parse_runs(LogParser::Pytest, text).unwrap()[0];
        assert_eq!(run.forgiven, vec!["t.py::b", "t.py::d", "t.py::f"]);
        assert_eq!(run.wrappers.len(), 1);
        assert_eq!(run.wrappers["t.py::d"], vec!["calc/ops.py:run"]);
        assert_eq!(run.bases["t.py::K::g"], vec!["t.K@t.py", "builtins.object"]);
        for bad in [
            r#"{"run": "1", "ev": "test", "id": "x", "status": "passed", "call": "fine"}"#,
            r#"{"run": "1", "ev": "test", "id": "x", "status": "passed", "call": 1}"#,
            r#"{"run": "1", "ev": "test", "id": "x", "status": "passed", "wrappers": "a"}"#,
            r#"{"run": "1", "ev": "test", "id": "x", "status": "passed", "wrappers": [1]}"#,
            r#"{"run": "1", "ev": "test", "id": "x", "status": "passed", "bases": "t.K"}"#,
        ] {
            assert!(parse_runs(LogParser::Pytest, bad).is_err(), "{bad}");
        }
    }
}
