//! `swerve-bench kernels`: each CUDA kernel timed with CUDA events (one warm-up, median of many
//! runs, inputs larger than L2), checked against the CPU reference, and compared with the card's
//! own copy bandwidth measured in the same run.

use crate::backend::cuda::CudaDevice;
use anyhow::{ensure, Result};
use cudarc::driver::{sys::CUevent_flags, CudaSlice};
use half::bf16;

#[derive(Debug, Clone)]
pub struct KernelRow {
    pub kernel: String,
    pub shape: String,
    pub median_us: f64,
    pub gb_per_s: f64,
    /// Achieved bandwidth over the measured device-to-device copy bandwidth.
    pub of_copy: f64,
    /// Largest |kernel - CPU reference| over the whole output.
    pub max_abs_error: f32,
}

/// Median milliseconds of `reps` launches of `f`, after one warm-up, timed with CUDA events.
pub fn time_ms(device: &CudaDevice, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = device
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        f()?;
        let end = device
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), over 1 GiB buffers.
pub fn copy_bandwidth(device: &CudaDevice) -> Result<f64> {
    let elements = 1usize << 29; // 1 GiB of bf16
    let src: CudaSlice<bf16> = device.stream.alloc_zeros(elements)?;
    let mut dst: CudaSlice<bf16> = device.stream.alloc_zeros(elements)?;
    let ms = time_ms(device, 20, || {
        Ok(device.stream.memcpy_dtod(&src, &mut dst)?)
    })?;
    Ok(2.0 * (elements * 2) as f64 / (ms * 1e-3) / 1e9)
}

/// Deterministic pseudo-random bf16 values in [-scale, scale].
pub fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
        })
        .collect()
}

/// RMSNorm forward at `[rows, cols]`: time, bandwidth, and error against the CPU reference.
pub fn rmsnorm(
    device: &CudaDevice,
    rows: usize,
    cols: usize,
    copy_gb_per_s: f64,
) -> Result<KernelRow> {
    let eps = 1e-6f32;
    let x_host = random_bf16(rows * cols, 1, 4.0);
    let w_host = random_bf16(cols, 2, 1.0);
    let x = device.stream.clone_htod(&x_host)?;
    let w = device.stream.clone_htod(&w_host)?;
    let mut out: CudaSlice<bf16> = device.stream.alloc_zeros(rows * cols)?;
    let ms = time_ms(device, 50, || {
        device.rmsnorm_fwd(&x, &w, rows, cols, eps, &mut out)
    })?;
    let got = device.stream.clone_dtoh(&out)?;

    let mut max_abs_error = 0.0f32;
    let w32: Vec<f32> = w_host.iter().map(|v| v.to_f32()).collect();
    for (row, got_row) in x_host.chunks_exact(cols).zip(got.chunks_exact(cols)) {
        let x32: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
        let mean_sq = x32.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
        let inv = 1.0 / (mean_sq + eps as f64).sqrt();
        for ((&xv, &wv), g) in x32.iter().zip(&w32).zip(got_row) {
            max_abs_error =
                max_abs_error.max(((xv as f64 * inv * wv as f64) as f32 - g.to_f32()).abs());
        }
    }
    ensure!(
        max_abs_error.is_finite(),
        "rmsnorm produced non-finite values"
    );
    let bytes = (2 * rows * cols + cols) * 2;
    let gb_per_s = bytes as f64 / (ms * 1e-3) / 1e9;
    Ok(KernelRow {
        kernel: "rmsnorm_fwd_bf16".into(),
        shape: format!("[{rows}, {cols}]"),
        median_us: ms * 1e3,
        gb_per_s,
        of_copy: gb_per_s / copy_gb_per_s,
        max_abs_error,
    })
}

pub fn print_kernel_table(copy_gb_per_s: f64, rows: &[KernelRow]) {
    println!("device-to-device copy: {copy_gb_per_s:.0} GB/s (read + write)");
    println!(
        "{:<22} {:>16} {:>11} {:>9} {:>8} {:>10}",
        "kernel", "shape", "median us", "GB/s", "of copy", "max err"
    );
    for r in rows {
        println!(
            "{:<22} {:>16} {:>11.1} {:>9.0} {:>7.0}% {:>10.2e}",
            r.kernel,
            r.shape,
            r.median_us,
            r.gb_per_s,
            100.0 * r.of_copy,
            r.max_abs_error
        );
    }
}
