//! The runner's own record of its tests: the JSON lines the grader's pytest plugin
//! (`grader_pytest_plugin.py`) and unittest hook (`grader_sitecustomize.py`) append to a file
//! named fresh per grading, read back after the run in a command of their own.
//!
//! ```text
//!   {"run": "PID-N", "ev": "start"}                 a test run began (a pytest session, a
//!   {"run": "PID-N", "ev": "test", "id": ID,         unittest result's startTestRun)
//!    "desc": DOC, "status": passed|failed|...}
//!   {"run": "PID-N", "ev": "collect-error", "id": ID}
//!   {"run": "PID-N", "ev": "end", "exit": N}        the run finished (its session's exit status)
//!   {"run": "PID-N", "ev": "framework",             the test framework's modules or classes
//!    "changed": [NAME, ...]}                        changed mid-run (grader_check.py)
//! ```
//!
//! One grading may hold several runs: the test command's, and runs the tests start themselves
//! (Django's test-runner tests, pytest's `pytester`). The command's run is the first one that
//! ran a canary ([`super::canary`]), else the first that started.

use crate::env::logs::{self, LogParser, TestStatus};
use serde_json::Value;
use std::collections::BTreeMap;

/// One test run's record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    pub id: String,
    pub started: bool,
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
}

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
            "start" => run.started = true,
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
}
