//! Launch of `kernels/sampling.cu`: unfiltered and greedy sampling of logits rows on the device,
//! so a decode step copies back 16 bytes per row instead of the vocabulary's logits: the token,
//! its score and the row's canonical (max, sum) statistics, from which the host finishes the
//! logprob exactly as the trainer does ([`finish_samples`]).

use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, CudaDevice};
use crate::backend::loss::RowStats;
use anyhow::{ensure, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Threads per row: `kLseThreads` (kernels/logsumexp.cuh), the block of the canonical chunked
/// reduction that `token_logprob_stats_f32` and the fused loss launch too.
pub const LSE_THREADS: u32 = 256;

/// `u32` words per sampled row: token, score bits, max bits, sum bits.
pub const SAMPLE_WORDS: usize = 4;

/// The (token, logprob) of each row of the sampler's output words: `x - max - ln sum` finished in
/// f64 by [`RowStats::logprob`], the trainer's expression, so at temperature 1 it equals the
/// trainer's logprob bit for bit; `-ln sum` when the max is +inf (sum counts the +inf scores),
/// -inf when no score is above -inf.
pub fn finish_samples(words: &[u32]) -> Vec<(u32, f32)> {
    words
        .chunks_exact(SAMPLE_WORDS)
        .map(|w| {
            let (x, max, sum) = (
                f32::from_bits(w[1]),
                f32::from_bits(w[2]),
                f32::from_bits(w[3]),
            );
            let logprob = if max == f32::NEG_INFINITY {
                f32::NEG_INFINITY
            } else if max == f32::INFINITY {
                -(sum as f64).ln() as f32
            } else {
                RowStats::from_f32(x, max, sum).logprob() as f32
            };
            (w[0], logprob)
        })
        .collect()
}

impl CudaDevice {
    /// `out [rows, SAMPLE_WORDS]` u32 (see [`finish_samples`]) per row of `logits [rows, vocab]`
    /// f32, with `temperatures [rows]` f32, `uniforms [rows]` f64 and the canonical reduction's
    /// vocabulary `chunk`.
    pub fn sample_rows(
        &self,
        logits: &CudaTensor,
        temperatures: &CudaTensor,
        uniforms: &CudaTensor,
        chunk: usize,
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
                && chunk > 0
                && out.len() == SAMPLE_WORDS * rows,
            "sample_rows: logits {:?}, {} temperatures, {} uniforms, out {:?}",
            logits.shape(),
            temperatures.len(),
            uniforms.len(),
            out.shape()
        );
        let (rows_i, vocab_i) = (as_i32("rows", rows)?, as_i32("vocab", vocab)?);
        let chunk_i = as_i32("vocabulary chunk", chunk)?;
        let f = self.function("sampling", "sample_rows_f32")?;
        let (o, l, t, u) = (out.ptr(), logits.ptr(), temperatures.ptr(), uniforms.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&o)
            .arg(&l)
            .arg(&t)
            .arg(&u)
            .arg(&rows_i)
            .arg(&vocab_i)
            .arg(&chunk_i);
        let config = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (LSE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(config) }?;
        Ok(())
    }
}
