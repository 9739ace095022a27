//! Launches of `kernels/rmsnorm.cu`, forward and backward.

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

    /// `(blocks, rows_per_block)` of the backward over `rows` rows: a few waves of blocks, each a
    /// contiguous run of rows (the partial d_weight buffer is `blocks x cols` f32).
    pub fn rmsnorm_bwd_grid(&self, rows: usize) -> (usize, usize) {
        rmsnorm_bwd_grid(rows, self.num_sms as usize)
    }

    /// Backward of `out = rmsnorm(x) * weight`: `d_x += ...` (bf16), `d_weight += ...` (f32),
    /// with `partial` (f32, at least `blocks x cols` of [`Self::rmsnorm_bwd_grid`]) as scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_bwd(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        eps: f32,
        d_out: &CudaTensor,
        d_x: &mut CudaTensor,
        d_weight: &mut CudaTensor,
        partial: &mut CudaTensor,
    ) -> Result<()> {
        let (rows, cols) = check(x, weight, &[d_out, d_x])?;
        ensure!(
            d_weight.dtype() == DeviceDType::F32 && d_weight.len() == cols as usize,
            "rmsnorm_backward: d_weight {:?} {:?} for {cols} columns (f32 expected)",
            d_weight.shape(),
            d_weight.dtype()
        );
        let smem = cols as usize * 4;
        // The default launch limit is 48 KiB of static plus dynamic shared memory; the kernel's
        // static scratch (128 bytes now) comes out of it, so leave it 1 KiB.
        ensure!(
            smem + 1024 <= 48 * 1024,
            "rmsnorm_backward: {cols} columns exceed the kernel's shared-memory row (12032)"
        );
        let (blocks, rows_per_block) = self.rmsnorm_bwd_grid(rows as usize);
        ensure!(
            partial.dtype() == DeviceDType::F32 && partial.len() >= blocks * cols as usize,
            "rmsnorm_backward: scratch {:?} for {blocks} x {cols}",
            partial.shape()
        );
        let (blocks_i, rpb_i) = (as_i32("blocks", blocks)?, as_i32("rows", rows_per_block)?);
        let f = self.function("rmsnorm", "rmsnorm_bwd_bf16")?;
        let (dx, pp, xp, w, dy) = (d_x.ptr(), partial.ptr(), x.ptr(), weight.ptr(), d_out.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&dx)
            .arg(&pp)
            .arg(&xp)
            .arg(&w)
            .arg(&dy)
            .arg(&rows)
            .arg(&cols)
            .arg(&rpb_i)
            .arg(&eps);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(config) }?;

        let f = self.function("rmsnorm", "rmsnorm_dw_reduce_f32")?;
        let dw = d_weight.ptr();
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&dw).arg(&pp).arg(&blocks_i).arg(&cols);
        let config = LaunchConfig {
            grid_dim: ((cols as u32).div_ceil(THREADS), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(config) }?;
        Ok(())
    }
}

/// [`CudaDevice::rmsnorm_bwd_grid`] for a device of `num_sms` SMs (`bench::plan` sizes the
/// partial buffer with it).
pub fn rmsnorm_bwd_grid(rows: usize, num_sms: usize) -> (usize, usize) {
    let target = (num_sms * 4).max(1);
    let rows_per_block = rows.div_ceil(target).max(1);
    (rows.div_ceil(rows_per_block).max(1), rows_per_block)
}
