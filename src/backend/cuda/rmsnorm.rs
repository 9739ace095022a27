//! Launches of `kernels/rmsnorm.cu`.

use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, CudaDevice};
use anyhow::{ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Threads per block; matches `RmsNormConfig::threads` in the kernel.
const THREADS: u32 = 256;

fn launch_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `(rows, cols)` of the row-major `x`, after checking every tensor is bf16 of that size and
/// `weight` has `cols` elements.
fn check(x: &CudaTensor, weight: &CudaTensor, others: &[&CudaTensor]) -> Result<(i32, i32)> {
    let (rows, cols) = (x.rows(), x.cols());
    ensure!(rows > 0 && cols > 0, "rmsnorm: empty input {:?}", x.shape());
    for t in others.iter().chain([&x, &weight]) {
        ensure!(
            t.dtype() == DeviceDType::Bf16,
            "rmsnorm: {:?} tensor, expected bf16",
            t.dtype()
        );
    }
    for t in others {
        ensure!(
            t.len() == rows * cols,
            "rmsnorm: {:?} beside input {:?}",
            t.shape(),
            x.shape()
        );
    }
    ensure!(
        weight.len() == cols,
        "rmsnorm: weight of {} for {cols} columns",
        weight.len()
    );
    Ok((as_i32("rows", rows)?, as_i32("cols", cols)?))
}

impl CudaDevice {
    /// `out = x * rsqrt(mean(x^2) + eps) * weight`, row by row (bf16).
    pub fn rmsnorm_fwd(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, cols) = check(x, weight, &[out])?;
        let f = self.function("rmsnorm", "rmsnorm_fwd_bf16")?;
        let (o, xp, w) = (out.ptr(), x.ptr(), weight.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&o)
            .arg(&xp)
            .arg(&w)
            .arg(&rows)
            .arg(&cols)
            .arg(&eps);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(launch_config(rows as usize)) }?;
        Ok(())
    }

    /// `residual += delta; out = rmsnorm(residual) * weight` (bf16).
    pub fn add_rmsnorm_fwd(
        &self,
        residual: &mut CudaTensor,
        delta: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, cols) = check(residual, weight, &[delta, out])?;
        let f = self.function("rmsnorm", "add_rmsnorm_fwd_bf16")?;
        let (o, r, d, w) = (out.ptr(), residual.ptr(), delta.ptr(), weight.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&o)
            .arg(&r)
            .arg(&d)
            .arg(&w)
            .arg(&rows)
            .arg(&cols)
            .arg(&eps);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(launch_config(rows as usize)) }?;
        Ok(())
    }
}
