//! The Kubernetes API stand-in (tests/k8s_standin/standin.py, docs/kubernetes-standin.md) as a
//! child process: started on a free port with its own instance label, its fault-injection and
//! statistics endpoints, the containers it started, and SIGTERM (it then removes them) on drop.

use super::root;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub struct StandIn {
    child: Child,
    pub port: u16,
    /// The label value on every container this stand-in starts
    /// (`swerve.k8s-standin.instance=...`).
    pub instance: String,
    log: tempfile::NamedTempFile,
}

impl StandIn {
    /// Starts `python3 tests/k8s_standin/standin.py --port 0` with `extra` flags (`--fault`,
    /// `--drop-exec`, `--docker-cli`) and waits for its `listening PORT` line.
    pub fn start(extra: &[&str]) -> StandIn {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let instance = format!(
            "t{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        );
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new("python3")
            .arg(Self::script())
            .args(["--port", "0", "--instance", &instance])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("the k8s stand-in needs python3: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the k8s stand-in printed {line:?}, not `listening PORT`; its log:\n{}",
                    std::fs::read_to_string(log.path()).unwrap_or_default()
                )
            });
        StandIn {
            child,
            port,
            instance,
            log,
        }
    }

    pub fn script() -> PathBuf {
        root().join("tests/k8s_standin/standin.py")
    }

    /// `http://127.0.0.1:PORT`, the API server's URL for a client.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// One request to the stand-in: (status, body as JSON).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let (status, raw) =
            swerve::http_client::http_request(&self.addr(), method, path, &[], body).unwrap();
        let value = serde_json::from_slice(&raw).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: answer {status} is not JSON ({e}): {}",
                String::from_utf8_lossy(&raw)
            )
        });
        (status, value)
    }

    /// Adds fault rules (`POST /standin/faults`, the body docs/kubernetes-standin.md describes).
    pub fn add_faults(&self, rules: &Value) {
        let (status, answer) = self.request("POST", "/standin/faults", Some(rules));
        assert_eq!(status, 200, "POST /standin/faults {rules}: {answer}");
    }

    pub fn clear_faults(&self) {
        let (status, answer) = self.request("DELETE", "/standin/faults", None);
        assert_eq!(status, 200, "DELETE /standin/faults: {answer}");
    }

    /// `GET /standin/stats`: requests, injected answers by status, exec sessions and drops.
    pub fn stats(&self) -> Value {
        self.request("GET", "/standin/stats", None).1
    }

    /// Ids of the containers (running or not) this stand-in started and has not removed.
    pub fn containers(&self) -> Vec<String> {
        let filter = format!("label=swerve.k8s-standin.instance={}", self.instance);
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker ps: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// SIGTERM and wait (it removes its containers first); false when it had to be killed.
    pub fn stop(&mut self) -> bool {
        if self.child.try_wait().unwrap().is_some() {
            return true;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..1200 {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop();
    }
}
