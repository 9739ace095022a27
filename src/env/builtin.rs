//! Built-in task sets, embedded in the binary from the repository's `tasks/` folder:
//! `--tasks builtin:NAME` reads `tasks/NAME/tasks.jsonl`. The files are written once per content
//! to a folder under the system's temporary directory (named by their hash), so a binary copied
//! to another machine carries its tasks with it.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/builtin_tasks.rs"));
}

/// Names of the embedded task sets.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = embedded::BUILTIN_TASK_FILES
        .iter()
        .filter_map(|(path, _)| path.strip_suffix("/tasks.jsonl"))
        .filter(|name| !name.contains('/'))
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// `builtin:NAME` to the path of its (extracted) tasks.jsonl; any other value is a path.
pub fn resolve_tasks(arg: &str) -> Result<PathBuf> {
    let Some(name) = arg.strip_prefix("builtin:") else {
        return Ok(PathBuf::from(arg));
    };
    if !names().iter().any(|n| n == name) {
        bail!(
            "--tasks {arg}: no built-in task set {name:?} (built in: {})",
            names().join(", ")
        );
    }
    let prefix = format!("{name}/");
    let files: Vec<(&str, &[u8])> = embedded::BUILTIN_TASK_FILES
        .iter()
        .filter(|(path, _)| path.starts_with(&prefix))
        .map(|(path, bytes)| (&path[prefix.len()..], *bytes))
        .collect();
    let dir = extract(name, &files)?;
    Ok(dir.join("tasks.jsonl"))
}

/// FNV-1a over names and contents: the folder name, so changed tasks never reuse a stale copy.
fn content_hash(files: &[(&str, &[u8])]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (path, bytes) in files {
        for b in path
            .bytes()
            .chain([0])
            .chain(bytes.iter().copied())
            .chain([0])
        {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn extract(name: &str, files: &[(&str, &[u8])]) -> Result<PathBuf> {
    let root = std::env::temp_dir().join(format!(
        "swerve-builtin-{name}-{:016x}",
        content_hash(files)
    ));
    if root.join(".complete").is_file() {
        return Ok(root);
    }
    // Written beside, then renamed: a concurrent or interrupted extraction never leaves half.
    let staging = root.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    for (path, bytes) in files {
        let dest = staging.join(path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&dest, bytes).with_context(|| format!("writing {}", dest.display()))?;
    }
    std::fs::write(staging.join(".complete"), b"")?;
    match std::fs::rename(&staging, &root) {
        Ok(()) => Ok(root),
        // Another process got there first with the same content.
        Err(_) if root.join(".complete").is_file() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(root)
        }
        Err(e) => Err(e).with_context(|| format!("moving {} into place", staging.display())),
    }
}

/// Whether `path` is inside an extracted built-in set (for messages).
pub fn is_builtin_path(path: &Path) -> bool {
    path.to_string_lossy().contains("swerve-builtin-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_bugs_is_built_in_and_extracts() {
        assert!(
            names().contains(&"python-bugs".to_string()),
            "{:?}",
            names()
        );
        let path = resolve_tasks("builtin:python-bugs").unwrap();
        assert!(path.is_file() && is_builtin_path(&path));
        let tasks = crate::env::load_tasks(&path).unwrap();
        assert!(tasks.len() >= 20, "{}", tasks.len());
        assert!(tasks.iter().all(|t| t.solution.is_some()));
        let err = resolve_tasks("builtin:nope").unwrap_err().to_string();
        assert!(err.contains("python-bugs"), "{err}");
        assert_eq!(
            resolve_tasks("x/y.jsonl").unwrap(),
            PathBuf::from("x/y.jsonl")
        );
    }
}
