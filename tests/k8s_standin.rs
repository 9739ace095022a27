//! The Kubernetes API stand-in (tests/k8s_standin/standin.py) checked against an independent
//! reference: the official `kubernetes` Python client (pinned in tests/requirements-k8s.txt,
//! provisioned as tests/common/python.rs says) runs tests/k8s_standin_check.py against it:
//! pods from swerve-test-python:1 watched to Running, exec with stdin, stdout, stderr and exit
//! codes, label and field selectors, Succeeded/Failed endings, activeDeadlineSeconds, a missing
//! image's ErrImagePull/ImagePullBackOff, deletion to 404, injected 409/429/500/503 answers
//! and dropped exec websockets. Those need docker and are ignored by a plain `cargo test`
//! (`.ci/run` runs them with `--ignored`); the checks without containers always run.

mod common;

use common::k8s_standin::StandIn;
use common::python::PythonEnv;
use serde_json::json;
use std::process::Command;

fn pinned_version() -> String {
    let text = std::fs::read_to_string(common::root().join("tests/requirements-k8s.txt")).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("kubernetes=="))
        .expect("tests/requirements-k8s.txt pins kubernetes")
        .to_string()
}

fn python_with_kubernetes() -> std::path::PathBuf {
    let version = pinned_version();
    PythonEnv {
        venv: format!("kubernetes-{version}-venv"),
        requirements: &["requirements-k8s.txt"],
        no_deps: &[],
        check: format!("import kubernetes, sys; sys.exit(kubernetes.__version__ != {version:?})"),
    }
    .python()
}

#[test]
#[ignore = "needs docker and the test images (.ci/run runs it)"]
fn the_official_kubernetes_client_drives_the_standin() {
    let python = python_with_kubernetes();
    let mut standin = StandIn::start(&[]);
    let out = Command::new(&python)
        .arg(common::root().join("tests/k8s_standin_check.py"))
        .arg(standin.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("checks passed"),
        "tests/k8s_standin_check.py failed:\n{stdout}\n{}\nstand-in log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        standin.log()
    );
    eprintln!("{stdout}");
    // A pod left running (as after a client killed midway) stays until swept or the stand-in
    // stops; on SIGTERM the stand-in removes every container it started.
    let (status, pod) = standin.request(
        "POST",
        "/api/v1/namespaces/left/pods",
        Some(&json!({"metadata": {"name": "left-behind"},
            "spec": {"containers": [{"name": "main", "image": "swerve-test-python:1",
                                     "command": ["sleep", "600"]}]}})),
    );
    assert_eq!(status, 201, "{pod}");
    for _ in 0..600 {
        if !standin.containers().is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        !standin.containers().is_empty(),
        "the pod's container never started"
    );
    assert!(standin.stop(), "the stand-in did not exit on SIGTERM");
    assert_eq!(
        standin.containers(),
        Vec::<String>::new(),
        "{}",
        standin.log()
    );
}

#[test]
fn discovery_errors_and_injected_faults_without_containers() {
    let standin = StandIn::start(&["--fault", "GET:^/api/v1/namespaces/[^/]+/pods$:503:1"]);
    let (status, version) = standin.request("GET", "/version", None);
    assert_eq!((status, &version["major"]), (200, &json!("1")), "{version}");
    let (status, resources) = standin.request("GET", "/api/v1", None);
    assert_eq!(status, 200);
    assert!(resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "pods/exec"));

    // The flag's fault answers the first list, then lists are served.
    let (status, answer) = standin.request("GET", "/api/v1/namespaces/a/pods", None);
    assert_eq!(
        (status, &answer["reason"]),
        (503, &json!("ServiceUnavailable")),
        "{answer}"
    );
    let (status, list) = standin.request("GET", "/api/v1/namespaces/a/pods", None);
    assert_eq!((status, &list["kind"]), (200, &json!("PodList")), "{list}");
    assert_eq!(list["items"], json!([]));

    let (status, answer) = standin.request("GET", "/api/v1/namespaces/a/pods/nope", None);
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["reason"], "NotFound");
    assert_eq!(answer["details"], json!({"name": "nope", "kind": "pods"}));
    let (status, answer) = standin.request(
        "GET",
        "/api/v1/namespaces/a/pods?labelSelector=a%3D%3D%3Db",
        None,
    );
    assert_eq!(
        (status, &answer["reason"]),
        (400, &json!("BadRequest")),
        "{answer}"
    );
    let (status, answer) = standin.request(
        "GET",
        "/api/v1/namespaces/a/pods?fieldSelector=spec.image%3Dx",
        None,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("spec.image"),
        "{answer}"
    );

    // 422 names the missing fields, before any container is involved.
    let (status, answer) = standin.request(
        "POST",
        "/api/v1/namespaces/a/pods",
        Some(&json!({"metadata": {}, "spec": {"containers": [{"name": "main"}]}})),
    );
    assert_eq!(
        (status, &answer["reason"]),
        (422, &json!("Invalid")),
        "{answer}"
    );
    let fields: Vec<&str> = answer["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["metadata.name", "spec.containers[0].image"]);

    // A bad rule is refused whole, naming what is wrong; a good one answers and is counted.
    let (status, answer) = standin.request(
        "POST",
        "/standin/faults",
        Some(&json!({"http": [{"method": "GET", "status": 418}]})),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("http[0]: status 418"),
        "{answer}"
    );
    standin.add_faults(
        &json!({"http": [{"method": "DELETE", "path": "/pods/", "status": 429,
                                         "count": 2, "retry_after": 7}]}),
    );
    for _ in 0..2 {
        let (status, answer) = standin.request("DELETE", "/api/v1/namespaces/a/pods/x", None);
        assert_eq!(
            (status, &answer["details"]["retryAfterSeconds"]),
            (429, &json!(7))
        );
    }
    let (status, _) = standin.request("DELETE", "/api/v1/namespaces/a/pods/x", None);
    assert_eq!(status, 404);
    let stats = standin.stats();
    assert_eq!(stats["injected"], json!({"503": 1, "429": 2}), "{stats}");
}

#[test]
fn a_bad_fault_flag_is_an_error_naming_it() {
    let out = Command::new("python3")
        .arg(StandIn::script())
        .args(["--port", "0", "--fault", "GET:/x:404:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("flags http[0]: status 404"), "{stderr}");
}
