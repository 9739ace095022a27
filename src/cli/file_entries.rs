//! A `--config` file's entries as command-line arguments: every key is checked against the
//! command's flags (an unknown key, a key of another command, a wrong type: an error naming the
//! file, the line and the key), and every value becomes the `--key=VALUE` arguments the flag
//! would have been given on the command line.

use super::flag_kind::{FlagKind, Joining, Scalar};
use clap::{Arg, Command};
use std::ffi::OsString;
use std::path::Path;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// One key of the file, as the arguments it stands for.
#[derive(Debug)]
pub(crate) struct FileEntry {
    /// The flag's clap id (for `ArgMatches::value_source`).
    pub id: String,
    pub key: String,
    /// 1-based line of the key in the file.
    pub line: usize,
    /// `--key=VALUE` and the like; empty for a switch set to its default or an empty array.
    pub args: Vec<OsString>,
}

/// The command a file configures, and the binary's other commands (for a key that is theirs).
pub(crate) struct Target<'a> {
    /// How messages name it: `swerve-train rl`.
    pub name: String,
    pub command: &'a Command,
    /// (name, command) of every other command of the binary that takes flags.
    pub others: Vec<(String, &'a Command)>,
}

/// The flags of `command` that a file may set, by key (the long name): every argument but
/// `--help`, `--version` and `--config` itself.
pub(crate) fn flag_keys(command: &Command) -> Vec<(&str, &Arg)> {
    command
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(|long| (long, arg)))
        .filter(|(long, _)| !matches!(*long, "help" | "version" | "config"))
        .collect()
}

/// 1-based line of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    1 + text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
}

/// A problem with one key: its line and what is wrong.
pub(crate) type Problem = (usize, String);

/// The entries of the TOML document `text` (read from `path`), in file order, and the problems
/// with the other keys; an error when the text is not TOML.
pub(crate) fn read_entries(
    path: &Path,
    text: &str,
    target: &Target,
) -> Result<(Vec<FileEntry>, Vec<Problem>), String> {
    let table = DeTable::parse(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s.start));
        format!(
            "{}:{line}: not TOML: {}",
            path.display(),
            e.message().trim_end()
        )
    })?;
    let keys = flag_keys(target.command);
    let mut entries = Vec::new();
    let mut problems: Vec<Problem> = Vec::new();
    for (key, value) in table.get_ref() {
        let line = line_of(text, key.span().start);
        let key = key.get_ref().as_ref();
        if let DeValue::Table(_) = value.get_ref() {
            problems.push((
                line,
                format!("`{key}` is a table: a config file holds `flag = value` lines only"),
            ));
            continue;
        }
        match keys.iter().find(|(long, _)| *long == key) {
            Some((_, arg)) => match arguments(key, arg, value) {
                Ok(args) => entries.push(FileEntry {
                    id: arg.get_id().to_string(),
                    key: key.to_string(),
                    line,
                    args,
                }),
                Err(problem) => problems.push((line, problem)),
            },
            None => problems.push((line, unknown_key(key, target, &keys))),
        }
    }
    entries.sort_by_key(|e| e.line);
    Ok((entries, problems))
}

/// Why `key` is not one of `keys`: another command's flag (naming those that take it), a typo
/// (the closest key), or neither.
fn unknown_key(key: &str, target: &Target, keys: &[(&str, &Arg)]) -> String {
    let takers: Vec<&str> = target
        .others
        .iter()
        .filter(|(_, command)| flag_keys(command).iter().any(|(long, _)| *long == key))
        .map(|(name, _)| name.as_str())
        .collect();
    if !takers.is_empty() {
        return format!(
            "`{key}` is not a flag of `{}`: {} {} it",
            target.name,
            takers.join(", "),
            if takers.len() == 1 { "takes" } else { "take" }
        );
    }
    let names: Vec<&str> = keys.iter().map(|(long, _)| *long).collect();
    match super::suggest::closest(key, &names) {
        Some(close) => format!(
            "unknown key `{key}` for `{}`: did you mean `{close}`?",
            target.name
        ),
        None => format!(
            "unknown key `{key}` for `{}` (the keys are its flags: `{} --help`)",
            target.name, target.name
        ),
    }
}

/// The command-line arguments that give `arg` the file's `value`, or why the value does not fit.
fn arguments(key: &str, arg: &Arg, value: &Spanned<DeValue>) -> Result<Vec<OsString>, String> {
    let value = value.get_ref();
    let kind = FlagKind::of(arg);
    let wrong = || {
        format!(
            "`{key}` takes {}, not {} {}",
            kind.describe(),
            article(value.type_str()),
            value.type_str()
        )
    };
    let flag = format!("--{key}");
    Ok(match kind {
        FlagKind::Switch { given_means } => match value {
            DeValue::Boolean(b) if *b == given_means => vec![flag.into()],
            DeValue::Boolean(_) => Vec::new(),
            _ => return Err(wrong()),
        },
        FlagKind::Count => {
            let n = match value {
                DeValue::Integer(_) => scalar_text(Scalar::Integer, value)
                    .and_then(|t| t.parse::<u8>().ok())
                    .ok_or_else(|| format!("`{key}` takes an integer from 0 to 255"))?,
                _ => return Err(wrong()),
            };
            vec![flag.into(); n as usize]
        }
        FlagKind::One(scalar) => {
            let text = scalar_text(scalar, value).ok_or_else(wrong)?;
            vec![format!("{flag}={text}").into()]
        }
        FlagKind::Many(scalar, joining) => {
            let DeValue::Array(items) = value else {
                return Err(wrong());
            };
            let mut texts = Vec::new();
            for item in items.iter() {
                texts.push(scalar_text(scalar, item.get_ref()).ok_or_else(wrong)?);
            }
            joined(key, &flag, texts, joining)?
        }
    })
}

/// Several values as the arguments of one flag.
fn joined(
    key: &str,
    flag: &str,
    texts: Vec<String>,
    joining: Joining,
) -> Result<Vec<OsString>, String> {
    Ok(match joining {
        _ if texts.is_empty() => Vec::new(),
        Joining::Repeated => texts
            .into_iter()
            .map(|t| format!("{flag}={t}").into())
            .collect(),
        Joining::Delimited(delimiter) => {
            if let Some(t) = texts.iter().find(|t| t.contains(delimiter)) {
                return Err(format!(
                    "`{key}`: the element {t:?} holds `{delimiter}`, which separates the flag's values"
                ));
            }
            let separator = delimiter.to_string();
            vec![format!("{flag}={}", texts.join(&separator)).into()]
        }
        Joining::Following => std::iter::once(flag.to_string())
            .chain(texts)
            .map(OsString::from)
            .collect(),
    })
}

/// A TOML value as the text the flag's parser reads, when it has the type the flag takes (an
/// integer is a number too).
fn scalar_text(scalar: Scalar, value: &DeValue) -> Option<String> {
    match (scalar, value) {
        (Scalar::Bool, DeValue::Boolean(b)) => Some(b.to_string()),
        (Scalar::Integer | Scalar::Float, DeValue::Integer(i)) => {
            i128::from_str_radix(i.as_str(), i.radix())
                .ok()
                .map(|v| v.to_string())
        }
        (Scalar::Float, DeValue::Float(f)) => Some(f.as_str().to_string()),
        (Scalar::Text, DeValue::String(s)) => Some(s.to_string()),
        _ => None,
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}
