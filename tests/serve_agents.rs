//! litellm and mini-swe-agent drive swerve-serve (tests/serve_agents.py): a multi-turn
//! tool-calling loop through litellm (non-streaming and streaming), and a mini-swe-agent 2.x
//! episode (DefaultAgent, LitellmModel, LocalEnvironment, unchanged) against a model folder
//! built here that deterministically calls its `bash` tool, three steps, ending `Submitted`.
//!
//! Needs Python 3 with litellm and mini-swe-agent (tests/requirements-agents.txt, and
//! tests/requirements-agents-nodeps.txt installed without its ~170 MB of declared dependencies
//! the agent never imports), provisioned as tests/common/python.rs says. Nothing leaves the
//! machine: litellm reads its bundled model cost map and mini-swe-agent's config folder is a
//! temporary one.

mod common;

use common::python::PythonEnv;
use common::serve::{agent_model, Server, MODEL_NAME};
use std::process::Command;

#[test]
fn litellm_and_mini_swe_agent_drive_the_server() {
    let python = PythonEnv {
        venv: "agents-litellm-1.110.2-mswea-2.4.6-venv".into(),
        requirements: &["requirements-agents.txt"],
        no_deps: &["requirements-agents-nodeps.txt"],
        check: "import litellm, minisweagent.agents.default, minisweagent.models.litellm_model"
            .into(),
    }
    .python();
    let server = Server::start(
        &agent_model(),
        &["--api-key", "agent-key", "--max-model-len", "4096"],
    );
    let work = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    let out = Command::new(&python)
        .arg(common::root().join("tests/serve_agents.py"))
        .args([&server.url(), MODEL_NAME, "agent-key"])
        .arg(work.path())
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_TELEMETRY", "False")
        .env("MSWEA_SILENT_STARTUP", "1")
        .env("MSWEA_GLOBAL_CONFIG_DIR", config.path())
        .env("MSWEA_COST_TRACKING", "ignore_errors")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tests/serve_agents.py failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.stderr()
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{stdout}");
    server.wait_idle();
}
