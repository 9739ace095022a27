//! Launches of `kernels/rmsnorm.cu`.

use super::CudaDevice;
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

/// Threads per block; matches `RmsNormConfig::threads` in the kernel.
const THREADS: u32 = 256;

fn launch_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check_dims(rows: usize, cols: usize, lens: &[usize]) -> Result<(i32, i32)> {
    ensure!(rows > 0 && cols > 0, "rmsnorm: empty [{rows}, {cols}]");
    ensure!(
        rows <= i32::MAX as usize && cols <= i32::MAX as usize,
        "rmsnorm: [{rows}, {cols}] too large"
    );
    for &len in lens {
        ensure!(
            len >= rows * cols,
            "rmsnorm: buffer of {len} elements for [{rows}, {cols}]"
        );
    }
    Ok((rows as i32, cols as i32))
}

impl CudaDevice {
    /// `out = x * rsqrt(mean(x^2) + eps) * weight` over `rows` rows of `cols` (bf16).
    pub fn rmsnorm_fwd(
        &self,
        x: &CudaSlice<bf16>,
        weight: &CudaSlice<bf16>,
        rows: usize,
        cols: usize,
        eps: f32,
        out: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        let (rows_i, cols_i) = check_dims(rows, cols, &[x.len(), out.len()])?;
        ensure!(
            weight.len() == cols,
            "rmsnorm: weight of {} for {cols} columns",
            weight.len()
        );
        let f = self.function("rmsnorm", "rmsnorm_fwd_bf16")?;
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(out)
            .arg(x)
            .arg(weight)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&eps);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(launch_config(rows)) }?;
        Ok(())
    }

    /// `residual += delta; out = rmsnorm(residual) * weight` (bf16).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_fwd(
        &self,
        residual: &mut CudaSlice<bf16>,
        delta: &CudaSlice<bf16>,
        weight: &CudaSlice<bf16>,
        rows: usize,
        cols: usize,
        eps: f32,
        out: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        let (rows_i, cols_i) = check_dims(rows, cols, &[residual.len(), delta.len(), out.len()])?;
        ensure!(
            weight.len() == cols,
            "rmsnorm: weight of {} for {cols} columns",
            weight.len()
        );
        let f = self.function("rmsnorm", "add_rmsnorm_fwd_bf16")?;
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(out)
            .arg(residual)
            .arg(delta)
            .arg(weight)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&eps);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(launch_config(rows)) }?;
        Ok(())
    }
}
