// Per-token log-softmax statistics from fp32 logits, for the trainer's token logprobs
// (`Backend::token_logprobs`, `swerve-train score`):
//
//   token_logprob_stats_f32:  out[t] = (logits[t, targets[t]], m_0, s_0, ..., m_{n-1}, s_{n-1})
//
// with (m_k, s_k) the canonical (max, sum of exp(x - max)) of vocabulary shard k of n (the LM
// head's tensor-parallel ranks, 1 without) over chunks of `chunk` columns (logsumexp.cuh: the
// order the sampler and the fused loss use too). The host finishes
// logprob = z - m - ln s in f64 (RowStats::logprob), as for the sampler and the loss, so the three
// agree bit for bit.
//
// Shapes: logits [tokens, vocab] fp32 row-major (the LM head's fp32 output for a chunk of rows);
// targets [tokens] u32 (checked below vocab by the host); out [tokens, 1 + 2 shards] fp32. One block of
// kLseThreads per row. Nothing but the per-row result is written. (Training's fused LM-head loss,
// which never stores the logits at all, is kernels/dapo_loss.cu.)

#include "logsumexp.cuh"

struct LogprobsConfig {
    static constexpr int threads = kLseThreads;
};

extern "C" __global__ void __launch_bounds__(LogprobsConfig::threads)
    token_logprob_stats_f32(float* __restrict__ out, const float* __restrict__ logits,
                            const uint32_t* __restrict__ targets, int tokens, int vocab, int chunk, int shards) {
    __shared__ float scratch[LogprobsConfig::threads / SWERVE_WARP];
    const int t = blockIdx.x;
    if (t >= tokens) return;
    const float* row = logits + (size_t)t * vocab;
    float* o = out + (size_t)t * (1 + 2 * shards);
    for (int k = 0; k < shards; ++k) {
        const int2 shard = vocab_shard(vocab, shards, k);
        const ChunkStats r = range_chunked_stats(row, shard.x, shard.y, chunk, IdentityScore{}, scratch);
        if (threadIdx.x == 0) {
            o[1 + 2 * k] = r.m;
            o[2 + 2 * k] = r.s;
        }
    }
    if (threadIdx.x == 0) {
        const uint32_t target = targets[t];
        o[0] = target < (uint32_t)vocab ? row[target] : __int_as_float(0x7fc00000);
    }
}
