//! [`CudaBackend`]: every forward op of the [`Backend`] trait on one GPU.
//!
//! Weights and activations are bf16, logits fp32 (the LM head GEMM writes fp32 directly, so log
//! probabilities never see a bf16 rounding of the logits). Parameters live in one arena
//! ([`Backend::upload_params`]); activations come from the caching [`BufferPool`]. Small per-call
//! inputs (token ids, `cu_seqlens`) are copied up on each call; positions, slot mappings and paged
//! layouts once per step inside a step scope ([`Backend::begin_step`]), else on each call; the
//! rotary frequencies once per distinct set.

use super::flash_attn::{check_cu_seqlens, VarlenLayout};
use super::gemm::Gemm;
use super::graph_inputs::DecodeGraphs;
use super::loss_tiles::LossTiles;
use super::paged_attn::DevicePagedLayout;
use super::sampling::{finish_samples, finish_token_logprobs, sample_words};
use super::tensor::{Arena, BufferPool, CudaTensor, DeviceDType, DeviceUpload};
use super::CudaDevice;
use crate::backend::{Backend, DecodeModel, PagedLayout, Rotary, RowDraw, OTHER_SHARD};
use crate::tensor::{DType, HostTensor};
use anyhow::{bail, ensure, Context, Result};
use cudarc::driver::result as driver;
use half::bf16;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

pub struct CudaBackend {
    pub device: CudaDevice,
    pub gemm: Gemm,
    pub pool: BufferPool,
    inv_freq: Mutex<Option<(Vec<f64>, CudaTensor)>>,
    step: Mutex<StepUploads>,
    /// Allocations of CUDA-graph warm-ups and captures: never handed to eager work, so a
    /// graph's baked-in buffers are only ever reused by other graphs (`cuda/graphs.rs`).
    pub graph_pool: BufferPool,
    /// Allocations come from `graph_pool` (a graph's warm-up or capture is running).
    pub(super) graph_mode: AtomicBool,
    /// A stream capture is running: host copies are refused.
    pub(super) capturing: AtomicBool,
    pub(super) graphs: Mutex<DecodeGraphs>,
    /// See [`Self::loss_tiles`].
    loss_tiles: Mutex<LossTiles>,
    /// See [`CudaBackend::lm_head_shards`].
    lm_head_shards: AtomicUsize,
}

/// Device copies of the current step's host index arrays (see [`Backend::begin_step`]): every
/// layer of a forward passes the same positions, slot mapping and paged layout, which are then
/// uploaded (and the attention work plan built) once per step instead of once per layer.
#[derive(Default)]
struct StepUploads {
    /// Open scopes; copies are kept only while it is above 0.
    depth: usize,
    /// (host address, length) of a `u32` array -> its device copy.
    arrays: Vec<((usize, usize), CudaTensor)>,
    /// Host address of a `PagedLayout` -> its device form.
    layouts: Vec<(usize, DevicePagedLayout)>,
}

impl CudaBackend {
    pub fn new(device: CudaDevice) -> Result<Self> {
        let gemm = Gemm::new(device.stream.clone())?;
        let pool = BufferPool::new(device.stream.clone());
        let graph_pool = BufferPool::for_graphs(device.stream.clone());
        Ok(Self {
            device,
            gemm,
            pool,
            inv_freq: Mutex::new(None),
            step: Mutex::new(StepUploads::default()),
            graph_pool,
            graph_mode: AtomicBool::new(false),
            capturing: AtomicBool::new(false),
            graphs: Mutex::new(DecodeGraphs::default()),
            loss_tiles: Mutex::new(LossTiles::DEFAULT),
            lm_head_shards: AtomicUsize::new(1),
        })
    }

    /// The vocabulary shards the sampler and `token_logprobs` split a logits row into: the
    /// tensor-parallel degree of the model whose LM head produced it (set when the model is
    /// built, [`crate::backend::Backend::set_lm_head_shards`]), so they report the bits of the
    /// vocabulary-parallel loss.
    pub fn lm_head_shards(&self) -> usize {
        self.lm_head_shards.load(Ordering::Relaxed).max(1)
    }

    /// The fused loss's tiles; their `vocab` is also the vocabulary chunk of the canonical
    /// log-softmax order (kernels/logsumexp.cuh) the sampler and `token_logprobs` use, so all
    /// three report the same logprob bits.
    pub fn loss_tiles(&self) -> LossTiles {
        self.loss_tiles
            .lock()
            .map(|t| *t)
            .unwrap_or(LossTiles::DEFAULT)
    }

    /// Sets [`Self::loss_tiles`] (tests use small tiles to exercise the chunk merging on small
    /// vocabularies). Captured decode graphs, which bake the chunk in, are dropped.
    pub fn set_loss_tiles(&self, tiles: LossTiles) -> Result<()> {
        ensure!(
            tiles.rows > 0 && tiles.rows <= 65535 && tiles.vocab > 0,
            "loss tiles {tiles:?}"
        );
        *self
            .loss_tiles
            .lock()
            .map_err(|_| anyhow::anyhow!("loss tiles lock poisoned"))? = tiles;
        self.reset_decode_graphs();
        Ok(())
    }

    /// Device `ordinal` (after [`super::probe`] found the driver and device 0).
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::new(CudaDevice::open(ordinal)?)
    }

    /// Devices the driver reports.
    pub fn device_count(&self) -> Result<usize> {
        let n = cudarc::driver::CudaContext::device_count()
            .map_err(|e| anyhow::anyhow!("the CUDA driver cannot count devices: {e}"))?;
        Ok(n.max(0) as usize)
    }

    /// Device 0, or why not (as [`super::probe`]).
    pub fn open_default() -> std::result::Result<Self, String> {
        let device = super::probe()?;
        Self::new(device).map_err(|e| format!("{e:#}"))
    }

    /// Calls `f` with a device copy of the `u32` array `data`: the step's copy inside a step
    /// scope (uploaded on first use), a fresh one outside.
    fn with_step_array<R>(
        &self,
        data: &[u32],
        f: impl FnOnce(&CudaTensor) -> Result<R>,
    ) -> Result<R> {
        let mut step = self.step.lock().expect("step uploads lock poisoned");
        if step.depth == 0 {
            drop(step);
            return f(&self.upload_pod(data, &[data.len()], DeviceDType::U32)?);
        }
        let key = (data.as_ptr() as usize, data.len());
        let i = match step.arrays.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let t = self.upload_pod(data, &[data.len()], DeviceDType::U32)?;
                step.arrays.push((key, t));
                step.arrays.len() - 1
            }
        };
        f(&step.arrays[i].1)
    }

    /// Calls `f` with the device form of `layout`, kept for the step inside a step scope.
    fn with_step_layout<R>(
        &self,
        layout: &PagedLayout,
        f: impl FnOnce(&DevicePagedLayout) -> Result<R>,
    ) -> Result<R> {
        let mut step = self.step.lock().expect("step uploads lock poisoned");
        if step.depth == 0 {
            drop(step);
            return f(&DevicePagedLayout::upload(self, layout)?);
        }
        let key = layout as *const PagedLayout as usize;
        let i = match step.layouts.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                step.layouts
                    .push((key, DevicePagedLayout::upload(self, layout)?));
                step.layouts.len() - 1
            }
        };
        f(&step.layouts[i].1)
    }

    /// Calls `f` with the device copies of `positions` (the step's, inside a step scope) and of
    /// the rotary frequencies (uploaded once per distinct set: every layer shares one); the rope
    /// forward and its backward (`cuda/grad.rs`) both go through here.
    pub(super) fn with_rope_tables<R>(
        &self,
        positions: &[u32],
        rotary: &Rotary,
        f: impl FnOnce(&CudaTensor, &CudaTensor) -> Result<R>,
    ) -> Result<R> {
        self.with_step_array(positions, |positions| {
            let mut cached = self.inv_freq.lock().expect("rotary cache lock poisoned");
            if cached
                .as_ref()
                .is_none_or(|(freqs, _)| freqs != &rotary.inv_freq)
            {
                let freqs = rotary.inv_freq.clone();
                let t = self.upload_pod(&freqs, &[freqs.len()], DeviceDType::F64)?;
                *cached = Some((freqs, t));
            }
            let (_, inv_freq) = cached.as_ref().expect("filled above");
            f(positions, inv_freq)
        })
    }

    /// Gives `host` (alive and unchanged until the step scope closes) the device copy `device`
    /// in the current step scope: ops given `host` use it instead of uploading. How a CUDA graph
    /// feeds its static input buffers to the generic model code.
    pub(super) fn pin_step_array(&self, host: &[u32], device: CudaTensor) {
        let mut step = self.step.lock().expect("step uploads lock poisoned");
        step.arrays
            .push(((host.as_ptr() as usize, host.len()), device));
    }

    /// [`Self::pin_step_array`] for a paged layout.
    pub(super) fn pin_step_layout(&self, host: &PagedLayout, device: DevicePagedLayout) {
        let mut step = self.step.lock().expect("step uploads lock poisoned");
        step.layouts
            .push((host as *const PagedLayout as usize, device));
    }

    /// The pool allocations come from now: the graph pool during a graph's warm-up and capture.
    pub fn active_pool(&self) -> &BufferPool {
        match self.graph_mode.load(Ordering::Relaxed) {
            true => &self.graph_pool,
            false => &self.pool,
        }
    }

    /// An uninitialised pooled tensor.
    pub fn alloc(&self, shape: &[usize], dtype: DeviceDType) -> Result<CudaTensor> {
        self.active_pool().alloc(shape, dtype)
    }

    fn refuse_host_copy_in_capture(&self, what: &str) -> Result<()> {
        ensure!(
            !self.capturing.load(Ordering::Relaxed),
            "{what} inside a CUDA graph capture: every input of a captured step must be pinned"
        );
        Ok(())
    }

    /// Copies host bytes into `tensor` (sizes must match).
    pub fn write_bytes(&self, tensor: &mut CudaTensor, bytes: &[u8]) -> Result<()> {
        ensure!(
            bytes.len() == tensor.num_bytes(),
            "upload of {} bytes into a tensor of {}",
            bytes.len(),
            tensor.num_bytes()
        );
        if bytes.is_empty() {
            return Ok(());
        }
        self.refuse_host_copy_in_capture("a copy to the GPU")?;
        // SAFETY: the tensor holds exactly `bytes.len()` bytes; a copy from pageable host memory
        // has staged the source before this call returns.
        unsafe { driver::memcpy_htod_async(tensor.ptr(), bytes, self.device.stream.cu_stream()) }
            .context("copying to the GPU")?;
        Ok(())
    }

    /// A pooled tensor holding `values`.
    pub fn upload_pod<T: bytemuck::Pod>(
        &self,
        values: &[T],
        shape: &[usize],
        dtype: DeviceDType,
    ) -> Result<CudaTensor> {
        ensure!(
            std::mem::size_of::<T>() == dtype.size(),
            "upload of {}-byte values as {dtype:?}",
            std::mem::size_of::<T>()
        );
        let mut t = self.alloc(shape, dtype)?;
        self.write_bytes(&mut t, bytemuck::cast_slice(values))?;
        Ok(t)
    }

    /// The raw bytes of a tensor, after all queued work.
    pub fn read_bytes(&self, tensor: &CudaTensor) -> Result<Vec<u8>> {
        self.refuse_host_copy_in_capture("a copy from the GPU")?;
        let mut bytes = vec![0u8; tensor.num_bytes()];
        if !bytes.is_empty() {
            // SAFETY: the tensor holds `bytes.len()` bytes; a copy to pageable memory returns
            // only when it has completed.
            unsafe {
                driver::memcpy_dtoh_async(&mut bytes, tensor.ptr(), self.device.stream.cu_stream())
            }
            .context("copying from the GPU")?;
        }
        self.device.synchronize()?;
        Ok(bytes)
    }

    /// Fills a tensor with one byte value (0 for zeros; 0xFF makes NaN poison in bf16 and f32).
    pub fn fill_bytes(&self, tensor: &mut CudaTensor, byte: u8) -> Result<()> {
        if tensor.num_bytes() > 0 {
            // SAFETY: the range is the tensor's own memory.
            unsafe {
                driver::memset_d8_async(
                    tensor.ptr(),
                    byte,
                    tensor.num_bytes(),
                    self.device.stream.cu_stream(),
                )
            }
            .context("memset on the GPU")?;
        }
        Ok(())
    }

    /// Writes a host tensor (any float dtype) into a device bf16 tensor of the same size.
    fn write_host_tensor(&self, host: &HostTensor<'_>, out: &mut CudaTensor) -> Result<()> {
        host.check()?;
        match host.dtype {
            DType::BF16 => self.write_bytes(out, &host.bytes),
            DType::F16 => self.write_bytes(out, bytemuck::cast_slice(&host.to_bf16_vec())),
            DType::F32 => {
                // Rounded on the GPU: the fp32 copy is staged in a pooled buffer.
                let mut staged = self.alloc(&host.shape, DeviceDType::F32)?;
                self.write_bytes(&mut staged, &host.bytes)?;
                self.device.convert(&staged, out)
            }
        }
    }
}

impl DeviceUpload for CudaBackend {
    fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
        &self.device.stream
    }
    fn write_bytes(&self, tensor: &mut CudaTensor, bytes: &[u8]) -> Result<()> {
        CudaBackend::write_bytes(self, tensor, bytes)
    }
    fn upload_pod<T: bytemuck::Pod>(
        &self,
        values: &[T],
        shape: &[usize],
        dtype: DeviceDType,
    ) -> Result<CudaTensor> {
        CudaBackend::upload_pod(self, values, shape, dtype)
    }
}

/// Values from little-endian bytes (which need not be aligned for `T`).
pub fn pod_vec<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// `[tokens, heads, head_dim]` of an attention operand.
fn heads_of(what: &str, t: &CudaTensor) -> Result<usize> {
    match t.shape() {
        [_, heads, _] => Ok(*heads),
        other => bail!("attention: {what} has shape {other:?}, expected [tokens, heads, head_dim]"),
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;

    fn name(&self) -> String {
        self.device.describe()
    }

    fn upload(&self, tensor: &HostTensor<'_>) -> Result<CudaTensor> {
        let mut out = self.alloc(&tensor.shape, DeviceDType::Bf16)?;
        self.write_host_tensor(tensor, &mut out)?;
        Ok(out)
    }

    fn upload_params(&self, tensors: &[&HostTensor<'_>]) -> Result<Vec<CudaTensor>> {
        // New weights: captured decode graphs (which bake weight addresses in) start over.
        self.bump_graph_generation();
        let bytes = Arena::bytes_for(tensors.iter().map(|t| t.numel() * 2));
        let mut arena = Arena::new(&self.device.stream, bytes)?;
        let mut out = Vec::with_capacity(tensors.len());
        for host in tensors {
            let mut t = arena.take(&host.shape, DeviceDType::Bf16)?;
            self.write_host_tensor(host, &mut t)?;
            out.push(t);
        }
        self.device.synchronize()?;
        Ok(out)
    }

    fn overwrite(&self, dst: &mut CudaTensor, src: &HostTensor<'_>) -> Result<()> {
        src.check()?;
        ensure!(
            dst.shape() == src.shape.as_slice() && dst.dtype() == DeviceDType::Bf16,
            "overwrite: a {:?} {:?} tensor with {:?} data",
            dst.shape(),
            dst.dtype(),
            src.shape
        );
        // Weights overwritten in place: captured decode graphs start over.
        self.bump_graph_generation();
        // A host-to-device copy into the existing buffer (f32 data is rounded on the device).
        self.write_host_tensor(src, dst)?;
        self.device.synchronize()
    }

    fn write_f32(&self, dst: &mut CudaTensor, values: &[f32]) -> Result<()> {
        ensure!(
            dst.len() == values.len(),
            "write_f32: {} values into a {:?} tensor",
            values.len(),
            dst.shape()
        );
        match dst.dtype() {
            DeviceDType::F32 => self.write_bytes(dst, bytemuck::cast_slice(values)),
            DeviceDType::Bf16 => {
                let host = HostTensor::from_f32(dst.shape().to_vec(), values);
                self.write_host_tensor(&host, dst)
            }
            other => bail!("write_f32: a {other:?} tensor"),
        }
    }

    fn zeros(&self, shape: &[usize]) -> Result<CudaTensor> {
        let mut t = self.alloc(shape, DeviceDType::Bf16)?;
        self.fill_bytes(&mut t, 0)?;
        Ok(t)
    }

    fn zeros_f32(&self, shape: &[usize]) -> Result<CudaTensor> {
        let mut t = self.alloc(shape, DeviceDType::F32)?;
        self.fill_bytes(&mut t, 0)?;
        Ok(t)
    }

    fn to_host(&self, tensor: &CudaTensor) -> Result<Vec<f32>> {
        let bytes = self.read_bytes(tensor)?;
        Ok(match tensor.dtype() {
            DeviceDType::Bf16 => pod_vec::<bf16>(&bytes).iter().map(|v| v.to_f32()).collect(),
            DeviceDType::F32 => pod_vec::<f32>(&bytes),
            other => bail!("to_host of a {other:?} tensor"),
        })
    }

    /// The device bytes as they are: bf16 weights stay bf16.
    fn to_host_tensor(&self, tensor: &CudaTensor) -> Result<HostTensor<'static>> {
        let dtype = match tensor.dtype() {
            DeviceDType::Bf16 => DType::BF16,
            DeviceDType::F32 => DType::F32,
            other => bail!("to_host_tensor of a {other:?} tensor"),
        };
        Ok(HostTensor {
            dtype,
            shape: tensor.shape().to_vec(),
            bytes: std::borrow::Cow::Owned(self.read_bytes(tensor)?),
        })
    }

    fn shape<'t>(&self, tensor: &'t CudaTensor) -> &'t [usize] {
        tensor.shape()
    }

    fn slice_rows(&self, tensor: &CudaTensor, range: std::ops::Range<usize>) -> Result<CudaTensor> {
        let rows = *tensor.shape().first().unwrap_or(&0);
        ensure!(
            range.start <= range.end && range.end <= rows,
            "slice_rows: {range:?} of {rows} rows"
        );
        let row_bytes = tensor.num_bytes() / rows.max(1);
        let mut shape = tensor.shape().to_vec();
        shape[0] = range.len();
        let out = self.alloc(&shape, tensor.dtype())?;
        if out.num_bytes() > 0 {
            // SAFETY: both ranges lie inside their tensors.
            unsafe {
                driver::memcpy_dtod_async(
                    out.ptr(),
                    tensor.ptr() + (range.start * row_bytes) as u64,
                    out.num_bytes(),
                    self.device.stream.cu_stream(),
                )
            }?;
        }
        Ok(out)
    }

    fn embedding(&self, table: &CudaTensor, ids: &[u32], out: &mut CudaTensor) -> Result<()> {
        let vocab = *table.shape().first().unwrap_or(&0);
        let outside = |&(_, &id): &(usize, &u32)| id as usize >= vocab && id != OTHER_SHARD;
        if let Some((t, &id)) = ids.iter().enumerate().find(outside) {
            bail!("embedding: token id {id} at position {t} is outside the vocabulary of {vocab}");
        }
        self.with_step_array(ids, |ids| self.device.embedding_fwd(table, ids, out))
    }

    fn rmsnorm(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        self.device.rmsnorm_fwd(x, weight, eps, out)
    }

    fn add_rmsnorm(
        &self,
        residual: &mut CudaTensor,
        delta: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        self.device
            .add_rmsnorm_fwd(residual, delta, weight, eps, out)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        bias: Option<&CudaTensor>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        self.gemm.linear(x, weight, bias, out)
    }

    fn begin_step(&self) {
        if let Ok(mut step) = self.step.lock() {
            step.depth += 1;
        }
    }

    fn end_step(&self) {
        if let Ok(mut step) = self.step.lock() {
            step.depth = step.depth.saturating_sub(1);
            if step.depth == 0 {
                step.arrays.clear();
                step.layouts.clear();
            }
        }
    }

    fn rope(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()> {
        self.with_rope_tables(positions, rotary, |positions, inv_freq| {
            self.device
                .rope_fwd(q, k, positions, inv_freq, rotary.attention_scaling as f32)
        })
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (_, total_tokens) = check_cu_seqlens(cu_seqlens)?;
        let (heads, kv_heads) = (heads_of("q", q)?, heads_of("k", k)?);
        ensure!(
            q.shape()[0] == total_tokens,
            "attention: q has {} rows, cu_seqlens ends at {total_tokens}",
            q.shape()[0]
        );
        // The longest sequence (the grid) is derived from the host cu_seqlens by the layout.
        let layout = VarlenLayout::upload(self, cu_seqlens)?;
        let mut lse = self.alloc(&[total_tokens, heads], DeviceDType::F32)?;
        self.device.flash_attn_fwd(
            q,
            k,
            v,
            &layout,
            heads,
            kv_heads,
            softmax_scale,
            out,
            &mut lse,
        )
    }

    fn write_kv(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        slot_mapping: &[u32],
        k_cache: &mut CudaTensor,
        v_cache: &mut CudaTensor,
    ) -> Result<()> {
        let cache_slots = k_cache.shape().iter().take(2).product::<usize>();
        if let Some((row, &slot)) = slot_mapping
            .iter()
            .enumerate()
            .find(|(_, &s)| s as usize >= cache_slots)
        {
            bail!("write_kv: row {row} maps to slot {slot} of a {cache_slots}-slot cache");
        }
        self.with_step_array(slot_mapping, |slots| {
            self.device.write_kv(k, v, slots, k_cache, v_cache)
        })
    }

    fn paged_attention(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        layout: &PagedLayout,
        softmax_scale: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        // The layout's structure is checked when it is uploaded, its block ids against this cache
        // in `CudaDevice::paged_attention`: once per step, not once per layer.
        self.with_step_layout(layout, |device_layout| {
            self.device.paged_attention(
                q,
                k_cache,
                v_cache,
                device_layout,
                softmax_scale,
                out,
                self.active_pool(),
            )
        })
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[u32]) -> Result<CudaTensor> {
        ensure!(
            x.dtype() == DeviceDType::Bf16,
            "gather_rows of a {:?} tensor",
            x.dtype()
        );
        let mut shape = x.shape().to_vec();
        ensure!(!shape.is_empty(), "gather_rows of a scalar");
        let table_rows = shape[0];
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= table_rows) {
            bail!("gather_rows: row {r} of {table_rows}");
        }
        // A row gather is the embedding kernel with `x` as the table.
        let ids = self.upload_pod(rows, &[rows.len()], DeviceDType::U32)?;
        shape[0] = rows.len();
        let mut out = self.alloc(&shape, DeviceDType::Bf16)?;
        self.device.embedding_fwd(x, &ids, &mut out)?;
        Ok(out)
    }

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor, out: &mut CudaTensor) -> Result<()> {
        self.device.swiglu_fwd(gate, up, out)
    }

    fn token_logprobs(&self, logits: &CudaTensor, targets: &[u32]) -> Result<Vec<f32>> {
        let vocab = logits.cols();
        if let Some((t, &id)) = targets
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            bail!("token_logprobs: target {id} at row {t} is outside the vocabulary of {vocab}");
        }
        let targets_dev = self.upload_pod(targets, &[targets.len()], DeviceDType::U32)?;
        let shards = self.lm_head_shards();
        let mut out = self.alloc(&[targets.len(), 1 + 2 * shards], DeviceDType::F32)?;
        let chunk = self.loss_tiles().vocab;
        self.device
            .token_logprob_stats(logits, &targets_dev, chunk, shards, &mut out)?;
        // Finished as the trainer's fused loss finishes its rows (RowStats::merge_shards, logprob).
        let values = pod_vec::<f32>(&self.read_bytes(&out)?);
        Ok(finish_token_logprobs(&values, shards))
    }

    fn sample_rows(&self, logits: &CudaTensor, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>> {
        ensure!(
            logits.rows() == draws.len() && !draws.is_empty(),
            "sample_rows: {} rows of logits for {} draws",
            logits.rows(),
            draws.len()
        );
        for (r, draw) in draws.iter().enumerate() {
            draw.check(r)?;
        }
        let temperatures: Vec<f32> = draws.iter().map(|d| d.temperature).collect();
        let uniforms: Vec<f64> = draws.iter().map(|d| d.uniform).collect();
        let temperatures = self.upload_pod(&temperatures, &[draws.len()], DeviceDType::F32)?;
        let uniforms = self.upload_pod(&uniforms, &[draws.len()], DeviceDType::F64)?;
        let shards = self.lm_head_shards();
        let mut out = self.alloc(&[draws.len(), sample_words(shards)], DeviceDType::U32)?;
        let chunk = self.loss_tiles().vocab;
        self.device
            .sample_rows(logits, &temperatures, &uniforms, chunk, shards, &mut out)?;
        Ok(finish_samples(
            &pod_vec::<u32>(&self.read_bytes(&out)?),
            shards,
        ))
    }

    fn decode_step_graph<M: DecodeModel<Self>>(
        &self,
        model: &M,
        kv: &mut M::Cache,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
        draws: &[RowDraw],
    ) -> Result<Option<Vec<(u32, f32)>>> {
        self.run_decode_graph(model, kv, tokens, positions, layout, draws)
    }

    fn reset_graphs(&self) {
        self.reset_decode_graphs();
    }

    fn set_lm_head_shards(&self, shards: usize) {
        self.lm_head_shards.store(shards.max(1), Ordering::Relaxed);
    }

    fn release_cached_memory(&self) {
        self.pool.release_cached();
    }

    fn device_span(&self, tensor: &CudaTensor) -> Result<Option<crate::backend::DeviceSpan>> {
        self.device.synchronize()?;
        Ok(Some(crate::backend::DeviceSpan {
            device: self.device.ordinal,
            ptr: tensor.ptr(),
            bytes: tensor.num_bytes(),
            element_bytes: tensor.dtype().size(),
        }))
    }

    unsafe fn copy_from_span(
        &self,
        dst: &mut CudaTensor,
        span: &crate::backend::DeviceSpan,
    ) -> Result<()> {
        ensure!(
            span.device == self.device.ordinal
                && span.bytes == dst.num_bytes()
                && span.element_bytes == dst.dtype().size(),
            "copy_from_span: {} bytes of {}-byte elements on device {} into a {:?} {:?} tensor on device {}",
            span.bytes,
            span.element_bytes,
            span.device,
            dst.shape(),
            dst.dtype(),
            self.device.ordinal
        );
        // Weights overwritten in place: captured decode graphs start over.
        self.bump_graph_generation();
        if span.bytes > 0 {
            // SAFETY: the caller guarantees the source is live and unchanged; both contexts are
            // the device's primary context, so the pointer is valid here; sizes checked above.
            unsafe {
                driver::memcpy_dtod_async(
                    dst.ptr(),
                    span.ptr,
                    span.bytes,
                    self.device.stream.cu_stream(),
                )
            }
            .context("copy_from_span: device copy")?;
        }
        self.device.synchronize()
    }
}
