//! `SWERVE_PARSE_ONLY=1`: a binary parses its arguments with its command-line parser and exits
//! (0 when they parse; clap's error and exit status 2 when they do not) before it reads a file,
//! loads a model or opens a port. `tests/doc_commands.rs` runs every command line the README and
//! `docs/` show this way, so a flag that was renamed or removed fails a test instead of a reader.

/// The environment variable's name.
pub const VAR: &str = "SWERVE_PARSE_ONLY";

/// Whether [`VAR`] asks for a parse only: `1` yes; unset, empty or `0` no; anything else is an
/// error naming the variable and its value (a typo must not start a real run). Checked by
/// `tests/doc_commands.rs` through the binaries.
pub fn requested() -> anyhow::Result<bool> {
    match std::env::var_os(VAR) {
        None => Ok(false),
        Some(value) => match value.to_str() {
            Some("1") => Ok(true),
            Some("" | "0") => Ok(false),
            _ => anyhow::bail!("{VAR} must be 1 (parse the arguments only) or 0, not {value:?}"),
        },
    }
}
