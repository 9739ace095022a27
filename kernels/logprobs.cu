// Per-token log-probabilities from fp32 logits: a row logsumexp and a gather.
//
//   token_logprobs_f32:  out[t] = logits[t, targets[t]] - logsumexp(logits[t, :])
//
// Shapes: logits [tokens, vocab] fp32 row-major (the LM head's fp32 output for a chunk of rows);
// targets [tokens] u32; out [tokens] fp32. One block per row, one pass over the row: each thread
// keeps an online (max, sum of exp) pair, the pairs merge by warp shuffles and then across warps.
// Nothing but the per-row result is written. (Training's fused LM-head loss, which never stores
// the logits at all, is kernels/dapo_loss.cu.)

#include "common.cuh"

struct LogprobsConfig {
    static constexpr int threads = 512;  // vocab 151,936 = ~297 values per thread
};

// Merges the running (max, sum) pair (m, s) with (m2, s2): the sum of exp(x - max) over both sets.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
    const float m_new = fmaxf(m, m2);
    if (m_new == -INFINITY) return;  // both empty
    s = s * __expf(m - m_new) + s2 * __expf(m2 - m_new);
    m = m_new;
}

extern "C" __global__ void __launch_bounds__(LogprobsConfig::threads)
    token_logprobs_f32(float* __restrict__ out, const float* __restrict__ logits, const uint32_t* __restrict__ targets,
                       int tokens, int vocab) {
    __shared__ float warp_max[LogprobsConfig::threads / SWERVE_WARP];
    __shared__ float warp_sum_exp[LogprobsConfig::threads / SWERVE_WARP];
    const int t = blockIdx.x;
    if (t >= tokens) return;
    const float* row = logits + (size_t)t * vocab;

    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x > m) {
            s = s * __expf(m - x) + 1.0f;
            m = x;
        } else {
            s += __expf(x - m);
        }
    }
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
        merge_max_sum(m, s, m2, s2);
    }
    const int lane = threadIdx.x % SWERVE_WARP, warp = threadIdx.x / SWERVE_WARP;
    if (lane == 0) {
        warp_max[warp] = m;
        warp_sum_exp[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        m = warp_max[0];
        s = warp_sum_exp[0];
        for (int w = 1; w < (int)(blockDim.x / SWERVE_WARP); ++w) merge_max_sum(m, s, warp_max[w], warp_sum_exp[w]);
        const uint32_t target = targets[t];
        out[t] = target < (uint32_t)vocab ? row[target] - (m + logf(s)) : __int_as_float(0x7fc00000);
    }
}
