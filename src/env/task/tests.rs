//! Task-file parsing: swerve's format and each SWE-bench-family dataset's line shape.

use super::*;
use crate::env::grading::{decide, Observation, Reference};
use crate::env::repos::patch_paths;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The one task of `text` (a task file's contents).
fn one(text: &str) -> Task {
    let dir = tempfile::tempdir().unwrap();
    let mut tasks = load_tasks(&write(dir.path(), "tasks.jsonl", text)).unwrap();
    assert_eq!(tasks.len(), 1);
    tasks.remove(0)
}

fn plan(task: &Task) -> &TestPlan {
    match &task.grading {
        Grading::Tests(plan) => plan,
        other => panic!("not graded by tests: {other:?}"),
    }
}

#[test]
fn native_lines_resolve_paths_and_defaults() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["t/repo", "t/tests/tests", "t/solution"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    std::fs::write(dir.path().join("t/tests/tests/test_a.py"), "").unwrap();
    let path = write(
        dir.path(),
        "tasks.jsonl",
        r#"{"id": "t", "repo": "t/repo", "tests": "t/tests", "problem_statement": "fix", "test_command": "python3 -m unittest -v tests.test_a", "solution": "t/solution", "setup": ["echo hi"]}
{"id": "u", "repo": "t/repo", "tests": "t/tests", "problem_statement": "fix", "test_command": "bash run.sh", "log_parser": "pytest", "FAIL_TO_PASS": ["t.py::test_a"], "activate": ". v/bin/activate"}"#,
    );
    let tasks = load_tasks(&path).unwrap();
    assert_eq!(tasks[0].repo, RepoSource::Folder(dir.path().join("t/repo")));
    assert_eq!(tasks[0].solution, Some(dir.path().join("t/solution")));
    assert_eq!(tasks[0].setup, vec!["echo hi".to_string()]);
    assert_eq!(tasks[0].timeout_s, DEFAULT_TIMEOUT_S);
    assert_eq!(tasks[0].activate, None);
    let p = plan(&tasks[0]);
    assert_eq!(p.command, "python3 -m unittest -v tests.test_a");
    assert_eq!(p.parser, LogParser::Unittest);
    assert!(
        p.safe_path,
        "python -m: the grader adds the workdir after site-packages"
    );
    assert_eq!(p.overlay, Some(dir.path().join("t/tests")));
    assert_eq!(
        p.owned_paths().unwrap(),
        vec!["tests/test_a.py".to_string()]
    );
    let p = plan(&tasks[1]);
    assert_eq!((p.parser, p.safe_path), (LogParser::Pytest, true));
    assert_eq!(p.fail_to_pass, vec!["t.py::test_a".to_string()]);
    assert_eq!(tasks[1].activate.as_deref(), Some(". v/bin/activate"));
}

#[test]
fn errors_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("r")).unwrap();
    let ok = r#""id": "a", "repo": "r", "tests": "r", "problem_statement": "p""#;
    let swe = r#""instance_id": "x__y-1", "problem_statement": "p", "test_patch": "diff", "repo": "pallets/flask""#;
    let cases = [
        (r#"{"id": "a", "repo": "r", "tests": "missing", "problem_statement": "p", "test_command": "pytest"}"#.to_string(), ":1: tests: "),
        (r#"{"id": "a", "repo": "r", "tests": "r", "problem_statement": 3, "test_command": "pytest"}"#.to_string(), ":1: problem_statement: expected a string"),
        (format!(r#"{{{ok}, "test_command": "pytest", "timeout_s": 0}}"#), ":1: timeout_s:"),
        (format!(r#"{{{ok}, "test_command": "pytest", "tset": 1}}"#), ":1: tset: unknown field"),
        (format!(r#"{{{ok}, "test_command": "make check"}}"#), ":1: log_parser: missing"),
        (format!(r#"{{{ok}, "test_command": "pytest", "log_parser": "nose"}}"#), ":1: log_parser: unknown log parser \"nose\""),
        (format!(r#"{{{ok}, "test_command": "pytest", "FAIL_TO_PASS": "x"}}"#), ":1: FAIL_TO_PASS: a string that is not a JSON list"),
        (r#"{"id": "a b", "repo": "r", "tests": "r", "problem_statement": "p", "test_command": "pytest"}"#.to_string(), ":1: id:"),
        (format!("{{{ok}, \"test_command\": \"pytest\"}}\n{{{ok}, \"test_command\": \"pytest\"}}"), ":2: id: \"a\" is used"),
        (format!(r#"{{{swe}, "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]"}}"#), ":1: FAIL_TO_PASS: no tests"),
        (format!(r#"{{{swe}, "FAIL_TO_PASS": "[1]", "PASS_TO_PASS": "[]"}}"#), ":1: FAIL_TO_PASS[0]: expected a string"),
        (r#"{"instance_id": "o__r-1", "repo": "o/r", "problem_statement": "p", "test_patch": "diff", "FAIL_TO_PASS": ["t"]}"#.to_string(), ":1: repo: \"o/r\" is not in swerve's table"),
        (r#"{"instance_id": "o__r-1", "repo": "o/r", "problem_statement": "p", "FAIL_TO_PASS": ["t"]}"#.to_string(), ":1: test_patch: missing"),
        (r#"{"instance_id": "o__r-1", "repo": "o/r", "problem_statement": "p", "test_patch": "d", "FAIL_TO_PASS": ["t"], "install_config": {"test_cmd": "pytest", "log_parser": "parse_log_nose"}}"#.to_string(), ":1: install_config.log_parser: unknown log parser"),
        (r#"{"instance_id": "o__r.1234abcd.func_pm__x", "repo": "swesmith/o__r.1234abcd", "problem_statement": "p", "patch": "d", "FAIL_TO_PASS": ["t"]}"#.to_string(), ":1: image_name: missing"),
    ];
    for (text, want) in cases {
        let path = write(dir.path(), "bad.jsonl", &text);
        let err = format!("{:#}", load_tasks(&path).unwrap_err());
        assert!(err.contains(want), "{text}\n  gave: {err}\n  want: {want}");
        assert!(err.contains("bad.jsonl"), "{err}");
    }
}

/// A Django line of SWE-bench Verified's shape (lists as JSON text, a test patch with a
/// fixture that is no directive).
const DJANGO_VERIFIED: &str = r#"{"repo": "django/django", "instance_id": "django__django-11099", "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c", "patch": "diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py\n--- a/django/contrib/auth/validators.py\n+++ b/django/contrib/auth/validators.py\n@@ -7,7 +7,7 @@\n-    regex = r'^[\\w.@+-]+$'\n+    regex = r'^[\\w.@+-]+\\Z'\n", "test_patch": "diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n--- a/tests/auth_tests/test_validators.py\n+++ b/tests/auth_tests/test_validators.py\n@@ -1 +1 @@\n-x\n+y\ndiff --git a/tests/auth_tests/fixtures/users.json b/tests/auth_tests/fixtures/users.json\nnew file mode 100644\n--- /dev/null\n+++ b/tests/auth_tests/fixtures/users.json\n@@ -0,0 +1 @@\n+[]\n", "problem_statement": "UsernameValidator allows trailing newline in usernames", "hints_text": "", "created_at": "2019-03-20T03:46:18Z", "version": "3.0", "FAIL_TO_PASS": "[\"test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)\", \"test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)\"]", "PASS_TO_PASS": "[\"test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)\"]", "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27", "difficulty": "<15 min fix"}"#;

#[test]
fn swe_bench_verified_django_line_gets_its_runner() {
    let task = one(DJANGO_VERIFIED);
    assert_eq!(
        task.image.as_deref(),
        Some("swebench/sweb.eval.x86_64.django_1776_django-11099:latest")
    );
    assert_eq!(task.repo_name.as_deref(), Some("django/django"));
    assert_eq!(task.version.as_deref(), Some("3.0"));
    assert_eq!(
        task.environment_setup_commit.as_deref(),
        Some("419a78300f7cd27611196e1e464d50fd0385ff27")
    );
    assert_eq!(task.activate.as_deref(), Some(swe::CONDA_ACTIVATE));
    assert!(task
        .gold_patch
        .as_deref()
        .unwrap()
        .contains("validators.py"));
    let p = plan(&task);
    assert!(
        p.command.ends_with(
            "; ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 'auth_tests.test_validators'"
        ),
        "{}",
        p.command
    );
    assert_eq!(p.parser, LogParser::Django);
    assert!(!p.safe_path);
    assert_eq!(
        p.base_commit.as_deref(),
        Some("d26b2424437dabeeca94d7900b37d2df4410da0c")
    );
    assert_eq!(p.fail_to_pass.len(), 2);
    assert_eq!(p.pass_to_pass.len(), 1);
    assert_eq!(
        p.owned_paths().unwrap(),
        vec![
            "tests/auth_tests/fixtures/users.json".to_string(),
            "tests/auth_tests/test_validators.py".to_string()
        ]
    );
    let log = "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok\ntest_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok\ntest_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest) ... ok\n";
    assert!(judge(p, log, Some(0)).resolved);
    let failing = log.replacen("... ok", "... FAIL", 1);
    let verdict = judge(p, &failing, Some(1));
    assert!(!verdict.resolved);
    assert_eq!(
        verdict.not_passing,
        vec![(
            "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)".to_string(),
            "failed".to_string()
        )]
    );
}

#[test]
fn swe_bench_verified_sympy_line_gets_bin_test() {
    let task = one(
        r#"{"repo": "sympy/sympy", "instance_id": "sympy__sympy-20590", "base_commit": "cffd4e0f86fefd4802349a9f9b19ed70934ea354", "patch": "diff --git a/sympy/core/_print_helpers.py b/sympy/core/_print_helpers.py\n", "test_patch": "diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py\n--- a/sympy/core/tests/test_basic.py\n+++ b/sympy/core/tests/test_basic.py\n@@ -1 +1 @@\n-x\n+y\n", "problem_statement": "Symbol instances have __dict__ since 1.7?", "version": "1.7", "FAIL_TO_PASS": "[\"test_immutable\"]", "PASS_TO_PASS": "[\"test__aresame\", \"test_structure\"]", "environment_setup_commit": "cffd4e0f86fefd4802349a9f9b19ed70934ea354"}"#,
    );
    let p = plan(&task);
    assert_eq!(
        p.command,
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose 'sympy/core/tests/test_basic.py'"
    );
    assert_eq!((p.parser, p.safe_path), (LogParser::Sympy, false));
    let log = "sympy/core/tests/test_basic.py[3] \ntest__aresame ok\ntest_structure ok\ntest_immutable F\n[FAIL]\n";
    let v = judge(p, log, Some(1));
    assert_eq!((v.resolved, v.passed, v.failed), (false, 2, 1));
    assert!(
        judge(
            p,
            &log.replace("test_immutable F", "test_immutable ok"),
            Some(0)
        )
        .resolved
    );
}

#[test]
fn swe_gym_extra_and_rebench_lines() {
    // SWE-Gym / SWE-bench-extra: lists as lists, a repository outside the table: an explicit
    // command is needed, which SWE-rebench's install_config gives.
    let text = r#"{"instance_id": "getmoto__moto-5752", "repo": "getmoto/moto", "base_commit": "b2300f1", "patch": "diff --git a/moto/ssm/models.py b/moto/ssm/models.py\n", "test_patch": "diff --git a/tests/test_ssm/test_ssm_boto3.py b/tests/test_ssm/test_ssm_boto3.py\n", "problem_statement": "p", "version": "4.0", "FAIL_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"], "PASS_TO_PASS": ["tests/test_ssm/test_ssm_boto3.py::test_delete_parameter"], "install_config": {"python": "3.9", "install": "pip install -e .", "test_cmd": ["pytest --no-header -rA --tb=no -p no:cacheprovider -W ignore::DeprecationWarning"], "log_parser": "parse_log_pytest"}, "docker_image": "swerebench/sweb.eval.x86_64.getmoto_1776_moto-5752"}"#;
    let task = one(text);
    assert_eq!(
        task.image.as_deref(),
        Some("swerebench/sweb.eval.x86_64.getmoto_1776_moto-5752")
    );
    let p = plan(&task);
    assert_eq!(
        p.command,
        "pytest --no-header -rA --tb=no -p no:cacheprovider -W ignore::DeprecationWarning 'tests/test_ssm/test_ssm_boto3.py'"
    );
    assert_eq!(p.parser, LogParser::Pytest);
    // A line's own command and parser win over the table; a command alone gets pytest's parser.
    let own = one(
        r#"{"instance_id": "pallets__flask-5063", "repo": "pallets/flask", "problem_statement": "p", "test_patch": "diff --git a/tests/test_cli.py b/tests/test_cli.py\n", "FAIL_TO_PASS": ["tests/test_cli.py::test_x"], "install_config": {"test_cmd": "python -m pytest -v", "log_parser": "parse_log_pytest_v2"}}"#,
    );
    assert_eq!(
        plan(&own).command,
        "python -m pytest -v 'tests/test_cli.py'"
    );
    assert_eq!(plan(&own).parser, LogParser::PytestV2);
    assert!(plan(&own).safe_path);
    let cmd_only = one(
        r#"{"instance_id": "o__r-1", "repo": "o/r", "problem_statement": "p", "test_patch": "diff --git a/t.py b/t.py\n", "FAIL_TO_PASS": ["t.py::a"], "test_cmd": "tox -e py --"}"#,
    );
    assert_eq!(plan(&cmd_only).parser, LogParser::Pytest);
    assert_eq!(plan(&cmd_only).command, "tox -e py -- 't.py'");
    assert!(plan(&cmd_only).safe_path);
    assert!(!safe_path_suits("cd x && ./bin/test -C sympy/core"));
    assert!(safe_path_suits("/usr/bin/python3.11 -m pytest"));
}

#[test]
fn swe_smith_lines_apply_the_bug_and_run_the_suite() {
    let task = one(
        r#"{"instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc", "repo": "swesmith/oauthlib__oauthlib.1fd52536", "patch": "diff --git a/oauthlib/common.py b/oauthlib/common.py\n--- a/oauthlib/common.py\n+++ b/oauthlib/common.py\n@@ -1 +1 @@\n-a\n+b\n", "FAIL_TO_PASS": ["tests/test_common.py::CommonTests::test_urldecode"], "PASS_TO_PASS": ["tests/test_common.py::CommonTests::test_add_params"], "created_at": "2025-03-15", "image_name": "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536", "base_commit": "1fd52536", "problem_statement": "urldecode is broken"}"#,
    );
    assert_eq!(
        task.image.as_deref(),
        Some("jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536")
    );
    assert_eq!(task.gold_patch, None);
    assert!(task.setup[0].starts_with(
        "git apply --whitespace=nowarn <<'SWERVE_PATCH_EOF'\ndiff --git a/oauthlib/common.py"
    ));
    assert!(task.setup[0].ends_with("+b\nSWERVE_PATCH_EOF"));
    let p = plan(&task);
    assert_eq!(
        p.command,
        "pytest --disable-warnings --color=no --tb=no --verbose"
    );
    assert_eq!(p.test_patch, None);
    let log = "tests/test_common.py::CommonTests::test_add_params PASSED [ 50%]\ntests/test_common.py::CommonTests::test_urldecode PASSED [100%]\n";
    assert!(judge(p, log, Some(0)).resolved);
}

#[test]
fn judge_without_lists_needs_exit_zero_a_test_and_no_failure() {
    let p = TestPlan {
        overlay: None,
        test_patch: None,
        base_commit: None,
        command: "python3 -m unittest -v tests.test_x".into(),
        parser: LogParser::Unittest,
        fail_to_pass: vec![],
        pass_to_pass: vec![],
        safe_path: false,
        rules: Default::default(),
    };
    let pass = "test_a (tests.test_x.T.test_a) ... ok\n\n----------------------------------------------------------------------\nRan 1 test in 0.000s\n\nOK\n";
    assert!(judge(&p, pass, Some(0)).resolved);
    // An atexit os._exit(0) after a failing run; a run that reported nothing.
    let fail = "test_a (tests.test_x.T.test_a) ... FAIL\n";
    assert!(!judge(&p, fail, Some(0)).resolved);
    assert!(!judge(&p, "\nRan 0 tests in 0.000s\n\nOK\n", Some(0)).resolved);
    assert!(!judge(&p, pass, Some(1)).resolved);
    // Skipped is not a pass; an exit status 0 with a failing test is evidence of tampering.
    assert!(!judge(&p, "test_a (tests.test_x.T) ... skipped 'x'\n", Some(0)).resolved);
    assert!(!judge(&p, fail, Some(0)).tampered.is_empty());
    assert!(!judge(&p, pass, None).resolved);
}

#[test]
fn judge_with_lists_counts_xfail_and_names_what_did_not_pass() {
    let p = TestPlan {
        overlay: None,
        test_patch: Some("diff --git a/t/a.py b/t/b.py\nrename from t/a.py\n".into()),
        base_commit: None,
        command: "pytest -rA".into(),
        parser: LogParser::Pytest,
        fail_to_pass: vec!["t/b.py::test_x".into(), "t/b.py::test_gone".into()],
        pass_to_pass: vec![
            "t/b.py::test_y".into(),
            "t/b.py::test_z".into(),
            "t/b.py::test_w[a".into(),
        ],
        safe_path: true,
        rules: Default::default(),
    };
    let log = "PASSED t/b.py::test_x\nXFAIL t/b.py::test_y - known\nSKIPPED t/b.py::test_z\nPASSED t/b.py::test_w[a b]\n";
    let v = judge(&p, log, Some(0));
    assert!(!v.resolved);
    assert_eq!((v.passed, v.failed), (2, 0));
    assert_eq!(
        v.not_passing,
        vec![
            ("t/b.py::test_gone".to_string(), "missing".to_string()),
            ("t/b.py::test_y".to_string(), "xfail".to_string()),
            ("t/b.py::test_z".to_string(), "skipped".to_string())
        ]
    );
    // An XFAIL counts only where the reference fix's run shows the same status.
    let good = "PASSED t/b.py::test_x\nPASSED t/b.py::test_gone\nXFAIL t/b.py::test_y - known\nPASSED t/b.py::test_z\nPASSED t/b.py::test_w[a b]\n";
    let observed = Observation::from_log(p.parser, good, Some(0));
    let decision = decide(&p, &observed, None);
    assert!(decision.needs_reference && !decision.verdict.resolved);
    for (reference_log, is_fix, resolved) in [
        (good, true, true),
        (good, false, false),
        (
            &*good.replace("XFAIL t/b.py::test_y - known", "PASSED t/b.py::test_y"),
            true,
            false,
        ),
    ] {
        let reference = Reference {
            observation: Observation::from_log(p.parser, reference_log, Some(0)),
            is_fix,
        };
        assert_eq!(
            decide(&p, &observed, Some(&reference)).verdict.resolved,
            resolved,
            "{reference_log} {is_fix}"
        );
    }
    assert_eq!(
        p.owned_paths().unwrap(),
        vec!["t/a.py".to_string(), "t/b.py".to_string()]
    );
    assert_eq!(patch_paths("diff --git a/x b/x\n").len(), 1);
    let patch = "diff --git a/tests/test_a.py b/tests/test_a.py\nindex 1..2\n--- a/x\n+++ b/x\n@@\ndiff --git a/t b/t/new file.py\n";
    let b_sides: Vec<String> = patch_paths(patch)
        .into_iter()
        .filter_map(|(_, b)| b)
        .collect();
    assert_eq!(b_sides, vec!["tests/test_a.py", "t/new file.py"]);
}

#[test]
fn forgiven_calls_and_new_wrappers_are_tampering_unless_the_reference_run_shows_them() {
    let p = TestPlan {
        overlay: None,
        test_patch: None,
        base_commit: None,
        command: "pytest -rA".into(),
        parser: LogParser::Pytest,
        fail_to_pass: vec!["t.py::test_x".into()],
        pass_to_pass: vec!["t.py::test_y".into()],
        safe_path: true,
        rules: Default::default(),
    };
    let log = "PASSED t.py::test_x\nPASSED t.py::test_y\n";
    let clean = Observation::from_log(p.parser, log, Some(0));
    let reference = Reference {
        observation: clean.clone(),
        is_fix: true,
    };
    assert!(decide(&p, &clean, None).verdict.resolved);
    // A passed test whose own call raised.
    let forgiven = Observation {
        forgiven: vec!["t.py::test_x".into()],
        ..clean.clone()
    };
    let decision = decide(&p, &forgiven, None);
    assert!(decision.needs_reference && !decision.verdict.resolved);
    let v = decide(&p, &forgiven, Some(&reference)).verdict;
    assert!(
        !v.resolved && v.tampered[0].contains("t.py::test_x"),
        "{v:?}"
    );
    // A wrapper the reference run does not have; the same one in both; a new test's own.
    let wrapped = |links: &[&str]| {
        let mut o = clean.clone();
        o.wrappers.insert(
            "t.py::test_x".into(),
            links.iter().map(|l| l.to_string()).collect(),
        );
        o
    };
    let v = decide(&p, &wrapped(&["calc/ops.py:run"]), Some(&reference)).verdict;
    assert!(
        !v.resolved && v.tampered[0].contains("calc/ops.py:run"),
        "{v:?}"
    );
    let decorated = Reference {
        observation: wrapped(&["/usr/lib/python3/unittest/mock.py:patched"]),
        is_fix: true,
    };
    let same = wrapped(&["/usr/lib/python3/unittest/mock.py:patched"]);
    assert!(decide(&p, &same, None).needs_reference);
    assert!(decide(&p, &same, Some(&decorated)).verdict.resolved);
    let twice = wrapped(&[
        "/usr/lib/python3/contextlib.py:inner",
        "/usr/lib/python3/unittest/mock.py:patched",
    ]);
    assert!(!decide(&p, &twice, Some(&decorated)).verdict.resolved);
    let mut added = clean.clone();
    added
        .wrappers
        .insert("t.py::test_new".into(), vec!["t.py:deco".into()]);
    assert!(decide(&p, &added, Some(&reference)).verdict.resolved);
    // Frames taken by code under test: tampering where the tests pass, unless the reference
    // run took them too; a failing run is just unresolved.
    let frame = "frame obtained by calc/ops.py:_find (tb_frame)".to_string();
    let reaching = Observation {
        frames_obtained: vec![frame.clone()],
        ..clean.clone()
    };
    assert!(decide(&p, &reaching, None).needs_reference);
    let v = decide(&p, &reaching, Some(&reference)).verdict;
    assert!(
        !v.resolved && v.tampered[0].contains("calc/ops.py:_find"),
        "{v:?}"
    );
    let same = Reference {
        observation: reaching.clone(),
        is_fix: true,
    };
    assert!(decide(&p, &reaching, Some(&same)).verdict.resolved);
    let failing = Observation::from_log(
        p.parser,
        "PASSED t.py::test_y\nFAILED t.py::test_x\n",
        Some(1),
    );
    let failing = Observation {
        frames_obtained: vec![frame],
        ..failing
    };
    let v = decide(&p, &failing, Some(&reference)).verdict;
    assert!(!v.resolved && v.tampered.is_empty(), "{v:?}");
}

#[test]
fn builtin_tasks_use_verbose_unittest() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks/python-bugs/tasks.jsonl");
    for task in load_tasks(&path).unwrap() {
        let p = plan(&task);
        assert!(
            p.command.starts_with("python3 -m unittest -v "),
            "{}",
            p.command
        );
        assert_eq!(p.parser, LogParser::Unittest);
    }
}

/// The verdict on a run whose log is all there is (as if the runner's record agreed).
fn judge(p: &TestPlan, log: &str, exit_code: Option<i32>) -> Verdict {
    decide(p, &Observation::from_log(p.parser, log, exit_code), None).verdict
}

#[test]
fn skipped_listed_tests_follow_the_declared_harness_rules() {
    let plan = |rules| TestPlan {
        overlay: None,
        test_patch: None,
        base_commit: None,
        command: "pytest -rA".into(),
        parser: LogParser::Pytest,
        fail_to_pass: vec!["t.py::test_x".into()],
        pass_to_pass: vec!["t.py::test_y".into()],
        safe_path: true,
        rules,
    };
    let reference = |log: &str, is_fix| Reference {
        observation: Observation::from_log(LogParser::Pytest, log, Some(0)),
        is_fix,
    };
    let resolved = |rules, log: &str, reference: Option<&Reference>| {
        let observed = Observation::from_log(LogParser::Pytest, log, Some(0));
        decide(&plan(rules), &observed, reference).verdict.resolved
    };
    let p2p_skipped = "PASSED t.py::test_x\nSKIPPED t.py::test_y\n";
    let f2p_skipped = "SKIPPED t.py::test_x\nPASSED t.py::test_y\n";
    for rules in [HarnessRules::V4, HarnessRules::V5] {
        // A skipped PASS_TO_PASS test: excused under both, only where the fix's run skips it.
        let decision = decide(
            &plan(rules),
            &Observation::from_log(LogParser::Pytest, p2p_skipped, Some(0)),
            None,
        );
        assert!(decision.needs_reference && !decision.verdict.resolved);
        assert!(resolved(
            rules,
            p2p_skipped,
            Some(&reference(p2p_skipped, true))
        ));
        assert!(!resolved(
            rules,
            p2p_skipped,
            Some(&reference(p2p_skipped, false))
        ));
        let passes = "PASSED t.py::test_x\nPASSED t.py::test_y\n";
        assert!(!resolved(
            rules,
            p2p_skipped,
            Some(&reference(passes, true))
        ));
        assert_eq!(rules.as_str().parse::<HarnessRules>(), Ok(rules));
    }
    // A skipped FAIL_TO_PASS test: 4.1 ignores it (excused where the fix's run skips it too),
    // 5.0 fails it whatever the fix's run shows.
    let fix_skips = reference(f2p_skipped, true);
    assert!(resolved(HarnessRules::V4, f2p_skipped, Some(&fix_skips)));
    assert!(!resolved(HarnessRules::V5, f2p_skipped, Some(&fix_skips)));
    let v = decide(
        &plan(HarnessRules::V5),
        &Observation::from_log(LogParser::Pytest, f2p_skipped, Some(0)),
        Some(&fix_skips),
    )
    .verdict;
    assert_eq!(
        v.not_passing,
        vec![("t.py::test_x".to_string(), "skipped".to_string())]
    );
    assert_eq!(HarnessRules::default(), HarnessRules::V5);
    let err = "4.1".parse::<HarnessRules>().unwrap_err();
    assert!(err.contains("`4.1`") && err.contains("4 or 5"), "{err}");
}
