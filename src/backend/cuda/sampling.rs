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

/// The most vocabulary shards the statistics kernels take (`kMaxVocabShards`): tensor-parallel
/// degrees of the LM head up to 8.
pub const MAX_VOCAB_SHARDS: usize = 8;

/// `u32` words per sampled row with one vocabulary shard (what a CUDA-graph decode step, always
/// tensor-parallel 1, reads back): token, score bits, max bits, sum bits.
pub const SAMPLE_WORDS: usize = 4;

/// `u32` words per sampled row over `shards` vocabulary shards: token, score, then each shard's
/// max and sum.
pub fn sample_words(shards: usize) -> usize {
    2 + 2 * shards
}

/// The (token, logprob) of each row of the sampler's output words over `shards` vocabulary
/// shards: `x - ln(sum over shards)` finished in f64 by [`RowStats::merge_shards`] and
/// [`RowStats::logprob`], the trainer's expressions, so at temperature 1 it equals the trainer's
/// logprob bit for bit at every tensor-parallel degree; `-ln sum` when the max is +inf (shard 0's
/// sum counts the +inf scores), -inf when no score is above -inf.
pub fn finish_samples(words: &[u32], shards: usize) -> Vec<(u32, f32)> {
    let f = |w: u32| f32::from_bits(w);
    words
        .chunks_exact(sample_words(shards))
        .map(|w| {
            let (x, max, sum) = (f(w[1]), f(w[2]), f(w[3]));
            let logprob = if max == f32::NEG_INFINITY {
                f32::NEG_INFINITY
            } else if max == f32::INFINITY {
                -(sum as f64).ln() as f32
            } else {
                let pieces: Vec<RowStats> = (0..shards)
                    .map(|k| RowStats::from_f32(x, f(w[2 + 2 * k]), f(w[3 + 2 * k])))
                    .collect();
                RowStats::merge_shards(&pieces, 0).logprob() as f32
            };
            (w[0], logprob)
        })
        .collect()
}

/// Token logprobs from `token_logprob_stats_f32`'s rows (the target's logit, then each of
/// `shards` vocabulary shards' max and sum), finished as the sampler's and the loss's are.
pub fn finish_token_logprobs(values: &[f32], shards: usize) -> Vec<f32> {
    values
        .chunks_exact(1 + 2 * shards)
        .map(|v| {
            let pieces: Vec<RowStats> = (0..shards)
                .map(|k| RowStats::from_f32(v[0], v[1 + 2 * k], v[2 + 2 * k]))
                .collect();
            RowStats::merge_shards(&pieces, 0).logprob() as f32
        })
        .collect()
}

impl CudaDevice {
    /// `out [rows, sample_words(shards)]` u32 (see [`finish_samples`]) per row of `logits [rows,
    /// vocab]` f32, with `temperatures [rows]` f32, `uniforms [rows]` f64 and the canonical
    /// reduction's vocabulary `chunk` and `shards` (the LM head's tensor-parallel ranks).
    #[allow(clippy::too_many_arguments)]
    pub fn sample_rows(
        &self,
        logits: &CudaTensor,
        temperatures: &CudaTensor,
        uniforms: &CudaTensor,
        chunk: usize,
        shards: usize,
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
                && (1..=MAX_VOCAB_SHARDS).contains(&shards)
                && shards <= vocab
                && out.len() == sample_words(shards) * rows,
            "sample_rows: logits {:?}, {} temperatures, {} uniforms, {shards} vocabulary shards, out {:?}",
            logits.shape(),
            temperatures.len(),
            uniforms.len(),
            out.shape()
        );
        let (rows_i, vocab_i) = (as_i32("rows", rows)?, as_i32("vocab", vocab)?);
        let chunk_i = as_i32("vocabulary chunk", chunk)?;
        let shards_i = shards as i32;
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
            .arg(&chunk_i)
            .arg(&shards_i);
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
