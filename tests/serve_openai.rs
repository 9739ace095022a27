//! The official `openai` Python client drives swerve-serve end to end (tests/serve_openai.py):
//! completions, chat with tools, streaming, logprobs, token ids in and out, and a 20-turn loop
//! extending `prompt_token_ids` that hits the prefix cache every turn after the first.
//!
//! Needs Python 3 and the pinned client (tests/requirements-serve.txt), provisioned as
//! tests/common/python.rs says.

mod common;

use common::python::PythonEnv;
use common::serve::{scripted_model, Server, MODEL_NAME};
use std::path::PathBuf;
use std::process::Command;

fn pinned_version() -> String {
    let text =
        std::fs::read_to_string(common::root().join("tests/requirements-serve.txt")).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("openai=="))
        .expect("tests/requirements-serve.txt pins openai")
        .to_string()
}

/// An interpreter that imports the pinned `openai`, provisioning one if needed.
fn python_with_openai() -> PathBuf {
    let version = pinned_version();
    PythonEnv {
        venv: format!("openai-{version}-venv"),
        requirements: &["requirements-serve.txt"],
        no_deps: &[],
        check: format!("import openai, sys; sys.exit(openai.__version__ != {version:?})"),
    }
    .python()
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
