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
