//! GPU-test helpers: the device, random bf16 inputs with their CPU copies, NaN-poisoned outputs,
//! the DESIGN.md tolerance (at most twice a naive same-precision computation's error), checked
//! row by row ([`within_naive`]), and attention in f64 (the reference long rows need).

use half::bf16;
use swerve::backend::cpu::CpuTensor;
use swerve::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use swerve::backend::grad::BackendGrad;
use swerve::bench::kernels::random_bf16;

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

/// bf16-representable values (uniform in +-scale), as f32.
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    random_bf16(n, seed, scale)
        .iter()
        .map(|v| v.to_f32())
        .collect()
}

/// An f32 device tensor of random bf16-representable values and its CPU copy.
pub fn random_f32(
    gpu: &CudaBackend,
    shape: &[usize],
    seed: u64,
    scale: f32,
) -> (CudaTensor, CpuTensor) {
    let v = values(shape.iter().product(), seed, scale);
    (
        gpu.upload_f32(shape, &v).unwrap(),
        CpuTensor::new(shape.to_vec(), v),
    )
}

/// An output tensor filled with NaN bytes, so unwritten elements cannot pass.
pub fn poisoned(gpu: &CudaBackend, shape: &[usize], dtype: DeviceDType) -> CudaTensor {
    let mut t = gpu.alloc(shape, dtype).unwrap();
    gpu.fill_bytes(&mut t, 0xFF).unwrap();
    t
}

/// How a flat output splits into the rows the tolerance is checked on, one by one: `len`
/// elements per row, `heads` consecutive rows per token (1 where the layout has no heads), and the
/// format the kernel writes (its final rounding is the floor of any row's error).
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    pub len: usize,
    pub heads: usize,
    pub output: Output,
    /// Where the naive row is exact, how far an element may still be off: 0 (exact), or an fp32
    /// noise level up to which a bf16 rounding step may flip (see [`within_naive`]).
    pub exact_noise: f32,
}

/// The element format of a kernel's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Bf16,
    F32,
}

impl Rows {
    /// Rows of `len` bf16 outputs.
    pub fn bf16(len: usize) -> Self {
        Self {
            len,
            heads: 1,
            output: Output::Bf16,
            exact_noise: 0.0,
        }
    }
    /// Rows of `len` f32 outputs.
    pub fn f32(len: usize) -> Self {
        Self {
            output: Output::F32,
            ..Self::bf16(len)
        }
    }
    /// `[tokens, heads, head_dim]` bf16: one row per (token, head).
    pub fn heads(heads: usize, head_dim: usize) -> Self {
        Self {
            heads,
            ..Self::bf16(head_dim)
        }
    }
    pub fn with_exact_noise(self, exact_noise: f32) -> Self {
        Self {
            exact_noise,
            ..self
        }
    }
    fn name(&self, i: usize) -> String {
        match self.heads {
            1 => format!("row {i}"),
            h => format!("row {} head {}", i / h, i % h),
        }
    }
}

/// Half a unit in the last place of `x`'s magnitude in the output format: the error of a
/// correctly rounded result, which no kernel writing that format can go below.
pub fn half_ulp(x: f32, output: Output) -> f32 {
    let x = x.abs();
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    let bits = match output {
        Output::Bf16 => 8,
        Output::F32 => 24,
    };
    2f32.powi(x.log2().floor() as i32 - bits)
}

/// One bf16 step above `|x|`.
fn bf16_step(x: f32) -> f32 {
    let b = bf16::from_f32(x.abs());
    (bf16::from_bits(b.to_bits() + 1).to_f32() - b.to_f32()).abs()
}

/// The DESIGN.md tolerance, row by row: each row's largest kernel error against the reference is
/// at most twice that row's own naive error, plus half an output ulp at the row's largest
/// reference value (the final rounding: two bf16 results of one value may round to neighbouring
/// steps). A row whose naive computation is exact must be exact too (f32 outputs: to the last
/// bit; with `exact_noise`, an element may be one bf16 step off where half a step is below that
/// noise). NaN is never within.
///
/// Row by row, not one bound for the tensor: a short row's large naive error would otherwise set
/// the bound of a long row, whose own error is far smaller (dropping a whole key partition of a
/// long row passed a tensor-wide bound). Returns a summary, or the failing rows, worst first.
pub fn within_naive(
    what: &str,
    got: &[f32],
    reference: &[f32],
    naive: &[f32],
    rows: Rows,
) -> Result<String, String> {
    check_row_sizes(what, got, reference, naive, rows)?;
    let mut failures: Vec<(f32, String)> = Vec::new();
    let (mut worst_ratio, mut worst_row) = (0.0f32, 0);
    let (mut kernel_max, mut naive_max) = (0.0f32, 0.0f32);
    for (i, ((g, r), n)) in got
        .chunks_exact(rows.len)
        .zip(reference.chunks_exact(rows.len))
        .zip(naive.chunks_exact(rows.len))
        .enumerate()
    {
        let kernel_err = max_err(g, r);
        let naive_err = max_err(n, r);
        kernel_max = kernel_max.max(kernel_err);
        naive_max = naive_max.max(naive_err);
        if naive_err == 0.0 {
            failures.extend(exact_row_failure(rows, i, g, r).map(|m| (f32::INFINITY, m)));
            continue;
        }
        let scale = r.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
        let bound = 2.0 * naive_err + half_ulp(scale, rows.output);
        let ratio = kernel_err / bound;
        if ratio > worst_ratio || ratio.is_nan() {
            (worst_ratio, worst_row) = (ratio, i);
        }
        if kernel_err > bound || bound.is_nan() {
            failures.push((
                ratio,
                format!(
                    "{}: kernel error {kernel_err:.3e} > 2 x naive {naive_err:.3e} + half ulp of {scale:.3e}",
                    rows.name(i)
                ),
            ));
        }
    }
    let summary = format!(
        "{what}: kernel error {kernel_max:.3e}, naive error {naive_max:.3e} (largest of {} rows); \
         worst row {} at {worst_ratio:.2} of its bound",
        reference.len() / rows.len,
        rows.name(worst_row)
    );
    if failures.is_empty() {
        return Ok(summary);
    }
    failures.sort_by(|a, b| b.0.total_cmp(&a.0));
    let shown: Vec<String> = failures.iter().take(8).map(|(_, m)| m.clone()).collect();
    Err(format!(
        "{summary}\n{what}: {} of {} rows outside their tolerance:\n  {}",
        failures.len(),
        reference.len() / rows.len,
        shown.join("\n  ")
    ))
}

/// The three tensors have one length, a whole number of rows.
fn check_row_sizes(
    what: &str,
    got: &[f32],
    reference: &[f32],
    naive: &[f32],
    rows: Rows,
) -> Result<(), String> {
    if got.len() != reference.len() || naive.len() != reference.len() {
        return Err(format!(
            "{what}: {} outputs, {} reference values, {} naive values",
            got.len(),
            reference.len(),
            naive.len()
        ));
    }
    if rows.len == 0 || !reference.len().is_multiple_of(rows.len) {
        return Err(format!(
            "{what}: {} values are not rows of {}",
            reference.len(),
            rows.len
        ));
    }
    Ok(())
}

/// `|a - b|`, infinite where either is NaN.
fn abs_err(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::INFINITY
    } else {
        (a - b).abs()
    }
}

/// The largest [`abs_err`] of a row against its reference row.
fn max_err(row: &[f32], reference: &[f32]) -> f32 {
    row.iter()
        .zip(reference)
        .fold(0.0f32, |m, (&a, &b)| m.max(abs_err(a, b)))
}

/// Row `i` of `got` against its reference `r` where the naive row is exact: element by element,
/// exact or within the allowed noise (an f32 result may differ in its last bit: another order of
/// the same additions). The first element outside, in words.
fn exact_row_failure(rows: Rows, i: usize, g: &[f32], r: &[f32]) -> Option<String> {
    let bad = g.iter().zip(r).position(|(&a, &b)| {
        let step = bf16_step(b);
        let allowed = if rows.exact_noise > 0.0 && step / 2.0 <= rows.exact_noise {
            step.max(rows.exact_noise)
        } else if rows.output == Output::F32 {
            2.0 * half_ulp(b, Output::F32)
        } else {
            0.0
        };
        abs_err(a, b) > allowed
    })?;
    Some(format!(
        "{}: element {bad} is {}, exactly {} (the naive row is exact)",
        rows.name(i),
        g[bad],
        r[bad]
    ))
}

/// [`within_naive`], printing the summary and failing the test on any row outside.
pub fn check_within_naive(what: &str, got: &[f32], reference: &[f32], naive: &[f32], rows: Rows) {
    match within_naive(what, got, reference, naive, rows) {
        Ok(summary) => println!("{summary}"),
        Err(report) => panic!("{report}"),
    }
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

/// Causal attention over packed sequences in f64 (scores, softmax and P V), rounded to f32 once:
/// the reference the tolerance is measured against, so that the long rows' small errors are not
/// lost in an f32 reference's own.
pub fn attention_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    cu: &[u32],
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; q.len()];
    for w in cu.windows(2) {
        let (start, end) = (w[0] as usize, w[1] as usize);
        for i in start..end {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let keys = (start..=i).map(|j| (j * kv_heads + g) * hd);
                let o = attention_row_f64(&q[(i * heads + h) * hd..][..hd], k, v, keys);
                out[(i * heads + h) * hd..][..hd].copy_from_slice(&o);
            }
        }
    }
    out
}

/// One query row's attention in f64 over the keys and values starting at the given offsets of
/// `k` and `v` (each `q.len()` long), scaled by `1 / sqrt(q.len())`.
pub fn attention_row_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    offsets: impl Iterator<Item = usize> + Clone,
) -> Vec<f32> {
    let hd = q.len();
    let scale = 1.0 / (hd as f64).sqrt();
    let scores: Vec<f64> = offsets
        .clone()
        .map(|o| {
            let kr = &k[o..o + hd];
            scale
                * q.iter()
                    .zip(kr)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum();
    let mut acc = vec![0.0f64; hd];
    for (w, o) in weights.iter().zip(offsets) {
        for (a, &x) in acc.iter_mut().zip(&v[o..o + hd]) {
            *a += w * x as f64;
        }
    }
    acc.iter().map(|&a| (a / sum) as f32).collect()
}
