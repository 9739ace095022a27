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
//                        u = sum exp(z - m) (z - m), merged into stats[r] = (m, s, u, z_target):
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

#include "common.cuh"

struct LossStatsConfig {
    static constexpr int threads = 256;
};
struct LossGradConfig {
    static constexpr int threads = 256;
    static constexpr int per_thread = 4;  // columns per thread per block of the 2-D grid
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
    const int lane = threadIdx.x % SWERVE_WARP, warp = threadIdx.x / SWERVE_WARP;
    const int warps = blockDim.x / SWERVE_WARP;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(x);
}

extern "C" __global__ void __launch_bounds__(LossStatsConfig::threads)
    lm_loss_stats_f32(float4* __restrict__ stats, const float* __restrict__ logits,
                      const uint32_t* __restrict__ targets, int rows, int cols, int v0, int first_tile) {
    __shared__ float scratch[LossStatsConfig::threads / SWERVE_WARP];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* z = logits + (size_t)r * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, z[j]);
    m = block_max(m, scratch);
    float s = 0.0f, u = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float centred = z[j] - m;
        const float e = __expf(centred);
        s += e;
        u += e * centred;
    }
    s = block_sum(s, scratch);
    u = block_sum(u, scratch);
    if (threadIdx.x != 0) return;
    const uint32_t local = targets[r] - (uint32_t)v0;  // wraps for targets below v0
    const bool has_target = local < (uint32_t)cols;
    if (first_tile) {
        stats[r] = make_float4(m, s, u, has_target ? z[local] : 0.0f);
        return;
    }
    const float4 old = stats[r];
    const float big = fmaxf(old.x, m);
    const float a1 = __expf(old.x - big), a2 = __expf(m - big);
    const float merged_s = a1 * old.y + a2 * s;
    const float merged_u = a1 * (old.z + (old.x - big) * old.y) + a2 * (u + (m - big) * s);
    stats[r] = make_float4(big, merged_s, merged_u, has_target ? z[local] : old.w);
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
