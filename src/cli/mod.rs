//! What the binaries share to read their command lines: range-checked number flags
//! ([`numbers`]) and `--config FILE.toml` ([`config_file`]): flag values from a TOML file for
//! any clap command, a key per flag, the command line overriding the file, and the resolved
//! configuration ([`ResolvedConfig`]) the training and rollout commands write to
//! `OUT/config.toml`. docs/config.md is the user's side of it.

pub mod config_file;
mod file_entries;
mod flag_kind;
pub mod numbers;
mod resolved;
mod suggest;
#[cfg(test)]
mod tests;

pub use config_file::{parse_or_exit, try_parse, ConfigSpec, Parsed};
pub use resolved::{FlagValue, ResolvedConfig};
