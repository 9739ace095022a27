//! The official `openai` Python client drives swerve-serve end to end (tests/serve_openai.py):
//! completions, chat with tools, streaming, logprobs, token ids in and out, and a 20-turn loop
//! extending `prompt_token_ids` that hits the prefix cache every turn after the first.
//!
//! Needs Python 3 with the pinned client (`python3 -m pip install -r tests/requirements-serve.txt`,
//! which `.ci/run` does); `SWERVE_PYTHON` names another interpreter. Without them this test fails,
//! saying so: it never skips.

mod common;

use common::serve::{scripted_model, Server, MODEL_NAME};
use std::process::Command;

#[test]
fn the_official_openai_client_drives_the_server() {
    let python = std::env::var("SWERVE_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python} ({e}): this test needs Python 3 with the `openai` package (python3 -m pip install -r tests/requirements-serve.txt; .ci/run does it)")
        });
    assert!(
        probe.status.success(),
        "{python} cannot import openai: install it with `python3 -m pip install -r tests/requirements-serve.txt` (.ci/run does it):\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
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
