//! `str_replace_editor` with SWE-agent's semantics, over a [`Sandbox`]: files are read and
//! written by commands inside the sandbox (`cat`), so a symlink the agent planted resolves in
//! the sandbox's view and an edit can never reach outside it.
//!
//! - `view PATH [view_range]`: a file as `cat -n` shows it, or a folder two levels deep (no
//!   hidden entries);
//! - `create PATH file_text`: refused when the file exists;
//! - `str_replace PATH old_str [new_str]`: `old_str` must occur exactly once;
//! - `insert PATH insert_line new_str`: after line `insert_line` (0: before the first);
//! - `undo_edit PATH`: back to the content before the last edit of that file.
//!
//! A bad call (unknown command, missing argument, no such file) is an observation telling the
//! agent what went wrong, not an error of the run.

use crate::env::task::shell_quote;
use crate::env::Sandbox;
use anyhow::Result;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// Largest file the editor reads.
const MAX_FILE_BYTES: usize = 4 << 20;
/// Lines shown around an edit.
const SNIPPET_LINES: usize = 4;

#[derive(Default)]
pub struct Editor {
    /// Per path: the contents before each edit, newest last.
    history: HashMap<String, Vec<String>>,
}

/// A failed file operation the agent caused (a read-only path, a file past the size limit): the
/// agent is told, the run goes on.
#[derive(Debug)]
struct AgentFault(String);

impl std::fmt::Display for AgentFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AgentFault {}

/// What a file operation inside the sandbox found.
enum Read {
    File(String),
    Dir,
    Missing,
    /// There, but `cat` failed (permissions): its message.
    Unreadable(String),
}

impl Editor {
    /// Runs one call; `Ok(text)` is the observation (success or a usage error), `Err` only for a
    /// sandbox that failed.
    pub fn call(
        &mut self,
        sandbox: &mut dyn Sandbox,
        args: &Value,
        timeout: Duration,
    ) -> Result<String> {
        let str_arg = |name: &str| args.get(name).and_then(Value::as_str);
        let Some(command) = str_arg("command") else {
            return Ok(
                "Error: `command` is required (view, create, str_replace, insert, undo_edit)."
                    .into(),
            );
        };
        let Some(raw_path) = str_arg("path") else {
            return Ok("Error: `path` is required.".into());
        };
        let workdir = sandbox.workdir().to_string();
        let path = if raw_path.starts_with('/') {
            raw_path.to_string()
        } else {
            format!("{workdir}/{raw_path}")
        };
        let mut io = SandboxFiles { sandbox, timeout };
        let result = match command {
            "view" => self.view(&mut io, &path, args.get("view_range")),
            "create" => self.create(&mut io, &path, args),
            "str_replace" => self.str_replace(&mut io, &path, args),
            "insert" => self.insert(&mut io, &path, args),
            "undo_edit" => self.undo_edit(&mut io, &path),
            other => Ok(format!(
                "Error: unknown command `{other}`; use view, create, str_replace, insert or undo_edit."
            )),
        };
        match result {
            Err(e) => match e.downcast::<AgentFault>() {
                Ok(fault) => Ok(format!("Error: {fault}")),
                Err(e) => Err(e),
            },
            ok => ok,
        }
    }

    /// `create`: a new file (never over an existing one).
    fn create(&mut self, io: &mut SandboxFiles<'_>, path: &str, args: &Value) -> Result<String> {
        let str_arg = |name: &str| args.get(name).and_then(Value::as_str);
        let Some(text) = str_arg("file_text") else {
            return Ok("Error: `file_text` is required for `create`.".into());
        };
        match io.read(path)? {
            Read::Missing => {
                io.write(path, text)?;
                self.history.entry(path.to_string()).or_default();
                Ok(format!("File created successfully at: {path}"))
            }
            _ => Ok(format!(
                "File already exists at: {path}. Cannot overwrite files using command `create`."
            )),
        }
    }

    /// `str_replace`: replaces the one occurrence of `old_str` with `new_str`.
    fn str_replace(
        &mut self,
        io: &mut SandboxFiles<'_>,
        path: &str,
        args: &Value,
    ) -> Result<String> {
        let str_arg = |name: &str| args.get(name).and_then(Value::as_str);
        let Some(old) = str_arg("old_str") else {
            return Ok("Error: `old_str` is required for `str_replace`.".into());
        };
        let new = str_arg("new_str").unwrap_or("");
        let content = match io.read(path)? {
            Read::File(c) => c,
            Read::Dir => {
                return Ok(format!(
                    "Error: {path} is a directory; `str_replace` edits files."
                ))
            }
            Read::Missing => return Ok(format!("Error: the path {path} does not exist.")),
            Read::Unreadable(why) => return Ok(format!("Error: cannot read {path}: {why}")),
        };
        if old.is_empty() {
            return Ok("Error: `old_str` must not be empty.".into());
        }
        let starts: Vec<usize> = content.match_indices(old).map(|(i, _)| i).collect();
        match starts.len() {
            0 => Ok(format!(
                "No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
            )),
            1 => {
                let edited = content.replacen(old, new, 1);
                io.write(path, &edited)?;
                let first_line = content[..starts[0]].matches('\n').count();
                let snippet = snippet(&edited, first_line, new.matches('\n').count());
                self.history
                    .entry(path.to_string())
                    .or_default()
                    .push(content);
                Ok(format!(
                    "The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n{snippet}\nReview the changes and make sure they are as expected. Edit the file again if necessary."
                ))
            }
            _ => {
                let lines: Vec<String> = starts
                    .iter()
                    .map(|&s| (content[..s].matches('\n').count() + 1).to_string())
                    .collect();
                Ok(format!(
                    "No replacement was performed. Multiple occurrences of old_str `{old}` in lines [{}]. Please ensure it is unique.",
                    lines.join(", ")
                ))
            }
        }
    }

    /// `insert`: `new_str` after line `insert_line` (0: at the top).
    fn insert(&mut self, io: &mut SandboxFiles<'_>, path: &str, args: &Value) -> Result<String> {
        let str_arg = |name: &str| args.get(name).and_then(Value::as_str);
        let Some(new) = str_arg("new_str") else {
            return Ok("Error: `new_str` is required for `insert`.".into());
        };
        let Some(line) = args.get("insert_line").and_then(Value::as_i64) else {
            return Ok("Error: `insert_line` (an integer) is required for `insert`.".into());
        };
        let content = match io.read(path)? {
            Read::File(c) => c,
            Read::Dir => {
                return Ok(format!(
                    "Error: {path} is a directory; `insert` edits files."
                ))
            }
            Read::Missing => return Ok(format!("Error: the path {path} does not exist.")),
            Read::Unreadable(why) => return Ok(format!("Error: cannot read {path}: {why}")),
        };
        let lines: Vec<&str> = content.split_inclusive('\n').collect();
        if line < 0 || line as usize > lines.len() {
            return Ok(format!(
                "Error: Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: [0, {}]",
                lines.len()
            ));
        }
        let at = line as usize;
        let mut edited: String = lines[..at].concat();
        if !edited.is_empty() && !edited.ends_with('\n') {
            edited.push('\n');
        }
        edited.push_str(new);
        if !new.ends_with('\n') && at < lines.len() {
            edited.push('\n');
        }
        edited.push_str(&lines[at..].concat());
        io.write(path, &edited)?;
        let shown = snippet(&edited, at, new.matches('\n').count());
        self.history
            .entry(path.to_string())
            .or_default()
            .push(content);
        Ok(format!(
            "The file {path} has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n{shown}\nReview the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary."
        ))
    }

    /// `undo_edit`: the file as it was before its last edit.
    fn undo_edit(&mut self, io: &mut SandboxFiles<'_>, path: &str) -> Result<String> {
        match self.history.get_mut(path).and_then(Vec::pop) {
            Some(previous) => {
                io.write(path, &previous)?;
                Ok(format!(
                    "Last edit to {path} undone successfully. {}",
                    numbered(&previous, 1)
                ))
            }
            None => Ok(format!("No edit history found for {path}.")),
        }
    }

    fn view(&self, io: &mut SandboxFiles<'_>, path: &str, range: Option<&Value>) -> Result<String> {
        match io.read(path)? {
            Read::Missing => Ok(format!("Error: the path {path} does not exist.")),
            Read::Unreadable(why) => Ok(format!("Error: cannot read {path}: {why}")),
            Read::Dir => {
                if range.is_some_and(|r| !r.is_null()) {
                    return Ok("Error: `view_range` only applies to files.".into());
                }
                let out = io.sandbox.run(
                    &format!(
                        "find {} -maxdepth 2 -not -path '*/.*' | sort",
                        shell_quote(path)
                    ),
                    None,
                    io.timeout,
                )?;
                Ok(format!(
                    "Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{}",
                    out.output
                ))
            }
            Read::File(content) => {
                let total = content.lines().count();
                let (first, last) = match range {
                    None | Some(Value::Null) => (1, total),
                    Some(r) => {
                        let pair = r
                            .as_array()
                            .filter(|a| a.len() == 2)
                            .and_then(|a| Some((a[0].as_i64()?, a[1].as_i64()?)));
                        let Some((first, last)) = pair else {
                            return Ok(
                                "Error: `view_range` must be two integers [first, last].".into()
                            );
                        };
                        let last = if last == -1 { total as i64 } else { last };
                        if first < 1
                            || first as usize > total.max(1)
                            || last < first
                            || last as usize > total
                        {
                            return Ok(format!(
                                "Error: Invalid `view_range` [{first}, {last}]: the file has {total} lines; use 1 <= first <= last <= {total} (last -1 for the end)."
                            ));
                        }
                        (first as usize, last as usize)
                    }
                };
                let shown: String = content
                    .lines()
                    .skip(first - 1)
                    .take(last + 1 - first)
                    .collect::<Vec<_>>()
                    .join("\n");
                Ok(format!(
                    "Here's the result of running `cat -n` on {path}:\n{}",
                    numbered(&shown, first)
                ))
            }
        }
    }
}

/// Lines numbered as `cat -n` does, starting at `first`.
fn numbered(text: &str, first: usize) -> String {
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        out.push_str(&format!("{:6}\t{line}\n", first + i));
    }
    out
}

/// The lines around an edit at line `start` (0-based) spanning `new_lines` more lines.
fn snippet(text: &str, start: usize, new_lines: usize) -> String {
    let first = start.saturating_sub(SNIPPET_LINES);
    let last = start + new_lines + SNIPPET_LINES;
    let shown: Vec<&str> = text.lines().skip(first).take(last + 1 - first).collect();
    numbered(&shown.join("\n"), first + 1)
}

struct SandboxFiles<'a> {
    sandbox: &'a mut dyn Sandbox,
    timeout: Duration,
}

impl SandboxFiles<'_> {
    fn read(&mut self, path: &str) -> Result<Read> {
        let q = shell_quote(path);
        let probe = self.sandbox.run(
            &format!("if [ -d {q} ]; then echo dir; elif [ -f {q} ]; then echo file; else echo missing; fi"),
            None,
            self.timeout,
        )?;
        match probe.output.trim() {
            "dir" => Ok(Read::Dir),
            "file" => {
                let out = self.sandbox.exec(
                    &format!("cat -- {q}"),
                    None,
                    self.timeout,
                    MAX_FILE_BYTES,
                )?;
                if !out.success() {
                    return Ok(Read::Unreadable(out.output.trim().to_string()));
                }
                if out.omitted_bytes > 0 {
                    // Editing a shortened copy would write the shortening back.
                    return Err(AgentFault(format!(
                        "{path} is larger than the editor's limit of {MAX_FILE_BYTES} bytes; \
                         it does not edit it (use bash)"
                    ))
                    .into());
                }
                Ok(Read::File(out.output))
            }
            _ => Ok(Read::Missing),
        }
    }

    fn write(&mut self, path: &str, content: &str) -> Result<()> {
        let q = shell_quote(path);
        let out = self.sandbox.run(
            &format!("mkdir -p -- \"$(dirname -- {q})\" && cat > {q}"),
            Some(content.as_bytes()),
            self.timeout,
        )?;
        if !out.success() {
            return Err(AgentFault(format!(
                "writing {path} failed ({}): {}",
                crate::env::describe_end(&out),
                out.output.trim()
            ))
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_and_snippets() {
        assert_eq!(numbered("a\nb", 9), "     9\ta\n    10\tb\n");
        let text = (1..=20)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        let s = snippet(&text, 10, 0);
        assert!(
            s.starts_with("     7\t7\n") && s.ends_with("    15\t15\n"),
            "{s}"
        );
    }
}
