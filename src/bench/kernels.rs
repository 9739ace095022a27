//! `swerve-bench kernels`: each CUDA kernel timed with CUDA events (one warm-up, median of many
//! runs, input sets rotated so that every run reads from HBM rather than L2), checked against the
//! CPU reference, and compared with the card's own ceilings measured in the same run: a 1 GiB
//! device-to-device copy for memory-bound kernels, a large cuBLASLt bf16 GEMM for attention
//! (forward here, backward in [`attention_bwd`]).

pub mod attention_bwd;

use crate::backend::cpu::{CpuBackend, CpuTensor};
use crate::backend::cuda::{CudaBackend, CudaDevice, CudaTensor, DeviceDType};
use crate::backend::{Backend, Rotary};
use anyhow::{ensure, Result};
use cudarc::driver::result as driver;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use half::bf16;

#[derive(Debug, Clone)]
pub struct KernelRow {
    pub kernel: String,
    pub shape: String,
    pub median_us: f64,
    /// Bytes moved per second (memory-bound kernels).
    pub gb_per_s: Option<f64>,
    /// FLOPs per second (attention, GEMM).
    pub tflops: Option<f64>,
    /// Achieved over the matching ceiling (copy bandwidth or GEMM rate).
    pub of_ceiling: f64,
    /// Largest |kernel - CPU reference| over the checked outputs.
    pub max_abs_error: f32,
}

/// The card's limits, measured in this run.
#[derive(Debug, Clone, Copy)]
pub struct Ceilings {
    /// Device-to-device copy, bytes read + written per second / 1e9.
    pub copy_gb_per_s: f64,
    /// cuBLASLt bf16 GEMM 8192^3, TFLOP/s.
    pub gemm_tflops: f64,
}

/// Median milliseconds of `reps` calls of `f(i)` (i = run index, for rotating inputs), after one
/// warm-up, each timed with CUDA events.
pub fn time_ms(
    device: &CudaDevice,
    reps: usize,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    f(0)?;
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps.max(1) {
        let start = device
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        f(i + 1)?;
        let end = device
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// How many copies of a `bytes_per_run` working set make consecutive runs miss L2 (at least
/// twice the L2 size in all), capped at 16.
pub fn rotation_sets(device: &CudaDevice, bytes_per_run: usize) -> usize {
    let l2 = device
        .ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .unwrap_or(50 << 20)
        .max(1) as usize;
    (2 * l2).div_ceil(bytes_per_run.max(1)).clamp(1, 16)
}

pub fn measure_ceilings(backend: &CudaBackend) -> Result<Ceilings> {
    let copy_gb_per_s = measure_copy_bandwidth(backend)?;
    let device = &backend.device;

    let n = 8192;
    let a = upload_random(backend, &[n, n], 11, 1.0)?;
    let w = upload_random(backend, &[n, n], 12, 1.0)?;
    let mut out = backend.alloc(&[n, n], DeviceDType::Bf16)?;
    let ms = time_ms(device, 20, |_| backend.gemm.linear(&a, &w, None, &mut out))?;
    let gemm_tflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12;
    Ok(Ceilings {
        copy_gb_per_s,
        gemm_tflops,
    })
}

/// Device-to-device copy of 1 GiB: bytes read + written per second / 1e9.
pub fn measure_copy_bandwidth(backend: &CudaBackend) -> Result<f64> {
    let device = &backend.device;
    let elements = 1usize << 29; // 1 GiB of bf16
    let src = backend.alloc(&[elements], DeviceDType::Bf16)?;
    let dst = backend.alloc(&[elements], DeviceDType::Bf16)?;
    let ms = time_ms(device, 20, |_| {
        // SAFETY: both buffers hold `elements` bf16 values.
        unsafe {
            driver::memcpy_dtod_async(
                dst.ptr(),
                src.ptr(),
                elements * 2,
                device.stream.cu_stream(),
            )
        }?;
        Ok(())
    })?;
    let copy_gb_per_s = 2.0 * (elements * 2) as f64 / (ms * 1e-3) / 1e9;
    drop((src, dst));
    Ok(copy_gb_per_s)
}

/// Deterministic pseudo-random bf16 values in [-scale, scale].
pub fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    use crate::rng::{Rng, XorShift64};
    let mut rng = XorShift64::new(seed);
    (0..n)
        .map(|_| bf16::from_f32(rng.next_signed_f32() * scale))
        .collect()
}

/// A device bf16 tensor of random values.
pub fn upload_random(
    backend: &CudaBackend,
    shape: &[usize],
    seed: u64,
    scale: f32,
) -> Result<CudaTensor> {
    let n = shape.iter().product();
    backend.upload_pod(&random_bf16(n, seed, scale), shape, DeviceDType::Bf16)
}

/// The CPU-backend copy of a device tensor (values as the device holds them).
pub fn to_cpu(backend: &CudaBackend, t: &CudaTensor) -> Result<CpuTensor> {
    Ok(CpuTensor::new(t.shape().to_vec(), backend.to_host(t)?))
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        if x.is_nan() || y.is_nan() {
            f32::INFINITY
        } else {
            m.max((x - y).abs())
        }
    })
}

fn memory_row(
    kernel: &str,
    shape: String,
    ms: f64,
    bytes: usize,
    ceilings: &Ceilings,
    max_abs_error: f32,
) -> Result<KernelRow> {
    ensure!(
        max_abs_error.is_finite(),
        "{kernel} {shape}: output differs from the CPU reference by {max_abs_error}"
    );
    let gb_per_s = bytes as f64 / (ms * 1e-3) / 1e9;
    Ok(KernelRow {
        kernel: kernel.into(),
        shape,
        median_us: ms * 1e3,
        gb_per_s: Some(gb_per_s),
        tflops: None,
        of_ceiling: gb_per_s / ceilings.copy_gb_per_s,
        max_abs_error,
    })
}

/// RMSNorm alone and fused with the residual add, at `[rows, cols]`.
pub fn rmsnorm(
    backend: &CudaBackend,
    rows: usize,
    cols: usize,
    ceilings: &Ceilings,
) -> Result<Vec<KernelRow>> {
    let device = &backend.device;
    let cpu = CpuBackend::new();
    let eps = 1e-6;
    let bytes = rows * cols * 2;
    let sets = rotation_sets(device, 2 * bytes);
    let xs = (0..sets)
        .map(|i| upload_random(backend, &[rows, cols], 100 + i as u64, 4.0))
        .collect::<Result<Vec<_>>>()?;
    let w = upload_random(backend, &[cols], 2, 1.0)?;
    let mut outs = (0..sets)
        .map(|_| backend.alloc(&[rows, cols], DeviceDType::Bf16))
        .collect::<Result<Vec<_>>>()?;
    let ms = time_ms(device, 50, |i| {
        device.rmsnorm_fwd(&xs[i % sets], &w, eps, &mut outs[i % sets])
    })?;
    let (x_cpu, w_cpu) = (to_cpu(backend, &xs[0])?, to_cpu(backend, &w)?);
    device.rmsnorm_fwd(&xs[0], &w, eps, &mut outs[0])?;
    let mut reference = cpu.zeros(&[rows, cols])?;
    cpu.rmsnorm(&x_cpu, &w_cpu, eps, &mut reference)?;
    let err = max_abs_diff(&backend.to_host(&outs[0])?, &reference.data);
    let shape = format!("[{rows}, {cols}]");
    let plain = memory_row(
        "rmsnorm_fwd",
        shape.clone(),
        ms,
        2 * bytes + cols * 2,
        ceilings,
        err,
    )?;

    // Fused: reads residual and delta, writes residual and out. Timed runs keep adding into
    // their residuals (random deltas of mean zero: values stay finite); the error check below
    // uses a fresh residual.
    let mut residuals = (0..sets)
        .map(|i| upload_random(backend, &[rows, cols], 300 + i as u64, 4.0))
        .collect::<Result<Vec<_>>>()?;
    let ms = time_ms(device, 50, |i| {
        let s = i % sets;
        device.add_rmsnorm_fwd(&mut residuals[s], &xs[s], &w, eps, &mut outs[s])
    })?;
    drop(residuals);
    let mut residual = upload_random(backend, &[rows, cols], 400, 4.0)?;
    let mut residual_cpu = to_cpu(backend, &residual)?;
    device.add_rmsnorm_fwd(&mut residual, &xs[0], &w, eps, &mut outs[0])?;
    let mut reference = cpu.zeros(&[rows, cols])?;
    cpu.add_rmsnorm(&mut residual_cpu, &x_cpu, &w_cpu, eps, &mut reference)?;
    let err = max_abs_diff(&backend.to_host(&outs[0])?, &reference.data).max(max_abs_diff(
        &backend.to_host(&residual)?,
        &residual_cpu.data,
    ));
    let fused = memory_row(
        "add_rmsnorm_fwd",
        shape,
        ms,
        4 * bytes + cols * 2,
        ceilings,
        err,
    )?;
    Ok(vec![plain, fused])
}

/// RoPE on q `[tokens, heads, hd]` and k `[tokens, kv_heads, hd]` at positions 0..tokens with
/// Qwen2.5's rope_theta (1e6).
pub fn rope(
    backend: &CudaBackend,
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ceilings: &Ceilings,
) -> Result<KernelRow> {
    let device = &backend.device;
    let rotary = Rotary {
        inv_freq: (0..head_dim / 2)
            .map(|i| 1.0 / 1e6f64.powf(2.0 * i as f64 / head_dim as f64))
            .collect(),
        attention_scaling: 1.0,
    };
    let positions: Vec<u32> = (0..tokens as u32).collect();
    let bytes = 2 * tokens * (heads + kv_heads) * head_dim * 2 + tokens * 4;
    let sets = rotation_sets(device, bytes);
    let mut qs = (0..sets)
        .map(|i| upload_random(backend, &[tokens, heads, head_dim], 500 + i as u64, 2.0))
        .collect::<Result<Vec<_>>>()?;
    let mut ks = (0..sets)
        .map(|i| upload_random(backend, &[tokens, kv_heads, head_dim], 600 + i as u64, 2.0))
        .collect::<Result<Vec<_>>>()?;
    let positions_dev = backend.upload_pod(&positions, &[tokens], DeviceDType::U32)?;
    let freqs = backend.upload_pod(&rotary.inv_freq, &[head_dim / 2], DeviceDType::F64)?;
    let ms = time_ms(device, 50, |i| {
        let s = i % sets;
        device.rope_fwd(&mut qs[s], &mut ks[s], &positions_dev, &freqs, 1.0)
    })?;
    let (mut q_cpu, mut k_cpu) = (to_cpu(backend, &qs[0])?, to_cpu(backend, &ks[0])?);
    device.rope_fwd(&mut qs[0], &mut ks[0], &positions_dev, &freqs, 1.0)?;
    CpuBackend::new().rope(&mut q_cpu, &mut k_cpu, &positions, &rotary)?;
    let err = max_abs_diff(&backend.to_host(&qs[0])?, &q_cpu.data)
        .max(max_abs_diff(&backend.to_host(&ks[0])?, &k_cpu.data));
    let shape = format!("[{tokens}, {heads}+{kv_heads}, {head_dim}]");
    memory_row("rope_fwd", shape, ms, bytes, ceilings, err)
}

/// SwiGLU over `[tokens, intermediate]`.
pub fn swiglu(
    backend: &CudaBackend,
    tokens: usize,
    inter: usize,
    ceilings: &Ceilings,
) -> Result<KernelRow> {
    let device = &backend.device;
    let n = tokens * inter;
    let bytes = 3 * n * 2;
    let sets = rotation_sets(device, bytes);
    let gates = (0..sets)
        .map(|i| upload_random(backend, &[tokens, inter], 700 + i as u64, 6.0))
        .collect::<Result<Vec<_>>>()?;
    let ups = (0..sets)
        .map(|i| upload_random(backend, &[tokens, inter], 800 + i as u64, 2.0))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = (0..sets)
        .map(|_| backend.alloc(&[tokens, inter], DeviceDType::Bf16))
        .collect::<Result<Vec<_>>>()?;
    let ms = time_ms(device, 50, |i| {
        let s = i % sets;
        device.swiglu_fwd(&gates[s], &ups[s], &mut outs[s])
    })?;
    let cpu = CpuBackend::new();
    let mut reference = cpu.zeros(&[tokens, inter])?;
    cpu.swiglu(
        &to_cpu(backend, &gates[0])?,
        &to_cpu(backend, &ups[0])?,
        &mut reference,
    )?;
    let err = max_abs_diff(&backend.to_host(&outs[0])?, &reference.data);
    memory_row(
        "swiglu_fwd",
        format!("[{tokens}, {inter}]"),
        ms,
        bytes,
        ceilings,
        err,
    )
}

/// Embedding gather of `tokens` random ids from a `[vocab, d]` table.
pub fn embedding(
    backend: &CudaBackend,
    tokens: usize,
    vocab: usize,
    d: usize,
    ceilings: &Ceilings,
) -> Result<KernelRow> {
    let device = &backend.device;
    let table = upload_random(backend, &[vocab, d], 900, 1.0)?;
    let ids: Vec<u32> = (0..tokens as u64)
        .map(|i| ((i * 2_654_435_761 + 12_345) % vocab as u64) as u32)
        .collect();
    let ids_dev = backend.upload_pod(&ids, &[tokens], DeviceDType::U32)?;
    let mut out = backend.alloc(&[tokens, d], DeviceDType::Bf16)?;
    let ms = time_ms(device, 50, |_| {
        device.embedding_fwd(&table, &ids_dev, &mut out)
    })?;
    let got = backend.to_host(&out)?;
    let table_host = backend.to_host(&table)?;
    let mut err = 0.0f32;
    for (t, &id) in ids.iter().enumerate() {
        let want = &table_host[id as usize * d..(id as usize + 1) * d];
        err = err.max(max_abs_diff(&got[t * d..(t + 1) * d], want));
    }
    let bytes = 2 * tokens * d * 2 + tokens * 4;
    memory_row(
        "embedding_fwd",
        format!("{tokens} of [{vocab}, {d}]"),
        ms,
        bytes,
        ceilings,
        err,
    )
}

/// One attention benchmark shape: `seqs` sequences of `len` tokens each.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub seqs: usize,
    pub len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    /// The key `bench/peers/attention.py` prints for the same shape.
    pub fn key(&self) -> String {
        format!(
            "seqs={} len={} heads={}/{} d={}",
            self.seqs, self.len, self.heads, self.kv_heads, self.head_dim
        )
    }

    /// FlashAttention's convention: causal attention is half of `4 b s^2 h d`.
    pub fn flops(&self) -> f64 {
        4.0 * (self.seqs * self.len * self.len * self.heads * self.head_dim) as f64 / 2.0
    }
}

/// The shapes `swerve-bench kernels` and the peer script time.
pub const ATTENTION_SHAPES: [AttentionShape; 8] = [
    AttentionShape {
        seqs: 1,
        len: 8192,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
    AttentionShape {
        seqs: 1,
        len: 16384,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
    AttentionShape {
        seqs: 1,
        len: 16384,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
    AttentionShape {
        seqs: 4,
        len: 4096,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
    AttentionShape {
        seqs: 1,
        len: 8192,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
    },
    AttentionShape {
        seqs: 1,
        len: 4096,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
    AttentionShape {
        seqs: 1,
        len: 32768,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
    AttentionShape {
        seqs: 1,
        len: 131072,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
    },
];

/// Exact causal attention output of query row `row` (packed index), head `h`, in f64.
#[allow(clippy::too_many_arguments)]
pub fn attention_row_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &AttentionShape,
    seq_start: usize,
    row: usize,
    h: usize,
    scale: f64,
) -> Vec<f64> {
    let (hd, heads, kv_heads) = (shape.head_dim, shape.heads, shape.kv_heads);
    let g = h / (heads / kv_heads);
    let qv = &q[(row * heads + h) * hd..(row * heads + h + 1) * hd];
    let scores: Vec<f64> = (seq_start..=row)
        .map(|j| {
            let kv = &k[(j * kv_heads + g) * hd..(j * kv_heads + g + 1) * hd];
            scale
                * qv.iter()
                    .zip(kv)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut out = vec![0.0f64; hd];
    for (w, j) in weights.iter().zip(seq_start..=row) {
        let vv = &v[(j * kv_heads + g) * hd..(j * kv_heads + g + 1) * hd];
        for (o, x) in out.iter_mut().zip(vv) {
            *o += w / total * *x as f64;
        }
    }
    out
}

/// Flash attention forward at one shape; the error is checked on sampled rows (first, last,
/// block edges) of every sequence for a few heads, against f64 attention.
pub fn attention(
    backend: &CudaBackend,
    shape: AttentionShape,
    ceilings: &Ceilings,
) -> Result<KernelRow> {
    use crate::backend::cuda::flash_attn::VarlenLayout;
    let device = &backend.device;
    let AttentionShape {
        seqs,
        len,
        heads,
        kv_heads,
        head_dim,
    } = shape;
    let t = seqs * len;
    let q = upload_random(backend, &[t, heads, head_dim], 1000, 1.0)?;
    let k = upload_random(backend, &[t, kv_heads, head_dim], 1001, 1.0)?;
    let v = upload_random(backend, &[t, kv_heads, head_dim], 1002, 1.0)?;
    let cu: Vec<u32> = (0..=seqs).map(|s| (s * len) as u32).collect();
    let layout = VarlenLayout::upload(backend, &cu)?;
    let mut out = backend.alloc(&[t, heads, head_dim], DeviceDType::Bf16)?;
    let mut lse = backend.alloc(&[t, heads], DeviceDType::F32)?;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let ms = time_ms(device, 20, |_| {
        device.flash_attn_fwd(
            &q, &k, &v, &layout, heads, kv_heads, scale, &mut out, &mut lse,
        )
    })?;

    let (qh, kh, vh, oh) = (
        backend.to_host(&q)?,
        backend.to_host(&k)?,
        backend.to_host(&v)?,
        backend.to_host(&out)?,
    );
    let mut err = 0.0f32;
    for s in 0..seqs {
        for offset in [0, 1, 63, 64, 127, 128, len / 2, len - 1] {
            let row = s * len + offset.min(len - 1);
            for h in [0, heads / 2, heads - 1] {
                let want =
                    attention_row_reference(&qh, &kh, &vh, &shape, s * len, row, h, scale as f64);
                let got = &oh[(row * heads + h) * head_dim..(row * heads + h + 1) * head_dim];
                let want: Vec<f32> = want.iter().map(|&x| x as f32).collect();
                err = err.max(max_abs_diff(got, &want));
            }
        }
    }
    ensure!(
        err.is_finite(),
        "attention {}: non-finite output",
        shape.key()
    );
    let tflops = shape.flops() / (ms * 1e-3) / 1e12;
    let kernel = if device.hopper_attention() {
        format!("flash_attn_fwd_sm90_hd{head_dim}")
    } else {
        format!("flash_attn_fwd_hd{head_dim}")
    };
    Ok(KernelRow {
        kernel,
        shape: shape.key(),
        median_us: ms * 1e3,
        gb_per_s: None,
        tflops: Some(tflops),
        of_ceiling: tflops / ceilings.gemm_tflops,
        max_abs_error: err,
    })
}

/// Every kernel at Qwen2.5-7B's shapes (and 0.5B's for head_dim 64).
pub fn run_all(backend: &CudaBackend) -> Result<(Ceilings, Vec<KernelRow>)> {
    let ceilings = measure_ceilings(backend)?;
    let mut rows = Vec::new();
    for (tokens, hidden) in [(16384, 3584), (16384, 8192), (4099, 896)] {
        rows.extend(rmsnorm(backend, tokens, hidden, &ceilings)?);
    }
    rows.push(rope(backend, 16384, 28, 4, 128, &ceilings)?);
    rows.push(rope(backend, 16384, 14, 2, 64, &ceilings)?);
    rows.push(swiglu(backend, 16384, 18944, &ceilings)?);
    rows.push(swiglu(backend, 4099, 4864, &ceilings)?);
    rows.push(embedding(backend, 16384, 152_064, 3584, &ceilings)?);
    // On Hopper both forward kernels, the portable one first (the sm_90a one stays selected).
    let hopper = backend.device.hopper_attention();
    for shape in ATTENTION_SHAPES {
        if hopper {
            backend.device.set_hopper_attention(false)?;
            rows.push(attention(backend, shape, &ceilings)?);
            backend.device.set_hopper_attention(true)?;
        }
        rows.push(attention(backend, shape, &ceilings)?);
    }
    for shape in attention_bwd::ATTENTION_BACKWARD_SHAPES {
        rows.push(attention_bwd::attention_backward(
            backend, shape, &ceilings,
        )?);
    }
    Ok((ceilings, rows))
}

pub fn print_kernel_table(ceilings: &Ceilings, rows: &[KernelRow]) {
    println!(
        "ceilings: device-to-device copy {:.0} GB/s (read + write); cuBLASLt bf16 GEMM 8192^3 {:.0} TFLOP/s",
        ceilings.copy_gb_per_s, ceilings.gemm_tflops
    );
    println!(
        "{:<22} {:>34} {:>11} {:>12} {:>9} {:>10}",
        "kernel", "shape", "median us", "achieved", "of limit", "max err"
    );
    for r in rows {
        let achieved = match (r.gb_per_s, r.tflops) {
            (Some(gb), _) => format!("{gb:.0} GB/s"),
            (_, Some(tf)) => format!("{tf:.1} TF/s"),
            _ => "-".into(),
        };
        println!(
            "{:<22} {:>34} {:>11.1} {:>12} {:>8.0}% {:>10.2e}",
            r.kernel,
            r.shape,
            r.median_us,
            achieved,
            100.0 * r.of_ceiling,
            r.max_abs_error
        );
    }
}

/// The rows as `bench/peers` JSON records (attention rows join the peers' by key).
pub fn jsonl_records(rows: &[KernelRow]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|r| {
            // Attention rows join the peers' by shape key, the backward in a table of its own.
            let table = match (r.tflops.is_some(), r.kernel.starts_with("flash_attn_bwd")) {
                (true, true) => "attention_bwd",
                (true, false) => "attention",
                (false, _) => "kernels",
            };
            serde_json::json!({
                "table": table,
                "impl": "swerve",
                "key": if table == "kernels" { format!("{} {}", r.kernel, r.shape) } else { r.shape.clone() },
                "median_ms": r.median_us / 1e3,
                "tflops": r.tflops,
                "gb_per_s": r.gb_per_s,
                "of_limit": r.of_ceiling,
                "max_abs_error": r.max_abs_error,
            })
        })
        .collect()
}
