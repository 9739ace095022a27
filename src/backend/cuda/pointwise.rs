//! Launches of the memory-bound kernel families: `embedding.cu`, `rope.cu`, `swiglu.cu`,
//! `convert.cu` and `logprobs.cu`. Each wrapper checks dtypes and sizes against the tensors first.

use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, grid_stride_config, CudaDevice};
use anyhow::{ensure, Result};
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
        expect_dtype("rope", "q", q, DeviceDType::Bf16)?;
        expect_dtype("rope", "k", k, DeviceDType::Bf16)?;
        expect_dtype("rope", "positions", positions, DeviceDType::U32)?;
        expect_dtype("rope", "inv_freq", inv_freq, DeviceDType::F64)?;
        let head_dim = inv_freq.len() * 2;
        ensure!(
            head_dim % 4 == 0 && head_dim <= 1024,
            "rope: head_dim {head_dim} (the kernel needs a multiple of 4)"
        );
        let tokens = positions.len();
        ensure!(
            tokens > 0 && q.len() % (tokens * head_dim) == 0 && k.len() % (tokens * head_dim) == 0,
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
        let f = self.function("rope", "rope_fwd_bf16")?;
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

    /// `out[t] = log_softmax(logits[t])[targets[t]]`; `logits [T, V]` f32, `targets [T]` u32,
    /// `out [T]` f32.
    pub fn token_logprobs(
        &self,
        logits: &CudaTensor,
        targets: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        expect_dtype("token_logprobs", "logits", logits, DeviceDType::F32)?;
        expect_dtype("token_logprobs", "targets", targets, DeviceDType::U32)?;
        expect_dtype("token_logprobs", "out", out, DeviceDType::F32)?;
        let (rows, vocab) = (logits.rows(), logits.cols());
        ensure!(
            rows > 0 && targets.len() == rows && out.len() == rows,
            "token_logprobs: logits {:?}, {} targets, out {:?}",
            logits.shape(),
            targets.len(),
            out.shape()
        );
        let (rows_i, vocab_i) = (as_i32("rows", rows)?, as_i32("vocab", vocab)?);
        let f = self.function("logprobs", "token_logprobs_f32")?;
        let (o, l, t) = (out.ptr(), logits.ptr(), targets.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&o).arg(&l).arg(&t).arg(&rows_i).arg(&vocab_i);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(rows_config(rows, (512, 1))) }?;
        Ok(())
    }
}
