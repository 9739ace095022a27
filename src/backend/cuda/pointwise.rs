//! Launches of the memory-bound kernel families: `embedding.cu`, `rope.cu`, `swiglu.cu`,
//! `convert.cu` and `logprobs.cu`, forward and backward. Each wrapper checks dtypes and sizes
//! against the tensors first.
//!
//! Gradient dtypes: activation gradients are bf16 like the activations (`d_q`, `d_gate`, ...);
//! parameter gradients are f32 (`d_table` of the embedding), so that micro-batches accumulate
//! without bf16 rounding.

use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, grid_stride_config, CudaDevice};
use crate::backend::OTHER_SHARD;
use anyhow::{bail, ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

fn expect_dtype(op: &str, what: &str, t: &CudaTensor, dtype: DeviceDType) -> Result<()> {
    ensure!(
        t.dtype() == dtype,
        "{op}: {what} is {:?}, expected {dtype:?}",
        t.dtype()
    );
    Ok(())
}

fn rows_config(rows: usize, threads: (u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads.0, threads.1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaDevice {
    /// `out[t] = table[ids[t]]`; `table [vocab, d...]` bf16, `ids [T]` u32, `out [T, d...]` bf16.
    pub fn embedding_fwd(
        &self,
        table: &CudaTensor,
        ids: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        expect_dtype("embedding", "table", table, DeviceDType::Bf16)?;
        expect_dtype("embedding", "ids", ids, DeviceDType::U32)?;
        expect_dtype("embedding", "out", out, DeviceDType::Bf16)?;
        // Any [rows, ...] tensor works as a table of rows (gather_rows uses this).
        let vocab = *table.shape().first().unwrap_or(&0);
        ensure!(vocab > 0, "embedding: table {:?}", table.shape());
        let d = table.len() / vocab;
        let tokens = ids.len();
        ensure!(
            tokens > 0 && out.len() == tokens * d,
            "embedding: out {:?} for {tokens} ids of width {d}",
            out.shape()
        );
        let (tokens_i, d_i, vocab_i) = (
            as_i32("tokens", tokens)?,
            as_i32("d", d)?,
            as_i32("vocab", vocab)?,
        );
        let f = self.function("embedding", "embedding_fwd_bf16")?;
        let (o, tb, id) = (out.ptr(), table.ptr(), ids.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&o)
            .arg(&tb)
            .arg(&id)
            .arg(&tokens_i)
            .arg(&d_i)
            .arg(&vocab_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(rows_config(tokens, (128, 1))) }?;
        Ok(())
    }

    /// Rotates `q [T, heads, hd]` and `k [T, kv_heads, hd]` in place; `positions [T]` u32,
    /// `inv_freq [hd / 2]` f64.
    pub fn rope_fwd(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        attention_scaling: f32,
    ) -> Result<()> {
        self.rope_launch(
            "rope_fwd_bf16",
            q,
            k,
            positions,
            inv_freq,
            attention_scaling,
        )
    }

    /// The backward of [`Self::rope_fwd`], in place on the gradients `d_q`, `d_k` (bf16): the
    /// rotation by minus each angle, with the same scaling.
    pub fn rope_bwd(
        &self,
        d_q: &mut CudaTensor,
        d_k: &mut CudaTensor,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        attention_scaling: f32,
    ) -> Result<()> {
        self.rope_launch(
            "rope_bwd_bf16",
            d_q,
            d_k,
            positions,
            inv_freq,
            attention_scaling,
        )
    }

    fn rope_launch(
        &self,
        kernel: &str,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        attention_scaling: f32,
    ) -> Result<()> {
        expect_dtype("rope", "q", q, DeviceDType::Bf16)?;
        expect_dtype("rope", "k", k, DeviceDType::Bf16)?;
        expect_dtype("rope", "positions", positions, DeviceDType::U32)?;
        expect_dtype("rope", "inv_freq", inv_freq, DeviceDType::F64)?;
        let head_dim = inv_freq.len() * 2;
        ensure!(
            head_dim.is_multiple_of(4) && head_dim <= 1024,
            "rope: head_dim {head_dim} (the kernel needs a multiple of 4)"
        );
        let tokens = positions.len();
        ensure!(
            tokens > 0
                && q.len().is_multiple_of(tokens * head_dim)
                && k.len().is_multiple_of(tokens * head_dim),
            "rope: q {:?}, k {:?} for {tokens} positions and head_dim {head_dim}",
            q.shape(),
            k.shape()
        );
        let heads = q.len() / (tokens * head_dim);
        let kv_heads = k.len() / (tokens * head_dim);
        let threads_x = (head_dim / 4) as u32;
        let threads_y = (256 / threads_x).max(1);
        let (tokens_i, heads_i, kv_i, hd_i) = (
            as_i32("tokens", tokens)?,
            as_i32("heads", heads)?,
            as_i32("kv_heads", kv_heads)?,
            as_i32("head_dim", head_dim)?,
        );
        let f = self.function("rope", kernel)?;
        let (qp, kp, pp, fp) = (q.ptr(), k.ptr(), positions.ptr(), inv_freq.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&qp)
            .arg(&kp)
            .arg(&pp)
            .arg(&fp)
            .arg(&tokens_i)
            .arg(&heads_i)
            .arg(&kv_i)
            .arg(&hd_i)
            .arg(&attention_scaling);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(rows_config(tokens, (threads_x, threads_y))) }?;
        Ok(())
    }

    /// `out = silu(gate) * up`, elementwise over bf16 tensors of equal size.
    pub fn swiglu_fwd(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        for (what, t) in [("gate", gate), ("up", up), ("out", &*out)] {
            expect_dtype("swiglu", what, t, DeviceDType::Bf16)?;
        }
        let n = gate.len();
        ensure!(
            n > 0 && up.len() == n && out.len() == n,
            "swiglu: gate {:?}, up {:?}, out {:?}",
            gate.shape(),
            up.shape(),
            out.shape()
        );
        let n_i = n as i64;
        let f = self.function("swiglu", "swiglu_fwd_bf16")?;
        let (o, g, u) = (out.ptr(), gate.ptr(), up.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&o).arg(&g).arg(&u).arg(&n_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(grid_stride_config(self, n.div_ceil(8), 256)) }?;
        Ok(())
    }

    /// Elementwise conversion between an fp32 and a bf16 tensor of the same size (either way).
    pub fn convert(&self, input: &CudaTensor, out: &mut CudaTensor) -> Result<()> {
        let name = match (input.dtype(), out.dtype()) {
            (DeviceDType::F32, DeviceDType::Bf16) => "convert_f32_to_bf16",
            (DeviceDType::Bf16, DeviceDType::F32) => "convert_bf16_to_f32",
            (a, b) => anyhow::bail!("convert: no kernel from {a:?} to {b:?}"),
        };
        let n = input.len();
        ensure!(
            out.len() == n,
            "convert: {:?} into {:?}",
            input.shape(),
            out.shape()
        );
        if n == 0 {
            return Ok(());
        }
        let n_i = n as i64;
        let f = self.function("convert", name)?;
        let (o, i) = (out.ptr(), input.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&o).arg(&i).arg(&n_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(grid_stride_config(self, n.div_ceil(8), 256)) }?;
        Ok(())
    }

    /// `out[t] = (logits[t, targets[t]], max, sum)`: row t's target logit and canonical
    /// log-softmax statistics over vocabulary chunks of `chunk` (kernels/logsumexp.cuh);
    /// `logits [T, V]` f32, `targets [T]` u32, `out [T, 3]` f32.
    pub fn token_logprob_stats(
        &self,
        logits: &CudaTensor,
        targets: &CudaTensor,
        chunk: usize,
        shards: usize,
        out: &mut CudaTensor,
    ) -> Result<()> {
        expect_dtype("token_logprobs", "logits", logits, DeviceDType::F32)?;
        expect_dtype("token_logprobs", "targets", targets, DeviceDType::U32)?;
        expect_dtype("token_logprobs", "out", out, DeviceDType::F32)?;
        let (rows, vocab) = (logits.rows(), logits.cols());
        ensure!(
            rows > 0
                && chunk > 0
                && (1..=super::sampling::MAX_VOCAB_SHARDS).contains(&shards)
                && shards <= vocab
                && targets.len() == rows
                && out.len() == (1 + 2 * shards) * rows,
            "token_logprobs: logits {:?}, {} targets, {shards} vocabulary shards, out {:?}",
            logits.shape(),
            targets.len(),
            out.shape()
        );
        let (rows_i, vocab_i) = (as_i32("rows", rows)?, as_i32("vocab", vocab)?);
        let chunk_i = as_i32("vocabulary chunk", chunk)?;
        let shards_i = shards as i32;
        let f = self.function("logprobs", "token_logprob_stats_f32")?;
        let (o, l, t) = (out.ptr(), logits.ptr(), targets.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&o)
            .arg(&l)
            .arg(&t)
            .arg(&rows_i)
            .arg(&vocab_i)
            .arg(&chunk_i)
            .arg(&shards_i);
        let threads = super::sampling::LSE_THREADS;
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(rows_config(rows, (threads, 1))) }?;
        Ok(())
    }

    /// `d_table[ids[t]] += d_out[t]`: `d_out [T, d]` bf16, `d_table [vocab, d]` f32. Deterministic
    /// without atomics: the ids are grouped on the host (see `embedding.cu`); every id must be
    /// below `vocab` (checked here).
    pub fn embedding_bwd(
        &self,
        d_out: &CudaTensor,
        ids: &[u32],
        d_table: &mut CudaTensor,
        upload: impl Fn(&[u32]) -> Result<CudaTensor>,
    ) -> Result<()> {
        expect_dtype("embedding_backward", "d_out", d_out, DeviceDType::Bf16)?;
        expect_dtype("embedding_backward", "d_table", d_table, DeviceDType::F32)?;
        let vocab = *d_table.shape().first().unwrap_or(&0);
        ensure!(
            vocab > 0,
            "embedding_backward: d_table {:?}",
            d_table.shape()
        );
        let d = d_table.len() / vocab;
        ensure!(
            d_out.len() == ids.len() * d,
            "embedding_backward: d_out {:?} for {} ids of width {d}",
            d_out.shape(),
            ids.len()
        );
        if ids.is_empty() {
            return Ok(());
        }
        let outside = |&(_, &id): &(usize, &u32)| id as usize >= vocab && id != OTHER_SHARD;
        if let Some((t, &id)) = ids.iter().enumerate().find(outside) {
            bail!("embedding_backward: token id {id} at position {t} is outside the table of {vocab} rows");
        }
        let (order, mut seg_start, mut unique_ids) = group_ids(ids);
        // Another shard's tokens sort last (the largest id): their segment is dropped.
        if unique_ids.last() == Some(&OTHER_SHARD) {
            unique_ids.pop();
            seg_start.pop();
        }
        if unique_ids.is_empty() {
            return Ok(());
        }
        let segments = unique_ids.len();
        let (order, seg_start, unique_ids) =
            (upload(&order)?, upload(&seg_start)?, upload(&unique_ids)?);
        let (segments_i, d_i, vocab_i) = (
            as_i32("segments", segments)?,
            as_i32("d", d)?,
            as_i32("vocab", vocab)?,
        );
        let f = self.function("embedding", "embedding_bwd_f32")?;
        let (tb, dy, o, s, u) = (
            d_table.ptr(),
            d_out.ptr(),
            order.ptr(),
            seg_start.ptr(),
            unique_ids.ptr(),
        );
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&tb)
            .arg(&dy)
            .arg(&o)
            .arg(&s)
            .arg(&u)
            .arg(&segments_i)
            .arg(&d_i)
            .arg(&vocab_i);
        let blocks = segments.min(self.num_sms as usize * 16).max(1);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(rows_config(blocks, (128, 1))) }?;
        Ok(())
    }

    /// `d_gate += d_out * up * silu'(gate)`, `d_up += d_out * silu(gate)` (bf16, equal sizes).
    pub fn swiglu_bwd(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        d_out: &CudaTensor,
        d_gate: &mut CudaTensor,
        d_up: &mut CudaTensor,
    ) -> Result<()> {
        let n = gate.len();
        for (what, t) in [
            ("gate", gate),
            ("up", up),
            ("d_out", d_out),
            ("d_gate", &*d_gate),
            ("d_up", &*d_up),
        ] {
            expect_dtype("swiglu_backward", what, t, DeviceDType::Bf16)?;
            ensure!(
                t.len() == n,
                "swiglu_backward: {what} {:?} beside gate {:?}",
                t.shape(),
                gate.shape()
            );
        }
        if n == 0 {
            return Ok(());
        }
        let n_i = n as i64;
        let f = self.function("swiglu", "swiglu_bwd_bf16")?;
        let (dg, du, g, u, dy) = (d_gate.ptr(), d_up.ptr(), gate.ptr(), up.ptr(), d_out.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&dg).arg(&du).arg(&g).arg(&u).arg(&dy).arg(&n_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(grid_stride_config(self, n.div_ceil(8), 256)) }?;
        Ok(())
    }

    /// `dst += src` element-wise: bf16 += bf16, f32 += f32, or bf16 += f32 (rounded once).
    pub fn add_into(&self, dst: &mut CudaTensor, src: &CudaTensor) -> Result<()> {
        let name = match (dst.dtype(), src.dtype()) {
            (DeviceDType::Bf16, DeviceDType::Bf16) => "add_into_bf16",
            (DeviceDType::F32, DeviceDType::F32) => "add_into_f32",
            (DeviceDType::Bf16, DeviceDType::F32) => "add_f32_into_bf16",
            (a, b) => bail!("add_into: no kernel adding {b:?} into {a:?}"),
        };
        ensure!(
            dst.len() == src.len(),
            "add_into: {:?} into {:?}",
            src.shape(),
            dst.shape()
        );
        if dst.is_empty() {
            return Ok(());
        }
        let n = dst.len();
        let n_i = n as i64;
        let f = self.function("convert", name)?;
        let (d, s) = (dst.ptr(), src.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&d).arg(&s).arg(&n_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(grid_stride_config(self, n.div_ceil(8), 256)) }?;
        Ok(())
    }

    /// Per-block f64 partial sums of `x^2` (x f32 or bf16) into `partials` (f64, at least
    /// [`SUM_SQUARES_BLOCKS`] long); returns how many blocks wrote one.
    pub fn sum_squares_partials(&self, x: &CudaTensor, partials: &mut CudaTensor) -> Result<usize> {
        let name = match x.dtype() {
            DeviceDType::F32 => "sum_squares_f32",
            DeviceDType::Bf16 => "sum_squares_bf16",
            other => bail!("sum_of_squares of a {other:?} tensor"),
        };
        expect_dtype("sum_of_squares", "partials", partials, DeviceDType::F64)?;
        let n = x.len();
        if n == 0 {
            return Ok(0);
        }
        let blocks = n.div_ceil(256 * 8).clamp(1, SUM_SQUARES_BLOCKS);
        ensure!(
            partials.len() >= blocks,
            "sum_of_squares: {} partials",
            partials.len()
        );
        let n_i = n as i64;
        let f = self.function("convert", name)?;
        let (p, xp) = (partials.ptr(), x.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&p).arg(&xp).arg(&n_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(rows_config(blocks, (256, 1))) }?;
        Ok(blocks)
    }
}

/// Blocks of the sum-of-squares reduction at most (a fixed grid: the same partials, so the same
/// sum, on every GPU).
pub const SUM_SQUARES_BLOCKS: usize = 1024;

/// Groups token rows by id for the deterministic embedding backward: `(order, seg_start,
/// unique_ids)`, where `order[seg_start[u]..seg_start[u + 1]]` are the rows (ascending) of
/// `unique_ids[u]`, ids ascending.
pub fn group_ids(ids: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_by_key(|&t| ids[t as usize]); // stable: rows stay ascending within an id
    let mut seg_start = Vec::new();
    let mut unique_ids = Vec::new();
    for (i, &t) in order.iter().enumerate() {
        let id = ids[t as usize];
        if unique_ids.last() != Some(&id) {
            unique_ids.push(id);
            seg_start.push(i as u32);
        }
    }
    seg_start.push(order.len() as u32);
    (order, seg_start, unique_ids)
}

#[cfg(test)]
mod tests {
    use super::group_ids;

    #[test]
    fn ids_group_by_value_with_rows_in_order() {
        let (order, seg_start, unique) = group_ids(&[5, 2, 5, 0, 2, 5]);
        assert_eq!(unique, vec![0, 2, 5]);
        assert_eq!(seg_start, vec![0, 1, 3, 6]);
        assert_eq!(order, vec![3, 1, 4, 0, 2, 5]);
        let (order, seg_start, unique) = group_ids(&[]);
        assert!(order.is_empty() && unique.is_empty());
        assert_eq!(seg_start, vec![0]);
    }
}
