//! The unittest-shaped parsers: Django's `runtests.py --verbosity 2` and `python -m unittest -v`
//! (one verbose shape), and sympy's `bin/test --verbose`.

use super::{record as merge_into, strip_ansi, TestStatus};
use std::collections::BTreeMap;

/// unittest's verbose result words (after ` ... `).
fn unittest_status(word: &str) -> Option<TestStatus> {
    let word = word.trim();
    Some(match word {
        "ok" | "OK" => TestStatus::Passed,
        "FAIL" => TestStatus::Failed,
        "ERROR" => TestStatus::Error,
        "expected failure" => TestStatus::XFail,
        // Not a pass (Python 3.11+ calls the run unsuccessful with one; older ones did not).
        "unexpected success" => TestStatus::XPass,
        _ if word == "skip" || word.starts_with("skipped") => TestStatus::Skipped,
        _ => return None,
    })
}

/// `name (dotted.path)`: the line unittest prints for a test whose docstring's first line
/// follows (on the next line, with the ` ... status`).
fn looks_like_test_id(line: &str) -> bool {
    let Some((name, rest)) = line.split_once(" (") else {
        return false;
    };
    let Some(path) = rest.strip_suffix(')') else {
        return false;
    };
    !name.is_empty()
        && !name.contains(char::is_whitespace)
        && !path.is_empty()
        && !path.contains(char::is_whitespace)
}

/// Django's and unittest's verbose runs. A test's output printed between its ` ... ` and its
/// status (a later line that is only `ok`, `FAIL`, ...) still counts; `FAIL: id` / `ERROR: id`
/// report headers mark `id` too; a docstring's first line and the test's own id both get the
/// status (SWE-bench's Django lists name such tests by the docstring line).
pub(super) fn parse(log: &str) -> BTreeMap<String, TestStatus> {
    let mut statuses = BTreeMap::new();
    // The test whose ` ... ` line carried no status yet, and the test-id line above it.
    let mut pending: Option<(String, Option<String>)> = None;
    let mut bare_id: Option<String> = None;
    for raw in log.lines() {
        let line = strip_ansi(raw);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // A Django test whose description spans lines (SWE-bench keeps this one by name).
        if line.contains("--version is equivalent to version") {
            merge_into(
                &mut statuses,
                "--version is equivalent to version".to_string(),
                TestStatus::Passed,
            );
        }
        if let Some(rest) = line
            .strip_prefix("FAIL: ")
            .or_else(|| line.strip_prefix("ERROR: "))
        {
            let status = if line.starts_with("FAIL") {
                TestStatus::Failed
            } else {
                TestStatus::Error
            };
            merge_into(&mut statuses, rest.trim().to_string(), status);
            bare_id = None;
            continue;
        }
        let mut record = |test: String, doc_of: Option<String>, status: TestStatus| {
            if let Some(id) = doc_of {
                merge_into(&mut statuses, id, status);
            }
            merge_into(&mut statuses, test, status);
        };
        if let Some((test, rest)) = line.split_once(" ... ") {
            let doc_of = bare_id.take().filter(|_| !looks_like_test_id(test));
            let status_text = rest.rsplit(" ... ").next().unwrap_or(rest);
            match unittest_status(status_text) {
                Some(status) => {
                    record(test.to_string(), doc_of, status);
                    pending = None;
                }
                None => pending = Some((test.to_string(), doc_of)),
            }
            continue;
        }
        if let Some(test) = line.strip_suffix(" ...") {
            let doc_of = bare_id.take().filter(|_| !looks_like_test_id(test));
            pending = Some((test.to_string(), doc_of));
            continue;
        }
        if let Some(status) = unittest_status(line) {
            if let Some((test, doc_of)) = pending.take() {
                record(test, doc_of, status);
            }
            continue;
        }
        bare_id = looks_like_test_id(line).then(|| line.to_string());
    }
    statuses
}

/// sympy's `bin/test --verbose`: `test_name ok`, `F`, `E`, `f` (expected to fail), `X` (expected
/// to fail and passed: not a pass), `s`/`w` (skipped; slow), `T`
/// (timed out), `K` (interrupted), a skip's reason between name and letter. A failure's
/// `___ path.py:test_name ___` header marks `path.py:test_name` failed when the verbose line
/// did not report `test_name` (a run without `--verbose`). A file's closing `[OK]` / `[FAIL]`
/// on a test's line is left out.
pub(super) fn parse_sympy(log: &str) -> BTreeMap<String, TestStatus> {
    let mut statuses = BTreeMap::new();
    let mut headers = Vec::new();
    for raw in log.lines() {
        let line = strip_ansi(raw);
        let line = line.trim();
        if line.starts_with('_') {
            let inner = line.trim_matches('_').trim();
            if let Some((file, name)) = inner.rsplit_once(".py:") {
                if !name.is_empty() && !name.contains(char::is_whitespace) {
                    headers.push((format!("{file}.py:{name}"), name.to_string()));
                }
            }
            continue;
        }
        if !line.starts_with("test_") {
            continue;
        }
        // The file's `[OK]` / `[FAIL]` may end its last test's line.
        let words: Vec<&str> = line
            .split_whitespace()
            .filter(|w| !matches!(*w, "[OK]" | "[FAIL]"))
            .collect();
        let (Some(&name), Some(&last)) = (words.first(), words.last()) else {
            continue;
        };
        let status = match last {
            _ if name == last => continue,
            "ok" => TestStatus::Passed,
            "X" => TestStatus::XPass,
            "F" | "T" | "K" => TestStatus::Failed,
            "E" => TestStatus::Error,
            "f" => TestStatus::XFail,
            "s" | "w" => TestStatus::Skipped,
            _ => continue,
        };
        merge_into(&mut statuses, name.to_string(), status);
    }
    for (key, name) in headers {
        if !statuses.contains_key(&name) {
            merge_into(&mut statuses, key, TestStatus::Failed);
        }
    }
    statuses
}
