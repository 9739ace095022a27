// Per-token log-softmax statistics from fp32 logits, for the trainer's token logprobs
// (`Backend::token_logprobs`, `swerve-train score`):
//
//   token_logprob_stats_f32:  out[t] = (logits[t, targets[t]], m, s)
//
// with (m, s) the row's canonical (max, sum of exp(x - max)) over vocabulary chunks of `chunk`
// columns (logsumexp.cuh: the order the sampler and the fused loss use too). The host finishes
// logprob = z - m - ln s in f64 (RowStats::logprob), as for the sampler and the loss, so the three
// agree bit for bit.
//
// Shapes: logits [tokens, vocab] fp32 row-major (the LM head's fp32 output for a chunk of rows);
// targets [tokens] u32 (checked below vocab by the host); out [tokens, 3] fp32. One block of
// kLseThreads per row. Nothing but the per-row result is written. (Training's fused LM-head loss,
// which never stores the logits at all, is kernels/dapo_loss.cu.)

#include "logsumexp.cuh"

struct LogprobsConfig {
    static constexpr int threads = kLseThreads;
};

extern "C" __global__ void __launch_bounds__(LogprobsConfig::threads)
    token_logprob_stats_f32(float* __restrict__ out, const float* __restrict__ logits,
                            const uint32_t* __restrict__ targets, int tokens, int vocab, int chunk) {
    __shared__ float scratch[LogprobsConfig::threads / SWERVE_WARP];
    const int t = blockIdx.x;
    if (t >= tokens) return;
    const float* row = logits + (size_t)t * vocab;
    const ChunkStats r = row_chunked_stats(row, vocab, chunk, IdentityScore{}, scratch);
    if (threadIdx.x == 0) {
        const uint32_t target = targets[t];
        out[3 * t] = target < (uint32_t)vocab ? row[target] : __int_as_float(0x7fc00000);
        out[3 * t + 1] = r.m;
        out[3 * t + 2] = r.s;
    }
}
