//! `swerve-bench gemm`: the forward GEMMs of the Qwen2.5 shapes (each preset and tensor-parallel
//! size asked for: q, k/v, o, gate/up, down, the LM head) at each row count M, run with
//!
//! - `pinned`: the one algorithm per (N, K) class that `--exact-logprobs` runs at every M;
//! - `per-problem`: cuBLASLt's own choice for that M, split-K allowed (`--exact-logprobs false`);
//! - `ws0-i` / `ws-i`: each algorithm the heuristic offers for that M without a reduction scheme
//!   (no split-K), with no workspace / with the 32 MiB workspace;
//!
//! each output checked bit for bit against the pinned algorithm's rows at the largest M (rows 0,
//! M / 2 and M - 1: row r of a product must be the same bits at every M), and timed with CUDA
//! events (median, weights rotated so that every run reads them from HBM). The question it
//! answers on a GPU (issue 36, item 2): which per-M choices keep a row's bits, and how close
//! they come to the copy bandwidth at decode sizes, where the weights dominate the bytes.

use crate::backend::cuda::gemm::{GemmKey, WORKSPACE_BYTES};
use crate::backend::cuda::gemm_survey::{Candidate, ExplicitPlan};
use crate::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use crate::bench::kernels::{rotation_sets, time_ms, upload_random, Ceilings};
use crate::model::synthetic;
use anyhow::{Context, Result};
use cudarc::driver::result as driver;
use std::collections::BTreeSet;

/// One distinct forward GEMM shape and the (preset, tp, layer) places that use it.
#[derive(Clone, Debug)]
pub struct GemmShape {
    pub n: usize,
    pub k: usize,
    pub bias: bool,
    pub f32_out: bool,
    pub users: Vec<String>,
}

/// The distinct forward GEMM shapes of `presets` at each tensor-parallel size, and a note for
/// each (preset, tp) that does not shard.
pub fn forward_shapes(presets: &[String], tps: &[usize]) -> Result<(Vec<GemmShape>, Vec<String>)> {
    let mut shapes: Vec<GemmShape> = Vec::new();
    let mut skipped = Vec::new();
    for name in presets {
        let (config, _) = synthetic::preset(name)?;
        for &tp in tps {
            let local = match config.local_sizes(tp) {
                Ok(l) => l,
                Err(e) => {
                    skipped.push(format!("{name} tp {tp}: {e:#}"));
                    continue;
                }
            };
            let (d, hd) = (config.hidden_size, config.head_dim);
            let layers = [
                ("q", local.heads_local * hd, d, true, false),
                ("k/v", local.kv_heads_local * hd, d, true, false),
                ("o", d, local.heads_local * hd, false, false),
                ("gate/up", local.intermediate_local, d, false, false),
                ("down", d, local.intermediate_local, false, false),
                ("lm_head", local.vocab_local, d, false, true),
            ];
            for (layer, n, k, bias, f32_out) in layers {
                let user = format!("{name}/tp{tp}/{layer}");
                match shapes
                    .iter_mut()
                    .find(|s| (s.n, s.k, s.bias, s.f32_out) == (n, k, bias, f32_out))
                {
                    Some(s) => s.users.push(user),
                    None => shapes.push(GemmShape {
                        n,
                        k,
                        bias,
                        f32_out,
                        users: vec![user],
                    }),
                }
            }
        }
    }
    Ok((shapes, skipped))
}

/// One (shape, M, algorithm) measurement.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GemmRow {
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub bias: bool,
    pub f32_out: bool,
    pub variant: String,
    /// `id/tile/stages/inner/cluster/swizzle/custom/splitk` (see `AlgoConfig::label`).
    pub algo: String,
    pub workspace: usize,
    /// Whether cuBLASLt accepts the algorithm for this M (`cublasLtMatmulAlgoCheck`).
    pub runs: bool,
    /// Rows 0, M / 2 and M - 1 equal the pinned algorithm's at the largest M, bit for bit.
    pub rows_equal: bool,
    pub median_us: f64,
    /// Weights + inputs + outputs over the time, over the copy bandwidth measured in this run.
    pub of_copy_bandwidth: f64,
}

/// The options of one survey.
pub struct SurveyOptions<'a> {
    pub rows: &'a [usize],
    pub candidates: usize,
    pub reps: usize,
}

/// A survey's device operands: rotated weight copies, the inputs, the bias and the output.
struct Operands {
    weights: Vec<CudaTensor>,
    x: CudaTensor,
    bias: Option<CudaTensor>,
    out: CudaTensor,
}

impl Operands {
    fn upload(backend: &CudaBackend, shape: &GemmShape, m_max: usize) -> Result<Operands> {
        let (n, k) = (shape.n, shape.k);
        let sets = rotation_sets(&backend.device, n * k * 2);
        let scale = (3.0 / k as f32).sqrt();
        let weights = (0..sets)
            .map(|i| upload_random(backend, &[n, k], 700 + i as u64, scale))
            .collect::<Result<Vec<_>>>()?;
        let bias = match shape.bias {
            true => Some(upload_random(backend, &[n], 698, 0.1)?),
            false => None,
        };
        let dtype = if shape.f32_out {
            DeviceDType::F32
        } else {
            DeviceDType::Bf16
        };
        Ok(Operands {
            weights,
            x: upload_random(backend, &[m_max, k], 699, 1.0)?,
            bias,
            out: backend.alloc(&[m_max, n], dtype)?,
        })
    }
}

/// Measures every variant of `shape` at every M of `opts.rows` (module doc).
pub fn survey_shape(
    backend: &CudaBackend,
    shape: &GemmShape,
    opts: &SurveyOptions,
    ceilings: &Ceilings,
) -> Result<Vec<GemmRow>> {
    let device = &backend.device;
    let gemm = &backend.gemm;
    let (n, k) = (shape.n, shape.k);
    let m_max = opts.rows.iter().copied().max().unwrap_or(1).max(1);
    let elem = if shape.f32_out { 4 } else { 2 };
    let Operands {
        weights,
        x,
        bias,
        out,
    } = Operands::upload(backend, shape, m_max)?;
    let sets = weights.len();
    let bias_ptr = bias.as_ref().map(CudaTensor::ptr);

    // The reference: the pinned algorithm at the largest M.
    let sampled: BTreeSet<usize> = opts
        .rows
        .iter()
        .flat_map(|&m| [0, m / 2, m.max(1) - 1])
        .collect();
    let key_max = GemmKey::linear(n, k, m_max, shape.f32_out, shape.bias);
    let pinned = gemm.pinned_candidate(&key_max)?;
    let plan_max = gemm.explicit_plan(key_max)?;
    // SAFETY: the tensors hold [n, k], [m_max, k] and [m_max, n] elements.
    unsafe {
        gemm.run_explicit(
            &plan_max,
            &pinned,
            weights[0].ptr(),
            x.ptr(),
            out.ptr(),
            bias_ptr,
        )
    }?;
    let reference = read_rows(backend, &out, n * elem, &sampled)?;

    let mut rows = Vec::new();
    for &m in opts.rows {
        let key = GemmKey::linear(n, k, m, shape.f32_out, shape.bias);
        let plan = gemm.explicit_plan(key)?;
        let variants = variants(backend, &plan, pinned, opts.candidates)?;
        let bytes = (n * k * 2 + m * k * 2 + m * n * elem) as f64;
        for (variant, c) in variants {
            let mut row = GemmRow {
                n,
                k,
                m,
                bias: shape.bias,
                f32_out: shape.f32_out,
                variant,
                algo: c.config.label(),
                workspace: c.workspace,
                runs: gemm.candidate_runs(&plan, &c),
                rows_equal: false,
                median_us: f64::NAN,
                of_copy_bandwidth: f64::NAN,
            };
            if row.runs {
                // SAFETY: as above; m <= m_max rows.
                unsafe {
                    gemm.run_explicit(&plan, &c, weights[0].ptr(), x.ptr(), out.ptr(), bias_ptr)
                }?;
                let want: BTreeSet<usize> = [0, m / 2, m.max(1) - 1].into_iter().collect();
                let got = read_rows(backend, &out, n * elem, &want)?;
                row.rows_equal = want.iter().all(|r| got.get(r) == reference.get(r));
                let reps = if m <= 512 {
                    opts.reps
                } else {
                    opts.reps.div_ceil(4)
                };
                let ms = time_ms(device, reps, |i| {
                    // SAFETY: as above.
                    unsafe {
                        gemm.run_explicit(
                            &plan,
                            &c,
                            weights[i % sets].ptr(),
                            x.ptr(),
                            out.ptr(),
                            bias_ptr,
                        )
                    }
                })?;
                row.median_us = ms * 1e3;
                row.of_copy_bandwidth = bytes / (ms * 1e-3) / 1e9 / ceilings.copy_gb_per_s;
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The algorithms measured at one M: the pinned one, cuBLASLt's per-problem choice, and each
/// distinct no-split-K algorithm offered with no workspace (`ws0-i`) and with the full one
/// (`ws-i`).
fn variants(
    backend: &CudaBackend,
    plan: &ExplicitPlan,
    pinned: Candidate,
    candidates: usize,
) -> Result<Vec<(String, Candidate)>> {
    let gemm = &backend.gemm;
    let mut variants: Vec<(String, Candidate)> = vec![("pinned".into(), pinned)];
    variants.push(("per-problem".into(), gemm.per_problem_candidate(plan)?));
    let mut offered: Vec<Candidate> = Vec::new();
    for (prefix, workspace) in [("ws0", 0), ("ws", WORKSPACE_BYTES)] {
        let found = gemm
            .no_split_k_candidates(plan, workspace, candidates)
            .unwrap_or_default();
        for (i, c) in found.into_iter().enumerate() {
            if !offered.iter().any(|o| o.algo.data == c.algo.data) {
                offered.push(c);
                variants.push((format!("{prefix}-{i}"), c));
            }
        }
    }
    Ok(variants)
}

/// The bytes of rows `which` of a row-major `[rows, row_bytes]` device tensor.
fn read_rows(
    backend: &CudaBackend,
    t: &CudaTensor,
    row_bytes: usize,
    which: &BTreeSet<usize>,
) -> Result<std::collections::BTreeMap<usize, Vec<u8>>> {
    backend.device.synchronize()?;
    let mut out = std::collections::BTreeMap::new();
    for &r in which {
        let mut bytes = vec![0u8; row_bytes];
        // SAFETY: row r lies inside the tensor (r < its rows); the copy to pageable memory
        // returns when complete.
        unsafe {
            driver::memcpy_dtoh_async(
                &mut bytes,
                t.ptr() + (r * row_bytes) as u64,
                backend.device.stream.cu_stream(),
            )
        }
        .context("copying a GEMM row from the GPU")?;
        out.insert(r, bytes);
    }
    backend.device.synchronize()?;
    Ok(out)
}

/// Per (shape, M): the pinned and per-problem times, the heuristic's first no-split-K choice,
/// and the fastest algorithm whose rows equal the pinned ones.
pub fn print_summary(rows: &[GemmRow]) {
    println!(
        "{:>7} {:>6} {:>5} {:>5} | {:>9} {:>5} | {:>9} {:>3} | {:>9} {:>3} | {:>9} {:>5} {:>5} best algo",
        "N",
        "K",
        "M",
        "f32",
        "pinned us",
        "bw",
        "per-prob",
        "eq",
        "ws0-0 us",
        "eq",
        "best eq",
        "bw",
        "eq/n",
    );
    let mut keys: Vec<(usize, usize, bool, bool, usize)> = rows
        .iter()
        .map(|r| (r.n, r.k, r.bias, r.f32_out, r.m))
        .collect();
    keys.dedup();
    for key in keys {
        let group: Vec<&GemmRow> = rows
            .iter()
            .filter(|r| (r.n, r.k, r.bias, r.f32_out, r.m) == key)
            .collect();
        let find = |v: &str| group.iter().find(|r| r.variant == v);
        let us = |r: Option<&&GemmRow>| r.map_or(f64::NAN, |r| r.median_us);
        let eq = |r: Option<&&GemmRow>| match r {
            Some(r) if r.runs => {
                if r.rows_equal {
                    "yes"
                } else {
                    "NO"
                }
            }
            Some(_) => "n/r",
            None => "-",
        };
        let equal: Vec<&&GemmRow> = group.iter().filter(|r| r.runs && r.rows_equal).collect();
        let best = equal
            .iter()
            .min_by(|a, b| a.median_us.total_cmp(&b.median_us));
        let (pinned, per, first) = (find("pinned"), find("per-problem"), find("ws0-0"));
        println!(
            "{:>7} {:>6} {:>5} {:>5} | {:>9.1} {:>4.0}% | {:>9.1} {:>3} | {:>9.1} {:>3} | {:>9.1} {:>4.0}% {:>2}/{:<2} {}",
            key.0,
            key.1,
            key.4,
            key.3,
            us(pinned),
            pinned.map_or(f64::NAN, |r| r.of_copy_bandwidth * 100.0),
            us(per),
            eq(per),
            us(first),
            eq(first),
            best.map_or(f64::NAN, |r| r.median_us),
            best.map_or(f64::NAN, |r| r.of_copy_bandwidth * 100.0),
            equal.len(),
            group.iter().filter(|r| r.variant.starts_with("ws")).count(),
            best.map_or("-".to_string(), |r| format!("{} {}", r.variant, r.algo)),
        );
    }
}
