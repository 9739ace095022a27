//! `--config FILE.toml`: flag values from a file, for any clap command, with nothing written per
//! flag. Every flag has a key of the same name (`tasks-per-iteration = 300`, `lr = 1e-6`,
//! `resume = true`, `sandbox-bind = ["/data"]`); flags given on the command line override the
//! file.
//!
//! ```text
//!   1. parse the command line with every flag optional (a required flag may come from the file)
//!   2. read FILE: each key must be a flag of the command, its value of the flag's type
//!      (else an error naming FILE:LINE and the key); each becomes --key=VALUE arguments,
//!      checked alone by the flag's own value parser (its errors get FILE:LINE too)
//!   3. drop the keys whose flag the command line set (ArgMatches::value_source), append the
//!      rest to the command line, and parse again with the real command
//!   4. read every flag's final value back from the matches: the resolved configuration
//! ```

use super::file_entries::{read_entries, FileEntry, Target};
use super::resolved::ResolvedConfig;
use anyhow::{anyhow, Context, Result};
use clap::parser::ValueSource;
use clap::{Arg, Command, Parser};
use std::ffi::OsString;
use std::path::PathBuf;

/// Which commands of a binary take `--config`, and what is left out of their resolved
/// configuration.
pub struct ConfigSpec {
    /// Subcommands that take `--config`; empty: the top-level command takes it (a binary
    /// without subcommands).
    pub subcommands: &'static [&'static str],
    /// Flags about how this invocation treats its output folder, not about the run
    /// (`resume`, `overwrite`): accepted in a file, left out of the resolved configuration.
    pub not_recorded: &'static [&'static str],
}

/// The parsed command line, and for a command that takes `--config`, every flag's final value.
pub struct Parsed<P> {
    pub cli: P,
    pub resolved: Option<ResolvedConfig>,
    /// The subcommand given, if any (`rl`).
    pub subcommand: Option<String>,
}

/// Parses the process's arguments as [`try_parse`]; exits as clap does on `--help` and on
/// errors (status 2, the message on stderr).
pub fn parse_or_exit<P: Parser>(spec: &ConfigSpec) -> Parsed<P> {
    match try_parse(spec, std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(error) => match error.downcast::<clap::Error>() {
            Ok(clap_error) => clap_error.exit(),
            Err(error) => {
                eprintln!("error: {error:#}");
                std::process::exit(2);
            }
        },
    }
}

/// The `--config` flag added to each command of `spec`.
fn config_arg() -> Arg {
    Arg::new("config")
        .long("config")
        .value_name("FILE.toml")
        .value_parser(clap::value_parser!(PathBuf))
        .help(
            "Flag values from a TOML file, a key per flag (`lr = 1e-6`, `resume = true`, \
             `sandbox-bind = [\"/data\"]`); flags on the command line override it",
        )
}

/// `P`'s command with `--config` on the commands of `spec`, built (global flags propagated).
fn command_with_config<P: Parser>(spec: &ConfigSpec) -> Command {
    let mut command = P::command();
    if spec.subcommands.is_empty() {
        command = command.arg(config_arg());
    }
    for name in spec.subcommands {
        command = command.mut_subcommand(name, |sub| sub.arg(config_arg()));
    }
    command.build();
    command
}

/// The same command with no flag required.
fn relaxed(command: &Command) -> Command {
    command
        .clone()
        .mut_args(|a| a.required(false))
        .mut_subcommands(|sub| sub.mut_args(|a| a.required(false)))
}

/// Parses `args` (the program name first) into `P`, with the values of a `--config` file
/// where the command line sets none (see the module doc). Errors: clap's own (downcast to
/// `clap::Error` for `exit`), or one naming the file, its line and the key.
pub fn try_parse<P: Parser>(spec: &ConfigSpec, args: Vec<OsString>) -> Result<Parsed<P>> {
    let mut command = command_with_config::<P>(spec);
    let relaxed = relaxed(&command);
    let first = match relaxed.clone().try_get_matches_from(&args) {
        Ok(matches) => matches,
        // --help, --version, a bad value: the real command's message (its usage line).
        Err(e) => {
            return Err(command
                .try_get_matches_from_mut(&args)
                .err()
                .unwrap_or(e)
                .into())
        }
    };
    let target_name = if spec.subcommands.is_empty() {
        None
    } else {
        match first.subcommand() {
            Some((name, _)) if spec.subcommands.contains(&name) => Some(name.to_string()),
            _ => {
                // A command without --config.
                let matches = command.try_get_matches_from_mut(&args)?;
                return Ok(Parsed {
                    cli: P::from_arg_matches(&matches)?,
                    resolved: None,
                    subcommand: matches.subcommand_name().map(str::to_string),
                });
            }
        }
    };
    let first_target = match &target_name {
        Some(name) => first
            .subcommand_matches(name)
            .expect("the subcommand parsed"),
        None => &first,
    };
    let mut full_args = args.clone();
    if let Some(path) = first_target.get_one::<PathBuf>("config") {
        let target = target_of(&command, target_name.as_deref());
        for entry in file_entries(path, &target, &relaxed, target_name.as_deref())? {
            if first_target.value_source(&entry.id) != Some(ValueSource::CommandLine) {
                full_args.extend(entry.args);
            }
        }
    }
    let matches = command.try_get_matches_from_mut(&full_args)?;
    let cli = P::from_arg_matches(&matches)?;
    let target = target_of(&command, target_name.as_deref());
    let target_matches = match &target_name {
        Some(name) => matches
            .subcommand_matches(name)
            .expect("the subcommand parsed"),
        None => &matches,
    };
    let resolved = ResolvedConfig::from_matches(
        &target.name,
        target.command,
        target_matches,
        spec.not_recorded,
    )?;
    Ok(Parsed {
        cli,
        resolved: Some(resolved),
        subcommand: target_name,
    })
}

/// The command a file configures (the subcommand `name`, or the top-level command) and the
/// binary's other commands.
fn target_of<'a>(command: &'a Command, name: Option<&str>) -> Target<'a> {
    let bin = command.get_name();
    match name {
        Some(name) => Target {
            name: format!("{bin} {name}"),
            command: command
                .find_subcommand(name)
                .expect("a subcommand of the spec"),
            others: command
                .get_subcommands()
                .filter(|sub| sub.get_name() != name)
                .map(|sub| (sub.get_name().to_string(), sub))
                .collect(),
        },
        None => Target {
            name: bin.to_string(),
            command,
            others: Vec::new(),
        },
    }
}

/// The entries of the file at `path`, each checked by its flag's value parser alone (on the
/// `relaxed` command: nothing else is required), so a bad value is an error with its line.
fn file_entries(
    path: &std::path::Path,
    target: &Target,
    relaxed: &Command,
    subcommand: Option<&str>,
) -> Result<Vec<FileEntry>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: cannot read it", path.display()))?;
    let (entries, mut problems) = read_entries(path, &text, target).map_err(|e| anyhow!(e))?;
    for entry in &entries {
        let mut args: Vec<OsString> = vec![relaxed.get_name().into()];
        args.extend(subcommand.map(OsString::from));
        args.extend(entry.args.iter().cloned());
        if let Err(e) = relaxed.clone().try_get_matches_from(args) {
            let problem = format!("`{}`: {}", entry.key, first_paragraph(&e));
            problems.push((entry.line, problem));
        }
    }
    if !problems.is_empty() {
        problems.sort();
        let lines: Vec<String> = problems
            .into_iter()
            .map(|(line, problem)| format!("{}:{line}: {problem}", path.display()))
            .collect();
        return Err(anyhow!(lines.join("\n")));
    }
    Ok(entries)
}

/// A clap error's message without its `error: ` prefix and its usage and help lines.
fn first_paragraph(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.trim_start_matches("error: ");
    text.split("\n\n").next().unwrap_or(text).trim().to_string()
}
