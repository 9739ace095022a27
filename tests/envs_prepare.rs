//! `swerve-train envs prepare` (src/env/prepare.rs): the images a task file needs with the lines
//! that need each, the Kubernetes pre-pull DaemonSet (parsed back; decoded by `kubectl label
//! --local` where kubectl exists), pull errors and timeouts through a stand-in docker
//! CLI, and (ignored, docker) real sizes and a real failed pull.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use swerve::env::load_tasks;
use swerve::env::prepare::{describe_origins, images_needed};

const TEST_PATCH: &str = "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n\
                          +++ b/tests/test_x.py\n@@ -1 +1 @@\n-a\n+b\n";

fn swe_line(n: usize, image: Option<&str>) -> Value {
    let mut line = json!({"instance_id": format!("pytest-dev__pytest-{n}"),
        "repo": "pytest-dev/pytest", "version": "8.0", "base_commit": "abc",
        "problem_statement": "p", "test_patch": TEST_PATCH, "patch": TEST_PATCH,
        "FAIL_TO_PASS": "[\"tests/test_x.py::t\"]", "PASS_TO_PASS": "[]"});
    if let Some(image) = image {
        line["image_name"] = json!(image);
    }
    line
}

/// A task file: SWE-bench lines in `images` (None: SWE-bench's own name) then a folder task
/// (the default image) and a toy task (no image).
fn task_file(dir: &Path, images: &[Option<&str>]) -> PathBuf {
    std::fs::create_dir_all(dir.join("r")).unwrap();
    std::fs::create_dir_all(dir.join("t")).unwrap();
    let mut lines: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, image)| swe_line(i + 1, *image))
        .collect();
    lines.push(
        json!({"id": "folder", "repo": "r", "tests": "t", "problem_statement": "p",
                      "test_command": "python3 -m unittest -v"}),
    );
    lines.push(json!({"id": "toy", "problem_statement": "guess", "toy": {"low": 1, "high": 10, "hidden": 3}}));
    let path = dir.join("tasks.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    path
}

fn swerve_train(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_swerve-train"))
        .args(["envs", "prepare"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

#[test]
fn each_image_once_with_the_lines_that_need_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = task_file(
        dir.path(),
        &[Some("img-a:1"), Some("img-b:1"), Some("img-a:1"), None],
    );
    let tasks = load_tasks(&path).unwrap();
    let at = |line: usize| format!("{}:{line}", path.display());
    let needs: Vec<(String, Vec<String>)> = images_needed(&tasks, "default:1")
        .into_iter()
        .map(|n| (n.image, n.origins))
        .collect();
    assert_eq!(
        needs,
        [
            ("img-a:1".to_string(), vec![at(1), at(3)]),
            ("img-b:1".to_string(), vec![at(2)]),
            (
                "swebench/sweb.eval.x86_64.pytest-dev_1776_pytest-4:latest".to_string(),
                vec![at(4)]
            ),
            ("default:1".to_string(), vec![at(5)]),
        ]
    );
    let origins: Vec<String> = ["f:1", "f:2", "f:3", "f:5", "g:7", "f:8"]
        .map(String::from)
        .to_vec();
    assert_eq!(describe_origins(&origins), "f:1-3,5, g:7, f:8");
    let many: Vec<String> = (1..=40).map(|i| format!("f:{}", 2 * i)).collect();
    assert_eq!(
        describe_origins(&many),
        "f:2,4,6,8,10,12,14,16,18,20,22,24 and 28 more lines"
    );
}

#[test]
fn the_kubernetes_daemonset_pulls_every_image_on_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = task_file(
        dir.path(),
        &[Some("img-a:1"), Some("img-b:1"), Some("img-a:1")],
    );
    let manifest = dir.path().join("prepull.json");
    let out = swerve_train(&[
        "--tasks",
        path.to_str().unwrap(),
        "--env",
        "kubernetes",
        "--manifest",
        manifest.to_str().unwrap(),
        "--namespace",
        "swerve-runs",
        "--image",
        "default:1",
        "--node-selector",
        "pool=sandbox",
        "--image-pull-secret",
        "regcred",
        "--docker-cli",
        "/nonexistent/docker",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 image(s) for 4 task line(s)"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "img-a:1  unknown  (2 line(s): {}:1,3)",
            path.display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("3 image size(s) unknown"), "{stdout}");

    let value: Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert_eq!(
        (value["apiVersion"].as_str(), value["kind"].as_str()),
        (Some("apps/v1"), Some("DaemonSet"))
    );
    assert_eq!(value["metadata"]["namespace"], "swerve-runs");
    let spec = &value["spec"]["template"]["spec"];
    let init = spec["initContainers"].as_array().unwrap();
    let images: Vec<&str> = init.iter().map(|c| c["image"].as_str().unwrap()).collect();
    assert_eq!(images, ["img-a:1", "img-b:1", "default:1"]);
    let names: Vec<&str> = init.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pull-0", "pull-1", "pull-2"]);
    assert!(init
        .iter()
        .all(|c| c["command"] == json!(["sh", "-c", "exit 0"])));
    assert_eq!(spec["containers"][0]["image"], "registry.k8s.io/pause:3.10");
    assert_eq!(spec["nodeSelector"], json!({"pool": "sandbox"}));
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(spec["tolerations"], json!([{"operator": "Exists"}]));
    // The selector must match the template's labels or the apiserver refuses the DaemonSet.
    let selector = value["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    for (key, label) in selector {
        assert_eq!(&value["spec"]["template"]["metadata"]["labels"][key], label);
    }
    kubectl_decodes(&manifest, &value);
}

/// Where kubectl is installed, it decodes the manifest as a client does (`kubectl label --local`:
/// offline; `kubectl apply --dry-run=client` needs a server's discovery) and gives back the same
/// DaemonSet.
fn kubectl_decodes(manifest: &Path, written: &Value) {
    let Ok(out) = Command::new("kubectl")
        .args(["label", "--local", "-o", "json", "checked=yes", "-f"])
        .arg(manifest)
        .output()
    else {
        eprintln!("kubectl is not installed: the manifest is checked by parsing it only");
        return;
    };
    assert!(out.status.success(), "kubectl label --local: {out:?}");
    let decoded: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decoded["kind"], "DaemonSet");
    assert_eq!(decoded["metadata"]["labels"]["checked"], "yes");
    assert_eq!(decoded["spec"], written["spec"]);
}

#[test]
fn flag_errors_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path = task_file(dir.path(), &[Some("img-a:1")]);
    let tasks = path.to_str().unwrap();
    let out = swerve_train(&["--tasks", tasks, "--env", "kubernetes"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--env kubernetes needs --manifest FILE"));
    let out = swerve_train(&["--tasks", tasks, "--env", "docker", "--manifest", "x.json"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--manifest is for --env kubernetes"));
    let out = swerve_train(&[
        "--tasks",
        tasks,
        "--env",
        "kubernetes",
        "--manifest",
        "x",
        "--node-selector",
        "novalue",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"novalue\" is not KEY=VALUE"));
    let toy = dir.path().join("toy.jsonl");
    std::fs::write(
        &toy,
        "{\"id\": \"toy\", \"problem_statement\": \"g\", \"toy\": {\"low\": 1, \"high\": 10, \"hidden\": 3}}\n",
    )
    .unwrap();
    let out = swerve_train(&["--tasks", toy.to_str().unwrap(), "--env", "docker"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no task needs a container image"));
}

/// A docker CLI with no images: `pull img-hang:1` hangs, other pulls fail as a registry would.
fn fake_docker(dir: &Path) -> PathBuf {
    let path = dir.join("docker");
    std::fs::write(
        &path,
        "#!/bin/sh\nif [ \"$1\" = image ]; then echo \"Error: No such image: $5\" >&2; exit 1; fi\n\
         if [ \"$1\" = pull ] && [ \"$2\" = img-hang:1 ]; then exec sleep 60; fi\n\
         echo \"Error response from daemon: manifest for $2 not found: manifest unknown\" >&2; exit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

#[test]
fn pull_failures_and_timeouts_name_the_image_and_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = task_file(
        dir.path(),
        &[Some("img-hang:1"), Some("img-gone:1"), Some("img-hang:1")],
    );
    let docker = fake_docker(dir.path());
    let started = std::time::Instant::now();
    let out = swerve_train(&[
        "--tasks",
        path.to_str().unwrap(),
        "--env",
        "docker",
        "--image",
        "img-gone:1",
        "--docker-cli",
        docker.to_str().unwrap(),
        "--pull-timeout",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        started.elapsed().as_secs() < 30,
        "the pull timeout did not end the hung pull"
    );
    let file = path.display();
    assert!(
        stderr.contains("2 of 2 images could not be pulled"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("image img-hang:1 (needed by {file}:1,3): pull did not finish within the pull timeout (1 s")), "{stderr}");
    let gone = format!(
        "image img-gone:1 (needed by {file}:2,4): `{} pull img-gone:1` failed",
        docker.display()
    );
    assert!(stderr.contains(&gone), "{stderr}");
    assert!(stderr.contains("manifest unknown"), "{stderr}");
}

fn docker_size(image: &str) -> u64 {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Size}}", image])
        .output()
        .unwrap();
    assert!(out.status.success(), "{image}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
#[ignore = "needs docker and the test images (.ci/run runs it)"]
fn docker_sizes_and_a_failed_pull() {
    let dir = tempfile::tempdir().unwrap();
    let python = "swerve-test-python:1";
    let swebench = "swerve-test-swebench:1";
    let path = task_file(dir.path(), &[Some(swebench), Some(python)]);
    let out = swerve_train(&[
        "--tasks",
        path.to_str().unwrap(),
        "--env",
        "docker",
        "--image",
        python,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total = docker_size(python) + docker_size(swebench);
    assert!(
        stdout.contains(&format!(
            "disk estimate: {:.2} GiB ({total} bytes;",
            total as f64 / (1u64 << 30) as f64
        )),
        "{stdout}"
    );
    assert!(
        !stdout.contains("pulled"),
        "present images are not pulled: {stdout}"
    );

    // A registry that refuses the connection: the error names the image and its line.
    let absent = "localhost:1/swerve-absent:1";
    let path = task_file(dir.path(), &[Some(python), Some(absent)]);
    let out = swerve_train(&[
        "--tasks",
        path.to_str().unwrap(),
        "--env",
        "docker",
        "--image",
        python,
        "--pull-timeout",
        "120",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("image {absent} (needed by {}:2)", path.display())),
        "{stderr}"
    );
}
