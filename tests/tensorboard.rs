//! `OUT/tb/` read by TensorBoard's own reader (tests/tensorboard_read.py: the `tensorboard`
//! package's `EventAccumulator` and `EventFileLoader`): after the toy `rl` run and an `rft` run,
//! each stopped and resumed, every scalar of every line of `iterations.jsonl` and
//! `metrics.jsonl` is there once, at its step, with its value in f32, and nothing else is.
//!
//! Needs Python 3 and the pinned `tensorboard` (tests/requirements-tensorboard.txt), provisioned
//! as tests/common/python.rs says.

mod common;

use common::python::PythonEnv;
use common::{bin_path, fixture_dir, json_lines};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn pinned_version() -> String {
    let text =
        std::fs::read_to_string(common::root().join("tests/requirements-tensorboard.txt")).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("tensorboard=="))
        .expect("tests/requirements-tensorboard.txt pins tensorboard")
        .to_string()
}

/// An interpreter that imports the pinned `tensorboard`, provisioning one if needed.
fn python_with_tensorboard() -> PathBuf {
    let version = pinned_version();
    PythonEnv {
        venv: format!("tensorboard-{version}-venv"),
        requirements: &["requirements-tensorboard.txt"],
        no_deps: &[],
        check: format!(
            "import tensorboard, sys; \
             from tensorboard.backend.event_processing import event_accumulator; \
             sys.exit(tensorboard.__version__ != {version:?})"
        ),
    }
    .python()
}

/// tests/tensorboard_read.py on `out`; returns its report.
fn check_with_tensorboard(out: &Path) -> String {
    let result = Command::new(python_with_tensorboard())
        .arg(common::root().join("tests/tensorboard_read.py"))
        .arg(out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    assert!(
        result.status.success(),
        "tests/tensorboard_read.py {} failed:\n{stdout}\n{}",
        out.display(),
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    eprintln!("{}: {stdout}", out.display());
    stdout
}

fn swerve_train(args: &[&str]) -> String {
    let result = Command::new(bin_path("swerve-train"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert!(
        result.status.success(),
        "swerve-train {args:?} failed:\n{stderr}"
    );
    stderr
}

fn event_files(out: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("tb"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// A run "killed" while writing its event file: half a record at its end.
fn tear_the_last_event_file(out: &Path) {
    let last = event_files(out).pop().unwrap();
    let mut file = std::fs::OpenOptions::new().append(true).open(last).unwrap();
    file.write_all(&[0x20, 0, 0, 0, 0, 0, 0, 0, 1, 2]).unwrap();
}

#[test]
fn the_toy_rl_run_stopped_and_resumed_shows_every_scalar_once_in_tensorboard() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toy");
    let args = |iterations: &str, extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "rl",
            "--model",
            "preset:toy",
            "--tasks",
            "builtin:toy",
            "--rft-first",
            "4",
            "--save-every",
            "2",
            "--device",
            "cpu",
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(out.to_str().unwrap().into());
        args.extend(["--iterations".into(), iterations.into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run =
        |args: Vec<String>| swerve_train(&args.iter().map(String::as_str).collect::<Vec<_>>());
    run(args("3", &[]));
    assert_eq!(event_files(&out).len(), 1);
    check_with_tensorboard(&out);
    // Stopped after iteration 3 (its checkpoint never written): the resume continues from
    // iteration 2, so iteration 3 and its steps come again, from a new event file.
    std::fs::remove_dir_all(out.join("iteration-000003")).unwrap();
    tear_the_last_event_file(&out);
    let stderr = run(args("4", &["--resume"]));
    assert!(stderr.contains("incomplete last record"), "{stderr}");
    assert_eq!(event_files(&out).len(), 2);
    let iterations = json_lines(&out.join("iterations.jsonl"));
    let seen: Vec<u64> = iterations
        .iter()
        .map(|l| l["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    let report = check_with_tensorboard(&out);
    assert!(report.contains("in 2 event file(s)"), "{report}");
    // --overwrite removes OUT/tb with the rest.
    run(args("1", &["--overwrite", "--no-rft-first"]));
    assert_eq!(event_files(&out).len(), 1);
    check_with_tensorboard(&out);
}

#[test]
fn an_rft_run_stopped_and_resumed_shows_every_scalar_once_in_tensorboard() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("rft.jsonl");
    let lines: String = (0..6)
        .map(|i| {
            let tokens = common::tokens(i, 24, 300);
            let mask = [vec![0; 8], vec![1; 16]].concat();
            format!("{}\n", json!({"tokens": tokens, "action_mask": mask}))
        })
        .collect();
    std::fs::write(&data, lines).unwrap();
    let out = dir.path().join("out");
    let model = fixture_dir("untied-gqa2-odd-f32");
    let mut args = vec![
        "rft",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--batch-size",
        "2",
        "--epochs",
        "3",
        "--save-every",
        "3",
    ];
    swerve_train(&args);
    assert_eq!(json_lines(&out.join("metrics.jsonl")).len(), 9);
    check_with_tensorboard(&out);
    // Stopped during step 7 (no checkpoint after step 6): steps 7 to 9 come again.
    for gone in ["step-000009", "final"] {
        std::fs::remove_dir_all(out.join(gone)).unwrap();
    }
    args.push("--resume");
    let stderr = swerve_train(&args);
    assert!(stderr.contains("resuming after step 6"), "{stderr}");
    assert_eq!(json_lines(&out.join("metrics.jsonl")).len(), 9);
    let report = check_with_tensorboard(&out);
    assert!(report.contains("in 2 event file(s)"), "{report}");
}
