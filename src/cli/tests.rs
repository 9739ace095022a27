//! The `--config` merge on a small clap command with the shapes the binaries use: a required
//! path, an optional range-checked number, a number with a default, switches, a repeated flag,
//! a comma-separated list, a global flag, and a subcommand without `--config`.

use super::numbers::positive_f64;
use super::*;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(name = "tool")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    /// A global switch with a value.
    #[arg(long, global = true, default_value_t = true, action = clap::ArgAction::Set)]
    exact: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Takes --config.
    Train {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_parser = positive_f64)]
        lr: Option<f64>,
        #[arg(long, default_value_t = 64)]
        batch_size: u64,
        #[arg(long)]
        resume: bool,
        #[arg(long)]
        bind: Vec<PathBuf>,
        #[arg(long, value_delimiter = ',')]
        seq_lens: Vec<usize>,
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Takes --config too.
    Roll {
        #[arg(long)]
        only_resolved: bool,
        #[arg(long, default_value_t = 10)]
        group: usize,
    },
    /// No --config.
    Score {
        #[arg(long)]
        input: PathBuf,
    },
}

const SPEC: ConfigSpec = ConfigSpec {
    subcommands: &["train", "roll"],
    not_recorded: &["resume"],
};

/// Parses `tool ARGS`, with `--config DIR/c.toml` holding `file` when given.
fn parse(dir: &Path, file: Option<&str>, args: &[&str]) -> anyhow::Result<Parsed<Cli>> {
    let mut argv: Vec<std::ffi::OsString> = vec!["tool".into()];
    argv.extend(args.iter().map(Into::into));
    if let Some(text) = file {
        let path = dir.join("c.toml");
        std::fs::write(&path, text).unwrap();
        argv.extend(["--config".into(), path.into_os_string()]);
    }
    try_parse(&SPEC, argv)
}

fn error(dir: &Path, file: &str, args: &[&str]) -> String {
    match parse(dir, Some(file), args) {
        Ok(parsed) => panic!("{file:?} parsed: {:?}", parsed.cli),
        Err(e) => format!("{e:#}"),
    }
}

const FULL: &str = r#"
out = "runs/a"
lr = 1e-3
batch-size = 16
resume = true
bind = ["/a", "/b"]
seq-lens = [128, 512]
exact = false
"#;

#[test]
fn a_file_alone_sets_every_kind_of_flag() {
    let dir = tempfile::tempdir().unwrap();
    let parsed = parse(dir.path(), Some(FULL), &["train"]).unwrap();
    let Cmd::Train {
        out,
        lr,
        batch_size,
        resume,
        bind,
        seq_lens,
        device,
    } = parsed.cli.command
    else {
        panic!("{:?}", parsed.cli.command)
    };
    assert_eq!(out, PathBuf::from("runs/a"));
    assert_eq!(lr, Some(1e-3));
    assert_eq!(batch_size, 16);
    assert!(resume);
    assert_eq!(bind, [PathBuf::from("/a"), PathBuf::from("/b")]);
    assert_eq!(seq_lens, [128, 512]);
    assert_eq!(device, "auto");
    assert!(!parsed.cli.exact);
    let resolved = parsed.resolved.unwrap();
    assert_eq!(resolved.get("lr"), Some(&FlagValue::Float(1e-3)));
    assert_eq!(resolved.get("batch-size"), Some(&FlagValue::Integer(16)));
    assert_eq!(
        resolved.get("device"),
        Some(&FlagValue::Text("auto".into()))
    );
    assert_eq!(resolved.get("exact"), Some(&FlagValue::Bool(false)));
    let seq_lens = FlagValue::List(vec![FlagValue::Integer(128), FlagValue::Integer(512)]);
    assert_eq!(resolved.get("seq-lens"), Some(&seq_lens));
    // How this invocation treats OUT is not the run's configuration.
    assert_eq!(resolved.get("resume"), None);
    assert!(!resolved.to_toml().contains("resume"));
}

#[test]
fn flags_on_the_command_line_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "train",
        "--lr",
        "2e-3",
        "--batch-size=8",
        "--bind",
        "/c",
        "--exact",
        "true",
    ];
    let parsed = parse(dir.path(), Some(FULL), &args).unwrap();
    let Cmd::Train {
        out,
        lr,
        batch_size,
        bind,
        seq_lens,
        ..
    } = parsed.cli.command
    else {
        panic!()
    };
    assert_eq!(
        (out, lr, batch_size),
        (PathBuf::from("runs/a"), Some(2e-3), 8)
    );
    // A list given on the command line replaces the file's, element by element.
    assert_eq!(bind, [PathBuf::from("/c")]);
    assert_eq!(seq_lens, [128, 512]);
    assert!(parsed.cli.exact);
    // The global flag given before the subcommand overrides the file too.
    let parsed = parse(dir.path(), Some(FULL), &["--exact", "true", "train"]).unwrap();
    assert!(parsed.cli.exact);
}

#[test]
fn the_resolved_configuration_is_the_same_from_a_file_or_from_flags_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let from_file = parse(dir.path(), Some(FULL), &["train"]).unwrap();
    let flags = [
        "train",
        "--out",
        "runs/a",
        "--lr",
        "0.001",
        "--batch-size",
        "16",
        "--bind",
        "/a",
        "--bind",
        "/b",
        "--seq-lens",
        "128,512",
        "--exact",
        "false",
    ];
    let from_flags = parse(dir.path(), None, &flags).unwrap();
    let text = from_file.resolved.unwrap().to_toml();
    assert_eq!(text, from_flags.resolved.unwrap().to_toml());
    assert!(text.contains("\nlr = 0.001\n"), "{text}");
    assert!(text.contains("\nbind = [\"/a\", \"/b\"]\n"), "{text}");
    let again = parse(dir.path(), Some(&text), &["train"]).unwrap();
    assert_eq!(again.resolved.unwrap().to_toml(), text);
}

#[test]
fn an_unknown_key_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let e = error(dir.path(), "out = \"x\"\n\ntemperature = 1\n", &["train"]);
    let want = format!(
        "{}:3: unknown key `temperature` for `tool train` (the keys are its flags: `tool train --help`)",
        dir.path().join("c.toml").display()
    );
    assert_eq!(e, want);
}

#[test]
fn a_typo_suggests_the_closest_key() {
    let dir = tempfile::tempdir().unwrap();
    let e = error(dir.path(), "out = \"x\"\nbatch-szie = 3\n", &["train"]);
    assert!(
        e.ends_with(
            "c.toml:2: unknown key `batch-szie` for `tool train`: did you mean `batch-size`?"
        ),
        "{e}"
    );
    let e = error(dir.path(), "batch_size = 3\n", &["train"]);
    assert!(
        e.contains("c.toml:1:") && e.contains("`batch-size`?"),
        "{e}"
    );
}

#[test]
fn a_key_of_another_subcommand_says_which_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let e = error(
        dir.path(),
        "out = \"x\"\nonly-resolved = true\n",
        &["train"],
    );
    assert!(
        e.ends_with("c.toml:2: `only-resolved` is not a flag of `tool train`: roll takes it"),
        "{e}"
    );
    let e = error(dir.path(), "input = \"x\"\n", &["roll"]);
    assert!(
        e.contains("`input` is not a flag of `tool roll`: score takes it"),
        "{e}"
    );
}

#[test]
fn a_wrong_type_names_the_line_the_key_and_both_types() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "batch-size = \"16\"",
            "`batch-size` takes an integer, not a string",
        ),
        (
            "batch-size = 1.5",
            "`batch-size` takes an integer, not a float",
        ),
        ("lr = \"1e-3\"", "`lr` takes a number, not a string"),
        (
            "resume = \"yes\"",
            "`resume` takes true or false, not a string",
        ),
        ("out = 3", "`out` takes a string, not an integer"),
        (
            "bind = \"/a\"",
            "`bind` takes an array, each element a string, not a string",
        ),
        (
            "seq-lens = [1, \"x\"]",
            "`seq-lens` takes an array, each element an integer, not an array",
        ),
        ("exact = 1", "`exact` takes true or false, not an integer"),
        (
            "[train]\nlr = 1",
            "`train` is a table: a config file holds `flag = value` lines only",
        ),
        ("a.b = 1", "`a` is a table"),
    ];
    for (line, want) in cases {
        let e = error(
            dir.path(),
            &format!("device = \"cpu\"\n{line}\n"),
            &["train"],
        );
        assert!(e.contains("c.toml:2: ") && e.contains(want), "{line}: {e}");
    }
    // Every problem of the file at once, in line order: types, unknown keys, refused values.
    let e = error(
        dir.path(),
        "lr = \"a\"\nbatch-size = -1\nbatchsize = 2\n",
        &["train"],
    );
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "{e}");
    assert!(lines[0].contains(":1: `lr` takes a number"), "{e}");
    assert!(
        lines[1].contains(":2: `batch-size`: invalid value '-1'"),
        "{e}"
    );
    assert!(lines[2].contains(":3: unknown key `batchsize`"), "{e}");
}

#[test]
fn a_value_the_flag_refuses_is_an_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let e = error(dir.path(), "out = \"x\"\n\nlr = -1\n", &["train"]);
    assert!(
        e.contains("c.toml:3: `lr`: invalid value '-1' for '--lr <LR>': -1 must be greater than 0"),
        "{e}"
    );
    let e = error(
        dir.path(),
        "out = \"x\"\nlr = 1e-3\nlr = 2e-3\n",
        &["train"],
    );
    assert!(e.contains("c.toml:3: not TOML"), "{e}");
    let e = error(dir.path(), "out = \"x\nlr = 1\n", &["train"]);
    assert!(e.contains("c.toml:1: not TOML"), "{e}");
}

#[test]
fn required_flags_may_come_from_either_place_but_must_come() {
    let dir = tempfile::tempdir().unwrap();
    let parsed = parse(dir.path(), Some("lr = 1\n"), &["train", "--out", "o"]).unwrap();
    assert!(matches!(
        parsed.cli.command,
        Cmd::Train { lr: Some(1.0), .. }
    ));
    let e = error(dir.path(), "lr = 1\n", &["train"]);
    assert!(e.contains("--out <OUT>"), "{e}");
}

#[test]
fn a_command_without_config_parses_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let parsed = parse(dir.path(), None, &["score", "--input", "x"]).unwrap();
    assert!(parsed.resolved.is_none());
    let e = error(dir.path(), "input = \"x\"\n", &["score"]);
    assert!(e.contains("--config"), "{e}");
}

#[test]
fn unset_flags_take_the_defaults_the_command_computes() {
    let dir = tempfile::tempdir().unwrap();
    let mut resolved = parse(dir.path(), None, &["train", "--out", "o"])
        .unwrap()
        .resolved
        .unwrap();
    assert_eq!(resolved.get("lr"), None);
    assert!(resolved.to_toml().contains("\n# lr: not set\n"));
    #[derive(serde::Serialize)]
    struct Defaults {
        lr: f32,
        batch_size: u64,
    }
    resolved
        .fill_unset(Defaults {
            lr: 0.3,
            batch_size: 1,
        })
        .unwrap();
    // The f32 as the decimal it prints as; a set flag keeps its value.
    assert_eq!(resolved.get("lr"), Some(&FlagValue::Float(0.3)));
    assert_eq!(resolved.get("batch-size"), Some(&FlagValue::Integer(64)));
    let e = resolved
        .fill_unset(serde_json::json!({"nope": 1}))
        .unwrap_err();
    assert!(e.to_string().contains("`nope`"), "{e}");
}
