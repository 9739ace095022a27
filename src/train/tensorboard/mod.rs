//! TensorBoard event files under `OUT/tb/`: every figure of `iterations.jsonl` and
//! `metrics.jsonl` as a scalar (docs/tensorboard.md shows how to read them).
//!
//! ```text
//! a line of FILE.jsonl ─► one event: step = the line's `iteration` (iterations.jsonl) or
//!                         `step` (metrics.jsonl); a scalar per numeric leaf, tagged
//!                         FILE/KEY[/SUBKEY...] (booleans 1/0; strings, arrays and nulls left out)
//! OUT/tb/events.out.tfevents.{secs}.{host}.{pid}: the file_version event, then those events,
//!                         each written whole (framed: tf_record) as its line is appended
//! ```
//!
//! One writer per run folder, in the process that writes the JSON lines. A `--resume` drops the
//! records past the checkpoint from the files already there ([`trim`], as the JSON lines are
//! trimmed) and writes on in a new file.

pub mod event;
pub mod tf_record;

use anyhow::{bail, Context, Result};
use event::{Event, What};
use serde_json::Value;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder under OUT.
pub const DIR: &str = "tb";

/// What every file's first event says: the version of the event format.
pub const FILE_VERSION: &str = "brain.Event:2";

/// What TensorBoard looks for in a file name.
const FILE_PREFIX: &str = "events.out.tfevents.";

/// The JSON-lines files that go to TensorBoard: each is its tags' first component and has its
/// own steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Series {
    /// `iterations.jsonl` of `rl`: a line per iteration (0: the RFT phase).
    Iterations,
    /// `metrics.jsonl` of `rft`, `dapo` and `rl`: a line per optimizer step.
    Metrics,
}

impl Series {
    pub const ALL: [Series; 2] = [Series::Iterations, Series::Metrics];

    /// The tags' first component: the file's name without `.jsonl`.
    pub fn prefix(self) -> &'static str {
        match self {
            Series::Iterations => "iterations",
            Series::Metrics => "metrics",
        }
    }

    /// The key whose value is the event's step (not itself a tag).
    pub fn step_key(self) -> &'static str {
        match self {
            Series::Iterations => "iteration",
            Series::Metrics => "step",
        }
    }

    /// The series a tag belongs to.
    fn of_tag(tag: &str) -> Option<Series> {
        let first = tag.split('/').next()?;
        Series::ALL.into_iter().find(|s| s.prefix() == first)
    }
}

/// A JSON line as (step, scalars): every numeric leaf but the step key, tagged with its path
/// under the series' prefix, booleans as 1 and 0, numbers rounded to f32 (one beyond f32's
/// range becomes an infinity, as it is); strings, arrays and nulls are not scalars.
pub fn scalars(series: Series, line: &Value) -> Result<(i64, Vec<(String, f32)>)> {
    let key = series.step_key();
    let (Some(fields), Some(step)) = (line.as_object(), line.get(key).and_then(Value::as_u64))
    else {
        bail!(
            "a line for {}.jsonl has no `{key}`: {line}",
            series.prefix()
        );
    };
    let step = i64::try_from(step).with_context(|| format!("`{key}` {step} is too large"))?;
    let mut out = Vec::new();
    for (name, value) in fields.iter().filter(|(name, _)| *name != key) {
        flatten(&format!("{}/{name}", series.prefix()), value, &mut out);
    }
    Ok((step, out))
}

fn flatten(tag: &str, value: &Value, out: &mut Vec<(String, f32)>) {
    match value {
        Value::Number(n) => {
            let x = n.as_f64().expect("serde_json numbers convert to f64");
            out.push((tag.to_string(), x as f32));
        }
        Value::Bool(b) => out.push((tag.to_string(), f32::from(u8::from(*b)))),
        Value::Object(fields) => {
            for (name, value) in fields {
                flatten(&format!("{tag}/{name}"), value, out);
            }
        }
        Value::Null | Value::String(_) | Value::Array(_) => {}
    }
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name as a file name part (letters, digits, `.`, `-`, `_`; `localhost` when
/// it has none).
fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `buffer.len()` bytes into the buffer it is given.
    let rc = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    let name: String = String::from_utf8_lossy(&buffer[..end])
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    if rc != 0 || name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// The seconds in an event file's name (`events.out.tfevents.{secs}.…`).
fn name_seconds(name: &str) -> Option<u64> {
    name.strip_prefix(FILE_PREFIX)?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The event files in `dir`, sorted by name (TensorBoard's reading order); none when it does
/// not exist.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in read {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with(FILE_PREFIX) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// An event file being written: scalars go in as their JSON lines are appended.
pub struct EventWriter {
    path: PathBuf,
    file: File,
}

impl EventWriter {
    /// A new event file in `dir` (created if needed), its first event written. Its name sorts
    /// after every event file there (TensorBoard reads a folder's files in name order, and for
    /// a step written twice shows the value read last): the seconds in it are the clock's, or
    /// one more than the newest file's when that is not earlier.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let wall_time = now();
        let newest = event_files(dir)?
            .iter()
            .filter_map(|p| name_seconds(&p.file_name()?.to_string_lossy()))
            .max();
        let seconds = (wall_time as u64).max(newest.map_or(0, |s| s + 1));
        let stem = format!(
            "{FILE_PREFIX}{seconds:010}.{}.{}",
            hostname(),
            std::process::id()
        );
        let (path, file) = (0..)
            .map(|n| match n {
                0 => dir.join(&stem),
                n => dir.join(format!("{stem}.{n}")),
            })
            .find_map(
                |path| match File::options().append(true).create_new(true).open(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                    opened => Some(opened.map(|file| (path, file))),
                },
            )
            .expect("some file name is free")
            .with_context(|| format!("cannot create an event file in {}", dir.display()))?;
        let writer = Self { path, file };
        writer.write(&Event {
            wall_time,
            step: 0,
            what: What::FileVersion(FILE_VERSION.into()),
        })?;
        Ok(writer)
    }

    /// The event file of the run in `out` (a new one in `out/tb/`) when this process writes the
    /// run's logs (`writes`), else none. After [`trim`], for a resumed run.
    pub fn for_run(out: &Path, writes: bool) -> Result<Option<Self>> {
        writes.then(|| Self::create(&out.join(DIR))).transpose()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `event` as one record, handed to the file system at once (a live TensorBoard
    /// sees it).
    pub fn write(&self, event: &Event) -> Result<()> {
        let record = tf_record::frame(&event::encode(event));
        let mut file = &self.file;
        file.write_all(&record)
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// The scalars of `line`, a line of `series`' file, as one event.
    pub fn write_line(&self, series: Series, line: &Value) -> Result<()> {
        let (step, values) = scalars(series, line)?;
        self.write(&Event {
            wall_time: now(),
            step,
            what: What::Scalars(values),
        })
    }
}

/// For `--resume`: drops, from the event files in `dir`, the scalars of each listed series past
/// its last kept step (`None`: all of them), as the JSON lines past the checkpoint are dropped,
/// and an incomplete last record (a run stopped while writing it). A file left without scalars
/// is removed; a changed one is written anew and renamed over the old. A damaged record is an
/// error naming the file.
pub fn trim(dir: &Path, last_kept: &[(Series, Option<u64>)]) -> Result<()> {
    let limit = |series: Series| last_kept.iter().find(|(s, _)| *s == series).map(|l| l.1);
    for path in event_files(dir)? {
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let read = tf_record::records(&bytes)
            .with_context(|| format!("{}: not a readable event file", path.display()))?;
        let (mut kept, mut scalars_kept) = (Vec::new(), false);
        for &(at, data) in &read.records {
            let event = event::decode(data)
                .with_context(|| format!("{}: byte {at}: not an event", path.display()))?;
            let drop = match &event.what {
                What::Scalars(values) => values.iter().any(|(tag, _)| {
                    Series::of_tag(tag)
                        .and_then(limit)
                        .is_some_and(|last| last.is_none_or(|last| event.step > last as i64))
                }),
                _ => false,
            };
            if !drop {
                scalars_kept |= matches!(event.what, What::Scalars(_));
                kept.push(data);
            }
        }
        if let Some(at) = read.torn_at {
            eprintln!(
                "{}: dropped an incomplete last record at byte {at} (the run stopped while writing it)",
                path.display()
            );
        }
        if !scalars_kept {
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        } else if kept.len() < read.records.len() || read.torn_at.is_some() {
            rewrite(dir, &path, &kept)?;
        }
    }
    Ok(())
}

/// Writes `records` to a temporary file in `dir` (a name TensorBoard does not read) and renames
/// it to `path`.
fn rewrite(dir: &Path, path: &Path, records: &[&[u8]]) -> Result<()> {
    let partial = dir.join(".trimmed.partial");
    let bytes: Vec<u8> = records.iter().flat_map(|r| tf_record::frame(r)).collect();
    std::fs::write(&partial, bytes)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, path)
        .with_context(|| format!("cannot move {} to {}", partial.display(), path.display()))
}

/// Every event of the files in `dir`, in TensorBoard's reading order (for tests and checks).
pub fn read_events(dir: &Path) -> Result<Vec<(PathBuf, Event)>> {
    let mut out = Vec::new();
    for path in event_files(dir)? {
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let read = tf_record::records(&bytes)
            .with_context(|| format!("{}: not a readable event file", path.display()))?;
        for (at, data) in read.records {
            let event = event::decode(data)
                .with_context(|| format!("{}: byte {at}: not an event", path.display()))?;
            out.push((path.clone(), event));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
