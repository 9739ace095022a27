//! JSON-lines files, the trainer's interface: reading one line at a time with errors that name
//! `file:line` (a data file is never held whole in memory as `serde_json::Value`, only the line
//! being converted), and writing through a temporary file renamed into place, so a failed run
//! leaves no partial output.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// What a file held, for telling two versions of it apart: its length and the 64-bit FNV-1a
/// hash of its bytes. FNV-1a is not cryptographic: it catches a changed or replaced file, not
/// one forged to collide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContentHash {
    pub bytes: u64,
    pub fnv1a64: u64,
}

impl ContentHash {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new() -> Self {
        Self {
            bytes: 0,
            fnv1a64: Self::OFFSET_BASIS,
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        let mut h = self.fnv1a64;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(Self::PRIME);
        }
        self.fnv1a64 = h;
        self.bytes += data.len() as u64;
    }
}

impl std::fmt::Display for ContentHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes, FNV-1a {:016x}", self.bytes, self.fnv1a64)
    }
}

/// The [`ContentHash`] of a whole file, read in 1 MiB pieces.
pub fn hash_file(path: &Path) -> Result<ContentHash> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hash = ContentHash::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buffer)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            return Ok(hash);
        }
        hash.update(&buffer[..n]);
    }
}

/// A JSON-lines file read one object at a time, with 1-based line numbers; every byte read also
/// goes into a [`ContentHash`]. Empty lines and lines that are not JSON objects are errors naming
/// `path:line`. As an iterator it yields `Result<(line_no, object)>`.
pub struct ObjectLines {
    path: PathBuf,
    reader: BufReader<std::fs::File>,
    line_no: usize,
    line: Vec<u8>,
    hash: ContentHash,
    failed: bool,
}

impl ObjectLines {
    pub fn open(path: &Path) -> Result<Self> {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, file),
            line_no: 0,
            line: Vec::new(),
            hash: ContentHash::new(),
            failed: false,
        })
    }

    /// The next line's object; `None` at the end of the file.
    pub fn next_object(&mut self) -> Result<Option<(usize, Value)>> {
        self.line.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .with_context(|| {
                format!(
                    "{}: cannot read line {}",
                    self.path.display(),
                    self.line_no + 1
                )
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        self.hash.update(&self.line);
        let at = || at(&self.path, self.line_no);
        let mut text = self.line.as_slice();
        if let Some(rest) = text.strip_suffix(b"\n") {
            text = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            bail!("{}: empty line", at());
        }
        let value: Value =
            serde_json::from_slice(text).with_context(|| format!("{}: not valid JSON", at()))?;
        if !value.is_object() {
            bail!("{}: expected a JSON object", at());
        }
        Ok(Some((self.line_no, value)))
    }

    /// The hash of the bytes read so far: the whole file's once [`ObjectLines::next_object`]
    /// has returned `None`.
    pub fn content_hash(&self) -> ContentHash {
        self.hash
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Iterator for ObjectLines {
    type Item = Result<(usize, Value)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.next_object().transpose();
        self.failed = matches!(item, Some(Err(_)));
        item
    }
}

/// Every line of `path` parsed as a JSON object, with its 1-based line number, all in memory:
/// for small files (task lists). Data files go through [`ObjectLines`] line by line.
pub fn read_objects(path: &Path) -> Result<Vec<(usize, Value)>> {
    ObjectLines::open(path)?.collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference (Fowler, Noll, Vo): "" and "a" and "foobar", 64-bit FNV-1a.
        for (text, expected) in [
            ("", 0xcbf2_9ce4_8422_2325u64),
            ("a", 0xaf63_dc4c_8601_ec8c),
            ("foobar", 0x8594_4171_f739_67e8),
        ] {
            let mut h = ContentHash::new();
            h.update(text.as_bytes());
            assert_eq!(h.fnv1a64, expected, "{text:?}");
            assert_eq!(h.bytes, text.len() as u64);
        }
        // Pieces hash as the whole.
        let mut h = ContentHash::new();
        h.update(b"foo");
        h.update(b"bar");
        assert_eq!(h.fnv1a64, 0x8594_4171_f739_67e8);
    }

    #[test]
    fn lines_are_read_one_at_a_time_and_hashed_as_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let text = "{\"a\": 1}\r\n{\"b\": [2]}\n{\"c\": 3}";
        std::fs::write(&path, text).unwrap();
        let mut lines = ObjectLines::open(&path).unwrap();
        let mut seen = Vec::new();
        while let Some((line_no, value)) = lines.next_object().unwrap() {
            seen.push((line_no, value));
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[1], (2, serde_json::json!({"b": [2]})));
        assert_eq!(seen[2].0, 3);
        assert_eq!(lines.content_hash(), hash_file(&path).unwrap());
        assert_eq!(lines.content_hash().bytes, text.len() as u64);
    }

    #[test]
    fn bad_lines_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        for (text, message) in [
            ("{}\n\n{}\n", ":2: empty line"),
            ("{}\n[1]\n", ":2: expected a JSON object"),
            ("{}\n{}\n{\"a\": \n", ":3: not valid JSON"),
        ] {
            let path = dir.path().join("bad.jsonl");
            std::fs::write(&path, text).unwrap();
            let error = read_objects(&path).unwrap_err();
            let shown = format!("{error:#}");
            assert!(shown.contains(&format!("bad.jsonl{message}")), "{shown}");
        }
    }
}
