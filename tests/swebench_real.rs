//! A real SWE-bench instance graded by swerve and by the harness's own code on the same log
//! (issue 35): `marshmallow-code__marshmallow-1359` (SWE-bench Lite, dev split), its repository
//! built locally at the instance's base commit (swerve-test-marshmallow:1 from
//! scripts/docker-test-images.sh; what it holds and where it comes from:
//! tests/fixtures/docker/marshmallow/SOURCE.md) and installed as the harness installs it. The
//! gold patch resolves and no patch does not, by swerve's verdict and by the pinned harness's
//! parser and grading functions (4.1.0, and 5.0.2's grading) reading the log swerve's grading
//! printed. Ignored without a Docker daemon; `.ci/run` runs it with `--ignored` in its docker
//! stage.

mod common;

use common::swebench::{harness_python_of, oracle_lines, HARNESS, HARNESS_5};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use swerve::env::docker::{new_run_id, DockerConfig, DockerEnvironment};
use swerve::env::grading::grade_fresh;
use swerve::env::{load_tasks, Grading, Limits, Task};

const IMAGE: &str = "swerve-test-marshmallow:1";
const REPO: &str = "marshmallow-code/marshmallow";
const FAIL_TO_PASS: &str =
    "tests/test_fields.py::TestParentAndName::test_datetime_list_inner_format";

fn fixture(name: &str) -> String {
    let path = common::root()
        .join("tests/fixtures/docker/marshmallow")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn environment() -> DockerEnvironment {
    let mut config = DockerConfig::new(Limits {
        command_timeout: Duration::from_secs(120),
        output_bytes: 1 << 16,
        output_kill_bytes: 8 << 20,
        memory_bytes: 2 << 30,
        processes: 128,
        file_bytes: 64 << 20,
    });
    config.tmp_bytes = 256 << 20;
    config.cli_timeout = Duration::from_secs(60);
    config.run_id = format!("test-{}", new_run_id());
    DockerEnvironment::new(config).expect("a docker daemon")
}

/// The instance's line as SWE-bench's dataset has it (no test command: the per-repository
/// table gives marshmallow 3.0's), with the image's base commit.
fn instance(dir: &std::path::Path) -> Task {
    let out = Command::new("docker")
        .args([
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"swerve.base_commit\"}}",
        ])
        .arg(IMAGE)
        .output()
        .expect("the docker CLI");
    assert!(
        out.status.success(),
        "{IMAGE}: run scripts/docker-test-images.sh: {out:?}"
    );
    let base_commit = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let pass_to_pass: Vec<String> = serde_json::from_str(&fixture("PASS_TO_PASS.json")).unwrap();
    assert_eq!(pass_to_pass.len(), 76);
    let line = json!({
        "instance_id": "marshmallow-code__marshmallow-1359", "repo": REPO, "version": "3.0",
        "base_commit": base_commit, "image_name": IMAGE,
        "problem_statement": "3.0: DateTime fields cannot be used as inner field for List or Tuple fields",
        "patch": fixture("gold.patch"), "test_patch": fixture("test.patch"),
        "FAIL_TO_PASS": json!([FAIL_TO_PASS]).to_string(),
        "PASS_TO_PASS": json!(pass_to_pass).to_string(),
    });
    let path: PathBuf = dir.join("tasks.jsonl");
    std::fs::write(&path, format!("{line}\n")).unwrap();
    load_tasks(&path).unwrap().remove(0)
}

/// Whether the harness `no_deps` pins resolves the instance from `statuses` (its parser's).
fn harness_resolves(no_deps: &'static [&'static str], task: &Task, statuses: &Value) -> bool {
    let Grading::Tests(plan) = &task.grading else {
        panic!("a task with tests")
    };
    let case = json!({"f2p": plan.fail_to_pass, "p2p": plan.pass_to_pass, "statuses": statuses});
    oracle_lines(&harness_python_of(no_deps), "rules", &[case])[0]["resolved"]
        .as_bool()
        .unwrap()
}

#[test]
#[ignore = "needs a Docker daemon and the test images (scripts/docker-test-images.sh): .ci/run runs it with --ignored"]
fn a_real_instance_is_graded_as_the_harness_grades_it_gold_resolved_no_patch_not() {
    let dir = tempfile::tempdir().unwrap();
    let env = environment();
    let task = instance(dir.path());
    let Grading::Tests(plan) = &task.grading else {
        panic!("a task with tests")
    };
    // The harness's command, its directive shell-quoted.
    assert_eq!(plan.command, "pytest -rA 'tests/test_fields.py'");
    for (name, patch, resolves) in [
        ("gold", fixture("gold.patch"), true),
        ("none", String::new(), false),
    ] {
        let graded = grade_fresh(&env, &task, plan, &patch, &format!("real-{name}")).unwrap();
        let verdict = serde_json::to_string(&graded.verdict).unwrap();
        assert_eq!(
            graded.resolved, resolves,
            "{name}: {verdict}\n{}",
            graded.output.output
        );
        if !resolves {
            assert!(verdict.contains(FAIL_TO_PASS), "{name}: {verdict}");
        }
        // The harness reads the same log: its parser, then its grading functions.
        let log = &graded.output.output;
        let parsed = oracle_lines(
            &harness_python_of(HARNESS),
            "parse",
            &[json!({"repo": REPO, "log": log})],
        );
        let statuses = &parsed[0]["statuses"];
        assert_eq!(
            statuses[FAIL_TO_PASS],
            json!(if resolves { "PASSED" } else { "FAILED" }),
            "{name}: {statuses}"
        );
        for harness in [HARNESS, HARNESS_5] {
            assert_eq!(
                harness_resolves(harness, &task, statuses),
                resolves,
                "{name}, harness {harness:?}: {statuses}"
            );
        }
    }
}
