//! The RMSNorm CUDA kernels against the CPU reference backend, on fresh random inputs of ragged
//! shapes (vector and scalar paths), outputs poisoned with NaN before each launch.
//!
//! Tolerance (DESIGN.md): the kernel's largest error against the reference must be at most twice
//! that of a naive same-precision computation (HF's order: normalise in f32, round to bf16,
//! multiply by the bf16 weight, round again).
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh. Without one these tests fail, never pass.

use cudarc::driver::CudaSlice;
use half::bf16;
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::CudaDevice;
use swerve::backend::Backend;
use swerve::bench::kernels::random_bf16;

const SHAPES: [(usize, usize); 7] = [
    (1, 896),
    (7, 3584),
    (129, 8192),
    (4099, 896),
    (33, 100),
    (5, 1),
    (64, 1544),
];
const EPS: f32 = 1e-6;

fn device() -> CudaDevice {
    CudaDevice::open(0)
        .expect("these tests need a CUDA GPU and a build with kernels (SWERVE_REQUIRE_CUDA=1)")
}

fn to_f32(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

fn poisoned(device: &CudaDevice, n: usize) -> CudaSlice<bf16> {
    device.stream.clone_htod(&vec![bf16::NAN; n]).unwrap()
}

/// HF's bf16 RMSNorm: f32 statistics, normalised value rounded to bf16, times weight in bf16.
fn naive_bf16(x: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols) {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let inv = 1.0 / (mean_sq + EPS).sqrt();
        for (v, wv) in row.iter().zip(w) {
            let normed = bf16::from_f32(v * inv).to_f32();
            out.push(bf16::from_f32(normed * wv).to_f32());
        }
    }
    out
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        if x.is_nan() || y.is_nan() {
            f32::INFINITY
        } else {
            m.max((x - y).abs())
        }
    })
}

fn cpu_reference(x: &[f32], w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let cpu = CpuBackend::new();
    let x = CpuTensor::new(vec![rows, cols], x.to_vec());
    let w = CpuTensor::new(vec![cols], w.to_vec());
    let mut out = cpu.zeros(&[rows, cols]).unwrap();
    cpu.rmsnorm(&x, &w, EPS, &mut out).unwrap();
    out.data
}

/// Asserts the kernel's output `got` for normalising `x` is within twice the naive bf16 error of
/// the CPU reference.
fn check_within_naive(kernel: &str, rows: usize, cols: usize, got: &[f32], x: &[f32], w: &[f32]) {
    let reference = cpu_reference(x, w, rows, cols);
    let kernel_err = max_abs_diff(got, &reference);
    let naive_err = max_abs_diff(&naive_bf16(x, w, cols), &reference);
    println!("{kernel} [{rows}, {cols}]: kernel error {kernel_err:.3e}, naive bf16 error {naive_err:.3e}");
    assert!(
        naive_err > 0.0,
        "naive error is zero: inputs are degenerate"
    );
    assert!(
        kernel_err <= 2.0 * naive_err,
        "{kernel} [{rows}, {cols}]: kernel error {kernel_err} > 2 x naive {naive_err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rmsnorm_fwd_matches_cpu_reference() {
    let device = device();
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        let x_host = random_bf16(rows * cols, 100 + i as u64, 3.0);
        let w_host = random_bf16(cols, 200 + i as u64, 1.5);
        let x = device.stream.clone_htod(&x_host).unwrap();
        let w = device.stream.clone_htod(&w_host).unwrap();
        let mut out = poisoned(&device, rows * cols);
        device
            .rmsnorm_fwd(&x, &w, rows, cols, EPS, &mut out)
            .unwrap();
        let got = to_f32(&device.stream.clone_dtoh(&out).unwrap());

        check_within_naive(
            "rmsnorm",
            rows,
            cols,
            &got,
            &to_f32(&x_host),
            &to_f32(&w_host),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn add_rmsnorm_fwd_matches_cpu_reference() {
    let device = device();
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        let r_host = random_bf16(rows * cols, 300 + i as u64, 3.0);
        let d_host = random_bf16(rows * cols, 400 + i as u64, 1.0);
        let w_host = random_bf16(cols, 500 + i as u64, 1.5);
        let mut residual = device.stream.clone_htod(&r_host).unwrap();
        let delta = device.stream.clone_htod(&d_host).unwrap();
        let w = device.stream.clone_htod(&w_host).unwrap();
        let mut out = poisoned(&device, rows * cols);
        device
            .add_rmsnorm_fwd(&mut residual, &delta, &w, rows, cols, EPS, &mut out)
            .unwrap();
        let got_residual = device.stream.clone_dtoh(&residual).unwrap();
        let got = to_f32(&device.stream.clone_dtoh(&out).unwrap());

        // The residual stream is bf16: the sum rounded once, bit for bit.
        let want_residual: Vec<bf16> = r_host
            .iter()
            .zip(&d_host)
            .map(|(r, d)| bf16::from_f32(r.to_f32() + d.to_f32()))
            .collect();
        assert_eq!(got_residual, want_residual, "[{rows}, {cols}]: residual");

        check_within_naive(
            "add_rmsnorm",
            rows,
            cols,
            &got,
            &to_f32(&want_residual),
            &to_f32(&w_host),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_embedded_kernel_family_loads() {
    let device = device();
    for (family, _) in swerve::backend::cuda::embedded::FATBINS {
        assert!(device.function(family, "definitely_not_a_kernel").is_err());
    }
    device.function("rmsnorm", "rmsnorm_fwd_bf16").unwrap();
    device.function("rmsnorm", "add_rmsnorm_fwd_bf16").unwrap();
}
