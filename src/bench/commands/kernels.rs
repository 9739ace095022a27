//! `swerve-bench kernels`: each CUDA kernel against the CPU reference and the card's measured
//! ceilings (needs a GPU).

use super::append_jsonl;
use crate::backend::{Backend, CudaBackend};
use crate::bench::kernels::{jsonl_records, print_kernel_table, run_all};
use anyhow::{Context, Result};
use std::path::Path;

/// Runs every kernel benchmark; with `jsonl`, also appends the device's ceilings and one record
/// per row to that file.
pub fn kernels(jsonl: Option<&Path>) -> Result<()> {
    let backend = CudaBackend::open_default()
        .map_err(|reason| anyhow::anyhow!("swerve-bench kernels needs a GPU: {reason}"))?;
    println!("device: {}", backend.name());
    let (ceilings, rows) = run_all(&backend).context("kernel benchmarks")?;
    print_kernel_table(&ceilings, &rows);
    if let Some(path) = jsonl {
        let mut records = vec![serde_json::json!({
            "table": "device", "impl": "swerve", "name": backend.device.name,
            "copy_gb_per_s": ceilings.copy_gb_per_s, "gemm_tflops": ceilings.gemm_tflops,
        })];
        records.extend(jsonl_records(&rows));
        append_jsonl(path, &records)?;
    }
    Ok(())
}
