// Per-token log-probabilities from fp32 logits: a row logsumexp and a gather.
//
//   token_logprobs_f32:  out[t] = logits[t, targets[t]] - logsumexp(logits[t, :])
//
// Shapes: logits [tokens, vocab] fp32 row-major (the LM head's fp32 output for a chunk of rows);
// targets [tokens] u32; out [tokens] fp32. One block per row, one pass over the row through
// row_max_sum_exp (logsumexp.cuh), the reduction the sampler shares.
// Nothing but the per-row result is written. (Training's fused LM-head loss, which never stores
// the logits at all, is kernels/dapo_loss.cu.)

#include "logsumexp.cuh"

struct LogprobsConfig {
    static constexpr int threads = 512;  // vocab 151,936 = ~297 values per thread
};

// The raw logit: NaN stays NaN (a NaN row gives a NaN logprob, as on the CPU reference).
struct IdentityScore {
    __device__ __forceinline__ float operator()(float z) const { return z; }
};

extern "C" __global__ void __launch_bounds__(LogprobsConfig::threads)
    token_logprobs_f32(float* __restrict__ out, const float* __restrict__ logits, const uint32_t* __restrict__ targets,
                       int tokens, int vocab) {
    __shared__ float warp_max[LogprobsConfig::threads / SWERVE_WARP];
    __shared__ float warp_sum_exp[LogprobsConfig::threads / SWERVE_WARP];
    const int t = blockIdx.x;
    if (t >= tokens) return;
    const float* row = logits + (size_t)t * vocab;
    const MaxSumExp r = row_max_sum_exp(row, vocab, IdentityScore{}, warp_max, warp_sum_exp);
    if (threadIdx.x == 0) {
        const uint32_t target = targets[t];
        out[t] = target < (uint32_t)vocab ? row[target] - (r.max + logf(r.sum)) : __int_as_float(0x7fc00000);
    }
}
