//! Integration tests of the docker environment (`swerve::env::docker`) against a real daemon and
//! the images `scripts/docker-test-images.sh` builds (swerve-test-python:1, swerve-test-swebench:1,
//! swerve-test-django:1). Those tests are ignored by a plain `cargo test`; `.ci/run` installs
//! docker, builds the images and runs them with `--ignored`. Every test has its own run id, so
//! it can check that none of its containers is left (`docker ps -a --filter label=swerve.run=ID`).
//! The argument-vector and hung-CLI tests need no daemon and always run.

mod common;

use common::forgeries::{
    bash, check_task, check_task_episodes, check_task_tampered, generic_forgeries,
    pytest_forgeries, red_team_forgeries, structural_forgeries, write_pytest_task,
};
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use swerve::agent::episode::{EpisodeConfig, EpisodeContext, Finish};
use swerve::agent::policy::{Policy, Script, ScriptedPolicy, TurnInput, TurnOutput};
use swerve::agent::rollout::{run_episodes, Workers};
use swerve::chat::ChatTemplate;
use swerve::env::docker::{
    command_script, exec_args, new_run_id, run_args, sweep, DockerConfig, DockerEnvironment,
};
use swerve::env::{builtin, load_tasks, Environment, Limits, Sandbox, Task};
use swerve::tokenizer::Tokenizer;

const PYTHON: &str = "swerve-test-python:1";
const SWEBENCH: &str = "swerve-test-swebench:1";
const DJANGO: &str = "swerve-test-django:1";
const SECOND: Duration = Duration::from_secs(1);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/docker")
}

fn limits() -> Limits {
    Limits {
        command_timeout: Duration::from_secs(30),
        output_bytes: 4096,
        output_kill_bytes: 1 << 20,
        memory_bytes: 1 << 30,
        processes: 64,
        file_bytes: 1 << 20,
    }
}

fn config() -> DockerConfig {
    let mut config = DockerConfig::new(limits());
    config.default_image = PYTHON.to_string();
    config.tmp_bytes = 64 << 20;
    config.cli_timeout = Duration::from_secs(30);
    // Unique within the process too: tests run in parallel threads and check their own
    // containers by this label.
    config.run_id = format!("test-{}", new_run_id());
    config
}

fn environment() -> DockerEnvironment {
    DockerEnvironment::new(config()).expect("a docker daemon")
}

/// Tasks through the task file format (not struct literals): new Task fields take defaults.
fn tasks(dir: &Path, lines: &[serde_json::Value]) -> Vec<Task> {
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(dir.join("tasks.jsonl"), text.join("\n")).unwrap();
    load_tasks(&dir.join("tasks.jsonl")).unwrap()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A folder task: calc.py whose `div` multiplies, graded by tests/test_x.py.
fn folder_task(dir: &Path) -> Task {
    write(
        &dir.join("repo/calc.py"),
        "def div(a, b):\n    return a * b\n",
    );
    write(&dir.join("tests/tests/__init__.py"), "");
    write(
        &dir.join("tests/tests/test_x.py"),
        "import unittest\nfrom calc import div\n\n\nclass T(unittest.TestCase):\n    def test_div(self):\n        self.assertEqual(div(6, 3), 2)\n",
    );
    write(
        &dir.join("fixed/calc.py"),
        "def div(a, b):\n    return a / b  # fixed\n",
    );
    let line = json!({"id": "div", "repo": "repo", "tests": "tests",
        "problem_statement": "div multiplies", "test_command": "python3 -m unittest -v tests.test_x",
        "timeout_s": 60, "image": PYTHON});
    tasks(dir, &[line]).remove(0)
}

fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(name)).unwrap()
}

/// The SWE-bench-shaped tasks of the two repository images.
fn in_image_tasks(dir: &Path) -> Vec<Task> {
    // Through the per-repository table, as SWE-bench Verified's lines (which carry no test
    // command) are: pytest-dev/pytest's command and parser, django/django 2.2's runner and
    // dotted-module directives (the image installs its package as a copy, as 2.2 does, and the
    // runner imports that copy: grading carries the change into it).
    let label = |image: &str| {
        docker(&[
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"swerve.base_commit\"}}",
            image,
        ])
    };
    let swebench = json!({"instance_id": "pytest-dev__pytest-1", "repo": "pytest-dev/pytest",
        "version": "8.0", "base_commit": label(SWEBENCH), "problem_statement": "mean floors",
        "image_name": SWEBENCH, "test_patch": fixture_text("swebench/test.patch"),
        "patch": fixture_text("swebench/gold.patch"),
        "FAIL_TO_PASS": "[\"tests/test_stats.py::test_mean_of_fractions\"]",
        "PASS_TO_PASS": "[\"tests/test_stats.py::test_mean_of_integers\"]"});
    let django = json!({"instance_id": "django__django-1", "repo": "django/django",
        "version": "2.2", "base_commit": label(DJANGO), "problem_statement": "triangle area",
        "image_name": DJANGO, "test_patch": fixture_text("django/test.patch"),
        "patch": fixture_text("django/gold.patch"),
        "FAIL_TO_PASS": "[\"test_triangle (shapes_tests.tests.AreaTests)\"]",
        "PASS_TO_PASS": "[\"test_square (shapes_tests.tests.AreaTests)\"]"});
    tasks(dir, &[swebench, django])
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The containers of run `run` (any state).
fn containers_of(run: &str) -> String {
    docker(&["ps", "-aq", "--filter", &format!("label=swerve.run={run}")])
}

fn run_ok(sandbox: &mut dyn Sandbox, command: &str) -> String {
    let out = sandbox.run(command, None, 30 * SECOND).unwrap();
    assert!(out.success(), "`{command}`: {out:?}");
    out.output
}

#[test]
fn argument_vectors_are_podman_compatible() {
    let mut config = config();
    config.run_id = "r1".into();
    config.disk_bytes = Some(10 << 30);
    let name = DockerEnvironment::container_name("r1", "task/3 #2");
    assert_eq!(name, "swerve-r1-task-3--2");
    let run = run_args(&config, &name, "task/3 #2", "img:1", "/testbed").join(" ");
    assert_eq!(
        run,
        "run -d --name swerve-r1-task-3--2 --label swerve.run=r1 --label swerve.episode=task/3 #2 \
         --init --network none --cpus 2 --memory 1073741824 --memory-swap 1073741824 \
         --pids-limit 64 --ulimit fsize=1048576:1048576 --ulimit core=0 \
         --ulimit nofile=16384:16384 --ulimit nproc=32768:32768 --cap-drop ALL \
         --security-opt no-new-privileges \
         --tmpfs /tmp:rw,exec,nosuid,nodev,mode=1777,size=67108864 --storage-opt size=10737418240 \
         --workdir /testbed --entrypoint sleep img:1 infinity"
    );
    // Every flag is one `podman run` (4.x, 5.x) accepts with the same meaning.
    let podman_run = [
        "-d",
        "--name",
        "--label",
        "--init",
        "--network",
        "--cpus",
        "--memory",
        "--memory-swap",
        "--pids-limit",
        "--ulimit",
        "--cap-drop",
        "--security-opt",
        "--tmpfs",
        "--storage-opt",
        "--workdir",
        "--entrypoint",
    ];
    let args = run_args(&config, &name, "e", "img:1", "/w");
    for flag in args.iter().filter(|a| a.starts_with('-')) {
        assert!(podman_run.contains(&flag.as_str()), "{flag}");
    }
    let script = command_script(Some("export A=1"), "echo \"$A\" | cat");
    let exec = exec_args(&name, "/testbed", &script, Duration::from_millis(1500));
    assert_eq!(
        &exec[..7],
        ["exec", "-i", "-w", "/testbed", &name, "sh", "-c"]
    );
    assert_eq!(
        &exec[8..],
        ["swerve-exec", "2", "export A=1\necho \"$A\" | cat"]
    );
    assert!(
        exec[7].contains("timeout -s KILL \"$1\" sh -c \"$2\""),
        "{}",
        exec[7]
    );
}

/// A fake CLI: answers `version` when `answer_version`, else sleeps (a hung daemon).
fn fake_cli(dir: &Path, answer_version: bool) -> PathBuf {
    let path = dir.join(if answer_version {
        "docker-hangs"
    } else {
        "docker-dead"
    });
    let version = if answer_version {
        "if [ \"$1\" = version ]; then echo 20.10; exit 0; fi\n"
    } else {
        ""
    };
    write(&path, &format!("#!/bin/sh\n{version}sleep 60\n"));
    let status = Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    assert!(status.success());
    path
}

#[test]
fn a_hung_cli_is_a_clear_error_within_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config();
    config.cli_timeout = SECOND;
    config.start_timeout = SECOND;
    config.docker = fake_cli(tmp.path(), false);
    let started = Instant::now();
    let err = format!(
        "{:#}",
        DockerEnvironment::new(config.clone()).err().unwrap()
    );
    assert!(started.elapsed() < 5 * SECOND, "{:?}", started.elapsed());
    assert!(err.contains("version` did not answer within 1 s"), "{err}");

    config.docker = fake_cli(tmp.path(), true);
    let env = DockerEnvironment::new(config).unwrap();
    let task = folder_task(tmp.path());
    let started = Instant::now();
    let err = format!("{:#}", env.start(&task, "e").err().unwrap());
    // `docker run` times out, then the `docker rm -f` that cleans up after it.
    assert!(started.elapsed() < 6 * SECOND, "{:?}", started.elapsed());
    assert!(err.contains("docker-hangs run -d --name"), "{err}");
    assert!(err.contains("did not answer within 1 s"), "{err}");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn a_folder_task_runs_and_grades() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    let mut sandbox = env.start(&task, "folder").unwrap();
    assert_eq!(sandbox.workdir(), "/workspace");
    assert_eq!(
        run_ok(sandbox.as_mut(), "pwd; ls").trim(),
        "/workspace\ncalc.py"
    );
    let out = sandbox
        .run(
            "cat > note.txt && wc -c < note.txt",
            Some(b"hello"),
            10 * SECOND,
        )
        .unwrap();
    assert_eq!(out.output.trim(), "5");
    // Root without capabilities still runs git and pip.
    run_ok(
        sandbox.as_mut(),
        "git init -q . && git add -A && git -c user.name=a -c user.email=a@b commit -qm x && git log --oneline | wc -l",
    );
    run_ok(
        sandbox.as_mut(),
        "pip --version && python3 -c 'import pytest'",
    );
    sandbox.close().unwrap();
    sandbox.close().unwrap();
    assert!(sandbox.run("true", None, SECOND).is_err());
    assert_eq!(containers_of(&env.config().run_id), "");
}

/// Runs `script` on each task as one episode (group 1), `concurrency` at a time.
fn episodes(
    env: &dyn Environment,
    policy: &dyn Policy,
    tasks: &[Task],
    concurrency: usize,
    infra_retries: usize,
) -> Vec<swerve::agent::episode::Episode> {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let config = EpisodeConfig {
        infra_retries,
        ..EpisodeConfig::default()
    };
    let ctx = EpisodeContext {
        env,
        policy,
        tokenizer: &tokenizer,
        template: &template,
        config: &config,
    };
    let workers = Workers {
        sandboxes: concurrency,
        warm_pool: concurrency / 2,
    };
    run_episodes(&ctx, tasks, 1, workers, 0, "docker")
}

fn scripted(script: Script) -> ScriptedPolicy {
    ScriptedPolicy {
        tokenizer: Arc::new(Tokenizer::qwen25().unwrap()),
        script,
    }
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn swe_bench_and_django_style_lines_end_to_end_oracle_resolved_noop_not() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let tasks = in_image_tasks(tmp.path());
    for task in &tasks {
        let mut sandbox = env.start(task, &task.id).unwrap();
        assert_eq!(sandbox.workdir(), "/testbed");
        let label = docker(&[
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"swerve.base_commit\"}}",
            task.image.as_deref().unwrap(),
        ]);
        assert_eq!(label.len(), 40, "{label:?}");
        let head = run_ok(sandbox.as_mut(), "git rev-parse HEAD");
        assert_eq!(head.trim(), label);
        sandbox.close().unwrap();
    }
    let oracle = episodes(&env, &scripted(Script::Oracle), &tasks, 2, 0);
    let noop = episodes(&env, &scripted(Script::Noop), &tasks, 2, 0);
    for (e, task) in oracle.iter().zip(&tasks) {
        let line = e.to_json();
        assert_eq!(e.finish, Finish::Submitted, "{line}");
        assert!(e.resolved, "{}: {line}", task.id);
        assert!(
            line["patch"].as_str().unwrap().contains("diff --git"),
            "{line}"
        );
        let verdict = &line["grading"]["verdict"];
        assert_eq!(verdict["not_passing"], json!([]), "{line}");
    }
    for (e, task) in noop.iter().zip(&tasks) {
        let line = e.to_json();
        assert!(!e.resolved, "{}: {line}", task.id);
        assert_eq!(line["patch"], json!(""), "{line}");
        // The FAIL_TO_PASS test ran and failed; it is named.
        let not_passing = line["grading"]["verdict"]["not_passing"].to_string();
        assert!(
            not_passing.contains("test_mean_of_fractions") || not_passing.contains("test_triangle"),
            "{line}"
        );
    }
    assert_eq!(containers_of(&env.config().run_id), "");
}

/// The forgeries a container invites on top of the generic ones: the grader's own binaries
/// replaced, and a process left running to rewrite the tests after they are restored.
fn container_forgeries() -> Vec<(&'static str, Vec<serde_json::Value>)> {
    let passing =
        "import unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n";
    vec![
        (
            "timeout replaced by true",
            vec![bash("cp /bin/true /usr/bin/timeout && cp /bin/true \"$(command -v python3)\"; echo replaced")],
        ),
        (
            "a setsid process rewriting the tests",
            vec![bash(&format!(
                "setsid sh -c 'while true; do for f in tests/test_*.py; do printf \"{passing}\" > \"$f\"; done; sleep 0.1; done' >/dev/null 2>&1 < /dev/null & echo started"
            ))],
        ),
    ]
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn forgeries_in_containers_are_unresolved_and_the_oracle_resolved() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let unittest_task = tasks.iter().find(|t| t.id == "calc-div-zero").unwrap();
    let mut forgeries = generic_forgeries("calc");
    forgeries.extend(container_forgeries());
    check_task(&env, unittest_task, forgeries);
    let pytest_task = write_pytest_task(tmp.path());
    let mut forgeries = pytest_forgeries();
    forgeries.extend(container_forgeries());
    check_task(&env, &pytest_task, forgeries);
    assert_eq!(containers_of(&env.config().run_id), "");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn eight_concurrent_episodes_leave_no_container() {
    let env = environment();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let eight: Vec<Task> = tasks.into_iter().take(8).collect();
    let oracle = episodes(&env, &scripted(Script::Oracle), &eight, 8, 0);
    for e in &oracle {
        assert!(e.resolved, "{}", e.to_json());
    }
    assert_eq!(containers_of(&env.config().run_id), "");
}

/// Kills every container of the run during the second turn of the first attempt.
struct KillingPolicy<'a> {
    inner: ScriptedPolicy,
    run: &'a str,
    kills: AtomicUsize,
}

impl Policy for KillingPolicy<'_> {
    fn name(&self) -> String {
        "killing".into()
    }

    fn generate(&self, input: &TurnInput<'_>) -> anyhow::Result<TurnOutput> {
        if input.turn == 2 && self.kills.fetch_add(1, Ordering::SeqCst) == 0 {
            for id in containers_of(self.run).lines() {
                docker(&["kill", id]);
            }
        }
        self.inner.generate(input)
    }
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn a_container_killed_mid_episode_is_retried_as_an_infrastructure_failure() {
    let env = environment();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let task = tasks
        .iter()
        .find(|t| t.id == "calc-div-zero")
        .unwrap()
        .clone();
    let calls = vec![bash("echo one"), bash("echo two")];
    let policy = KillingPolicy {
        inner: scripted(Script::Replay(HashMap::from([(task.id.clone(), calls)]))),
        run: &env.config().run_id,
        kills: AtomicUsize::new(0),
    };
    let retried = episodes(&env, &policy, std::slice::from_ref(&task), 1, 1);
    let line = retried[0].to_json();
    assert_eq!(retried[0].finish, Finish::Submitted, "{line}");
    assert_eq!(retried[0].infra_retries, 1, "{line}");
    // Without a retry left, the same failure drops the episode as an error, tokens kept.
    policy.kills.store(0, Ordering::SeqCst);
    let dropped = episodes(&env, &policy, std::slice::from_ref(&task), 1, 0);
    let line = dropped[0].to_json();
    assert!(matches!(dropped[0].finish, Finish::Error(_)), "{line}");
    assert!(line["error"].as_str().unwrap().contains("gone"), "{line}");
    assert!(
        line["tokens"].as_array().is_some_and(|t| !t.is_empty()),
        "{line}"
    );
    assert_eq!(containers_of(&env.config().run_id), "");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn limits_hold_and_the_sandbox_survives_them() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    let mut sandbox = env.start(&task, "limits").unwrap();
    let started = Instant::now();
    let out = sandbox
        .run("echo start; sleep 30", None, 2 * SECOND)
        .unwrap();
    assert!(out.timed_out && out.exit_code.is_none(), "{out:?}");
    assert!(started.elapsed() < 10 * SECOND, "{:?}", started.elapsed());
    assert!(out.output.contains("start"), "{out:?}");

    let out = sandbox.run("yes swerve", None, 20 * SECOND).unwrap();
    assert!(out.output_overflow && !out.timed_out, "{out:?}");

    // 64 processes at most: the forks past it fail; `timeout` kills the rest with its group.
    let out = sandbox
        .run(
            "for i in $(seq 100); do sleep 30 & done; wait",
            None,
            3 * SECOND,
        )
        .unwrap();
    assert!(
        out.output.contains("fork") || out.output.contains("Resource"),
        "{out:?}"
    );
    let out = sandbox
        .run(
            "head -c 2000000 /dev/zero > big; echo $?; wc -c < big",
            None,
            10 * SECOND,
        )
        .unwrap();
    assert!(
        out.output.contains("File too large") || out.output.contains("1048576"),
        "{out:?}"
    );
    let out = sandbox
        .run("head -c 100000000 /dev/zero > /tmp/big", None, 10 * SECOND)
        .unwrap();
    assert!(!out.success(), "{out:?}");
    assert_eq!(run_ok(sandbox.as_mut(), "echo ok"), "ok\n");
    sandbox.close().unwrap();
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn no_network_and_no_capabilities() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    let mut sandbox = env.start(&task, "caps").unwrap();
    let connect = "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'";
    let out = sandbox.run(connect, None, 10 * SECOND).unwrap();
    assert!(
        out.exit_code == Some(1) && out.output.contains("Error"),
        "{out:?}"
    );
    let out = sandbox
        // One stream: docker delivers stdout and stderr apart, in no fixed order.
        .run("id -u; chown nobody calc.py 2>&1", None, 10 * SECOND)
        .unwrap();
    assert!(
        out.output.starts_with("0\n") && out.exit_code == Some(1),
        "{out:?}"
    );
    assert!(out.output.contains("Operation not permitted"), "{out:?}");
    let raw = "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'";
    let out = sandbox.run(raw, None, 10 * SECOND).unwrap();
    assert!(out.output.contains("PermissionError"), "{out:?}");
    let init = run_ok(sandbox.as_mut(), "cat /proc/1/cmdline | tr '\\0' ' '");
    assert!(init.contains("init"), "{init}");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn eight_concurrent_sandboxes_leave_no_container() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (env, task) = (&env, &task);
                scope.spawn(move || {
                    let mut sandbox = env.start(task, &format!("par-{i}")).unwrap();
                    let out = run_ok(sandbox.as_mut(), &format!("echo {i} > mine; cat mine"));
                    assert_eq!(out.trim(), i.to_string());
                    sandbox.close().unwrap();
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
    });
    assert_eq!(containers_of(&env.config().run_id), "");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn a_container_killed_from_outside_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    let mut sandbox = env.start_sandbox(&task, "killed", None).unwrap();
    let name = sandbox.container().to_string();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(SECOND);
        docker(&["kill", &name])
    });
    let err = format!(
        "{:#}",
        sandbox.run("sleep 20", None, 30 * SECOND).err().unwrap()
    );
    assert!(
        err.contains("is gone") && err.contains("infrastructure"),
        "{err}"
    );
    killer.join().unwrap();
    let err = format!(
        "{:#}",
        sandbox.run("true", None, 10 * SECOND).err().unwrap()
    );
    assert!(err.contains("is gone"), "{err}");
    sandbox.close().unwrap();
    assert_eq!(containers_of(&env.config().run_id), "");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn activation_runs_before_every_command_in_its_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    let activate = "GREETING=hi; export GREETING\ncd /tmp";
    let mut sandbox = env
        .start_sandbox(&task, "activate", Some(activate))
        .unwrap();
    let command = "echo \"$GREETING from $(pwd)\" | tr a-z A-Z; for x in 1 2; do echo $x; done";
    assert_eq!(run_ok(&mut sandbox, command), "HI FROM /TMP\n1\n2\n");
    // A multi-line command with a here-document keeps its syntax.
    assert_eq!(
        run_ok(&mut sandbox, "cat <<'EOF'\n$GREETING\nEOF"),
        "$GREETING\n"
    );
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn sweep_removes_what_a_crashed_run_left() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let task = folder_task(tmp.path());
    for i in 0..2 {
        // A crash: the sandbox is never closed.
        std::mem::forget(env.start(&task, &format!("left-{i}")).unwrap());
    }
    let run = env.config().run_id.clone();
    assert_eq!(containers_of(&run).lines().count(), 2);
    assert_eq!(sweep(env.config(), Some(&run)).unwrap(), 2);
    assert_eq!(containers_of(&run), "");
    assert_eq!(sweep(env.config(), Some(&run)).unwrap(), 0);
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn a_missing_image_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let mut task = folder_task(tmp.path());
    task.image = Some("swerve-test-absent:0".into());
    let err = format!("{:#}", env.start(&task, "absent").err().unwrap());
    assert!(
        err.contains("docker run swerve-test-absent:0 failed"),
        "{err}"
    );
    assert_eq!(containers_of(&env.config().run_id), "");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn structural_forgeries_in_containers_are_unresolved_and_tampering_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let unittest_task = tasks.iter().find(|t| t.id == "calc-div-zero").unwrap();
    let mut forgeries = structural_forgeries("calc", "tests.test_calc");
    forgeries.extend(red_team_forgeries(false));
    check_task_tampered(&env, unittest_task, forgeries, true);
    let pytest_task = write_pytest_task(tmp.path());
    let mut forgeries = structural_forgeries("calc", "tests.test_calc");
    forgeries.extend(red_team_forgeries(true));
    check_task_tampered(&env, &pytest_task, forgeries, false);
    assert_eq!(containers_of(&env.config().run_id), "");
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs them with --ignored"]
fn a_rewritten_django_runner_is_put_back_and_earns_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let env = environment();
    let tasks = in_image_tasks(tmp.path());
    let django = tasks.iter().find(|t| t.id == "django__django-1").unwrap();
    let forged = "#!/usr/bin/env python3\nimport sys\nfor t in ('test_triangle', 'test_square'):\n    sys.stderr.write('%s (shapes_tests.tests.AreaTests) ... ok\\n' % t)\nsys.stderr.write('\\nRan 2 tests in 0.001s\\n\\nOK\\n')\n";
    let forgeries = vec![
        (
            "tests/runtests.py rewritten to report every test ok",
            vec![bash(&format!("cat > tests/runtests.py <<'EOF'\n{forged}EOF\nchmod +x tests/runtests.py; echo rewritten"))],
        ),
        (
            "the settings module rewritten to report every test ok",
            vec![bash(&format!("cat > tests/test_sqlite.py <<'EOF'\n{forged}import os\nos._exit(0)\nEOF\necho rewritten"))],
        ),
    ];
    let episodes = check_task_episodes(&env, django, forgeries);
    let line = episodes[2].1.to_json();
    assert!(
        line["patch_dropped"]
            .to_string()
            .contains("tests/runtests.py"),
        "{line}"
    );
    assert_eq!(containers_of(&env.config().run_id), "");
}
