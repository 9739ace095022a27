//! Integration tests of the kubernetes environment (`swerve::env::kubernetes`) against the
//! stand-in API server (tests/k8s_standin/standin.py: the pod, watch, delete and exec endpoints,
//! each pod a local docker container, faults injected on request), reached through a kubeconfig
//! written to a temporary folder (`server: http://127.0.0.1:PORT`), as a cluster would be.
//! They need docker and the test images (scripts/docker-test-images.sh), so a plain `cargo test`
//! skips them; `.ci/run` runs them with `--ignored` after the docker tests. Every test has its
//! own stand-in, namespace and run id, and checks that none of its pods is left: through the
//! API (a list by label) and through docker (the stand-in's containers carry the pod's labels).

mod common;

use common::k8s_standin::StandIn;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use swerve::env::kubernetes::config::RetryPolicy;
use swerve::env::kubernetes::{sweep, KubernetesConfig, KubernetesEnvironment, KubernetesOptions};
use swerve::env::{load_tasks, Environment, Limits, Sandbox, Task};

const PYTHON: &str = "swerve-test-python:1";
const SECOND: Duration = Duration::from_secs(1);
/// The namespace every test's kubeconfig context names.
const NAMESPACE: &str = "swerve-test";

/// A stand-in and a kubeconfig pointing at it (`server: http://127.0.0.1:PORT`).
struct Standin {
    api: StandIn,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Standin {
    fn start(extra: &[&str]) -> Self {
        let api = StandIn::start(extra);
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let server = api.url();
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {server}\nusers:\n- name: standin\n  user: {{}}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: {NAMESPACE}\ncurrent-context: standin\n"
            ),
        )
        .unwrap();
        Self {
            api,
            kubeconfig,
            _dir: dir,
        }
    }

    fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.api.request("GET", path, None);
        assert_eq!(
            status,
            200,
            "GET {path}: {body}\nthe stand-in's log:\n{}",
            self.api.log()
        );
        body
    }

    fn add_faults(&self, rules: Value) {
        self.api.add_faults(&rules);
    }
}

/// The names of the pods of run `run` in `namespace`, through the API.
fn list_pods(standin: &Standin, namespace: &str, run: Option<&str>) -> Vec<String> {
    let selector = match run {
        Some(run) => format!("swerve.run%3D{run}"),
        None => "swerve.run".to_string(),
    };
    let list = standin.get_json(&format!(
        "/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    ));
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items: {list}"))
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// The docker containers labelled with run `run` (the stand-in copies a pod's labels).
fn docker_of_run(run: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=swerve.run={run}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn limits() -> Limits {
    Limits {
        command_timeout: Duration::from_secs(30),
        output_bytes: 4096,
        output_kill_bytes: 1 << 20,
        memory_bytes: 256 << 20,
        processes: 64,
        file_bytes: 1 << 20,
    }
}

fn config(standin: &Standin) -> KubernetesConfig {
    let options = KubernetesOptions {
        kubeconfig: Some(standin.kubeconfig.clone()),
        run_id: Some(swerve::env::docker::new_run_id()),
        start_timeout: Duration::from_secs(60),
        ..KubernetesOptions::default()
    };
    let mut config = KubernetesConfig::new(limits(), options);
    config.default_image = PYTHON.to_string();
    config.retry = RetryPolicy {
        attempts: 5,
        base: Duration::from_millis(50),
        cap: Duration::from_millis(500),
    };
    config
}

fn environment(standin: &Standin) -> KubernetesEnvironment {
    KubernetesEnvironment::new(config(standin)).expect("the stand-in answers")
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
    let line = json!({"id": "div", "repo": "repo", "tests": "tests",
        "problem_statement": "div multiplies", "test_command": "python3 -m unittest -v tests.test_x",
        "timeout_s": 60, "image": PYTHON});
    std::fs::write(dir.join("tasks.jsonl"), line.to_string()).unwrap();
    load_tasks(&dir.join("tasks.jsonl")).unwrap().remove(0)
}

fn run_ok(sandbox: &mut dyn Sandbox, command: &str) -> String {
    let out = sandbox.run(command, None, 30 * SECOND).unwrap();
    assert!(out.success(), "`{command}`: {out:?}");
    out.output
}

/// No pod of the run through the API, no container through docker.
fn assert_nothing_left(standin: &Standin, env: &KubernetesEnvironment) {
    let run = env.run_id();
    assert_eq!(
        list_pods(standin, env.namespace(), Some(run)),
        Vec::<String>::new()
    );
    assert_eq!(docker_of_run(run), "");
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn commands_stdin_exit_codes_files_and_close() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let env = environment(&standin);
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
    assert_eq!((out.output.trim(), out.exit_code), ("5", Some(0)));
    let out = sandbox
        .run("echo out; echo err >&2; exit 3", None, 10 * SECOND)
        .unwrap();
    assert_eq!(
        (out.output.as_str(), out.exit_code),
        ("out\nerr\n", Some(3))
    );
    assert!(!out.success());
    // A fresh shell each time: cd and variables do not carry over.
    run_ok(sandbox.as_mut(), "cd /tmp; X=1");
    assert_eq!(
        run_ok(sandbox.as_mut(), "pwd; echo \"[$X]\""),
        "/workspace\n[]\n"
    );
    // Stdin larger than a websocket frame and the stream buffers, binary included.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let out = sandbox.run("md5sum", Some(&big), 30 * SECOND).unwrap();
    let expected = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            std::io::Write::write_all(&mut c.stdin.take().unwrap(), &big)?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(out.output, String::from_utf8_lossy(&expected.stdout));
    // Files in over the workspace, replacing what is there.
    let extra = tmp.path().join("extra");
    write(&extra.join("tests/test_x.py"), "replaced\n");
    write(&extra.join("calc.py"), "new\n");
    sandbox.copy_in(&extra).unwrap();
    assert_eq!(
        run_ok(sandbox.as_mut(), "cat calc.py tests/test_x.py"),
        "new\nreplaced\n"
    );
    let pod = list_pods(&standin, env.namespace(), Some(env.run_id()));
    assert_eq!(pod.len(), 1, "{pod:?}");
    sandbox.close().unwrap();
    sandbox.close().unwrap();
    assert!(sandbox.run("true", None, SECOND).is_err());
    assert_nothing_left(&standin, &env);
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn the_pod_carries_the_spec_the_api_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let mut config = config(&standin);
    config
        .options
        .node_selector
        .insert("kubernetes.io/os".into(), "linux".into());
    config.options.active_deadline = Duration::from_secs(3600);
    let env = KubernetesEnvironment::new(config).unwrap();
    let task = folder_task(tmp.path());
    let sandbox = env.start_sandbox(&task, "Spec_Check #1", None).unwrap();
    let pod = standin.get_json(&format!(
        "/api/v1/namespaces/{}/pods/{}",
        env.namespace(),
        sandbox.pod()
    ));
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Never", "{pod}");
    assert_eq!(spec["activeDeadlineSeconds"], 3600);
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux");
    let container = &spec["containers"][0];
    assert_eq!(container["image"], PYTHON);
    assert_eq!(
        container["resources"]["limits"]["memory"],
        (256u64 << 20).to_string()
    );
    assert_eq!(container["resources"]["requests"]["cpu"], "500m");
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    assert_eq!(pod["metadata"]["labels"]["swerve.run"], env.run_id());
    assert_eq!(pod["metadata"]["labels"]["swerve.episode"], "Spec_Check--1");
    assert_eq!(
        pod["metadata"]["annotations"]["swerve.episode"],
        "Spec_Check #1"
    );
    assert_eq!(pod["status"]["phase"], "Running");
    drop(sandbox);
    assert_nothing_left(&standin, &env);
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn timeouts_output_limits_and_memory_hold_and_the_sandbox_survives_them() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let env = environment(&standin);
    let mut sandbox = env.start(&folder_task(tmp.path()), "limits").unwrap();
    let started = Instant::now();
    let out = sandbox
        .run("echo start; sleep 30", None, 2 * SECOND)
        .unwrap();
    assert!(out.timed_out && out.exit_code.is_none(), "{out:?}");
    assert!(started.elapsed() < 10 * SECOND, "{:?}", started.elapsed());
    assert!(out.output.contains("start"), "{out:?}");
    // Nothing the timed-out command started is left.
    let out = sandbox
        .run("sleep 60 & echo $!; wait", None, SECOND)
        .unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(
        run_ok(sandbox.as_mut(), "ps -eo comm | grep -c '^sleep$' || true").trim(),
        "1"
    );

    let out = sandbox.run("yes swerve", None, 20 * SECOND).unwrap();
    assert!(
        out.output_overflow && !out.timed_out && out.exit_code.is_none(),
        "{out:?}"
    );
    assert!(out.output.contains("bytes of output omitted"), "{out:?}");
    assert!(out.output.len() < 4096 + 100, "{}", out.output.len());
    let out = sandbox.run("seq 100000", None, 20 * SECOND).unwrap();
    assert!(out.success(), "{out:?}");
    assert!(out.output.starts_with("1\n2\n") && out.output.ends_with("99999\n100000\n"));
    assert!(out.omitted_bytes > 500_000, "{out:?}");

    // 256 MiB: a process taking 1 GiB is killed.
    let hog = "python3 -c 'b = bytearray(1 << 30); print(len(b))'";
    let out = sandbox.run(hog, None, 30 * SECOND).unwrap();
    assert!(
        !out.success() && !out.output.contains("1073741824"),
        "{out:?}"
    );
    assert_eq!(run_ok(sandbox.as_mut(), "echo ok"), "ok\n");
    sandbox.close().unwrap();
    assert_nothing_left(&standin, &env);
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn throttling_server_errors_and_name_conflicts_are_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let env = environment(&standin);
    let pods = "^/api/v1/namespaces/[^/]+/pods$";
    let pod = "^/api/v1/namespaces/[^/]+/pods/[^/]+$";
    let exec = "^/api/v1/namespaces/[^/]+/pods/[^/]+/exec";
    standin.add_faults(json!({"http": [
        {"method": "POST", "path": pods, "status": 429, "count": 2, "retry_after": 0},
        {"method": "POST", "path": pods, "status": 500, "count": 1},
        {"method": "POST", "path": pods, "status": 409, "count": 1},
        {"method": "GET", "path": pod, "status": 503, "count": 2},
        {"method": "GET", "path": exec, "status": 500, "count": 2},
        {"method": "DELETE", "path": pod, "status": 429, "count": 1, "retry_after": 0},
    ]}));
    let mut sandbox = env.start(&folder_task(tmp.path()), "retried").unwrap();
    assert_eq!(
        run_ok(sandbox.as_mut(), "echo x >> count; wc -l < count").trim(),
        "1"
    );
    sandbox.close().unwrap();
    let stats = standin.api.stats();
    for (status, count) in [("429", 3), ("500", 3), ("409", 1), ("503", 2)] {
        assert_eq!(stats["injected"][status], count, "{status}: {stats}");
    }
    assert_nothing_left(&standin, &env);
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn a_dropped_exec_is_retried_only_when_the_command_cannot_have_run() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let env = environment(&standin);
    let mut sandbox = env.start(&folder_task(tmp.path()), "dropped").unwrap();
    let next = standin.api.stats()["exec_sessions"].as_u64().unwrap() + 1;
    // Cut before the command started: sent again, and it ran once.
    standin.add_faults(json!({"exec_drops": [{"session": next, "when": "before_output"}]}));
    let out = sandbox
        .run("echo x >> count; wc -l < count", None, 10 * SECOND)
        .unwrap();
    assert_eq!(out.output.trim(), "1", "{out:?}");
    // Cut after its output: it ran, so it is not sent again: an infrastructure failure.
    let next = standin.api.stats()["exec_sessions"].as_u64().unwrap() + 1;
    standin.add_faults(json!({"exec_drops": [{"session": next, "when": "after_output"}]}));
    let err = format!(
        "{:#}",
        sandbox
            .run("echo x >> count; wc -l < count", None, 10 * SECOND)
            .err()
            .unwrap()
    );
    assert!(
        err.contains("may have run") && err.contains("infrastructure"),
        "{err}"
    );
    assert_eq!(run_ok(sandbox.as_mut(), "wc -l < count").trim(), "2");
    let stats = standin.api.stats();
    assert_eq!(
        stats["exec_dropped"],
        json!({"before_output": 1, "after_output": 1}),
        "{stats}"
    );
    sandbox.close().unwrap();
    assert_nothing_left(&standin, &env);
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn the_active_deadline_ends_a_pod_and_a_missing_image_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let mut config = config(&standin);
    config.options.active_deadline = Duration::from_secs(4);
    let env = KubernetesEnvironment::new(config).unwrap();
    let mut task = folder_task(tmp.path());
    let mut sandbox = env.start_sandbox(&task, "deadline", None).unwrap();
    std::thread::sleep(6 * SECOND);
    let err = format!(
        "{:#}",
        sandbox.run("true", None, 10 * SECOND).err().unwrap()
    );
    assert!(
        err.contains("is gone") && err.contains("DeadlineExceeded"),
        "{err}"
    );
    sandbox.close().unwrap();

    task.image = Some("swerve-test-absent:0".into());
    let started = Instant::now();
    let err = format!("{:#}", env.start(&task, "absent").err().unwrap());
    assert!(started.elapsed() < 30 * SECOND, "{:?}", started.elapsed());
    assert!(
        err.contains("swerve-test-absent:0") && err.contains("ErrImagePull"),
        "{err}"
    );
    assert!(
        err.contains("swerve-") && err.contains("did not start"),
        "{err}"
    );
    assert_nothing_left(&standin, &env);
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn sweep_removes_what_a_crashed_run_left_and_a_restart_with_its_id_too() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let config = config(&standin);
    let env = KubernetesEnvironment::new(config.clone()).unwrap();
    let task = folder_task(tmp.path());
    for i in 0..3 {
        // A crash: the sandbox is never closed.
        std::mem::forget(env.start(&task, &format!("left-{i}")).unwrap());
    }
    let run = env.run_id().to_string();
    assert_eq!(list_pods(&standin, env.namespace(), Some(&run)).len(), 3);
    assert_eq!(sweep(&config, Some(&run)).unwrap().1, 3);
    assert_nothing_left(&standin, &env);
    assert_eq!(sweep(&config, Some(&run)).unwrap().1, 0);
    // A run started again with the id of one that crashed deletes its pods first.
    std::mem::forget(env.start(&task, "left-again").unwrap());
    let again = KubernetesEnvironment::new(config).unwrap();
    assert_eq!(again.run_id(), run);
    assert_nothing_left(&standin, &again);
}

/// `swerve-train ARGS` to its end.
fn swerve_train(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_swerve-train"))
        .args(args)
        .output()
        .unwrap()
}

fn docker_label(image: &str) -> String {
    let out = std::process::Command::new("docker")
        .args([
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"swerve.base_commit\"}}",
            image,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// SWE-bench Verified-shaped lines on the two repository images (as tests/env_docker.rs).
fn swe_bench_lines(dir: &Path) -> PathBuf {
    let fixture = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/docker")
            .join(name);
        std::fs::read_to_string(path).unwrap()
    };
    let swebench = json!({"instance_id": "pytest-dev__pytest-1", "repo": "pytest-dev/pytest",
        "version": "8.0", "base_commit": docker_label("swerve-test-swebench:1"),
        "problem_statement": "mean floors", "image_name": "swerve-test-swebench:1",
        "test_patch": fixture("swebench/test.patch"), "patch": fixture("swebench/gold.patch"),
        "FAIL_TO_PASS": "[\"tests/test_stats.py::test_mean_of_fractions\"]",
        "PASS_TO_PASS": "[\"tests/test_stats.py::test_mean_of_integers\"]"});
    let django = json!({"instance_id": "django__django-1", "repo": "django/django",
        "version": "4.0", "base_commit": docker_label("swerve-test-django:1"),
        "problem_statement": "triangle area", "image_name": "swerve-test-django:1",
        "test_patch": fixture("django/test.patch"), "patch": fixture("django/gold.patch"),
        "FAIL_TO_PASS": "[\"test_triangle (shapes_tests.tests.AreaTests)\"]",
        "PASS_TO_PASS": "[\"test_square (shapes_tests.tests.AreaTests)\"]"});
    let path = dir.join("swe.jsonl");
    std::fs::write(&path, format!("{swebench}\n{django}\n")).unwrap();
    path
}

/// `rollout --env kubernetes` of `tasks`; its summary (rollout.json). No pod of the run is left.
fn rollout(
    standin: &Standin,
    out: &Path,
    tasks: &str,
    policy: &str,
    extra: &[&str],
) -> serde_json::Value {
    let run = format!("cli-{}", swerve::env::docker::new_run_id());
    let kubeconfig = standin.kubeconfig.to_str().unwrap();
    let mut args = vec![
        "rollout",
        "--env",
        "kubernetes",
        "--kubeconfig",
        kubeconfig,
        "--k8s-run-id",
        &run,
        "--tasks",
        tasks,
        "--policy",
        policy,
        "--image",
        PYTHON,
        "--sandbox-memory-mb",
        "512",
        "--out",
        out.to_str().unwrap(),
        "--infra-retries",
        "0",
    ];
    args.extend_from_slice(extra);
    let output = swerve_train(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    assert!(
        stderr.contains(&format!("envs sweep --run {run}")),
        "{stderr}"
    );
    assert_eq!(
        list_pods(standin, NAMESPACE, Some(&run)),
        Vec::<String>::new()
    );
    assert_eq!(docker_of_run(&run), "");
    let text = std::fs::read_to_string(out.join("rollout.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn rollout_cli_32_episodes_at_once_oracle_resolved_noop_not() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let at_once = ["--limit-tasks", "8", "--group", "4", "--concurrency", "32"];
    let oracle = rollout(
        &standin,
        &tmp.path().join("oracle"),
        "builtin:python-bugs",
        "oracle",
        &at_once,
    );
    assert_eq!(oracle["episodes"], 32, "{oracle}");
    assert_eq!(oracle["resolved"], 32, "{oracle}");
    assert_eq!(oracle["infrastructure_failures"], 0, "{oracle}");
    assert_eq!(oracle["environment"], "kubernetes");
    let noop = rollout(
        &standin,
        &tmp.path().join("noop"),
        "builtin:python-bugs",
        "noop",
        &at_once,
    );
    assert_eq!(
        (noop["episodes"].as_u64(), noop["resolved"].as_u64()),
        (Some(32), Some(0)),
        "{noop}"
    );
    assert_eq!(noop["infrastructure_failures"], 0, "{noop}");

    let lines = swe_bench_lines(tmp.path());
    let lines = lines.to_str().unwrap();
    let two = ["--group", "2", "--concurrency", "4"];
    let oracle = rollout(
        &standin,
        &tmp.path().join("swe-oracle"),
        lines,
        "oracle",
        &two,
    );
    assert_eq!(
        (oracle["episodes"].as_u64(), oracle["resolved"].as_u64()),
        (Some(4), Some(4)),
        "{oracle}"
    );
    let noop = rollout(&standin, &tmp.path().join("swe-noop"), lines, "noop", &two);
    assert_eq!(
        (noop["episodes"].as_u64(), noop["resolved"].as_u64()),
        (Some(4), Some(0)),
        "{noop}"
    );
    assert_eq!(noop["infrastructure_failures"], 0, "{noop}");
}

#[test]
#[ignore = "needs docker, the test images and python3 (the k8s stand-in): .ci/run runs them with --ignored"]
fn a_run_killed_midway_leaves_pods_that_envs_sweep_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let standin = Standin::start(&[]);
    let run = format!("killed-{}", swerve::env::docker::new_run_id());
    let kubeconfig = standin.kubeconfig.to_str().unwrap().to_string();
    let out = tmp.path().join("out");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_swerve-train"))
        .args([
            "rollout",
            "--env",
            "kubernetes",
            "--kubeconfig",
            &kubeconfig,
            "--k8s-run-id",
            &run,
        ])
        .args([
            "--tasks",
            "builtin:python-bugs",
            "--limit-tasks",
            "8",
            "--group",
            "2",
        ])
        .args([
            "--concurrency",
            "8",
            "--policy",
            "oracle",
            "--image",
            PYTHON,
        ])
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while list_pods(&standin, NAMESPACE, Some(&run)).len() < 4 {
        assert!(started.elapsed() < 120 * SECOND, "no pods after 120 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    child.kill().unwrap(); // SIGKILL: nothing of the run cleans up
    child.wait().unwrap();
    let left = list_pods(&standin, NAMESPACE, Some(&run));
    assert!(!left.is_empty());
    let sweep = swerve_train(&[
        "envs",
        "sweep",
        "--run",
        &run,
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        NAMESPACE,
    ]);
    let said = String::from_utf8_lossy(&sweep.stdout);
    assert!(
        sweep.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    assert!(
        said.starts_with("deleted ")
            && said.contains(&format!("of run {run} in namespace swerve-test")),
        "{said}"
    );
    assert_eq!(
        list_pods(&standin, NAMESPACE, Some(&run)),
        Vec::<String>::new()
    );
    assert_eq!(docker_of_run(&run), "");
    // Malformed values are errors naming the flag and the value.
    let bad = swerve_train(&["envs", "sweep", "--run=-bad-", "--kubeconfig", &kubeconfig]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("--run") && err.contains("-bad-"),
        "{err}"
    );
    let bad = swerve_train(&["envs", "sweep", "--all", "--k8s-toleration", "a:Sometimes"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--k8s-toleration") && err.contains("Sometimes"),
        "{err}"
    );
}
