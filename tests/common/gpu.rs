//! GPU-test helpers: the device, random bf16 inputs with their CPU copies, NaN-poisoned outputs,
//! and the DESIGN.md tolerance (at most twice a naive same-precision computation's error).

use half::bf16;
use swerve::backend::cpu::CpuTensor;
use swerve::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use swerve::bench::kernels::{max_abs_diff, random_bf16};

pub fn gpu() -> CudaBackend {
    CudaBackend::open_default()
        .expect("these tests need a CUDA GPU and a build with kernels (SWERVE_REQUIRE_CUDA=1)")
}

pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// A device tensor of random bf16 values and its f32 copy for the CPU.
pub fn random(
    gpu: &CudaBackend,
    shape: &[usize],
    seed: u64,
    scale: f32,
) -> (CudaTensor, CpuTensor) {
    let values = random_bf16(shape.iter().product(), seed, scale);
    let dev = gpu.upload_pod(&values, shape, DeviceDType::Bf16).unwrap();
    let host = CpuTensor::new(shape.to_vec(), values.iter().map(|v| v.to_f32()).collect());
    (dev, host)
}

/// An output tensor filled with NaN bytes, so unwritten elements cannot pass.
pub fn poisoned(gpu: &CudaBackend, shape: &[usize], dtype: DeviceDType) -> CudaTensor {
    let mut t = gpu.alloc(shape, dtype).unwrap();
    gpu.fill_bytes(&mut t, 0xFF).unwrap();
    t
}

pub fn check_within_naive(what: &str, got: &[f32], reference: &[f32], naive: &[f32]) {
    assert_eq!(got.len(), reference.len(), "{what}: output size");
    let kernel_err = max_abs_diff(got, reference);
    let naive_err = max_abs_diff(naive, reference);
    println!("{what}: kernel error {kernel_err:.3e}, naive error {naive_err:.3e}");
    if naive_err == 0.0 {
        // The naive computation is exact here (a one-key softmax, say): so must the kernel be.
        assert!(
            kernel_err == 0.0,
            "{what}: kernel error {kernel_err} where the naive computation is exact"
        );
        return;
    }
    assert!(
        kernel_err <= 2.0 * naive_err,
        "{what}: kernel error {kernel_err} > 2 x naive {naive_err}"
    );
}

/// Transformers' eager bf16 attention: scores rounded to bf16, softmax in f32 rounded to bf16,
/// P V accumulated in f32 and rounded.
pub fn naive_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cu: &[u32],
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f32> {
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0f32; q.len()];
    for w in cu.windows(2) {
        let (start, end) = (w[0] as usize, w[1] as usize);
        for i in start..end {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let qr = &q[(i * heads + h) * hd..][..hd];
                let scores: Vec<f32> = (start..=i)
                    .map(|j| {
                        let kr = &k[(j * kv_heads + g) * hd..][..hd];
                        round_bf16(qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale)
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = scores.iter().map(|s| (s - max).exp()).sum();
                let o = &mut out[(i * heads + h) * hd..][..hd];
                for (s, j) in scores.iter().zip(start..=i) {
                    let p = round_bf16((s - max).exp() / sum);
                    let vr = &v[(j * kv_heads + g) * hd..][..hd];
                    for (x, y) in o.iter_mut().zip(vr) {
                        *x += p * y;
                    }
                }
                o.iter_mut().for_each(|x| *x = round_bf16(*x));
            }
        }
    }
    out
}
