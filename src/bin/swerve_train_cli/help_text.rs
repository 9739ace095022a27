//! Every flag of every subcommand says what it is in `--help`.

use super::Cli;
use clap::CommandFactory;

/// Every flag of every subcommand says what it is in `--help`.
#[test]
fn every_argument_has_help_text() {
    fn visit(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            let help = arg
                .get_help()
                .or(arg.get_long_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            if help.trim().is_empty() {
                missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
            }
        }
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if sub
                .get_about()
                .is_none_or(|a| a.to_string().trim().is_empty())
                && sub.get_name() != "help"
            {
                missing.push(format!("{path} (no description)"));
            }
            visit(sub, &path, missing);
        }
    }
    let command = Cli::command();
    command.clone().debug_assert();
    let mut missing = Vec::new();
    visit(&command, "swerve-train", &mut missing);
    assert!(missing.is_empty(), "no help text: {missing:#?}");
    // The walk sees the flattened shared structs.
    let rl = command.find_subcommand("rl").unwrap();
    let names: Vec<&str> = rl.get_arguments().filter_map(|a| a.get_long()).collect();
    for flag in [
        "device",
        "out",
        "resume",
        "overwrite",
        "eps-low",
        "grad-clip",
        "group",
    ] {
        assert!(names.contains(&flag), "rl --{flag}: {names:?}");
    }
}

/// `--suspicious-reward` and its config key take keep, zero or penalty (default keep) in
/// `rollout`, `eval` and `rl`; anything else is refused naming the flag and the values.
#[test]
fn suspicious_reward_is_keep_zero_or_penalty() {
    use super::{Command, CONFIG};
    use swerve::agent::reward::SuspiciousReward;
    let parse = |args: &[&str]| {
        let mut all = vec!["swerve-train"];
        all.extend_from_slice(args);
        swerve::cli::try_parse::<Cli>(&CONFIG, all.iter().map(Into::into).collect())
    };
    let pick = |parsed: swerve::cli::Parsed<Cli>| match parsed.cli.command {
        Command::Rollout { args, .. } | Command::Eval { args } => {
            args.options(false, None).episode.suspicious_reward
        }
        Command::Rl { args } => args.options(None).agent.episode.suspicious_reward,
        _ => unreachable!("not an episode command"),
    };
    let chosen = |args: &[&str]| pick(parse(args).unwrap());
    let commands: [&[&str]; 3] = [
        &["rollout", "--tasks", "builtin:python-bugs"],
        &["eval", "--tasks", "builtin:python-bugs"],
        &[
            "rl",
            "--tasks",
            "builtin:toy",
            "--model",
            "preset:toy",
            "--out",
            "o",
        ],
    ];
    for command in commands {
        assert_eq!(chosen(command), SuspiciousReward::Keep, "{command:?}");
        let with = |value: &'static str| [command, &["--suspicious-reward", value]].concat();
        assert_eq!(chosen(&with("penalty")), SuspiciousReward::Penalty);
        let error = format!("{:#}", parse(&with("nope")).err().unwrap());
        assert!(
            error.contains("--suspicious-reward") && error.contains("keep, zero or penalty"),
            "{error}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("run.toml");
    let from_file = |value: &str| {
        let text = format!("tasks = \"builtin:python-bugs\"\nsuspicious-reward = \"{value}\"\n");
        std::fs::write(&file, text).unwrap();
        parse(&["rollout", "--config", file.to_str().unwrap()])
    };
    assert_eq!(pick(from_file("zero").unwrap()), SuspiciousReward::Zero);
    let error = format!("{:#}", from_file("Zero").err().unwrap());
    assert!(
        error.contains("run.toml:2") && error.contains("suspicious-reward"),
        "{error}"
    );
    assert!(error.contains("keep, zero or penalty"), "{error}");
}
