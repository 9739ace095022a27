//! A command's resolved configuration: every flag's final value (the command line over the
//! `--config` file over the defaults), written as TOML to `OUT/config.toml` in the form a
//! `--config` file takes, so that `--config OUT/config.toml` repeats the run.

use super::file_entries::flag_keys;
use super::flag_kind::{FlagKind, Scalar};
use anyhow::{bail, Context, Result};
use clap::{ArgMatches, Command};

/// One flag's value.
#[derive(Clone, Debug, PartialEq)]
pub enum FlagValue {
    Bool(bool),
    Integer(i128),
    Float(f64),
    Text(String),
    List(Vec<FlagValue>),
}

/// Every flag of one command with its value; `None`: not set, and no default known here.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedConfig {
    /// `swerve-train rl`.
    command: String,
    entries: Vec<(String, Option<FlagValue>)>,
}

impl ResolvedConfig {
    /// The values in `matches` of `command`'s flags (in the order `--help` lists them), less
    /// `not_recorded` (how this invocation treats OUT, not what the run is: `resume`,
    /// `overwrite`).
    pub(crate) fn from_matches(
        name: &str,
        command: &Command,
        matches: &ArgMatches,
        not_recorded: &[&str],
    ) -> Result<Self> {
        let mut entries = Vec::new();
        for (key, arg) in flag_keys(command) {
            if not_recorded.contains(&key) {
                continue;
            }
            let id = arg.get_id().as_str();
            let kind = FlagKind::of(arg);
            let raw: Vec<String> = match matches.get_raw(id) {
                None => Vec::new(),
                Some(values) => values
                    .map(|v| {
                        v.to_str().map(str::to_string).with_context(|| {
                            format!("--{key}: {v:?} is not UTF-8, which a TOML file cannot hold")
                        })
                    })
                    .collect::<Result<_>>()?,
            };
            let value = match kind {
                FlagKind::Switch { .. } => Some(FlagValue::Bool(matches.get_flag(id))),
                FlagKind::Count => Some(FlagValue::Integer(i128::from(matches.get_count(id)))),
                FlagKind::One(scalar) => match raw.first() {
                    Some(text) => Some(scalar_value(key, scalar, text)?),
                    None => None,
                },
                FlagKind::Many(scalar, _) => Some(FlagValue::List(
                    raw.iter()
                        .map(|text| scalar_value(key, scalar, text))
                        .collect::<Result<_>>()?,
                )),
            };
            entries.push((key.to_string(), value));
        }
        Ok(Self {
            command: name.to_string(),
            entries,
        })
    }

    /// The value of flag `key` (`None`: not a flag here, or not set).
    pub fn get(&self, key: &str) -> Option<&FlagValue> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.as_ref())
    }

    /// Gives the flags that are not set the values the command uses for them, where clap has
    /// no default because it depends on the command or on another flag (`rl`'s schedule on
    /// `--tasks`). `defaults` serializes to an object by flag name (`tasks_per_iteration` or
    /// `tasks-per-iteration`); `null` leaves a flag unset. A name that is not a flag of the
    /// command is an error (a default for nothing).
    pub fn fill_unset(&mut self, defaults: impl serde::Serialize) -> Result<()> {
        // Through JSON text: an f32 reads back as the decimal it prints as (0.3, not
        // 0.30000001192092896).
        let text = serde_json::to_string(&defaults).context("defaults")?;
        let defaults: serde_json::Value = serde_json::from_str(&text).context("defaults")?;
        let Some(defaults) = defaults.as_object() else {
            bail!("defaults for {}: not an object: {text}", self.command);
        };
        for (name, value) in defaults {
            let key = name.replace('_', "-");
            let Some((_, slot)) = self.entries.iter_mut().find(|(k, _)| *k == key) else {
                bail!(
                    "a default for `{key}`, which is not a flag of {}",
                    self.command
                );
            };
            if slot.is_none() {
                *slot = json_value(value);
            }
        }
        Ok(())
    }

    /// The configuration as a TOML document: a header, then `key = value` per flag, an unset
    /// flag as a comment.
    pub fn to_toml(&self) -> String {
        let mut text = format!(
            "# {}: every flag's value for this run (the command line over --config over the\n\
             # defaults). `--config` takes this file as it is.\n",
            self.command
        );
        for (key, value) in &self.entries {
            match value {
                Some(value) => text += &format!("{key} = {}\n", toml_text(value)),
                None => text += &format!("# {key}: not set\n"),
            }
        }
        text
    }
}

/// A flag's raw text as a value of its type.
fn scalar_value(key: &str, scalar: Scalar, text: &str) -> Result<FlagValue> {
    let bad = || format!("--{key}: {text:?} as {}", scalar.describe());
    Ok(match scalar {
        Scalar::Bool => FlagValue::Bool(text.parse().with_context(bad)?),
        Scalar::Integer => FlagValue::Integer(text.parse().with_context(bad)?),
        Scalar::Float => FlagValue::Float(text.parse().with_context(bad)?),
        Scalar::Text => FlagValue::Text(text.to_string()),
    })
}

fn json_value(value: &serde_json::Value) -> Option<FlagValue> {
    use serde_json::Value;
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => FlagValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => FlagValue::Integer(i128::from(i)),
            (None, Some(u)) => FlagValue::Integer(i128::from(u)),
            _ => FlagValue::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => FlagValue::Text(s.clone()),
        Value::Array(items) => FlagValue::List(items.iter().filter_map(json_value).collect()),
        Value::Object(_) => FlagValue::Text(value.to_string()),
    })
}

/// `value` as TOML text.
fn toml_text(value: &FlagValue) -> String {
    match value {
        FlagValue::Bool(b) => b.to_string(),
        FlagValue::Integer(i) => i.to_string(),
        FlagValue::Float(f) if f.is_nan() => "nan".into(),
        FlagValue::Float(f) if f.is_infinite() => if *f > 0.0 { "inf" } else { "-inf" }.into(),
        // Debug: the shortest text that reads back as the same f64, always with a `.` or an
        // exponent (`30.0`, `1e-6`), so it stays a float.
        FlagValue::Float(f) => format!("{f:?}"),
        FlagValue::Text(s) => toml_string(s),
        FlagValue::List(items) => {
            let items: Vec<String> = items.iter().map(toml_text).collect();
            format!("[{}]", items.join(", "))
        }
    }
}

/// A TOML basic string: quotes, backslashes and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
