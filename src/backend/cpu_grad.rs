//! The CPU reference of [`BackendGrad`]: plain f32 loops (f64 where a row reduction decides the
//! accuracy), obviously correct, the yardstick for the CUDA backward kernels.
//!
//! Every gradient output accumulates (`+=`), as the trait says. Linear layers split their two
//! products over the machine's cores (token rows for `d_x`, weight rows for `d_weight`); the
//! rest is single-threaded.

use super::adamw::{adamw_update_slice, AdamWStep};
use super::cpu::{CpuBackend, CpuTensor};
use super::grad::BackendGrad;
use super::loss::{lm_head_loss_grad_cpu, lm_head_stats_cpu, RowStats};
use super::{Backend, Rotary, OTHER_SHARD};
use anyhow::{ensure, Result};

fn cols(x: &CpuTensor) -> usize {
    *x.shape.last().unwrap_or(&1)
}

fn same_len(what: &str, a: &CpuTensor, b: &CpuTensor) -> Result<()> {
    ensure!(
        a.data.len() == b.data.len(),
        "{what}: {:?} and {:?} differ in size",
        a.shape,
        b.shape
    );
    Ok(())
}

/// Runs `work(first_row, chunk)` over `data` split into contiguous row chunks, one per core.
fn par_row_chunks(data: &mut [f32], row_len: usize, work: impl Fn(usize, &mut [f32]) + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = data.len().checked_div(row_len).unwrap_or(0);
    if threads <= 1 || rows <= 1 {
        work(0, data);
        return;
    }
    let per_thread = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (i, chunk) in data.chunks_mut(per_thread * row_len).enumerate() {
            let work = &work;
            s.spawn(move || work(i * per_thread, chunk));
        }
    });
}

fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `(heads, kv_heads)` of packed attention tensors over `tokens` rows.
fn attention_heads(
    q: &CpuTensor,
    k: &CpuTensor,
    head_dim: usize,
    tokens: usize,
) -> Result<(usize, usize)> {
    ensure!(
        tokens > 0 && q.data.len().is_multiple_of(tokens * head_dim),
        "attention: q {:?} for {tokens} tokens",
        q.shape
    );
    let heads = q.data.len() / (tokens * head_dim);
    let kv_heads = k.data.len() / (tokens * head_dim);
    ensure!(
        kv_heads > 0
            && heads.is_multiple_of(kv_heads)
            && k.data.len() == tokens * kv_heads * head_dim,
        "attention: {heads} heads over k {:?}",
        k.shape
    );
    Ok((heads, kv_heads))
}

/// The sequence bounds `(start, end)` of every packed sequence.
fn sequences(cu_seqlens: &[u32]) -> Result<Vec<(usize, usize)>> {
    ensure!(
        cu_seqlens.first() == Some(&0) && cu_seqlens.windows(2).all(|w| w[0] <= w[1]),
        "attention: cu_seqlens must rise from 0"
    );
    Ok(cu_seqlens
        .windows(2)
        .map(|w| (w[0] as usize, w[1] as usize))
        .collect())
}

impl BackendGrad for CpuBackend {
    fn fill_zero(&self, x: &mut CpuTensor) -> Result<()> {
        x.data.fill(0.0);
        Ok(())
    }

    fn add_into(&self, dst: &mut CpuTensor, src: &CpuTensor) -> Result<()> {
        same_len("add_into", dst, src)?;
        for (d, &s) in dst.data.iter_mut().zip(&src.data) {
            *d += s;
        }
        Ok(())
    }

    fn attention_with_lse(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        out: &mut CpuTensor,
        lse: &mut CpuTensor,
    ) -> Result<()> {
        // The output exactly as serving computes it; the logsumexp from a second sweep of scores.
        self.attention(q, k, v, cu_seqlens, softmax_scale, out)?;
        let head_dim = cols(q);
        let tokens = *cu_seqlens.last().unwrap_or(&0) as usize;
        let (heads, kv_heads) = attention_heads(q, k, head_dim, tokens)?;
        ensure!(
            lse.data.len() == tokens * heads,
            "attention: lse {:?} for [{tokens}, {heads}]",
            lse.shape
        );
        let group = heads / kv_heads;
        let mut scores = Vec::new();
        for (start, end) in sequences(cu_seqlens)? {
            for t in start..end {
                for h in 0..heads {
                    let q_row = &q.data[(t * heads + h) * head_dim..][..head_dim];
                    let kv = h / group;
                    scores.clear();
                    scores.extend((start..=t).map(|j| {
                        let k_row = &k.data[(j * kv_heads + kv) * head_dim..][..head_dim];
                        (dot(q_row, k_row) * softmax_scale) as f64
                    }));
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    lse.data[t * heads + h] = (max + sum.ln()) as f32;
                }
            }
        }
        Ok(())
    }

    fn embedding_backward(
        &self,
        d_out: &CpuTensor,
        ids: &[u32],
        d_table: &mut CpuTensor,
    ) -> Result<()> {
        let d = cols(d_table);
        let vocab = d_table.data.len() / d;
        ensure!(
            d_out.data.len() == ids.len() * d,
            "embedding_backward: d_out {:?} for {} ids of width {d}",
            d_out.shape,
            ids.len()
        );
        for (row, &id) in d_out.data.chunks_exact(d).zip(ids) {
            if id == OTHER_SHARD {
                continue;
            }
            ensure!(
                (id as usize) < vocab,
                "token id {id} is outside the embedding table of {vocab} rows"
            );
            axpy(1.0, row, &mut d_table.data[id as usize * d..][..d]);
        }
        Ok(())
    }

    fn rmsnorm_backward(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        eps: f32,
        d_out: &CpuTensor,
        d_x: &mut CpuTensor,
        d_weight: &mut CpuTensor,
    ) -> Result<()> {
        let d = weight.data.len();
        ensure!(
            cols(x) == d && d_weight.data.len() == d,
            "rmsnorm_backward: x {:?}, weight {:?}",
            x.shape,
            weight.shape
        );
        same_len("rmsnorm_backward", x, d_out)?;
        same_len("rmsnorm_backward", x, d_x)?;
        // y = x r w with r = 1 / sqrt(mean(x^2) + eps); with g = dy w:
        // dx = r g - x r^3 mean(g x), dw = sum over rows of dy x r.
        for ((xr, dyr), dxr) in x
            .data
            .chunks_exact(d)
            .zip(d_out.data.chunks_exact(d))
            .zip(d_x.data.chunks_exact_mut(d))
        {
            let mean_sq = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
            let r = 1.0 / (mean_sq + eps as f64).sqrt();
            let mean_gx = xr
                .iter()
                .zip(dyr)
                .zip(&weight.data)
                .map(|((&xv, &dy), &w)| dy as f64 * w as f64 * xv as f64)
                .sum::<f64>()
                / d as f64;
            for i in 0..d {
                let g = dyr[i] as f64 * weight.data[i] as f64;
                dxr[i] += (r * g - xr[i] as f64 * r * r * r * mean_gx) as f32;
                d_weight.data[i] += (dyr[i] as f64 * xr[i] as f64 * r) as f32;
            }
        }
        Ok(())
    }

    fn linear_backward(
        &self,
        x: &CpuTensor,
        weight: &CpuTensor,
        d_out: &CpuTensor,
        d_x: &mut CpuTensor,
        d_weight: &mut CpuTensor,
        d_bias: Option<&mut CpuTensor>,
    ) -> Result<()> {
        let (k, n) = (cols(weight), weight.data.len() / cols(weight));
        ensure!(
            k > 0 && x.data.len().is_multiple_of(k),
            "linear_backward: x {:?} against weight {:?}",
            x.shape,
            weight.shape
        );
        let tokens = x.data.len() / k;
        ensure!(
            d_out.data.len() == tokens * n
                && d_x.data.len() == x.data.len()
                && d_weight.data.len() == weight.data.len(),
            "linear_backward: d_out {:?}, d_x {:?}, d_weight {:?} for x {:?}, weight {:?}",
            d_out.shape,
            d_x.shape,
            d_weight.shape,
            x.shape,
            weight.shape
        );
        let (xs, w, dy) = (&x.data, &weight.data, &d_out.data);
        // d_x[t] += sum_j dy[t, j] W[j]: threads own token rows.
        par_row_chunks(&mut d_x.data, k, |first, rows| {
            for (i, dx_row) in rows.chunks_exact_mut(k).enumerate() {
                let t = first + i;
                for j in 0..n {
                    axpy(dy[t * n + j], &w[j * k..(j + 1) * k], dx_row);
                }
            }
        });
        // d_weight[j] += sum_t dy[t, j] x[t]: threads own weight rows.
        par_row_chunks(&mut d_weight.data, k, |first, rows| {
            for (i, dw_row) in rows.chunks_exact_mut(k).enumerate() {
                let j = first + i;
                for t in 0..tokens {
                    axpy(dy[t * n + j], &xs[t * k..(t + 1) * k], dw_row);
                }
            }
        });
        if let Some(d_bias) = d_bias {
            ensure!(
                d_bias.data.len() == n,
                "linear_backward: d_bias {:?} for {n} outputs",
                d_bias.shape
            );
            for row in dy.chunks_exact(n) {
                axpy(1.0, row, &mut d_bias.data);
            }
        }
        Ok(())
    }

    fn rope_backward(
        &self,
        d_q: &mut CpuTensor,
        d_k: &mut CpuTensor,
        positions: &[u32],
        rotary: &Rotary,
    ) -> Result<()> {
        let head_dim = cols(d_q);
        let half = head_dim / 2;
        ensure!(
            rotary.inv_freq.len() == half && cols(d_k) == head_dim,
            "rope_backward: {} frequencies for d_q {:?}, d_k {:?}",
            rotary.inv_freq.len(),
            d_q.shape,
            d_k.shape
        );
        let tokens = positions.len().max(1);
        ensure!(
            d_q.data.len().is_multiple_of(tokens * head_dim)
                && d_k.data.len().is_multiple_of(tokens * head_dim),
            "rope_backward: d_q {:?}, d_k {:?} for {} positions",
            d_q.shape,
            d_k.shape,
            positions.len()
        );
        let q_len = d_q.data.len() / tokens;
        let k_len = d_k.data.len() / tokens;
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        for (t, &pos) in positions.iter().enumerate() {
            for (i, &f) in rotary.inv_freq.iter().enumerate() {
                let angle = pos as f64 * f;
                cos[i] = (angle.cos() * rotary.attention_scaling) as f32;
                sin[i] = (angle.sin() * rotary.attention_scaling) as f32;
            }
            // Forward: a' = a cos - b sin, b' = b cos + a sin. Its transpose:
            // da = da' cos + db' sin, db = db' cos - da' sin.
            let q_token = &mut d_q.data[t * q_len..(t + 1) * q_len];
            let k_token = &mut d_k.data[t * k_len..(t + 1) * k_len];
            for head in q_token
                .chunks_exact_mut(head_dim)
                .chain(k_token.chunks_exact_mut(head_dim))
            {
                let (a, b) = head.split_at_mut(half);
                for i in 0..half {
                    let (da, db) = (a[i], b[i]);
                    a[i] = da * cos[i] + db * sin[i];
                    b[i] = db * cos[i] - da * sin[i];
                }
            }
        }
        Ok(())
    }

    fn swiglu_backward(
        &self,
        gate: &CpuTensor,
        up: &CpuTensor,
        d_out: &CpuTensor,
        d_gate: &mut CpuTensor,
        d_up: &mut CpuTensor,
    ) -> Result<()> {
        for (what, t) in [
            ("up", up),
            ("d_out", d_out),
            ("d_gate", d_gate),
            ("d_up", d_up),
        ] {
            same_len(&format!("swiglu_backward: gate vs {what}"), gate, t)?;
        }
        for i in 0..gate.data.len() {
            let g = gate.data[i];
            let sigmoid = 1.0 / (1.0 + (-g).exp());
            let silu = g * sigmoid;
            let d_silu = sigmoid * (1.0 + g * (1.0 - sigmoid));
            d_gate.data[i] += d_out.data[i] * up.data[i] * d_silu;
            d_up.data[i] += d_out.data[i] * silu;
        }
        Ok(())
    }

    fn attention_backward(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        out: &CpuTensor,
        lse: &CpuTensor,
        d_out: &CpuTensor,
        cu_seqlens: &[u32],
        softmax_scale: f32,
        d_q: &mut CpuTensor,
        d_k: &mut CpuTensor,
        d_v: &mut CpuTensor,
    ) -> Result<()> {
        let head_dim = cols(q);
        let tokens = *cu_seqlens.last().unwrap_or(&0) as usize;
        let (heads, kv_heads) = attention_heads(q, k, head_dim, tokens)?;
        for (what, a, b) in [
            ("v", k, v),
            ("out", q, out),
            ("d_out", q, d_out),
            ("d_q", q, &*d_q),
            ("d_k", k, &*d_k),
            ("d_v", k, &*d_v),
        ] {
            same_len(&format!("attention_backward: {what}"), a, b)?;
        }
        ensure!(
            lse.data.len() == tokens * heads,
            "attention_backward: lse {:?} for [{tokens}, {heads}]",
            lse.shape
        );
        let group = heads / kv_heads;
        let q_at = |t: usize, h: usize| (t * heads + h) * head_dim;
        let kv_at = |t: usize, g: usize| (t * kv_heads + g) * head_dim;
        // One query row at a time, as flash-attention's backward: with P = exp(S - lse),
        // dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ += scale dS K,
        // dK += scale dS^T Q.
        for (start, end) in sequences(cu_seqlens)? {
            for i in start..end {
                for h in 0..heads {
                    let g = h / group;
                    let q_row = &q.data[q_at(i, h)..][..head_dim];
                    let do_row = &d_out.data[q_at(i, h)..][..head_dim];
                    let o_row = &out.data[q_at(i, h)..][..head_dim];
                    let row_lse = lse.data[i * heads + h];
                    let delta = dot(do_row, o_row);
                    for j in start..=i {
                        let k_row = &k.data[kv_at(j, g)..][..head_dim];
                        let v_row = &v.data[kv_at(j, g)..][..head_dim];
                        let p = (dot(q_row, k_row) * softmax_scale - row_lse).exp();
                        let dp = dot(do_row, v_row);
                        let ds = p * (dp - delta) * softmax_scale;
                        axpy(p, do_row, &mut d_v.data[kv_at(j, g)..][..head_dim]);
                        axpy(ds, k_row, &mut d_q.data[q_at(i, h)..][..head_dim]);
                        axpy(ds, q_row, &mut d_k.data[kv_at(j, g)..][..head_dim]);
                    }
                }
            }
        }
        Ok(())
    }

    fn lm_head_stats(
        &self,
        hidden: &CpuTensor,
        weight: &CpuTensor,
        targets: &[u32],
    ) -> Result<Vec<RowStats>> {
        lm_head_stats_cpu(&hidden.data, &weight.data, cols(weight), targets)
    }

    fn lm_head_loss_grad(
        &self,
        hidden: &CpuTensor,
        weight: &CpuTensor,
        targets: &[u32],
        lse: &[f64],
        coef: &[f64],
        d_hidden: &mut CpuTensor,
        d_weight: &mut CpuTensor,
    ) -> Result<()> {
        lm_head_loss_grad_cpu(
            &hidden.data,
            &weight.data,
            cols(weight),
            targets,
            lse,
            coef,
            &mut d_hidden.data,
            &mut d_weight.data,
        )
    }

    fn sum_of_squares(&self, x: &CpuTensor) -> Result<f64> {
        Ok(x.data.iter().map(|&v| (v as f64) * (v as f64)).sum())
    }

    fn adamw_update(
        &self,
        master: &mut CpuTensor,
        grad: &CpuTensor,
        exp_avg: &mut CpuTensor,
        exp_avg_sq: &mut CpuTensor,
        step: &AdamWStep,
    ) -> Result<()> {
        same_len("adamw_update: grad", master, grad)?;
        same_len("adamw_update: exp_avg", master, exp_avg)?;
        same_len("adamw_update: exp_avg_sq", master, exp_avg_sq)?;
        adamw_update_slice(
            &mut master.data,
            &grad.data,
            &mut exp_avg.data,
            &mut exp_avg_sq.data,
            step,
        );
        Ok(())
    }

    fn copy_weights(&self, src: &CpuTensor, dst: &mut CpuTensor) -> Result<()> {
        same_len("copy_weights", src, dst)?;
        dst.data.copy_from_slice(&src.data);
        Ok(())
    }

    fn upload_f32(&self, shape: &[usize], values: &[f32]) -> Result<CpuTensor> {
        ensure!(
            shape.iter().product::<usize>() == values.len(),
            "upload_f32: {} values for shape {shape:?}",
            values.len()
        );
        Ok(CpuTensor::new(shape.to_vec(), values.to_vec()))
    }
}
