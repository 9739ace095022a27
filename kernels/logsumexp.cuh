// The canonical log-softmax statistics of an fp32 logits row (issue 25, DESIGN.md decision 10),
// shared by the three paths that report a token's logprob: sampling.cu (the rollout sampler),
// logprobs.cu (the trainer's token_logprobs, `swerve-train score`) and dapo_loss.cu (the fused
// LM-head loss, `train_logprobs`, RFT / DAPO). Each computes, for a row's logits (whose bits are
// the same on every path: gemm.rs pins the LM head's GEMM), the same f32 pair (m, s):
//
//   0. The vocabulary is cut into `shards` near-equal runs, longer ones first (vocab_shard: the
//      rows tensor-parallel rank k's LM head holds, src/config/shard.rs; one shard without tensor
//      parallelism). Each shard gets its own (m_k, s_k) by steps 1-3; the shards combine on the
//      host, in f64, in rank order (RowStats::merge_shards), as the vocabulary-parallel loss
//      combines its ranks': so the sampler and `token_logprobs`, which see the gathered logits,
//      give the loss's bits at every tensor-parallel degree.
//   1. A shard is cut into chunks of `chunk` columns at offsets 0, chunk, 2 chunk, ... from the
//      shard's first column (the loss's vocabulary tile, LossTiles::vocab; the backend passes the
//      same value to every path). The last chunk may be shorter.
//   2. Per chunk, one block of kLseThreads threads: m_c = the block max (exact, any order);
//      thread t sums __expf(x - m_c) over columns c0 + t, c0 + t + kLseThreads, ... in that
//      order; block_sum (common.cuh: warp xor-butterflies, then the warps' sums in one warp) adds
//      the threads' sums. The loss also sums u_c = sum exp(x - m_c) (x - m_c) for the entropy,
//      which does not touch m_c or s_c.
//   3. Chunks merge left to right (merge_chunk): M = max(m, m_c), s = exp(m - M) s + exp(m_c - M)
//      s_c. A chunk with no finite-or-+inf value (m_c = -inf) is skipped; the first chunk's
//      statistics are taken as they are.
//
// The logprob itself, z - m - ln s, is finished on the host in f64 from these f32 values by one
// function (backend::loss::RowStats::logprob), so sampler, scorer and trainer agree bit for bit.
// Rejected: one online (max, sum) pass per thread over the whole row (what the sampler and scorer
// did before): the loss cannot walk a row whole, it sees one vocabulary tile at a time.
#pragma once

#include "common.cuh"

// Threads of every block that reduces a chunk; the launch code of all three paths uses it.
constexpr int kLseThreads = 256;

struct ChunkStats {
    float m;  // max
    float s;  // sum exp(x - m)
    float u;  // sum exp(x - m) (x - m) (the loss's entropy; 0 elsewhere)
};

// The raw logit as the value reduced: NaN stays NaN (a NaN row gives a NaN logprob, as on the CPU
// reference).
struct IdentityScore {
    __device__ __forceinline__ float operator()(float z) const { return z; }
};

__device__ __forceinline__ float lse_warp_max(float x) {
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

// The block's max, in every thread. `scratch` holds one float per warp.
__device__ __forceinline__ float lse_block_max(float x, float* scratch) {
    const int lane = threadIdx.x % SWERVE_WARP, warp = threadIdx.x / SWERVE_WARP;
    const int warps = blockDim.x / SWERVE_WARP;
    x = lse_warp_max(x);
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < warps ? scratch[lane] : -INFINITY;
    return lse_warp_max(x);
}

// Step 2 over columns [begin, end) of `row`, in every thread of the block. `score` maps a logit
// to the value reduced (the sampler's temperature; identity elsewhere).
template <bool kCentred, typename Score>
__device__ __forceinline__ ChunkStats chunk_stats(const float* __restrict__ row, int begin, int end, Score score,
                                                  float* scratch) {
    float m = -INFINITY;
    for (int j = begin + threadIdx.x; j < end; j += blockDim.x) m = fmaxf(m, score(row[j]));
    m = lse_block_max(m, scratch);
    float s = 0.0f, u = 0.0f;
    if (m != -INFINITY) {  // the same in every thread
        for (int j = begin + threadIdx.x; j < end; j += blockDim.x) {
            const float centred = score(row[j]) - m;
            const float e = __expf(centred);
            s += e;
            if (kCentred) u += e * centred;
        }
    }
    s = block_sum(s, scratch);
    if (kCentred) u = block_sum(u, scratch);
    return {m, s, u};
}

// Step 3: merges chunk `c` (to the right of everything in `acc`) into `acc`. Every product and
// sum is rounded explicitly: no compiler may contract it differently in another kernel.
__device__ __forceinline__ void merge_chunk(ChunkStats& acc, const ChunkStats& c, bool first) {
    if (first || acc.m == -INFINITY) {
        acc = c;
        return;
    }
    if (c.m == -INFINITY) return;
    const float big = fmaxf(acc.m, c.m);
    const float a1 = __expf(__fsub_rn(acc.m, big)), a2 = __expf(__fsub_rn(c.m, big));
    const float s = __fadd_rn(__fmul_rn(a1, acc.s), __fmul_rn(a2, c.s));
    const float u1 = __fadd_rn(acc.u, __fmul_rn(__fsub_rn(acc.m, big), acc.s));
    const float u2 = __fadd_rn(c.u, __fmul_rn(__fsub_rn(c.m, big), c.s));
    acc.u = __fadd_rn(__fmul_rn(a1, u1), __fmul_rn(a2, u2));
    acc.s = s;
    acc.m = big;
}

// The most vocabulary shards (tensor-parallel ranks of the LM head) the kernels take.
constexpr int kMaxVocabShards = 8;

// Step 0: shard k of `shards` near-equal runs of `vocab` columns, longer ones first (the split of
// src/config/shard.rs's near_equal): [begin, end).
__device__ __forceinline__ int2 vocab_shard(int vocab, int shards, int k) {
    const int base = vocab / shards, rem = vocab % shards;
    const int begin = k * base + min(k, rem);
    return make_int2(begin, begin + base + (k < rem ? 1 : 0));
}

// Steps 1-3 over columns [begin, end) of `row` (one shard), in every thread.
template <typename Score>
__device__ __forceinline__ ChunkStats range_chunked_stats(const float* __restrict__ row, int begin, int end, int chunk,
                                                          Score score, float* scratch) {
    ChunkStats acc{-INFINITY, 0.0f, 0.0f};
    for (int c0 = begin; c0 < end; c0 += chunk) {
        const ChunkStats c = chunk_stats<false>(row, c0, min(end, c0 + chunk), score, scratch);
        merge_chunk(acc, c, c0 == begin);
    }
    return acc;
}
