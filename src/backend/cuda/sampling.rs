//! Launch of `kernels/sampling.cu`: unfiltered and greedy sampling of logits rows on the device,
//! so a decode step copies back 8 bytes per row instead of the vocabulary's logits.

use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, CudaDevice};
use anyhow::{ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Threads per row; `SamplingConfig::threads` in the kernel (and `LogprobsConfig::threads`: the
/// two must reduce in the same order).
const SAMPLING_THREADS: u32 = 512;

impl CudaDevice {
    /// `out [rows, 2]` u32 = (token, logprob bits) per row of `logits [rows, vocab]` f32, with
    /// `temperatures [rows]` f32 and `uniforms [rows]` f64.
    pub fn sample_rows(
        &self,
        logits: &CudaTensor,
        temperatures: &CudaTensor,
        uniforms: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        for (what, t, dtype) in [
            ("logits", logits, DeviceDType::F32),
            ("temperatures", temperatures, DeviceDType::F32),
            ("uniforms", uniforms, DeviceDType::F64),
            ("out", &*out, DeviceDType::U32),
        ] {
            ensure!(
                t.dtype() == dtype,
                "sample_rows: {what} is {:?}, expected {dtype:?}",
                t.dtype()
            );
        }
        let (rows, vocab) = (logits.rows(), logits.cols());
        ensure!(
            rows > 0
                && vocab > 0
                && temperatures.len() == rows
                && uniforms.len() == rows
                && out.len() == 2 * rows,
            "sample_rows: logits {:?}, {} temperatures, {} uniforms, out {:?}",
            logits.shape(),
            temperatures.len(),
            uniforms.len(),
            out.shape()
        );
        let (rows_i, vocab_i) = (as_i32("rows", rows)?, as_i32("vocab", vocab)?);
        let f = self.function("sampling", "sample_rows_f32")?;
        let (o, l, t, u) = (out.ptr(), logits.ptr(), temperatures.ptr(), uniforms.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&o)
            .arg(&l)
            .arg(&t)
            .arg(&u)
            .arg(&rows_i)
            .arg(&vocab_i);
        let config = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (SAMPLING_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(config) }?;
        Ok(())
    }
}
