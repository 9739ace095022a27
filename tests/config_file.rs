//! `--config FILE.toml` end to end on the toy (docs/config.md): `swerve-train rl --config
//! examples/toy.toml` runs the same run as the same settings given as flags (every figure of
//! `iterations.jsonl` but the wall-clock times, and `OUT/config.toml`), a typo'd key is an
//! error naming the file, the line and the closest key, `--resume` with a changed config is
//! refused, and `--config OUT/config.toml --resume` continues the run.

mod common;

use common::{bin_path, json_lines, root};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// The toy's settings, as flags: what examples/toy.toml says, written out independently (but
/// `--iterations`, which the test gives both runs, and `--out`).
const TOY_FLAGS: &[&str] = &[
    "--model",
    "preset:toy",
    "--tasks",
    "builtin:toy",
    "--seed",
    "0",
    "--tasks-per-iteration",
    "8",
    "--group",
    "16",
    "--batch-size",
    "32",
    "--lr",
    "0.001",
    "--warmup-steps",
    "0",
    "--eps-low",
    "0.2",
    "--eps-high",
    "0.3",
    "--max-turns",
    "8",
    "--turn-threshold",
    "4",
    "--max-turn-tokens",
    "1",
    "--concurrency",
    "64",
    "--rft-first",
    "64",
    "--rft-lr",
    "1e-3",
    "--rft-warmup-steps",
    "0",
    "--rft-batch-size",
    "32",
    "--rft-epochs",
    "1",
];

/// `swerve-train rl ARGS --device cpu`.
fn rl(args: &[&str]) -> Output {
    Command::new(bin_path("swerve-train"))
        .arg("rl")
        .args(args)
        .args(["--device", "cpu"])
        .current_dir(root())
        .output()
        .unwrap()
}

fn succeeds(args: &[&str]) {
    let out = rl(args);
    assert!(
        out.status.success(),
        "swerve-train rl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn refused(args: &[&str]) -> String {
    let out = rl(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} ran:\n{stderr}");
    stderr
}

/// A line of `iterations.jsonl` without its wall-clock figures (the only part a rerun may
/// change): the `time_s` split and rates per second.
fn without_times(mut line: Value) -> Value {
    let object = line.as_object_mut().unwrap();
    object.retain(|key, _| key != "time_s" && !key.ends_with("_per_s"));
    line
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_toy_from_its_config_file_equals_the_toy_from_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toy");
    let out_arg = out.to_str().unwrap();
    let short = ["--iterations", "2", "--out", out_arg];
    let mut args = vec!["--config", "examples/toy.toml"];
    args.extend(short);
    succeeds(&args);
    let from_file = (
        json_lines(&out.join("iterations.jsonl")),
        read(&out.join("config.toml")),
    );
    // The same settings as flags, into the same folder (so OUT/config.toml's `out` agrees).
    let mut args = TOY_FLAGS.to_vec();
    args.extend(short);
    args.push("--overwrite");
    succeeds(&args);
    let from_flags = (
        json_lines(&out.join("iterations.jsonl")),
        read(&out.join("config.toml")),
    );
    assert_eq!(from_file.1, from_flags.1);
    assert_eq!(from_file.0.len(), 3, "the RFT phase and two iterations");
    assert_eq!(from_file.0.len(), from_flags.0.len());
    for (a, b) in from_file.0.into_iter().zip(from_flags.0) {
        assert_eq!(without_times(a), without_times(b));
    }
    // Every value the run used, the command line's over the file's.
    let config = from_file.1;
    for line in [
        "iterations = 2",
        "lr = 0.001",
        "rft-first = 64",
        "group = 16",
        "model = \"preset:toy\"",
        "no-rft-first = false",
        "sandbox-bind = []",
        "exact-logprobs = true",
        "device = \"cpu\"",
        &format!("out = {out_arg:?}"),
    ] {
        assert!(config.lines().any(|l| l == line), "{line} in\n{config}");
    }
    assert!(!config.contains("overwrite"), "{config}");
}

#[test]
fn a_typo_in_a_config_file_is_an_error_with_its_line_and_the_closest_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.toml");
    let toy = read(&root().join("examples/toy.toml"));
    let typo = toy.replace("\nbatch-size = 32\n", "\nbatch-szie = 32\n");
    assert_ne!(toy, typo);
    std::fs::write(&file, &typo).unwrap();
    let line = 1 + typo[..typo.find("batch-szie").unwrap()]
        .matches('\n')
        .count();
    let out = dir.path().join("never");
    let stderr = refused(&[
        "--config",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let want = format!(
        "{}:{line}: unknown key `batch-szie` for `swerve-train rl`: did you mean `batch-size`?",
        file.display()
    );
    assert!(stderr.contains(&want), "{want} in:\n{stderr}");
    assert!(!out.exists(), "nothing ran");
    // A flag of another command names the commands that take it.
    std::fs::write(&file, format!("{toy}only-resolved = true\n")).unwrap();
    let stderr = refused(&["--config", file.to_str().unwrap()]);
    assert!(
        stderr.contains("`only-resolved` is not a flag of `swerve-train rl`: rollout takes it"),
        "{stderr}"
    );
}

#[test]
fn a_resume_with_a_changed_config_is_refused_and_the_recorded_one_continues() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toy");
    let out_arg = out.to_str().unwrap();
    let common = ["--out", out_arg, "--no-rft-first", "--save-every", "1"];
    let mut args = vec!["--config", "examples/toy.toml", "--iterations", "1"];
    args.extend(common);
    succeeds(&args);
    let recorded = out.join("config.toml");
    let before = read(&recorded);
    // The config file with another learning rate.
    let changed = dir.path().join("changed.toml");
    let toy = read(&root().join("examples/toy.toml"));
    std::fs::write(&changed, toy.replace("\nlr = 1e-3\n", "\nlr = 2e-3\n")).unwrap();
    let mut args = vec!["--config", changed.to_str().unwrap(), "--iterations", "2"];
    args.extend(common);
    args.push("--resume");
    let stderr = refused(&args);
    let hint = format!(
        "`--config {} --resume` repeats them all",
        recorded.display()
    );
    assert!(
        stderr.contains("--lr: 0.001 in the run, 0.002 now") && stderr.contains(&hint),
        "{stderr}"
    );
    assert_eq!(
        read(&recorded),
        before,
        "a refused resume leaves the run's config"
    );
    // The recorded configuration continues the run (a resume may extend it).
    let recorded_arg = recorded.to_str().unwrap();
    succeeds(&["--config", recorded_arg, "--resume", "--iterations", "2"]);
    assert_eq!(json_lines(&out.join("iterations.jsonl")).len(), 2);
    let after = read(&recorded);
    assert!(after.contains("\niterations = 2\n"), "{after}");
    assert_eq!(
        after.replace("\niterations = 2\n", "\niterations = 1\n"),
        before
    );
}

#[test]
fn swerve_serve_takes_a_config_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    std::fs::write(&file, "port = 0\nmax-num-seq = 4\n").unwrap();
    let serve = |args: &[&str]| {
        Command::new(bin_path("swerve-serve"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = serve(&["--config", file.to_str().unwrap(), "--model", "x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let want = format!(
        "{}:2: unknown key `max-num-seq` for `swerve-serve`: did you mean `max-num-seqs`?",
        file.display()
    );
    assert!(stderr.contains(&want), "{want} in:\n{stderr}");
    // The file's model is the one the server tries to load.
    let missing = dir.path().join("no-such-model");
    let text = format!(
        "model = {:?}\nport = 0\ndevice = \"cpu\"\n",
        missing.to_str().unwrap()
    );
    std::fs::write(&file, text).unwrap();
    let out = serve(&["--config", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no-such-model"), "{stderr}");
    // The example parses (keys, types, values), the command line over it.
    let out = Command::new(bin_path("swerve-serve"))
        .args(["--config", "examples/serve.toml", "--port", "8001"])
        .env("SWERVE_PARSE_ONLY", "1")
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
}
