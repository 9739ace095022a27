//! Checkpoint folders in HF layout: `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. Files are memory-mapped; tensors are borrowed views until a
//! backend uploads them.
//!
//! Loading is strict: every tensor the config implies must be present with its exact shape and a
//! float dtype (BF16, F16 or F32), and nothing else may be present (a tied model has no
//! `lm_head.weight`). Every error names the file and the tensor at fault.

use crate::config::{LocalSizes, ModelConfig};
use crate::model::params::Qwen2Params;
use crate::tensor::{DType, HostTensor};
use anyhow::{anyhow, bail, Context, Result};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// All tensors of a checkpoint folder, indexed by name, their bytes still in the mapped files.
pub struct Checkpoint {
    files: Vec<(PathBuf, Mmap)>,
    tensors: BTreeMap<String, TensorEntry>,
}

struct TensorEntry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the mapped file (header included in the offset).
    range: std::ops::Range<usize>,
}

impl Checkpoint {
    /// Maps `DIR/model.safetensors`, or every shard named by `DIR/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        let mut checkpoint = Checkpoint {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        if index_path.is_file() {
            let weight_map = read_index(&index_path)?;
            let mut shard_names: Vec<&String> = weight_map.values().collect();
            shard_names.sort();
            shard_names.dedup();
            for shard in shard_names {
                if shard.contains('/') || shard.contains('\\') || shard == ".." {
                    bail!(
                        "{}: shard name {shard:?} must be a file name inside the folder",
                        index_path.display()
                    );
                }
                let path = dir.join(shard);
                checkpoint.add_file(&path)?;
                // Every tensor in a shard must be listed in the index as living in that shard.
                let file_index = checkpoint.files.len() - 1;
                for (name, entry) in &checkpoint.tensors {
                    if entry.file == file_index && weight_map.get(name) != Some(shard) {
                        bail!(
                            "{}: tensor {name} is in this shard but {} lists it {}",
                            path.display(),
                            index_path.display(),
                            match weight_map.get(name) {
                                Some(other) => format!("in {other}"),
                                None => "nowhere".to_string(),
                            }
                        );
                    }
                }
            }
            for (name, shard) in &weight_map {
                if !checkpoint.tensors.contains_key(name) {
                    bail!(
                        "{}: lists tensor {name} in {shard}, which does not contain it",
                        index_path.display()
                    );
                }
            }
        } else if single_path.is_file() {
            checkpoint.add_file(&single_path)?;
        } else {
            bail!(
                "no checkpoint in {}: expected {SINGLE_FILE} or {INDEX_FILE}",
                dir.display()
            );
        }
        Ok(checkpoint)
    }

    /// Maps one safetensors file of any name (an optimizer state, say).
    pub fn open_file(path: &Path) -> Result<Self> {
        let mut checkpoint = Checkpoint {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        checkpoint.add_file(path)?;
        Ok(checkpoint)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: the file is opened read-only; a checkpoint changed by another process while
        // mapped is outside what any loader can defend against.
        let mmap = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| describe_bad_file(&mmap, e))
            .with_context(|| format!("{}: not a valid safetensors file", path.display()))?;
        let data_start = 8 + header_len;
        let file_index = self.files.len();
        for (name, info) in metadata.tensors() {
            if let Some(previous) = self.tensors.get(&name) {
                bail!(
                    "tensor {name} appears twice: in {} and in {}",
                    self.files[previous.file].0.display(),
                    path.display()
                );
            }
            let (start, end) = info.data_offsets;
            self.tensors.insert(
                name,
                TensorEntry {
                    file: file_index,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    range: data_start + start..data_start + end,
                },
            );
        }
        self.files.push((path.to_path_buf(), mmap));
        Ok(())
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The file a tensor lives in, for error messages.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.tensors
            .get(name)
            .map(|e| self.files[e.file].0.as_path())
    }

    /// A float tensor by name, checked against the expected shape.
    pub fn tensor(&self, name: &str, expected_shape: &[usize]) -> Result<HostTensor<'_>> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            let files: Vec<String> = self
                .files
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect();
            anyhow!(
                "tensor {name} is missing from the checkpoint ({})",
                files.join(", ")
            )
        })?;
        let path = self.files[entry.file].0.display();
        let dtype = match entry.dtype {
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            Dtype::F32 => DType::F32,
            other => bail!("{path}: tensor {name} has dtype {other:?}; expected BF16, F16 or F32"),
        };
        if entry.shape != expected_shape {
            bail!(
                "{path}: tensor {name} has shape {:?}; the config implies {expected_shape:?}",
                entry.shape
            );
        }
        let tensor = HostTensor {
            dtype,
            shape: entry.shape.clone(),
            bytes: Cow::Borrowed(&self.files[entry.file].1[entry.range.clone()]),
        };
        tensor
            .check()
            .with_context(|| format!("{path}: tensor {name}"))?;
        Ok(tensor)
    }

    /// Every parameter of a Qwen2 model on one rank (`local`: its slices of each tensor, read
    /// from the mapped files; rows stay borrowed), shape-checked against the whole tensors, with
    /// no tensor left over.
    pub fn qwen2_params(
        &self,
        config: &ModelConfig,
        local: &LocalSizes,
    ) -> Result<Qwen2Params<HostTensor<'_>>> {
        // A config with absurd sizes must fail before a per-layer list is allocated: every
        // tensor's shape is checked against the file below, but not the number of layers. Each
        // layer has several tensors, so a count past the checkpoint's is hopeless; below it, the
        // first missing tensor is named.
        if config.num_hidden_layers > self.tensors.len() {
            bail!(
                "config.json's `num_hidden_layers` {} is more than the {} tensors the checkpoint \
                 ({}) holds ({} per layer)",
                config.num_hidden_layers,
                self.tensors.len(),
                self.files
                    .iter()
                    .map(|(p, _)| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Qwen2Params::<()>::TENSORS_PER_LAYER
            );
        }
        let mut used = std::collections::HashSet::new();
        let params = Qwen2Params::try_build(config, local, |name, _, shard| {
            used.insert(name.to_string());
            let whole = self.tensor(name, &shard.full_shape)?;
            match &shard.split {
                None => Ok(whole),
                Some((dim, range)) => whole.slice(*dim, range.clone()),
            }
        })?;
        if let Some(extra) = self.tensors.keys().find(|name| !used.contains(*name)) {
            let why = if extra == "lm_head.weight" && config.tie_word_embeddings {
                " (config.json has tie_word_embeddings: true, so the LM head is the embedding)"
            } else {
                ""
            };
            bail!(
                "{}: unexpected tensor {extra}{why}",
                self.file_of(extra).unwrap().display()
            );
        }
        Ok(params)
    }
}

fn read_index(path: &Path) -> Result<HashMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", path.display()))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| anyhow!("{}: no `weight_map` object", path.display()))?;
    map.iter()
        .map(|(name, file)| match file.as_str() {
            Some(f) => Ok((name.clone(), f.to_string())),
            None => bail!(
                "{}: weight_map entry {name} must be a file name, found {file}",
                path.display()
            ),
        })
        .collect()
}

/// Turns safetensors' terse errors into what a user can act on, truncation above all.
fn describe_bad_file(bytes: &[u8], error: safetensors::SafeTensorError) -> anyhow::Error {
    use safetensors::SafeTensorError as E;
    let file_len = bytes.len();
    let header_len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    match (&error, header_len) {
        (E::HeaderTooSmall, _) => {
            anyhow!("file is {file_len} bytes, too short for the 8-byte header length")
        }
        (E::InvalidHeaderLength, Some(n)) => {
            anyhow!("truncated or corrupt: the header claims {n} bytes but the file has {file_len} bytes")
        }
        (E::MetadataIncompleteBuffer, Some(n)) => {
            // The header parsed; the data section is shorter or longer than it declares.
            let declared = std::str::from_utf8(&bytes[8..8 + n as usize])
                .ok()
                .and_then(|h| serde_json::from_str::<serde_json::Value>(h).ok())
                .and_then(|h| {
                    h.as_object()?
                        .values()
                        .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
                        .max()
                })
                .map(|end| end + 8 + n);
            match declared {
                Some(want) if (want as usize) > file_len => {
                    anyhow!("truncated: the header declares {want} bytes in all, the file has {file_len}")
                }
                Some(want) => anyhow!("the header declares {want} bytes in all, the file has {file_len} (trailing bytes)"),
                None => anyhow!("{error}"),
            }
        }
        _ => anyhow!("bad header: {error}"),
    }
}

impl safetensors::View for &HostTensor<'_> {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            DType::BF16 => Dtype::BF16,
            DType::F16 => Dtype::F16,
            DType::F32 => Dtype::F32,
        }
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Writes tensors to one safetensors file (used by tests and by checkpoint writing).
pub fn write_safetensors(path: &Path, tensors: &[(String, HostTensor<'_>)]) -> Result<()> {
    let views: Vec<(&str, &HostTensor<'_>)> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::serialize_to_file(views, None, path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// A safetensors file written one tensor at a time, in a fixed order announced up front: the
/// header (every name, dtype, shape and offset) first, then each tensor's bytes as it comes, so a
/// checkpoint of any size passes through memory one tensor at a time (a tensor-parallel save
/// gathers each from the ranks just before writing it).
pub struct SafetensorsWriter {
    path: PathBuf,
    file: std::io::BufWriter<File>,
    /// (name, bytes) of every tensor, in file order; `next` is the one to write now.
    entries: Vec<(String, usize)>,
    next: usize,
}

impl SafetensorsWriter {
    /// Creates `path` with the header for `tensors` (name, dtype, shape), in that order.
    pub fn create(path: &Path, tensors: &[(String, DType, Vec<usize>)]) -> Result<Self> {
        use std::io::Write;
        let mut header = serde_json::Map::new();
        let mut offset = 0usize;
        let mut entries = Vec::with_capacity(tensors.len());
        for (name, dtype, shape) in tensors {
            let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype.name(), "shape": shape,
                                   "data_offsets": [offset, offset + bytes]}),
            );
            entries.push((name.clone(), bytes));
            offset += bytes;
        }
        let mut text = serde_json::to_string(&serde_json::Value::Object(header))?;
        // The data starts 8-byte aligned, as the format's writers pad it.
        while (8 + text.len()) % 8 != 0 {
            text.push(' ');
        }
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
        file.write_all(&(text.len() as u64).to_le_bytes())
            .and_then(|()| file.write_all(text.as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            entries,
            next: 0,
        })
    }

    /// Writes the next tensor's bytes (its name must be the next announced one).
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let Some((want, len)) = self.entries.get(self.next) else {
            bail!(
                "{}: tensor {name} written after the last one",
                self.path.display()
            );
        };
        if want != name || *len != bytes.len() {
            bail!(
                "{}: tensor {name} of {} bytes written where {want} of {len} bytes comes next",
                self.path.display(),
                bytes.len()
            );
        }
        self.file
            .write_all(bytes)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.next += 1;
        Ok(())
    }

    /// Checks every tensor was written and flushes the file to disk.
    pub fn finish(self) -> Result<()> {
        if self.next != self.entries.len() {
            bail!(
                "{}: {} of {} tensors written",
                self.path.display(),
                self.next,
                self.entries.len()
            );
        }
        let file = self
            .file
            .into_inner()
            .map_err(|e| anyhow!("cannot write {}: {}", self.path.display(), e.error()))?;
        file.sync_all()
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}
