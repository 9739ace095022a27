// The row (max, sum of exp(x - max)) reduction of an fp32 row, shared by logprobs.cu (the
// trainer's token logprobs) and sampling.cu (the rollout sampler), so that at temperature 1 the
// logprob a rollout reports is bit for bit the one the trainer computes (DESIGN.md decision 10).
//
// One block per row. Each thread keeps an online (max, sum) pair over a block-strided walk of the
// row; pairs merge by warp shuffles (xor butterfly), then across warps in warp order by thread 0.
// Both kernels call this one function with the same block size, so the additions happen in the
// same order.
#pragma once

#include "common.cuh"

// Merges the running (max, sum) pair (m, s) with (m2, s2): the sum of exp(x - max) over both sets.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
    const float m_new = fmaxf(m, m2);
    if (m_new == -INFINITY) return;  // both empty
    s = s * __expf(m - m_new) + s2 * __expf(m2 - m_new);
    m = m_new;
}

struct MaxSumExp {
    float max;
    float sum;
};

// Reduces `score(row[i])` over i in [0, vocab). The result is valid in thread 0 only.
// `warp_max` and `warp_sum_exp` hold one float per warp of the block.
template <typename Score>
__device__ __forceinline__ MaxSumExp row_max_sum_exp(const float* __restrict__ row, int vocab, Score score,
                                                     float* warp_max, float* warp_sum_exp) {
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = score(row[i]);
        if (x > m) {
            s = s * __expf(m - x) + 1.0f;
            m = x;
        } else if (x != -INFINITY) {  // -inf adds 0; while m is -inf too, exp(-inf + inf) is NaN
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
    MaxSumExp result{-INFINITY, 0.0f};
    if (threadIdx.x == 0) {
        m = warp_max[0];
        s = warp_sum_exp[0];
        for (int w = 1; w < (int)(blockDim.x / SWERVE_WARP); ++w) merge_max_sum(m, s, warp_max[w], warp_sum_exp[w]);
        result = {m, s};
    }
    return result;
}
