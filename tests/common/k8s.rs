//! The Kubernetes API stand-in (tests/k8s_standin/standin.py) for tests/env_kubernetes.rs: started
//! on a free port, a kubeconfig pointing at it written to a temporary folder, stopped (SIGTERM:
//! it removes its containers) when dropped; plain HTTP/1.0 calls to read pods and set faults.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The namespace every test's kubeconfig context names.
pub const NAMESPACE: &str = "swerve-test";

pub struct Standin {
    child: Child,
    pub port: u16,
    pub kubeconfig: PathBuf,
    /// The stand-in's stderr (its log).
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Standin {
    /// Starts a stand-in with `extra` flags (`--fault ...`, `--drop-exec ...`).
    pub fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("standin.log");
        let script = super::root().join("tests/k8s_standin/standin.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let port: u16 = first
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("the stand-in said {first:?}, not `listening PORT`; its log:\n{log}")
            });
        // Whatever else it prints is drained, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: standin\n  user: {{}}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n    namespace: {NAMESPACE}\ncurrent-context: standin\n"
            ),
        )
        .unwrap();
        Self {
            child,
            port,
            kubeconfig,
            log,
            _dir: dir,
        }
    }

    /// One HTTP/1.0 call; the status and the body.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path}: no status in {head:?}"));
        (status, body.to_string())
    }

    pub fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.request("GET", path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// `POST /standin/faults`.
    pub fn add_faults(&self, rules: Value) {
        let (status, body) = self.request("POST", "/standin/faults", Some(&rules));
        assert!((200..300).contains(&status), "POST /standin/faults {rules}: {status} {body}");
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        // SIGTERM: it removes its containers, then exits.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid; no memory involved.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The names of the pods of run `run` (every swerve pod when `None`) in `namespace`, through
/// the API.
pub fn list_pods(standin: &Standin, namespace: &str, run: Option<&str>) -> Vec<String> {
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
pub fn docker_of_run(run: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=swerve.run={run}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
