//! The narrow set of fused operations the model is written against (DESIGN.md decision 1).
//!
//! Model code calls only these; each backend implements them over its own tensor storage. The CPU
//! backend ([`cpu::CpuBackend`]) is the reference: plain f32 loops, obviously correct. The CUDA
//! backend ([`cuda`]) runs the same operations with the kernels in `kernels/`.
//!
//! Conventions: activations are row-major `[tokens, features]`; a sequence batch is packed
//! (tokens of all sequences back to back) and described by `cu_seqlens` (`[0, len0, len0+len1,
//! ...]`) and per-token `positions`; weights follow HF (`linear` computes `x W^T + b` with `W`
//! stored `[out_features, in_features]`).

pub mod adamw;
pub mod cpu;
pub mod cpu_grad;
pub mod cpu_sampling;
pub mod cuda;
pub mod grad;
pub mod loss;

pub use cuda::CudaBackend;
pub use grad::BackendGrad;

use crate::tensor::HostTensor;
use anyhow::{bail, Result};

/// A token id that another tensor-parallel rank's vocabulary shard holds: the embedding gives it
/// a zero row (and its backward skips it), the fused loss finds no target logit for it here.
pub const OTHER_SHARD: u32 = u32::MAX;

/// Rotary embedding parameters shared by every layer: the inverse frequencies of the
/// `head_dim / 2` rotated pairs and YaRN's attention scaling (1 without YaRN).
#[derive(Clone, Debug)]
pub struct Rotary {
    pub inv_freq: Vec<f64>,
    pub attention_scaling: f64,
}

/// How one row of logits is sampled by [`Backend::sample_rows`]: no filters, no top-n logprobs
/// (those stay on the host sampler, `engine/sampler.rs`, which this op follows exactly on the CPU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowDraw {
    /// 0 = greedy (the argmax, ties to the lowest id; `uniform` unused); otherwise the row's
    /// `softmax(logits / temperature)` is sampled.
    pub temperature: f32,
    /// The inverse CDF's uniform draw in [0, 1), taken from the request's seeded generator.
    pub uniform: f64,
}

impl RowDraw {
    /// Checks the draw is in range; the error names the row and field.
    pub fn check(&self, row: usize) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(
                "sample_rows: row {row} has temperature {}",
                self.temperature
            );
        }
        if !(0.0..1.0).contains(&self.uniform) {
            bail!(
                "sample_rows: row {row} has uniform draw {} outside [0, 1)",
                self.uniform
            );
        }
        Ok(())
    }
}

/// Where one engine step's query rows sit in the paged KV cache (DESIGN.md decision 7).
///
/// ```text
///  sequence s: context positions 0 .. context_lens[s]
///  ┌──────── already cached ────────┬── this step's query rows ──┐
///  0                      context_lens[s] - n_s          context_lens[s]
///  n_s = cu_query[s+1] - cu_query[s]; position p lives in slot
///  block_tables[s][p / block_size] * block_size + p % block_size
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PagedLayout {
    pub block_size: usize,
    /// `[0, n_0, n_0 + n_1, ...]`: query rows of each sequence, packed.
    pub cu_query: Vec<u32>,
    /// Per sequence: context length including this step's rows.
    pub context_lens: Vec<u32>,
    /// `[num_seqs, max_blocks_per_seq]` row-major, padded with the null block 0.
    pub block_tables: Vec<u32>,
    pub max_blocks_per_seq: usize,
    /// Per query row: the cache slot its K/V is written to.
    pub slot_mapping: Vec<u32>,
}

impl PagedLayout {
    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }
    pub fn num_query_rows(&self) -> usize {
        *self.cu_query.last().unwrap_or(&0) as usize
    }
    pub fn block_table(&self, seq: usize) -> &[u32] {
        &self.block_tables[seq * self.max_blocks_per_seq..][..self.max_blocks_per_seq]
    }
    /// The sequence a packed query row belongs to.
    pub fn sequence_of_row(&self, row: usize) -> usize {
        self.cu_query
            .partition_point(|&start| start as usize <= row)
            - 1
    }
    /// The context position of query row `row` of sequence `seq`.
    pub fn position_of_row(&self, seq: usize, row: usize) -> usize {
        self.context_lens[seq] as usize - (self.cu_query[seq + 1] as usize - row)
    }
    /// Checks the layout is consistent and every table entry addresses one of `num_blocks`.
    pub fn check(&self, num_blocks: usize) -> Result<()> {
        let n = self.num_seqs();
        if self.block_size == 0 || self.cu_query.len() != n + 1 || self.cu_query[0] != 0 {
            bail!("paged layout: {n} sequences, cu_query {:?}", self.cu_query);
        }
        if self.block_tables.len() != n * self.max_blocks_per_seq
            || self.slot_mapping.len() != self.num_query_rows()
        {
            bail!(
                "paged layout: {} table entries for {n} x {}, {} slots for {} rows",
                self.block_tables.len(),
                self.max_blocks_per_seq,
                self.slot_mapping.len(),
                self.num_query_rows()
            );
        }
        for s in 0..n {
            let rows = self.cu_query[s + 1].checked_sub(self.cu_query[s]);
            let context = self.context_lens[s] as usize;
            match rows {
                Some(rows) if rows as usize <= context => {}
                _ => bail!("paged layout: sequence {s} has bad query rows or context"),
            }
            if context.div_ceil(self.block_size) > self.max_blocks_per_seq {
                bail!("paged layout: sequence {s} context {context} exceeds its block table");
            }
            if let Some(&b) = self
                .block_table(s)
                .iter()
                .find(|&&b| b as usize >= num_blocks)
            {
                bail!("paged layout: block {b} of {num_blocks} in sequence {s}'s table");
            }
        }
        Ok(())
    }
}

pub trait Backend {
    type Tensor;

    /// A short name for logs and tables: `cpu`, `cuda:0 (NVIDIA H100 ...)`.
    fn name(&self) -> String;

    /// Copies a host tensor (any float dtype) into this backend's storage.
    fn upload(&self, tensor: &HostTensor<'_>) -> Result<Self::Tensor>;
    /// Copies a model's parameters, in order. Backends that keep parameters in one arena
    /// (CUDA: a single allocation with aligned views) override this.
    fn upload_params(&self, tensors: &[&HostTensor<'_>]) -> Result<Vec<Self::Tensor>> {
        tensors.iter().map(|t| self.upload(t)).collect()
    }
    /// Overwrites `dst` in place with `src` (same shape, any float dtype, converted as
    /// [`Backend::upload`] converts): `dst` keeps its storage, so a weight reload needs no second
    /// copy of the model. Errors, with `dst` unchanged, when the shapes or the byte count differ.
    fn overwrite(&self, dst: &mut Self::Tensor, src: &HostTensor<'_>) -> Result<()>;
    /// Overwrites every element of `dst` with `values` (f32, rounded to `dst`'s element type as
    /// an upload rounds): the host-staged collectives write their results back with it. Unlike
    /// [`Backend::overwrite`] it takes activations and f32 tensors alike and is not a weight
    /// change (captured graphs stay valid).
    fn write_f32(&self, dst: &mut Self::Tensor, values: &[f32]) -> Result<()>;
    /// Opens a step scope, closed by [`Backend::end_step`]. Inside it the backend may keep device
    /// copies of the host index arrays its ops are given (positions, slot mappings, paged
    /// layouts), keyed by their address, so that the layers of one forward upload them once.
    /// Callers keep those arrays alive and unchanged until `end_step` (a forward that borrows
    /// them for its whole duration does). Scopes nest. Default: nothing is kept.
    fn begin_step(&self) {}
    /// Closes the innermost step scope; the outermost close drops the kept copies.
    fn end_step(&self) {}
    /// A zero-filled activation tensor (bf16 on CUDA, f32 on the CPU).
    fn zeros(&self, shape: &[usize]) -> Result<Self::Tensor>;
    /// A zero-filled tensor kept in f32 on every backend: logits, losses, statistics.
    fn zeros_f32(&self, shape: &[usize]) -> Result<Self::Tensor> {
        self.zeros(shape)
    }
    /// Every element as f32 on the host.
    fn to_host(&self, tensor: &Self::Tensor) -> Result<Vec<f32>>;
    /// The tensor on the host in its own element type (bf16 weights on CUDA, f32 on the CPU):
    /// what a weight handoff through host memory sends, one tensor at a time. Default: widened
    /// to f32.
    fn to_host_tensor(&self, tensor: &Self::Tensor) -> Result<HostTensor<'static>> {
        let values = self.to_host(tensor)?;
        Ok(HostTensor::from_f32(self.shape(tensor).to_vec(), &values))
    }
    fn shape<'t>(&self, tensor: &'t Self::Tensor) -> &'t [usize];
    /// A copy of rows `range` of a tensor (first dimension).
    fn slice_rows(
        &self,
        tensor: &Self::Tensor,
        range: std::ops::Range<usize>,
    ) -> Result<Self::Tensor>;

    /// `out[t] = table[ids[t]]`; `table: [vocab, d]`, `out: [T, d]`; an id of [`OTHER_SHARD`]
    /// gives a zero row (vocabulary-parallel embedding: the ranks' rows add up).
    fn embedding(&self, table: &Self::Tensor, ids: &[u32], out: &mut Self::Tensor) -> Result<()>;
    /// `out = x * rsqrt(mean(x^2) + eps) * weight`, row by row.
    fn rmsnorm(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `residual += delta; out = rmsnorm(residual) * weight`.
    fn add_rmsnorm(
        &self,
        residual: &mut Self::Tensor,
        delta: &Self::Tensor,
        weight: &Self::Tensor,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// `out[T, n] = x[T, k] W[n, k]^T (+ bias[n])`; `out` may be an f32 tensor (logits).
    fn linear(
        &self,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// Rotates `q: [T, heads, head_dim]` and `k: [T, kv_heads, head_dim]` in place (HF's
    /// rotate-half pairing `(i, i + head_dim/2)`), cos and sin multiplied by the attention scaling.
    fn rope(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()>;
    /// Causal GQA attention within each packed sequence. `q, out: [T, heads, head_dim]`,
    /// `k, v: [T, kv_heads, head_dim]`; query head `h` reads kv head `h / (heads / kv_heads)`.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// Copies each new token's K and V rows (`k, v: [T, kv_heads, head_dim]`) into its slot of the
    /// paged caches (`[num_blocks, block_size, kv_heads, head_dim]`); slot = block * block_size +
    /// offset.
    fn write_kv(
        &self,
        k: &Self::Tensor,
        v: &Self::Tensor,
        slot_mapping: &[u32],
        k_cache: &mut Self::Tensor,
        v_cache: &mut Self::Tensor,
    ) -> Result<()>;
    /// Causal GQA attention of this step's query rows over their sequences' whole cached context
    /// (which already holds this step's K/V: call `write_kv` first). One op for chunked prefill,
    /// prefill after a prefix-cache hit, and decode. `q, out: [rows, heads, head_dim]`.
    fn paged_attention(
        &self,
        q: &Self::Tensor,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        layout: &PagedLayout,
        softmax_scale: f32,
        out: &mut Self::Tensor,
    ) -> Result<()>;
    /// Rows `rows` of `x` (first dimension), in that order.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;
    /// `out = silu(gate) * up`, elementwise.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor, out: &mut Self::Tensor) -> Result<()>;
    /// `log_softmax(logits[t])[targets[t]]` for every row of `logits: [T, vocab]`.
    fn token_logprobs(&self, logits: &Self::Tensor, targets: &[u32]) -> Result<Vec<f32>>;
    /// Samples one token from each row of `logits: [rows, vocab]` (f32) as [`RowDraw`] says:
    /// the inverse CDF of `softmax(logits / temperature)` in index order at the draw, or the
    /// argmax at temperature 0. Returns `(token, logprob)` per row, the logprob under the
    /// distribution sampled from; at temperature 1 (and greedy) it is this backend's
    /// `token_logprobs` of the token, bit for bit.
    fn sample_rows(&self, logits: &Self::Tensor, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>>;

    /// One pure decode step (every sequence of `layout` adds the one token in `tokens`), its LM
    /// head and [`Backend::sample_rows`] with `draws`, replayed from a captured graph where the
    /// backend has them (CUDA: `cuda/graphs.rs`). `None`: no graph for this step, run it eagerly
    /// (the CPU backend always answers `None`).
    fn decode_step_graph<M: DecodeModel<Self>>(
        &self,
        _model: &M,
        _cache: &mut M::Cache,
        _tokens: &[u32],
        _positions: &[u32],
        _layout: &PagedLayout,
        _draws: &[RowDraw],
    ) -> Result<Option<Vec<(u32, f32)>>>
    where
        Self: Sized,
    {
        Ok(None)
    }
    /// Drops captured graphs: the weights (or cache) they read may be gone.
    fn reset_graphs(&self) {}
    /// The tensor-parallel degree of the LM head whose logits this backend's `sample_rows` and
    /// `token_logprobs` will see (the model sets it when built): they split a row's statistics
    /// into that many vocabulary shards, combined as the vocabulary-parallel loss combines its
    /// ranks', so all three give the same bits (CUDA, `kernels/logsumexp.cuh`). The CPU reference
    /// computes in f64 and ignores it.
    fn set_lm_head_shards(&self, _shards: usize) {}
    /// Gives memory the backend keeps cached for reuse back to the system (after a large free,
    /// such as a released KV cache, so another user of the device can have it).
    fn release_cached_memory(&self) {}
    /// Where a tensor's bytes are on the device, for a handoff between two backends of the same
    /// device in one process (the RL loop's trainer to its engine); `None` on host backends.
    /// Waits for queued work first, so the bytes are final.
    fn device_span(&self, _tensor: &Self::Tensor) -> Result<Option<DeviceSpan>> {
        Ok(None)
    }
    /// Overwrites `dst` with the bytes of `span` (same device, same byte count and element type)
    /// and waits for the copy.
    ///
    /// # Safety
    /// `span` must describe live device memory of another backend on this device that nobody
    /// writes until this returns.
    unsafe fn copy_from_span(&self, _dst: &mut Self::Tensor, _span: &DeviceSpan) -> Result<()> {
        anyhow::bail!("this backend has no device memory to copy into")
    }
}

/// What [`Backend::decode_step_graph`] needs of a model. A backend that captures decode steps
/// runs the model's own forward inside the capture (the model is written once, DESIGN.md
/// decision 1), so it calls back into the model through this trait instead of knowing its type:
/// the model sits above the backend. [`crate::model::Qwen2Model`] implements it over its paged
/// KV cache (`model/decode_step.rs`).
pub trait DecodeModel<B: Backend> {
    /// What the step's forward reads and writes besides the parameters: the paged K/V cache.
    type Cache;
    /// (query heads, KV heads) of this rank.
    fn heads_local(&self) -> (usize, usize);
    /// Blocks in `cache`; 0 when it holds no layers (a released cache).
    fn cache_blocks(&self, cache: &Self::Cache) -> usize;
    /// Every tensor a step reads or writes by address, in a fixed order: each parameter, then
    /// each layer's K and V cache. A captured step is valid only while these stay where they are.
    fn step_tensors<'a>(&'a self, cache: &'a Self::Cache) -> Vec<&'a B::Tensor>;
    /// The paged forward of one step (`tokens` at `positions`, placed by `layout`, their K/V
    /// written into `cache`) and the LM head: f32 logits `[rows, vocab]`.
    fn step_logits(
        &self,
        backend: &B,
        cache: &mut Self::Cache,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
    ) -> Result<B::Tensor>;
}

/// Bytes of a tensor on a device: see [`Backend::device_span`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpan {
    pub device: usize,
    pub ptr: u64,
    pub bytes: usize,
    /// Bytes per element (2: bf16, 4: f32).
    pub element_bytes: usize,
}

/// Where a command runs its model: `auto` (the GPU when there is one, else the CPU), `cpu`, or
/// `cuda` (an error without a usable GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda),
            other => Err(format!(
                "unknown device {other:?}: expected auto, cpu or cuda"
            )),
        }
    }
}

/// The backend a command got, with the line it prints about it, e.g.
/// `backend: cpu (2 threads); CUDA: no CUDA driver (libcuda) on this machine`.
pub enum Selected {
    Cpu(cpu::CpuBackend),
    Cuda(Box<CudaBackend>),
}

pub fn select(choice: DeviceChoice) -> Result<(Selected, String)> {
    let cuda = match choice {
        DeviceChoice::Cpu => Err("not requested (--device cpu)".to_string()),
        // The emulated device is for correctness checks: slow, so never picked by `auto`.
        DeviceChoice::Auto if cuda::is_emulated() => {
            Err("emulated device (a SWERVE_EMU=1 build), used only with --device cuda".to_string())
        }
        DeviceChoice::Auto | DeviceChoice::Cuda => CudaBackend::open_default(),
    };
    match cuda {
        Ok(backend) => {
            let line = format!("backend: {} (CUDA kernels + cuBLASLt)", backend.name());
            Ok((Selected::Cuda(Box::new(backend)), line))
        }
        Err(reason) if choice == DeviceChoice::Cuda => bail!("--device cuda: {reason}"),
        Err(reason) => {
            let cpu = cpu::CpuBackend::new();
            let line = format!("backend: {}; CUDA: {reason}", cpu.name());
            Ok((Selected::Cpu(cpu), line))
        }
    }
}
