//! The forgery suite shared by tests/grading_forgeries.rs (local sandbox) and
//! tests/env_docker.rs (containers): cheap generic ways to turn an unfixed task green, each
//! run as a replay episode, and the check that grading calls every one unresolved while the
//! oracle on the same task is resolved.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use swerve::agent::episode::{run_episode, Episode, EpisodeConfig, EpisodeContext, Finish};
use swerve::agent::policy::{Script, ScriptedPolicy};
use swerve::chat::ChatTemplate;
use swerve::env::{load_tasks, Environment, Task};
use swerve::tokenizer::Tokenizer;

/// A bash call.
pub fn bash(command: &str) -> Value {
    json!({"name": "bash", "arguments": {"command": command}})
}

/// A file written through the editor.
pub fn create(path: &str, text: &str) -> Value {
    json!({"name": "str_replace_editor", "arguments": {"command": "create", "path": path, "file_text": text}})
}

/// The forgeries every Python task gets: (name, tool calls). `module` is the package under test.
pub fn generic_forgeries(module: &str) -> Vec<(&'static str, Vec<Value>)> {
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
pub fn pytest_forgeries() -> Vec<(&'static str, Vec<Value>)> {
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
pub fn write_pytest_task(dir: &Path) -> Task {
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
pub fn run_scripts(
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
