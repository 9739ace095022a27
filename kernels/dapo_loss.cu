// The fused LM-head loss of RFT and DAPO (src/train/loss.rs is the reference and the contract):
// the element-wise halves. The logits tiles themselves come from cuBLASLt GEMMs
// (src/backend/cuda/loss.rs drives them); these kernels turn a tile into per-row softmax
// statistics, then (after the host has the loss terms) into the logits' gradient.
//
// What is never materialised: the [T, V] logits. The host walks tiles of at most
// LossTiles::rows x LossTiles::vocab logits (fp32, one reused scratch buffer), twice: pass 1 for
// the statistics, pass 2 recomputes each tile for the gradient.
//
//   lm_loss_stats_f32:   per row r of a tile z [rows, cols] (vocabulary columns v0 .. v0 + cols):
//                        the tile's own (m, s, u) with m = max z, s = sum exp(z - m),
//                        u = sum exp(z - m) (z - m) (logsumexp.cuh's chunk_stats, the
//                        canonical order), merged into stats[r] = (m, s, u, z_target) by
//                        merge_chunk:
//                            M = max(m1, m2), a_i = exp(m_i - M)
//                            s = a1 s1 + a2 s2,  u = a1 (u1 + (m1 - M) s1) + a2 (u2 + (m2 - M) s2)
//                        and z_target = z[targets[r] - v0] when the target falls in this tile.
//                        Then lse = m + log s, logp = z_target - lse, entropy = log s - u / s.
//                        These (m, s, u, z_target) pieces are what a vocabulary-parallel loss
//                        all-reduces across ranks (same merge rule) before pass 2.
//   lm_loss_dlogits_bf16: g[r, j] = coef[r] * (1[v0 + j == targets[r]] - exp(z[r, j] - lse[r]))
//                        in bf16 (the two gradient GEMMs' input), coef[r] = d loss / d logp_r
//                        (0 for rows outside the loss: their g is all zero).
//
// Shapes: z [rows, cols] f32 row-major (ld = cols); stats [rows] float4; targets, lse, coef
// [rows]; g [rows, cols] bf16. Statistics accumulate in fp32 relative to the running max (u is
// centred, so the entropy's lse - E[z] never cancels two large numbers). One block per row for
// the statistics (two sweeps of the row: max, then the sums; the second hits L1/L2); the gradient
// is a 2-D grid of row segments.

#include "logsumexp.cuh"

struct LossStatsConfig {
    static constexpr int threads = kLseThreads;  // the canonical chunk reduction's block
};
struct LossGradConfig {
    static constexpr int threads = 256;
    static constexpr int per_thread = 4;  // columns per thread per block of the 2-D grid
};

// One tile is one chunk of the canonical order (logsumexp.cuh) when the tile's columns are the
// backend's vocabulary chunk: then (m, s) equal the sampler's and token_logprobs' bit for bit.
extern "C" __global__ void __launch_bounds__(LossStatsConfig::threads)
    lm_loss_stats_f32(float4* __restrict__ stats, const float* __restrict__ logits,
                      const uint32_t* __restrict__ targets, int rows, int cols, int v0, int first_tile) {
    __shared__ float scratch[LossStatsConfig::threads / SWERVE_WARP];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* z = logits + (size_t)r * cols;
    const ChunkStats tile = chunk_stats<true>(z, 0, cols, IdentityScore{}, scratch);
    if (threadIdx.x != 0) return;
    const uint32_t local = targets[r] - (uint32_t)v0;  // wraps for targets below v0
    const bool has_target = local < (uint32_t)cols;
    const float4 old = first_tile ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : stats[r];
    ChunkStats acc{old.x, old.y, old.z};
    merge_chunk(acc, tile, first_tile != 0);
    stats[r] = make_float4(acc.m, acc.s, acc.u, has_target ? z[local] : old.w);
}

// grid = (ceil(cols / (threads * per_thread)), rows)
extern "C" __global__ void __launch_bounds__(LossGradConfig::threads)
    lm_loss_dlogits_bf16(__nv_bfloat16* __restrict__ g, const float* __restrict__ logits,
                         const float* __restrict__ lse, const float* __restrict__ coef,
                         const uint32_t* __restrict__ targets, int rows, int cols, int v0) {
    const int r = blockIdx.y;
    if (r >= rows) return;
    const float c = coef[r], row_lse = lse[r];
    const uint32_t local = targets[r] - (uint32_t)v0;
    const float* z = logits + (size_t)r * cols;
    __nv_bfloat16* out = g + (size_t)r * cols;
    const int base = blockIdx.x * LossGradConfig::threads * LossGradConfig::per_thread + threadIdx.x;
#pragma unroll
    for (int i = 0; i < LossGradConfig::per_thread; ++i) {
        const int j = base + i * LossGradConfig::threads;
        if (j >= cols) break;
        const float onehot = (uint32_t)j == local ? 1.0f : 0.0f;
        out[j] = f32_to_bf16(c == 0.0f ? 0.0f : c * (onehot - __expf(z[j] - row_lse)));
    }
}
