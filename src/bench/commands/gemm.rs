//! `swerve-bench gemm`: which per-M cuBLASLt choices keep a forward GEMM row's bits, and their
//! speed (`crate::bench::gemm`; needs a GPU).

use super::append_jsonl;
use crate::backend::{Backend, CudaBackend};
use crate::bench::gemm::{forward_shapes, print_summary, survey_shape, SurveyOptions};
use crate::bench::kernels::{measure_copy_bandwidth, Ceilings};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

pub struct GemmOptions {
    pub presets: Vec<String>,
    pub tensor_parallel: Vec<usize>,
    pub rows: Vec<usize>,
    pub candidates: usize,
    pub reps: usize,
    pub jsonl: Option<PathBuf>,
}

pub fn gemm(opts: &GemmOptions) -> Result<()> {
    if opts.rows.is_empty() || opts.rows.contains(&0) {
        bail!(
            "--rows: give row counts of at least 1 (got {:?})",
            opts.rows
        );
    }
    if opts.tensor_parallel.is_empty() || opts.tensor_parallel.contains(&0) {
        bail!(
            "--tp: give tensor-parallel sizes of at least 1 (got {:?})",
            opts.tensor_parallel
        );
    }
    let (shapes, skipped) = forward_shapes(&opts.presets, &opts.tensor_parallel)?;
    let backend = CudaBackend::open_default()
        .map_err(|reason| anyhow::anyhow!("swerve-bench gemm needs a GPU: {reason}"))?;
    println!("device: {}", backend.name());
    for s in &skipped {
        println!("skipped (does not shard): {s}");
    }
    let ceilings = Ceilings {
        copy_gb_per_s: measure_copy_bandwidth(&backend)?,
        gemm_tflops: f64::NAN,
    };
    println!(
        "copy bandwidth {:.0} GB/s; {} distinct shapes; rows {:?}",
        ceilings.copy_gb_per_s,
        shapes.len(),
        opts.rows
    );
    let survey = SurveyOptions {
        rows: &opts.rows,
        candidates: opts.candidates,
        reps: opts.reps,
    };
    let mut all = Vec::new();
    for shape in &shapes {
        println!(
            "\n== N {} K {} (bias {}, f32 out {}): {}",
            shape.n,
            shape.k,
            shape.bias,
            shape.f32_out,
            shape.users.join(", ")
        );
        let rows = survey_shape(&backend, shape, &survey, &ceilings)
            .with_context(|| format!("GEMM survey of N {} K {}", shape.n, shape.k))?;
        print_summary(&rows);
        if let Some(path) = &opts.jsonl {
            let records: Vec<serde_json::Value> = rows
                .iter()
                .map(|r| {
                    let mut v = serde_json::to_value(r).unwrap_or_default();
                    v["table"] = "gemm_rows".into();
                    v["impl"] = "swerve".into();
                    v["device"] = backend.device.name.clone().into();
                    v
                })
                .collect();
            append_jsonl(path, &records)?;
        }
        all.extend(rows);
    }
    let total = all
        .iter()
        .filter(|r| r.variant == "ws0-0" && r.runs)
        .count();
    let equal = all
        .iter()
        .filter(|r| r.variant == "ws0-0" && r.runs && r.rows_equal)
        .count();
    println!("\ncuBLASLt's first no-split-K, no-workspace choice keeps the pinned rows' bits in {equal} of {total} (shape, M) problems");
    Ok(())
}
