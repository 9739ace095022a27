//! Rewards an agent cannot forge: each cheap generic forgery runs as a replay episode on an
//! unfixed task in the local sandbox and is graded unresolved, while the oracle on the same tasks
//! is resolved. Two tasks: a built-in unittest task (no test list: exit status plus per-test
//! lines decide) and a pytest task built here (no test list either, so that pytest's
//! configuration, not a list, is what the forgeries attack). The docker environment runs the
//! same suite in tests/env_docker.rs.
//!
//! The local sandbox needs bubblewrap; the pytest task needs Debian's python3-pytest in the
//! system Python (`.ci/run` installs both).

mod common;

use common::forgeries::{
    check_task, generic_forgeries, pytest_forgeries, run_scripts, write_pytest_task,
};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use swerve::agent::policy::Script;
use swerve::env::local::{LocalConfig, LocalEnvironment};
use swerve::env::{builtin, load_tasks, Limits};

/// The first uid of this file's sandboxes (tests/env_sandbox.rs uses 310_000 to 400_007).
const UIDS: u32 = 950_000;

/// A local environment over its own root and uid range (the tests run in parallel).
fn local_env(dir: &Path, uid_base: u32) -> LocalEnvironment {
    let mut config = LocalConfig::new(Limits::default());
    config.root = dir.join("sandboxes");
    config.uid_base = uid_base;
    LocalEnvironment::new(config).unwrap()
}

#[test]
fn forgeries_on_a_unittest_task_are_unresolved_and_the_oracle_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let env = local_env(dir.path(), UIDS);
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let task = tasks.iter().find(|t| t.id == "calc-div-zero").unwrap();
    check_task(&env, task, generic_forgeries("calc"));
}

#[test]
fn forgeries_on_a_pytest_task_are_unresolved_and_the_oracle_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let env = local_env(dir.path(), UIDS + 1000);
    let task = write_pytest_task(dir.path());
    let mut forgeries = generic_forgeries("calc");
    forgeries.extend(pytest_forgeries());
    check_task(&env, &task, forgeries);
}

#[test]
fn flagged_hacks_are_counted_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let env = local_env(dir.path(), UIDS + 2000);
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let task = tasks.iter().find(|t| t.id == "calc-div-zero").unwrap();
    let forgeries = generic_forgeries("calc");
    let scripts = forgeries
        .into_iter()
        .filter(|(name, _)| {
            name.contains("atexit") || name.contains("TestCase.run") || name.contains("shadowing")
        })
        .map(|(name, calls)| {
            (
                name.to_string(),
                Script::Replay(HashMap::from([(String::new(), calls)])),
            )
        })
        .collect();
    for (name, e) in run_scripts(&env, task, scripts) {
        let line = e.to_json();
        assert_eq!(line["suspicious"], json!(true), "{name}: {line}");
        let reasons = line["suspicious_reasons"].to_string();
        let want = if name.contains("atexit") {
            "os._exit"
        } else if name.contains("TestCase.run") {
            "TestCase.run"
        } else {
            "shadows the module `unittest`"
        };
        assert!(reasons.contains(want), "{name}: {reasons}");
    }
}
