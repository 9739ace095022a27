//! The official `openai` Python client drives swerve-serve end to end (tests/serve_openai.py):
//! completions, chat with tools, streaming, logprobs, token ids in and out, and a 20-turn loop
//! extending `prompt_token_ids` that hits the prefix cache every turn after the first.
//!
//! Needs Python 3 and the pinned client (tests/requirements-serve.txt). `SWERVE_PYTHON` names an
//! interpreter that has it; else `python3` is used when it already imports the pinned version;
//! else the test provisions a virtual environment with it under cargo's target folder (once;
//! later runs reuse it). Where that is impossible it fails with the one command that fixes it:
//! it never skips.

mod common;

use common::serve::{scripted_model, Server, MODEL_NAME};
use std::path::{Path, PathBuf};
use std::process::Command;

fn pinned_version() -> String {
    let text =
        std::fs::read_to_string(common::root().join("tests/requirements-serve.txt")).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("openai=="))
        .expect("tests/requirements-serve.txt pins openai")
        .to_string()
}

fn imports_openai(python: &Path, version: &str) -> bool {
    Command::new(python)
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == version)
}

/// An interpreter that imports the pinned `openai`, provisioning one if needed.
fn python_with_openai() -> PathBuf {
    if let Some(python) = std::env::var_os("SWERVE_PYTHON") {
        return PathBuf::from(python);
    }
    let version = pinned_version();
    let system = PathBuf::from("python3");
    if imports_openai(&system, &version) {
        return system;
    }
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("openai-{version}-venv"));
    let python = venv.join("bin/python3");
    if imports_openai(&python, &version) {
        return python;
    }
    let fix = "apt-get install python3-venv (or set SWERVE_PYTHON to a Python with `pip install -r tests/requirements-serve.txt`)";
    let made = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .output()
        .unwrap_or_else(|e| panic!("this test needs python3 ({e}): {fix}"));
    assert!(
        made.status.success(),
        "cannot create a virtual environment for the openai client: {fix}\n{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let installed = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(common::root().join("tests/requirements-serve.txt"))
        .output()
        .unwrap();
    assert!(
        installed.status.success(),
        "cannot install the pinned openai client into {}: {}\n{}",
        venv.display(),
        fix,
        String::from_utf8_lossy(&installed.stderr)
    );
    assert!(
        imports_openai(&python, &version),
        "{} cannot import openai {version} after installing it",
        python.display()
    );
    python
}

#[test]
fn the_official_openai_client_drives_the_server() {
    let python = python_with_openai();
    let server = Server::start(&scripted_model(), &["--api-key", "test-key"]);
    let out = Command::new(&python)
        .arg(common::root().join("tests/serve_openai.py"))
        .args([&server.url(), MODEL_NAME, "test-key"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/serve_openai.py failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");
    server.wait_idle();
}
