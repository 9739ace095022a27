//! SWE-bench's own harness, pinned and installed without its dependencies into a virtual
//! environment under the target folder (tests/common/python.rs), and tests/swebench_oracle.py,
//! which drives its eval-script writer, log parsers and grading functions.

use super::python::PythonEnv;
use serde_json::Value;
use std::process::Command;

/// The harness (4.x) whose specifications and parsers swerve's table follows.
pub const HARNESS: &[&str] = &["requirements-swebench-nodeps.txt"];
/// The 5.x harness, whose grading rules `--swebench-rules 5` follows.
pub const HARNESS_5: &[&str] = &["requirements-swebench5-nodeps.txt"];

/// The swebench version `tests/FILE` pins.
pub fn pinned_in(file: &str) -> String {
    let text = std::fs::read_to_string(super::root().join("tests").join(file)).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("swebench=="))
        .unwrap_or_else(|| panic!("tests/{file} pins swebench"))
        .to_string()
}

/// An interpreter with the harness `tests/NO_DEPS[0]` pins (installed without its dependencies).
pub fn harness_python_of(no_deps: &'static [&'static str]) -> std::path::PathBuf {
    let version = pinned_in(no_deps[0]);
    PythonEnv {
        venv: format!("swebench-{version}-venv"),
        requirements: &["requirements-swebench.txt"],
        no_deps,
        check: format!(
            "import importlib.metadata as m, sys, unidiff; sys.exit(m.version('swebench') != {version:?})"
        ),
    }
    .python()
}

/// tests/swebench_oracle.py in `mode` (`parse`, `rules`) over JSON lines `input`, one answer a
/// line.
pub fn oracle_lines(python: &std::path::Path, mode: &str, input: &[Value]) -> Vec<Value> {
    let text: String = input.iter().map(|v| format!("{v}\n")).collect();
    let mut child = Command::new(python)
        .arg(super::root().join("tests/swebench_oracle.py"))
        .arg(mode)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "tests/swebench_oracle.py {mode} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), input.len());
    lines
}
