//! JSON-lines files, the trainer's interface: reading with errors that name `file:line`, and
//! writing through a temporary file renamed into place, so a failed run leaves no partial output.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Every line of `path` parsed as a JSON object, with its 1-based line number. Empty lines and
/// lines that are not JSON objects are errors naming `path:line`.
pub fn read_objects(path: &Path) -> Result<Vec<(usize, Value)>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line_no = i + 1;
        let line =
            line.with_context(|| format!("{}: cannot read line {line_no}", path.display()))?;
        if line.trim().is_empty() {
            bail!("{}:{line_no}: empty line", path.display());
        }
        let value: Value = serde_json::from_str(&line)
            .with_context(|| format!("{}:{line_no}: not valid JSON", path.display()))?;
        if !value.is_object() {
            bail!("{}:{line_no}: expected a JSON object", path.display());
        }
        out.push((line_no, value));
    }
    Ok(out)
}

/// Where a line of `path` is, for error messages: `path:line`.
pub fn at(path: &Path, line_no: usize) -> String {
    format!("{}:{line_no}", path.display())
}

/// Writes `path` by calling `write_lines` with a writer on `path.partial`, then renames it into
/// place. On any error the partial file is removed.
pub fn write_atomically(
    path: &Path,
    write_lines: impl FnOnce(&mut dyn FnMut(&Value) -> Result<()>) -> Result<()>,
) -> Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut writer = BufWriter::new(file);
    let result = write_lines(&mut |value: &Value| {
        serde_json::to_writer(&mut writer, value)?;
        writer.write_all(b"\n")?;
        Ok(())
    })
    .and_then(|()| {
        writer
            .flush()
            .map_err(|e| anyhow!("cannot write {}: {e}", partial.display()))
    });
    drop(writer);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, path)
        .with_context(|| format!("cannot move {} to {}", partial.display(), path.display()))
}
