// The canonical tensor-parallel sum (DESIGN.md decision 10): n ranks' partial values of the same
// elements, received side by side, summed per element IN RANK ORDER in fp32 and rounded once.
//
//   rank_sum_{bf16,f32}:  out[i] = round(((p[0][i] + p[1][i]) + p[2][i]) + ... + p[n-1][i])
//                         for i < count, p[r] = partials + r * stride; fp32 accumulator, bf16
//                         inputs widened exactly, one rounding to the output type
//
// Shapes: partials [ranks, stride] (row r = rank r's values; only the first `count` of a row are
// read), out [count], same dtype. Forward only: a sum has no backward of its own (the model's
// backward calls the collectives again). What it never does: reorder, pair up or split the sum,
// so the result is the same for every message size and for the all-reduce and the reduce-scatter
// (src/dist/nccl/ordered.rs), and bitwise equal to the host path's rank-order f32 sum
// (src/dist/mod.rs, `reduce_in_rank_order`), the CPU reference.
// Memory-bound: one element per thread per step of a grid-stride loop; rows are read coalesced.

#include "common.cuh"

struct RankSumConfig {
    static constexpr int threads = 256;
};

extern "C" __global__ void __launch_bounds__(RankSumConfig::threads)
    rank_sum_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ partials, int ranks,
                  long long stride, long long count) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        float acc = bf16_to_f32(partials[i]);
        for (int r = 1; r < ranks; ++r) acc += bf16_to_f32(partials[(long long)r * stride + i]);
        out[i] = f32_to_bf16(acc);
    }
}

extern "C" __global__ void __launch_bounds__(RankSumConfig::threads)
    rank_sum_f32(float* __restrict__ out, const float* __restrict__ partials, int ranks, long long stride,
                 long long count) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        float acc = partials[i];
        for (int r = 1; r < ranks; ++r) acc += partials[(long long)r * stride + i];
        out[i] = acc;
    }
}
