//! The reference backend: f32 tensors in host memory and plain loops, obviously correct.
//!
//! Everything the engine does runs here with tiny models (CI has no GPU), and every CUDA kernel
//! is checked against these functions. Speed matters only enough for tests and the default
//! benchmark to be quick: GEMMs and attention split their work over the machine's cores.

use super::cpu_sampling::sample_unfiltered_at;
use super::{Backend, PagedLayout, Rotary, RowDraw, OTHER_SHARD};
use crate::tensor::HostTensor;
use anyhow::{bail, ensure, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape {shape:?} vs {} values",
            data.len()
        );
        Self { shape, data }
    }

    /// Length of the last dimension (the row length of a row-major matrix view).
    fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }

    fn rows(&self) -> usize {
        self.data.len() / self.cols().max(1)
    }
}

/// Causal attention of one query row over its first `num_keys` keys: key `j`'s row starts at
/// `key_row(j)` in `keys`/`values`, offset by `head_offset` for the kv head. Plain and paged
/// attention both call this, in the same order, so a paged run equals a full recomputation bit
/// for bit on this backend.
#[allow(clippy::too_many_arguments)]
fn attend_row(
    q_row: &[f32],
    keys: &[f32],
    values: &[f32],
    head_offset: usize,
    num_keys: usize,
    key_row: impl Fn(usize) -> usize,
    softmax_scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let head_dim = q_row.len();
    scores.clear();
    scores.extend(
        (0..num_keys)
            .map(|j| dot(q_row, &keys[key_row(j) + head_offset..][..head_dim]) * softmax_scale),
    );
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        let v_row = &values[key_row(j) + head_offset..][..head_dim];
        for (od, &vd) in out.iter_mut().zip(v_row) {
            *od += p * vd;
        }
    }
    for od in out.iter_mut() {
        *od /= sum;
    }
}

#[derive(Clone, Debug)]
pub struct CpuBackend {
    threads: usize,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        Self {
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }

    /// Threads its parallel loops use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn with_threads(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
        }
    }
}

/// Runs `work(first_row, rows_chunk)` over `data` split into `threads` contiguous row chunks.
fn par_rows(
    threads: usize,
    data: &mut [f32],
    row_len: usize,
    work: impl Fn(usize, &mut [f32]) + Sync,
) {
    let rows = data.len().checked_div(row_len).unwrap_or(0);
    let per_thread = rows.div_ceil(threads.max(1)).max(1);
    if threads <= 1 || rows <= 1 {
        work(0, data);
        return;
    }
    std::thread::scope(|s| {
        for (i, chunk) in data.chunks_mut(per_thread * row_len).enumerate() {
            let work = &work;
            s.spawn(move || work(i * per_thread, chunk));
        }
    });
}

/// Dot product with eight independent accumulators (vectorises without reassociating a single sum):
/// every CPU matmul uses it, the fused loss's logits included.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() / 8 * 8);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a_rest.iter().zip(b_rest) {
        sum += x * y;
    }
    sum
}

fn rmsnorm_row(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean_sq = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
    let inv_rms = (1.0 / (mean_sq + eps as f64).sqrt()) as f32;
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv_rms * w;
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }

    fn upload(&self, tensor: &HostTensor<'_>) -> Result<CpuTensor> {
        tensor.check()?;
        Ok(CpuTensor::new(tensor.shape.clone(), tensor.to_f32_vec()))
    }

    fn overwrite(&self, dst: &mut CpuTensor, src: &HostTensor<'_>) -> Result<()> {
        src.check()?;
        ensure!(
            dst.shape == src.shape,
            "overwrite: a {:?} tensor with {:?} data",
            dst.shape,
            src.shape
        );
        src.write_f32(&mut dst.data);
        Ok(())
    }

    fn write_f32(&self, dst: &mut CpuTensor, values: &[f32]) -> Result<()> {
        ensure!(
            dst.data.len() == values.len(),
            "write_f32: {} values into a {:?} tensor",
            values.len(),
            dst.shape
        );
        dst.data.copy_from_slice(values);
        Ok(())
    }

    fn zeros(&self, shape: &[usize]) -> Result<CpuTensor> {
        Ok(CpuTensor::new(
            shape.to_vec(),
            vec![0.0; shape.iter().product()],
        ))
    }

    fn to_host(&self, tensor: &CpuTensor) -> Result<Vec<f32>> {
        Ok(tensor.data.clone())
    }

    /// One copy of the f32 values (the default would make two).
    fn to_host_tensor(&self, tensor: &CpuTensor) -> Result<HostTensor<'static>> {
        Ok(HostTensor::from_f32(tensor.shape.clone(), &tensor.data))
    }

    fn shape<'t>(&self, tensor: &'t CpuTensor) -> &'t [usize] {
        &tensor.shape
    }

    fn slice_rows(&self, tensor: &CpuTensor, range: std::ops::Range<usize>) -> Result<CpuTensor> {
        let rows = *tensor.shape.first().unwrap_or(&0);
        ensure!(
            range.start <= range.end && range.end <= rows,
            "slice_rows: {range:?} of {rows} rows"
        );
        let row_len = tensor.data.len() / rows.max(1);
        let mut shape = tensor.shape.clone();
        shape[0] = range.len();
        Ok(CpuTensor::new(
            shape,
            tensor.data[range.start * row_len..range.end * row_len].to_vec(),
        ))
    }

    fn embedding(&self, table: &CpuTensor, ids: &[u32], out: &mut CpuTensor) -> Result<()> {
        let d = table.cols();
        let vocab = table.rows();
        ensure!(
            out.data.len() == ids.len() * d,
            "embedding: out {:?} for {} ids of width {d}",
            out.shape,
            ids.len()
        );
        for (row, &id) in out.data.chunks_exact_mut(d).zip(ids) {
            if id == OTHER_SHARD {
                row.fill(0.0);
                continue;
            }
            if id as usize >= vocab {
                bail!("token id {id} is outside the embedding table of {vocab} rows");
            }
            row.copy_from_slice(&table.data[id as usize * d..(id as usize + 1) * d]);
        }
        Ok(())
    }

    fn rmsnorm(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        eps: f32,
        out: &mut CpuTensor,
    ) -> Result<()> {
        let d = weight.data.len();
        ensure!(
            x.cols() == d && out.data.len() == x.data.len(),
            "rmsnorm: x {:?}, weight {:?}",
            x.shape,
            weight.shape
        );
        for (xr, or) in x.data.chunks_exact(d).zip(out.data.chunks_exact_mut(d)) {
            rmsnorm_row(xr, &weight.data, eps, or);
        }
        Ok(())
    }

    fn add_rmsnorm(
        &self,
        residual: &mut CpuTensor,
        delta: &CpuTensor,
        weight: &CpuTensor,
        eps: f32,
        out: &mut CpuTensor,
    ) -> Result<()> {
        ensure!(
            residual.data.len() == delta.data.len(),
            "add_rmsnorm: residual {:?} vs delta {:?}",
            residual.shape,
            delta.shape
        );
        for (r, &d) in residual.data.iter_mut().zip(&delta.data) {
            *r += d;
        }
        self.rmsnorm(residual, weight, eps, out)
    }

    fn linear(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        bias: Option<&CpuTensor>,
        out: &mut CpuTensor,
    ) -> Result<()> {
        let (k, n) = (weight.cols(), weight.rows());
        ensure!(
            k > 0 && x.data.len().is_multiple_of(k),
            "linear: x {:?} against weight {:?}",
            x.shape,
            weight.shape
        );
        let tokens = x.data.len() / k;
        ensure!(
            out.data.len() == tokens * n,
            "linear: out {:?}, expected [{tokens}, {n}]",
            out.shape
        );
        if let Some(b) = bias {
            ensure!(
                b.data.len() == n,
                "linear: bias {:?} for {n} outputs",
                b.shape
            );
        }
        // Tokens in blocks that stay in cache while every weight row streams past them once.
        const TOKEN_BLOCK: usize = 32;
        let w = &weight.data;
        let xs = &x.data;
        par_rows(self.threads, &mut out.data, n, |first_token, out_rows| {
            let rows_here = out_rows.len() / n;
            for t0 in (0..rows_here).step_by(TOKEN_BLOCK) {
                let t1 = (t0 + TOKEN_BLOCK).min(rows_here);
                for j in 0..n {
                    let w_row = &w[j * k..(j + 1) * k];
                    let b = bias.map_or(0.0, |b| b.data[j]);
                    for t in t0..t1 {
                        let x_row = &xs[(first_token + t) * k..(first_token + t + 1) * k];
                        out_rows[t * n + j] = dot(x_row, w_row) + b;
                    }
                }
            }
        });
        Ok(())
    }

    fn rope(
        &self,
        q: &mut CpuTensor,
        k: &mut CpuTensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()> {
        let head_dim = q.cols();
        let half = head_dim / 2;
        ensure!(
            rotary.inv_freq.len() == half,
            "rope: {} frequencies for head_dim {head_dim}",
            rotary.inv_freq.len()
        );
        ensure!(
            k.cols() == head_dim,
            "rope: q head_dim {head_dim}, k {:?}",
            k.shape
        );
        let heads_of = |x: &CpuTensor| -> Result<usize> {
            let heads = x.data.len() / head_dim / positions.len().max(1);
            ensure!(
                x.data.len() == positions.len() * heads * head_dim,
                "rope: {:?} for {} positions",
                x.shape,
                positions.len()
            );
            Ok(heads)
        };
        let (q_heads, k_heads) = (heads_of(q)?, heads_of(k)?);
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        for (t, &pos) in positions.iter().enumerate() {
            // One cos/sin row per token, shared by every q and k head.
            for (i, &f) in rotary.inv_freq.iter().enumerate() {
                let angle = pos as f64 * f;
                cos[i] = (angle.cos() * rotary.attention_scaling) as f32;
                sin[i] = (angle.sin() * rotary.attention_scaling) as f32;
            }
            let q_token = &mut q.data[t * q_heads * head_dim..(t + 1) * q_heads * head_dim];
            let k_token = &mut k.data[t * k_heads * head_dim..(t + 1) * k_heads * head_dim];
            for head in q_token
                .chunks_exact_mut(head_dim)
                .chain(k_token.chunks_exact_mut(head_dim))
            {
                let (a, b) = head.split_at_mut(half);
                for i in 0..half {
                    let (x1, x2) = (a[i], b[i]);
                    a[i] = x1 * cos[i] - x2 * sin[i];
                    b[i] = x2 * cos[i] + x1 * sin[i];
                }
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut CpuTensor,
    ) -> Result<()> {
        let head_dim = q.cols();
        let tokens = *cu_seqlens.last().unwrap_or(&0) as usize;
        ensure!(
            tokens > 0 && q.data.len().is_multiple_of(tokens * head_dim),
            "attention: q {:?} for {tokens} tokens",
            q.shape
        );
        let heads = q.data.len() / (tokens * head_dim);
        let kv_heads = k.data.len() / (tokens * head_dim);
        ensure!(
            kv_heads > 0 && heads.is_multiple_of(kv_heads),
            "attention: {heads} heads over {kv_heads} kv heads"
        );
        ensure!(
            v.data.len() == k.data.len() && out.data.len() == q.data.len(),
            "attention: v {:?}, out {:?}",
            v.shape,
            out.shape
        );
        ensure!(
            cu_seqlens[0] == 0 && cu_seqlens.windows(2).all(|w| w[0] <= w[1]),
            "attention: cu_seqlens must rise from 0"
        );
        let group = heads / kv_heads;
        let row_len = kv_heads * head_dim;
        // Each token's output row [heads, head_dim] is computed by the thread owning that token.
        par_rows(
            self.threads,
            &mut out.data,
            heads * head_dim,
            |first_token, out_rows| {
                let mut scores = Vec::new();
                for (i, out_row) in out_rows.chunks_exact_mut(heads * head_dim).enumerate() {
                    let t = first_token + i;
                    let seq = cu_seqlens.partition_point(|&start| start as usize <= t) - 1;
                    let seq_start = cu_seqlens[seq] as usize;
                    let key_row = |j: usize| (seq_start + j) * row_len;
                    for h in 0..heads {
                        attend_row(
                            &q.data[(t * heads + h) * head_dim..][..head_dim],
                            &k.data,
                            &v.data,
                            (h / group) * head_dim,
                            t - seq_start + 1,
                            key_row,
                            softmax_scale,
                            &mut scores,
                            &mut out_row[h * head_dim..(h + 1) * head_dim],
                        );
                    }
                }
            },
        );
        Ok(())
    }

    fn write_kv(
        &self,
        k: &CpuTensor,
        v: &CpuTensor,
        slot_mapping: &[u32],
        k_cache: &mut CpuTensor,
        v_cache: &mut CpuTensor,
    ) -> Result<()> {
        let row_len = k.data.len() / slot_mapping.len().max(1);
        ensure!(
            k.data.len() == slot_mapping.len() * row_len && v.data.len() == k.data.len(),
            "write_kv: k {:?}, v {:?} for {} slots",
            k.shape,
            v.shape,
            slot_mapping.len()
        );
        let slots = k_cache.data.len() / row_len.max(1);
        ensure!(
            v_cache.data.len() == k_cache.data.len(),
            "write_kv: caches differ"
        );
        for (t, &slot) in slot_mapping.iter().enumerate() {
            let slot = slot as usize;
            ensure!(slot < slots, "write_kv: slot {slot} of {slots}");
            k_cache.data[slot * row_len..][..row_len]
                .copy_from_slice(&k.data[t * row_len..][..row_len]);
            v_cache.data[slot * row_len..][..row_len]
                .copy_from_slice(&v.data[t * row_len..][..row_len]);
        }
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        k_cache: &CpuTensor,
        v_cache: &CpuTensor,
        layout: &PagedLayout,
        softmax_scale: f32,
        out: &mut CpuTensor,
    ) -> Result<()> {
        let head_dim = q.cols();
        let rows = layout.num_query_rows();
        let num_blocks = k_cache.shape.first().copied().unwrap_or(0);
        layout.check(num_blocks)?;
        ensure!(
            rows > 0
                && q.data.len().is_multiple_of(rows * head_dim)
                && out.data.len() == q.data.len(),
            "paged_attention: q {:?}, out {:?} for {rows} query rows",
            q.shape,
            out.shape
        );
        let heads = q.data.len() / (rows * head_dim);
        let slot_len = k_cache.data.len() / (num_blocks * layout.block_size).max(1);
        let kv_heads = slot_len / head_dim;
        ensure!(
            kv_heads > 0
                && heads.is_multiple_of(kv_heads)
                && v_cache.data.len() == k_cache.data.len(),
            "paged_attention: {heads} heads over a cache {:?}",
            k_cache.shape
        );
        let group = heads / kv_heads;
        par_rows(
            self.threads,
            &mut out.data,
            heads * head_dim,
            |first_row, out_rows| {
                let mut scores = Vec::new();
                for (i, out_row) in out_rows.chunks_exact_mut(heads * head_dim).enumerate() {
                    let r = first_row + i;
                    let seq = layout.sequence_of_row(r);
                    let position = layout.position_of_row(seq, r);
                    let table = layout.block_table(seq);
                    let bs = layout.block_size;
                    let key_row = |j: usize| (table[j / bs] as usize * bs + j % bs) * slot_len;
                    for h in 0..heads {
                        attend_row(
                            &q.data[(r * heads + h) * head_dim..][..head_dim],
                            &k_cache.data,
                            &v_cache.data,
                            (h / group) * head_dim,
                            position + 1,
                            key_row,
                            softmax_scale,
                            &mut scores,
                            &mut out_row[h * head_dim..(h + 1) * head_dim],
                        );
                    }
                }
            },
        );
        Ok(())
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[u32]) -> Result<CpuTensor> {
        let cols = x.cols();
        let mut data = Vec::with_capacity(rows.len() * cols);
        for &r in rows {
            ensure!(
                (r as usize) < x.rows(),
                "gather_rows: row {r} of {}",
                x.rows()
            );
            data.extend_from_slice(&x.data[r as usize * cols..][..cols]);
        }
        let mut shape = x.shape.clone();
        shape[0] = rows.len();
        Ok(CpuTensor::new(shape, data))
    }

    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor, out: &mut CpuTensor) -> Result<()> {
        ensure!(
            gate.data.len() == up.data.len() && out.data.len() == up.data.len(),
            "swiglu: gate {:?}, up {:?}",
            gate.shape,
            up.shape
        );
        for ((o, &g), &u) in out.data.iter_mut().zip(&gate.data).zip(&up.data) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
        Ok(())
    }

    fn token_logprobs(&self, logits: &CpuTensor, targets: &[u32]) -> Result<Vec<f32>> {
        let vocab = logits.cols();
        ensure!(
            logits.rows() == targets.len(),
            "token_logprobs: {} rows for {} targets",
            logits.rows(),
            targets.len()
        );
        logits
            .data
            .chunks_exact(vocab)
            .zip(targets)
            .map(|(row, &target)| {
                if target as usize >= vocab {
                    bail!("target id {target} is outside the vocabulary of {vocab}");
                }
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let sum: f64 = row.iter().map(|&z| (z as f64 - max).exp()).sum();
                Ok((row[target as usize] as f64 - max - sum.ln()) as f32)
            })
            .collect()
    }

    fn sample_rows(&self, logits: &CpuTensor, draws: &[RowDraw]) -> Result<Vec<(u32, f32)>> {
        ensure!(
            logits.rows() == draws.len(),
            "sample_rows: {} rows of logits for {} draws",
            logits.rows(),
            draws.len()
        );
        let vocab = logits.cols();
        ensure!(vocab > 0, "sample_rows: logits {:?}", logits.shape);
        logits
            .data
            .chunks_exact(vocab)
            .zip(draws)
            .enumerate()
            .map(|(r, (row, draw))| {
                draw.check(r)?;
                Ok(sample_unfiltered_at(row, draw.temperature, draw.uniform))
            })
            .collect()
    }
}
