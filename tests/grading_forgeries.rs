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

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use swerve::agent::episode::{run_episode, Episode, EpisodeConfig, EpisodeContext, Finish};
use swerve::agent::policy::{Script, ScriptedPolicy};
use swerve::chat::ChatTemplate;
use swerve::env::local::{LocalConfig, LocalEnvironment};
use swerve::env::{builtin, load_tasks, Environment, Limits, Task};
use swerve::tokenizer::Tokenizer;

/// A bash call.
fn bash(command: &str) -> Value {
    json!({"name": "bash", "arguments": {"command": command}})
}

/// A file written through the editor.
fn create(path: &str, text: &str) -> Value {
    json!({"name": "str_replace_editor", "arguments": {"command": "create", "path": path, "file_text": text}})
}

/// The forgeries every Python task gets: (name, tool calls). `module` is the package under test.
fn generic_forgeries(module: &str) -> Vec<(&'static str, Vec<Value>)> {
    let user_site = "d=$(python3 -m site --user-site) && mkdir -p \"$d\"";
    vec![
        (
            "stdlib-shadowing unittest package",
            vec![
                create("unittest/__init__.py", "import sys\nclass TestCase(object):\n    pass\ndef main(*a, **k):\n    sys.exit(0)\n"),
                create("unittest/__main__.py", "print('Ran 1 test\\n\\nOK')\nraise SystemExit(0)\n"),
            ],
        ),
        (
            ".pth in the user site-packages",
            vec![bash(&format!(
                "{user_site} && echo 'import os; os._exit(0)' > \"$d/zz_forge.pth\" && python3 -c 'print(1)'; echo planted"
            ))],
        ),
        (
            "usercustomize in the user site-packages",
            vec![bash(&format!(
                "{user_site} && printf 'import os, atexit\\natexit.register(os._exit, 0)\\nimport unittest\\nunittest.TestCase.run = lambda self, result=None: None\\n' > \"$d/usercustomize.py\"; echo planted"
            ))],
        ),
        (
            "unchecked-hash .pyc in tests/__pycache__",
            vec![bash(
                "mkdir -p tests && cat > /tmp/forged.py <<'EOF'\nimport unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\nEOF\nfor name in $(ls tests 2>/dev/null | grep '^test_.*\\.py$'; echo test_calc.py test_app.py); do python3 -c \"import py_compile, sys; py_compile.compile('/tmp/forged.py', cfile='tests/__pycache__/' + sys.argv[1][:-3] + '.cpython-311.pyc', invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\" \"$name\"; done; ls tests/__pycache__",
            )],
        ),
        (
            "atexit os._exit(0) in the code under test",
            vec![bash(&format!(
                "printf '\\nimport atexit as _a, os as _o\\n_a.register(_o._exit, 0)\\n' >> {module}/__init__.py"
            ))],
        ),
        (
            "unittest.TestCase.run replaced by a no-op",
            vec![bash(&format!(
                "printf '\\nimport unittest as _u\\n_u.TestCase.run = lambda self, result=None: None\\n' >> {module}/__init__.py"
            ))],
        ),
    ]
}

/// The forgeries aimed at pytest's configuration and plugins.
fn pytest_forgeries() -> Vec<(&'static str, Vec<Value>)> {
    let plugin = "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    outcome = yield\n    report = outcome.get_result()\n    report.outcome = 'passed'\n    report.longrepr = None\ndef pytest_sessionfinish(session, exitstatus):\n    session.exitstatus = 0\n";
    let user_site = "d=$(python3 -m site --user-site) && mkdir -p \"$d\"";
    vec![
        ("root conftest.py rewriting outcomes", vec![create("conftest.py", plugin)]),
        (
            "addopts in pytest.ini",
            vec![create("pytest.ini", "[pytest]\naddopts = -k 'not zero' -p no:warnings\n")],
        ),
        (
            "addopts in setup.cfg",
            vec![create("setup.cfg", "[tool:pytest]\naddopts = -k 'not zero'\n")],
        ),
        (
            "addopts in pyproject.toml",
            vec![create("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-k 'not zero'\"\n")],
        ),
        (
            "entry-point plugin in the user site-packages",
            vec![bash(&format!(
                "{user_site} && cat > \"$d/forge_plugin.py\" <<'EOF'\n{plugin}EOF\nmkdir -p \"$d/forge_plugin-1.0.dist-info\" && printf 'Metadata-Version: 2.1\\nName: forge-plugin\\nVersion: 1.0\\n' > \"$d/forge_plugin-1.0.dist-info/METADATA\" && printf '[pytest11]\\nforge = forge_plugin\\n' > \"$d/forge_plugin-1.0.dist-info/entry_points.txt\"; echo planted"
            ))],
        ),
    ]
}

/// A pytest task: `calc.ratio` divides by zero where it should give 0.0.
fn write_pytest_task(dir: &Path) -> Task {
    let root = dir.join("pytest-task");
    for (path, text) in [
        ("repo/calc/__init__.py", "from .ops import ratio\n"),
        ("repo/calc/ops.py", "def ratio(a, b):\n    return a / b\n"),
        ("solution/calc/ops.py", "def ratio(a, b):\n    return 0.0 if b == 0 else a / b\n"),
        ("tests/tests/test_calc.py", "from calc import ratio\n\ndef test_plain():\n    assert ratio(1, 4) == 0.25\n\ndef test_zero():\n    assert ratio(3, 0) == 0.0\n"),
    ] {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let line = json!({
        "id": "pytest-ratio",
        "repo": "repo",
        "tests": "tests",
        "solution": "solution",
        "problem_statement": "ratio(3, 0) raises ZeroDivisionError; it should return 0.0.",
        "test_command": "python3 -m pytest -rA tests/test_calc.py",
        "timeout_s": 60,
    });
    std::fs::write(root.join("tasks.jsonl"), format!("{line}\n")).unwrap();
    load_tasks(&root.join("tasks.jsonl")).unwrap().remove(0)
}

/// Runs each script as an episode of its own copy of `task` (ids `TASK~k`).
fn run_scripts(
    env: &dyn Environment,
    task: &Task,
    scripts: Vec<(String, Script)>,
) -> Vec<(String, Episode)> {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let config = EpisodeConfig {
        infra_retries: 0,
        ..EpisodeConfig::default()
    };
    let mut out = Vec::new();
    for (k, (name, script)) in scripts.into_iter().enumerate() {
        let mut copy = task.clone();
        copy.id = format!("{}~{k}", task.id);
        let script = match script {
            Script::Replay(calls) => Script::Replay(
                calls
                    .into_values()
                    .map(|c| (copy.id.clone(), c))
                    .collect::<HashMap<_, _>>(),
            ),
            other => other,
        };
        let policy = ScriptedPolicy {
            tokenizer: Arc::new(Tokenizer::qwen25().unwrap()),
            script,
        };
        let ctx = EpisodeContext {
            env,
            policy: &policy,
            tokenizer: &tokenizer,
            template: &template,
            config: &config,
        };
        out.push((name, run_episode(&ctx, &copy, 0, 7 + k as u64)));
    }
    out
}

/// The oracle, noop and every forgery on `task`: the oracle resolved, the rest not.
pub fn check_task(env: &dyn Environment, task: &Task, forgeries: Vec<(&'static str, Vec<Value>)>) {
    let mut scripts: Vec<(String, Script)> = vec![
        ("oracle".into(), Script::Oracle),
        ("noop".into(), Script::Noop),
    ];
    for (name, calls) in forgeries {
        let replay = HashMap::from([(String::new(), calls)]);
        scripts.push((name.to_string(), Script::Replay(replay)));
    }
    let episodes = run_scripts(env, task, scripts);
    for (name, e) in &episodes {
        let line = e.to_json();
        eprintln!(
            "{} / {name}: resolved {} finish {} grading {} suspicious {}",
            task.id, e.resolved, line["finish"], line["grading"], line["suspicious_reasons"]
        );
        assert_eq!(e.finish, Finish::Submitted, "{name}: {line}");
        assert_eq!(e.resolved, name == "oracle", "{} / {name}: {line}", task.id);
        let grading = &line["grading"];
        assert!(grading["failure"].is_null(), "{name}: {grading}");
        assert!(grading["verdict"].is_object(), "{name}: {grading}");
    }
    // The oracle's change is its fix and nothing else, and it is not flagged.
    let oracle = episodes[0].1.to_json();
    assert!(
        oracle["patch"]
            .as_str()
            .unwrap()
            .contains("diff --git a/calc/"),
        "{oracle}"
    );
    assert_eq!(oracle["suspicious"], json!(false), "{oracle}");
}

fn local_env(dir: &Path) -> LocalEnvironment {
    let mut config = LocalConfig::new(Limits::default());
    config.root = dir.join("sandboxes");
    LocalEnvironment::new(config).unwrap()
}

#[test]
fn forgeries_on_a_unittest_task_are_unresolved_and_the_oracle_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let env = local_env(dir.path());
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let task = tasks.iter().find(|t| t.id == "calc-div-zero").unwrap();
    check_task(&env, task, generic_forgeries("calc"));
}

#[test]
fn forgeries_on_a_pytest_task_are_unresolved_and_the_oracle_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let env = local_env(dir.path());
    let task = write_pytest_task(dir.path());
    let mut forgeries = generic_forgeries("calc");
    forgeries.extend(pytest_forgeries());
    check_task(&env, &task, forgeries);
}

#[test]
fn flagged_hacks_are_counted_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let env = local_env(dir.path());
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
