// Flash attention for prefill and training: causal, GQA, packed variable-length sequences,
// forward and backward. Neither direction ever materialises the [T, T] score or probability
// matrix: both stream key/value (forward) or query (backward) tiles through shared memory and keep
// the statistics they need in fp32 registers.
//
// Shapes (T = total packed tokens, group = heads / kv_heads, query head h reads kv head h / group):
//   q, out, d_out, d_q [T, heads, head_dim] bf16;  k, v, d_k, d_v [T, kv_heads, head_dim] bf16;
//   cu_seqlens [num_seqs + 1] i32 (sequence s is rows cu_seqlens[s] .. cu_seqlens[s+1]);
//   lse [T, heads] fp32 (natural log; the layout of BackendGrad::attention_with_lse, so the CPU
//   reference, the trait and both kernels share one convention). Head dims 16, 32, 64, 128.
//
// ---- forward: flash_attn_fwd_hd{16,32,64,128} ----------------------------------------------------
//   out[i, h, :] = sum_{j <= i} softmax_j(scale * q[i, h] . k[j, h / group]) v[j, h / group, :]
//   lse[i, h]    = log sum_{j <= i} exp(scale * q[i, h] . k[j, h / group])
//
// Each block owns kBlockM query rows of one (sequence, head) and streams the key/value tiles of
// that sequence through shared memory, keeping the running row max and row sum in fp32 registers
// (online softmax) and rescaling the fp32 output accumulator as the max grows. Scores and the
// output come from bf16 tensor-core MMAs (mma.sync m16n8k16, fp32 accumulation), with P rounded to
// bf16 for the second MMA, as FlashAttention 2 does. Each warp owns 16 query rows.
//
// Pipeline per key tile j (cp.async, single-buffered K and V, FlashAttention 2's overlap):
//   issue V(j) | wait K(j) | S = Q K(j)^T, mask, softmax | issue K(j+1) | wait V(j) | O += P V(j)
//
// Masking: keys beyond the sequence and keys after the query (causal) are -inf; rows past the end
// of the sequence are computed on zero-filled queries and never written. Tiles past the diagonal
// are never loaded. Blocks are scheduled longest-first (the last query tile has the most keys).
//
// ---- backward: three launches --------------------------------------------------------------------
// Gradient convention (BackendGrad): d_q, d_k, d_v are ACCUMULATED, d_x += ..., each element read,
// added in fp32 and rounded to bf16 once. With P = exp(scale S - lse), S = Q K^T:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) with D_i = rowsum(dO_i * O_i),
//   dQ = scale dS K,  dK = scale dS^T Q        (dK, dV summed over the query heads of a kv head)
//
// 1. flash_attn_bwd_preprocess: D = rowsum(dO * O) in fp32 from the bf16 out and d_out; lse * log2(e);
//    both written [heads, T] (so the main kernel's per-tile reads are contiguous); zeroes the fp32
//    dQ accumulator. One pass over out and d_out.
// 2. flash_attn_bwd_hd{16,32,64,128}: one block per (sequence, kBlockN-key tile, kv head), FA2's
//    loop order: K and V of the tile stay in shared memory; the block walks every query tile at or
//    after the diagonal, for every query head of the GQA group, with Q, dO, lse and D double-
//    buffered through cp.async. Each warp owns 16 keys and computes in registers, transposed so that
//    no fragment needs to move between warps:
//      S^T = K Q^T  ->  P^T = exp2(S^T scale log2e - lse log2e), masked (key > query or query past
//      the sequence: 0)  ->  dV += P^T dO  ->  dP^T = V dO^T  ->  dS^T = P^T (dP^T - D)  ->  dK += dS^T Q
//    (an accumulator's layout is the A-fragment layout of the next MMA, P and dS rounded to bf16 as
//    MMA operands). dK and dV stay in fp32 registers for the whole block (summed over the group)
//    and are added into d_k, d_v once at the end: no atomics, no scratch. dS^T goes to shared memory,
//    and the warps, re-tiled over (query rows, head-dim columns), compute the tile's dQ part dS K
//    and add it into an fp32 accumulator with vector atomics (red.global.add.v2.f32 on sm_90).
// 3. flash_attn_bwd_dq_add: d_q += scale * dQ_accum (one bf16 rounding).
//
// Why atomics for dQ rather than a second (query-major) pass: a dQ pass would recompute S and dP
// (2 of the 5 T x T x head_dim products, +40% tensor work) and re-read K and V per query tile; the
// atomics cost L2 traffic of T^2 heads head_dim / (2 kBlockN) fp32 adds (hd128, 16k tokens, 28 heads:
// ~3.8e9 adds, ~15 GB of L2 traffic against ~0.5 PFLOP of MMAs), which L2 absorbs at FA2's measured
// rates, and a [T, heads, head_dim] fp32 scratch (0.23 GB at 16k tokens x 28 heads x 128). The
// price is run-to-run nondeterminism of dQ's fp32 summation order (a last-bit difference before the
// bf16 rounding); dK and dV are deterministic. A deterministic mode would be the separate pass.
//
// On sm_90a the target is a wgmma + TMA version (FlashAttention 3's warp-specialised pipeline);
// these mma.sync kernels are the portable, verified baselines that version must match.

#include "attn_tile.cuh"

// Tile configuration per head dim. Shared memory: (kBlockM + 2 kBlockN) rows of head_dim + 8
// bf16 (the 16-byte pad makes ldmatrix's eight 16-byte rows land in distinct bank groups), then
// the segment fold: each thread's head_dim / 2 fp32 of folded O (attn_tile.cuh), thread-private
// and laid out [element][thread] so that a warp's accesses are conflict-free.
//   hd128: 128 x 64, 8 warps: 69,632 + 65,536 = 135,168 B smem: one block (8 warps) per SM.
//   hd64:  128 x 64, 8 warps: 36,864 + 32,768 = 69,632 B: one block per SM (registers).
// (Registers: ptxas, CUDA 13.0, sm_90a; 256-thread blocks; 65,536 registers per SM.) The fold
// costs one pass over the folded O per segment_keys / 64 tiles (8 at 512 keys) and shared memory
// that hd128 cannot fit on sm_86 / sm_89 (99 KiB per block; the host refuses there with the
// figures, as the backward already does).
// Not yet tuned on a GPU: candidates to measure are kBlockN = 128 for hd64 and 4 warps x 32 rows.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct FlashFwdConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kSmemStride = kHeadDim + 8;  // bf16 elements per shared-memory row
    static constexpr int kTileBytes = (kBlockM + 2 * kBlockN) * kSmemStride * 2;
    static constexpr int kFoldFloats = kHeadDim / 2;  // folded O per thread
    static constexpr int kSmemBytes = kTileBytes + kThreads * kFoldFloats * 4;
    static_assert(kBlockM == 16 * kWarps, "each warp owns 16 query rows");
    static_assert(kBlockN == kAttnKeyTile, "key tiles are the canonical tiles of attn_tile.cuh");
    static_assert(kHeadDim % 16 == 0, "MMA tiles are 16 wide");
};

using FlashFwdHd128 = FlashFwdConfig<128, 128, 64, 8>;
using FlashFwdHd64 = FlashFwdConfig<64, 128, 64, 8>;
using FlashFwdHd32 = FlashFwdConfig<32, 128, 64, 8>;  // small test models
using FlashFwdHd16 = FlashFwdConfig<16, 128, 64, 8>;  // small test models

// Copies `rows` rows (row0 .. row0 + rows - 1 of a sequence of `seqlen` rows, each `row_stride`
// elements apart in global memory) into shared memory; rows past the end become zeros.
template <typename Cfg>
__device__ __forceinline__ void load_tile(__nv_bfloat16* smem, const __nv_bfloat16* gmem, int rows, int row0,
                                          int seqlen, size_t row_stride) {
    constexpr int kChunksPerRow = Cfg::kHeadDim / 8;
    for (int i = threadIdx.x; i < rows * kChunksPerRow; i += Cfg::kThreads) {
        const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
        const bool valid = row0 + r < seqlen;
        const __nv_bfloat16* src = valid ? gmem + (size_t)(row0 + r) * row_stride + c : gmem;
        cp_async_16(smem + r * Cfg::kSmemStride + c, src, valid);
    }
}

// ---- the kernel --------------------------------------------------------------------------------

template <typename Cfg>
__device__ __forceinline__ void flash_attn_fwd(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                               const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out,
                                               float* __restrict__ lse, const int* __restrict__ cu_seqlens, int heads,
                                               int kv_heads, int segment_keys, float softmax_scale) {
    constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kSmemStride;
    constexpr int kDTiles = D / 8;   // 8-wide MMA tiles of the output

    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest first
    const int head = blockIdx.y;
    const int seq = blockIdx.z;
    const int seq_start = cu_seqlens[seq];
    const int seqlen = cu_seqlens[seq + 1] - seq_start;
    const int m0 = m_block * BM;
    if (m0 >= seqlen) return;
    const int kv_head = head / (heads / kv_heads);

    extern __shared__ __align__(16) unsigned char flash_smem[];
    __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(flash_smem);
    __nv_bfloat16* sK = sQ + BM * S;
    __nv_bfloat16* sV = sK + BN * S;
    // This thread's folded O: element i at fold_o[i * kThreads].
    float* fold_o = reinterpret_cast<float*>(flash_smem + Cfg::kTileBytes) + threadIdx.x;

    const size_t q_stride = (size_t)heads * D, kv_stride = (size_t)kv_heads * D;
    const __nv_bfloat16* q_seq = q + (size_t)seq_start * q_stride + (size_t)head * D;
    const __nv_bfloat16* k_seq = k + (size_t)seq_start * kv_stride + (size_t)kv_head * D;
    const __nv_bfloat16* v_seq = v + (size_t)seq_start * kv_stride + (size_t)kv_head * D;

    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;
    const int group_row = lane / 4;  // MMA fragment row
    const float scale_log2 = softmax_scale * 1.4426950408889634f;

    // Keys this query tile can see: up to its last row (causal) and the end of the sequence.
    const int n_end = min(seqlen, m0 + BM);
    const int n_blocks = (n_end + BN - 1) / BN;

    load_tile<Cfg>(sQ, q_seq, BM, m0, seqlen, q_stride);
    load_tile<Cfg>(sK, k_seq, BN, 0, seqlen, kv_stride);
    cp_async_commit();

    uint32_t q_frag[D / 16][4];
    float o_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};  // rows group_row and group_row + 8, raw scores
    float row_sum[2] = {0.0f, 0.0f};            // this thread's part of each row's sum
    float fold_max[2] = {-INFINITY, -INFINITY}, fold_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < Cfg::kFoldFloats; ++i) fold_o[i * Cfg::kThreads] = 0.0f;
    int q_idx[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) q_idx[r] = m0 + warp * 16 + group_row + r * 8;

    for (int j = 0; j < n_blocks; ++j) {
        const int n0 = j * BN;
        load_tile<Cfg>(sV, v_seq, BN, n0, seqlen, kv_stride);
        cp_async_commit();
        cp_async_wait<1>();  // Q (first time) and K(j) have landed
        __syncthreads();

        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const int r = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = kk * 16 + (lane / 16) * 8;
                ldmatrix_x4(q_frag[kk], sQ + r * S + c);
            }
        }
        // A tile that starts a segment closes the previous one (attn_tile.cuh's order).
        if (j > 0 && n0 % segment_keys == 0) {
            fold_segment<kDTiles>(fold_o, Cfg::kThreads, fold_max, fold_sum, o_acc, row_max, row_sum, scale_log2);
        }

        // S = Q K^T, keys past the diagonal or the end of the sequence masked, online softmax.
        float s_acc[BN / 8][4];
        attn_tile_scores<D>(s_acc, q_frag, sK, S, lane);
        if (n0 + BN > m0 || n0 + BN > seqlen) {
            mask_tile(s_acc, lane, [&](int r, int key) { return n0 + key > q_idx[r] || n0 + key >= seqlen; });
        }
        online_softmax_tile<BN / 8, kDTiles>(s_acc, o_acc, row_max, row_sum, scale_log2);

        __syncthreads();  // every warp is done reading sK
        if (j + 1 < n_blocks) load_tile<Cfg>(sK, k_seq, BN, n0 + BN, seqlen, kv_stride);
        cp_async_commit();   // possibly empty: keeps the group count uniform
        cp_async_wait<1>();  // V(j) has landed
        __syncthreads();

        attn_tile_pv<D>(o_acc, s_acc, sV, S, lane);
        __syncthreads();  // every warp is done reading sV before the next V load
    }
    fold_segment<kDTiles>(fold_o, Cfg::kThreads, fold_max, fold_sum, o_acc, row_max, row_sum, scale_log2);

    attn_store_rows<D>(out, lse, fold_o, Cfg::kThreads, fold_max, fold_sum, q_idx, seq_start, seqlen, heads, head,
                       softmax_scale, lane);
}

#define FLASH_FWD_ENTRY(name, Cfg)                                                                                  \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)                                                 \
        name(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,                             \
             const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,         \
             const int* __restrict__ cu_seqlens, int heads, int kv_heads, int segment_keys, float softmax_scale) { \
        flash_attn_fwd<Cfg>(q, k, v, out, lse, cu_seqlens, heads, kv_heads, segment_keys, softmax_scale);        \
    }

FLASH_FWD_ENTRY(flash_attn_fwd_hd128, FlashFwdHd128)
FLASH_FWD_ENTRY(flash_attn_fwd_hd64, FlashFwdHd64)
FLASH_FWD_ENTRY(flash_attn_fwd_hd32, FlashFwdHd32)
FLASH_FWD_ENTRY(flash_attn_fwd_hd16, FlashFwdHd16)

// =================================================================================================
// Backward
// =================================================================================================

// Tile configuration per head dim. Each of the kWarps warps owns 16 of the block's kBlockN keys;
// a block walks query tiles of kBlockM rows. For the dQ product the warps are re-tiled as
// kDqWarpsM (16 query rows each) x kDqWarpsN (kDqCols head-dim columns each); warps beyond
// kDqWarpsM * kDqWarpsN (hd16 only) sit that product out.
// Registers per thread: dK + dV accumulators head_dim / 2 fp32, S^T and dP^T kBlockM / 4 each.
// Shared memory: K, V (kBlockN rows), Q, dO (2 stages of kBlockM rows), each row head_dim + 8
// bf16 (the 16-byte pad keeps ldmatrix conflict-free); dS^T kBlockN x (kBlockM + 8) bf16; lse and
// D 2 stages x kBlockM fp32.
//   hd128: 128 keys x 64 queries, 8 warps: 158,720 B smem (above sm_86 / sm_89's 99 KiB opt-in:
//          the host refuses there with the figures).
//   hd64:  128 x 64, 8 warps:  93,184 B.   hd32: 128 x 64: 60,416 B.   hd16: 128 x 64: 44,032 B.
// Occupancy is set by registers, not shared memory (ptxas, CUDA 13.0, sm_90a; sm_80 within 2):
// hd128 and hd64 use 255 registers per thread (the cap; no spills), so a 256-thread block takes
// 65,280 of the SM's 65,536 registers: one block (8 warps) per SM. hd32 (186) and hd16 (136) are
// one block per SM too (256 x 192 and 256 x 136 registers: 2 would need 98,304 and 69,632).
// Not yet measured on a GPU. Candidates, in the order to try: hd64 and below with kBlockM = 128
// (the same one block per SM, with half the query-tile iterations; hd64 must first fit its S^T and
// dP^T, 16 more registers each, without spilling); hd128 with the K / V A-fragments kept in
// registers (+64 registers: would need kBlockM = 32); staging the dQ tile through shared memory
// for 16-byte, whole-line red.global.add.v4.f32 instead of 8-byte ones from the fragments; skipping
// the warps whose 16 keys all lie past a diagonal tile's last query (saves half of 2 tiles per
// block). The Hopper answer is wgmma with the accumulators split across two warpgroups.
template <int kHeadDim_, int kBlockN_, int kBlockM_, int kWarps_>
struct FlashBwdConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockN = kBlockN_;  // keys per block
    static constexpr int kBlockM = kBlockM_;  // query rows per tile
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kSmemStride = kHeadDim + 8;  // bf16 elements per K / V / Q / dO row
    static constexpr int kDsStride = kBlockM + 8;     // bf16 elements per dS^T row
    static constexpr int kDqWarpsM = kBlockM / 16;
    static constexpr int kDqWarpsN = (kWarps / kDqWarpsM) < (kHeadDim / 16) ? (kWarps / kDqWarpsM) : (kHeadDim / 16);
    static constexpr int kDqCols = kHeadDim / kDqWarpsN;
    static constexpr int kSmemBytes = 2 * kBlockN * kSmemStride * 2 + 2 * 2 * kBlockM * kSmemStride * 2 +
                                      kBlockN * kDsStride * 2 + 2 * 2 * kBlockM * 4;
    static_assert(kBlockN == 16 * kWarps, "each warp owns 16 keys");
    static_assert(kBlockN % kBlockM == 0, "a key tile starts on a query-tile boundary");
    static_assert(kBlockM % 16 == 0 && kHeadDim % 16 == 0, "MMA tiles are 16 wide");
    static_assert(kDqWarpsM <= kWarps && kDqCols % 16 == 0, "dQ warp tiling");
};

using FlashBwdHd128 = FlashBwdConfig<128, 128, 64, 8>;
using FlashBwdHd64 = FlashBwdConfig<64, 128, 64, 8>;
using FlashBwdHd32 = FlashBwdConfig<32, 128, 64, 8>;  // small test models
using FlashBwdHd16 = FlashBwdConfig<16, 128, 64, 8>;  // small test models

// Step 1: D[h, i] = sum_d d_out[i, h, d] * out[i, h, d] (fp32), lse_log2[h, i] = lse[i, h] log2(e),
// dq_accum = 0. One thread per 8 head-dim elements; the head_dim / 8 threads of a (row, head) are
// consecutive lanes of one warp. head_dim / 8 must be a power of two <= 32.
extern "C" __global__ void __launch_bounds__(256)
    flash_attn_bwd_preprocess(const __nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ d_out,
                              const float* __restrict__ lse, float* __restrict__ lse_log2,
                              float* __restrict__ delta, float* __restrict__ dq_accum, int total_tokens, int heads,
                              int head_dim) {
    const int chunks = head_dim / 8;
    const size_t total = (size_t)total_tokens * heads * chunks;
    const int lane = threadIdx.x % SWERVE_WARP;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    // `i - lane` is the warp's first index: every lane runs the same iterations (the shuffles).
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i - lane < total; i += stride) {
        const bool valid = i < total;
        float acc = 0.0f;
        if (valid) {
            float o[8], d[8];
            bf16x8_to_f32(*reinterpret_cast<const bf16x8*>(out + i * 8), o);
            bf16x8_to_f32(*reinterpret_cast<const bf16x8*>(d_out + i * 8), d);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc = fmaf(o[e], d[e], acc);
            float4* zero = reinterpret_cast<float4*>(dq_accum + i * 8);
            zero[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        for (int offset = 1; offset < chunks; offset *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
        if (valid && i % chunks == 0) {
            const size_t row_head = i / chunks;
            const size_t t = row_head / heads, h = row_head % heads;
            const float l = lse[row_head];
            delta[h * total_tokens + t] = acc;
            // A row that saw no key (none in a causal layout) gets P = 0 everywhere.
            lse_log2[h * total_tokens + t] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
        }
    }
}

// Step 3: d_q += scale * dq_accum, 8 elements per thread (n8 = elements / 8).
extern "C" __global__ void __launch_bounds__(256)
    flash_attn_bwd_dq_add(const float* __restrict__ dq_accum, __nv_bfloat16* __restrict__ d_q, size_t n8,
                          float softmax_scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        float cur[8];
        bf16x8_to_f32(*reinterpret_cast<const bf16x8*>(d_q + i * 8), cur);
        const float4 a = reinterpret_cast<const float4*>(dq_accum)[2 * i];
        const float4 b = reinterpret_cast<const float4*>(dq_accum)[2 * i + 1];
        const float add[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) cur[e] = fmaf(softmax_scale, add[e], cur[e]);
        *reinterpret_cast<bf16x8*>(d_q + i * 8) = f32_to_bf16x8(cur);
    }
}

// Step 2. Fragment coordinates as in the forward: lane = 4 * group_row + group_col / 2; an m16n8
// accumulator holds rows group_row (e = 0, 1) and group_row + 8 (e = 2, 3), columns group_col + e % 2.
// Here the rows of S^T, dP^T, dK, dV are the warp's 16 keys; the columns of S^T and dP^T are the
// tile's queries.
template <typename Cfg>
__device__ __forceinline__ void flash_attn_bwd(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                               const __nv_bfloat16* __restrict__ v,
                                               const __nv_bfloat16* __restrict__ d_out,
                                               const float* __restrict__ lse_log2, const float* __restrict__ delta,
                                               float* __restrict__ dq_accum, __nv_bfloat16* __restrict__ d_k,
                                               __nv_bfloat16* __restrict__ d_v, const int* __restrict__ cu_seqlens,
                                               int total_tokens, int heads, int kv_heads, float softmax_scale) {
    constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN, BM = Cfg::kBlockM, S = Cfg::kSmemStride;
    constexpr int SD = Cfg::kDsStride;
    constexpr int kQTiles = BM / 8;  // 8-query MMA tiles of S^T and dP^T
    constexpr int kDTiles = D / 8;   // 8-wide MMA tiles of dK and dV

    const int n_block = blockIdx.x;  // key tile 0 has the most query tiles: scheduled first
    const int kv_head = blockIdx.y;
    const int seq = blockIdx.z;
    const int seq_start = cu_seqlens[seq];
    const int seqlen = cu_seqlens[seq + 1] - seq_start;
    const int n0 = n_block * BN;
    if (n0 >= seqlen) return;
    const int group = heads / kv_heads;

    extern __shared__ __align__(16) unsigned char flash_smem[];
    __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(flash_smem);
    __nv_bfloat16* sV = sK + BN * S;
    __nv_bfloat16* sQ = sV + BN * S;     // 2 stages
    __nv_bfloat16* sdO = sQ + 2 * BM * S;  // 2 stages
    __nv_bfloat16* sdS = sdO + 2 * BM * S;
    float* sLse = reinterpret_cast<float*>(sdS + BN * SD);  // 2 stages
    float* sDelta = sLse + 2 * BM;                           // 2 stages

    const size_t q_stride = (size_t)heads * D, kv_stride = (size_t)kv_heads * D;
    const __nv_bfloat16* k_seq = k + (size_t)seq_start * kv_stride + (size_t)kv_head * D;
    const __nv_bfloat16* v_seq = v + (size_t)seq_start * kv_stride + (size_t)kv_head * D;

    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;
    const int group_row = lane / 4, group_col = 2 * (lane % 4);
    const float scale_log2 = softmax_scale * 1.4426950408889634f;

    // Query tiles that can see this key tile: from the diagonal to the end of the sequence, for
    // each query head of the group; iteration it = (head in group) * m_count + (tile - m_first).
    const int m_first = n0 / BM;
    const int m_count = (seqlen + BM - 1) / BM - m_first;
    const int n_iters = group * m_count;

    auto load_query_tile = [&](int it, int stage) {
        const int head = kv_head * group + it / m_count;
        const int m0 = (m_first + it % m_count) * BM;
        const size_t head_off = (size_t)seq_start * q_stride + (size_t)head * D;
        load_tile<Cfg>(sQ + stage * BM * S, q + head_off, BM, m0, seqlen, q_stride);
        load_tile<Cfg>(sdO + stage * BM * S, d_out + head_off, BM, m0, seqlen, q_stride);
        const size_t stat_off = (size_t)head * total_tokens + seq_start;
        for (int i = threadIdx.x; i < 2 * BM; i += Cfg::kThreads) {
            const int r = i % BM;
            const bool valid = m0 + r < seqlen;
            const float* src = (i < BM ? lse_log2 : delta) + stat_off + (valid ? m0 + r : 0);
            cp_async_4((i < BM ? sLse : sDelta) + stage * BM + r, src, valid);
        }
    };

    load_tile<Cfg>(sK, k_seq, BN, n0, seqlen, kv_stride);
    load_tile<Cfg>(sV, v_seq, BN, n0, seqlen, kv_stride);
    load_query_tile(0, 0);
    cp_async_commit();

    float dk_acc[kDTiles][4], dv_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.0f;
    }

    // Fragment addresses that do not change across iterations.
    const int a_row = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;  // K / V A-fragments (non-trans)
    const int a_col = (lane / 16) * 8;
    const int b_row = (lane % 8) + (lane / 16) * 8;  // Q / dO B-fragments of S^T, dP^T (non-trans)
    const int b_col = ((lane / 8) % 2) * 8;
    const int t_row = (lane % 8) + ((lane / 8) % 2) * 8;  // transposed B-fragments
    const int t_col = (lane / 16) * 8;

    for (int it = 0; it < n_iters; ++it) {
        const int stage = it & 1;
        cp_async_wait<0>();
        __syncthreads();  // this tile has landed everywhere; every warp is done with the last one
        if (it + 1 < n_iters) load_query_tile(it + 1, stage ^ 1);
        cp_async_commit();

        const int head = kv_head * group + it / m_count;
        const int m0 = (m_first + it % m_count) * BM;
        const __nv_bfloat16* cQ = sQ + stage * BM * S;
        const __nv_bfloat16* cdO = sdO + stage * BM * S;
        const float* cLse = sLse + stage * BM;
        const float* cDelta = sDelta + stage * BM;

        // S^T = K Q^T: the warp's 16 keys x BM queries.
        float s_acc[kQTiles][4];
#pragma unroll
        for (int i = 0; i < kQTiles; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            ldmatrix_x4(a, sK + a_row * S + kk * 16 + a_col);
#pragma unroll
            for (int np = 0; np < kQTiles / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, cQ + (np * 16 + b_row) * S + kk * 16 + b_col);
                mma_bf16_16816(s_acc[2 * np], a, b[0], b[1]);
                mma_bf16_16816(s_acc[2 * np + 1], a, b[2], b[3]);
            }
        }

        // P^T = exp2(scale log2e S^T - lse log2e); 0 where the key follows the query or the query
        // lies past the sequence (its lse is a zero fill).
        const bool need_mask = m0 < n0 + BN || m0 + BM > seqlen;
#pragma unroll
        for (int nt = 0; nt < kQTiles; ++nt) {
            const float2 l = *reinterpret_cast<const float2*>(cLse + nt * 8 + group_col);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float p = exp2f(s_acc[nt][e] * scale_log2 - (e % 2 ? l.y : l.x));
                if (need_mask) {
                    const int key = n0 + warp * 16 + group_row + (e / 2) * 8;
                    const int query = m0 + nt * 8 + group_col + (e % 2);
                    if (key > query || query >= seqlen) p = 0.0f;
                }
                s_acc[nt][e] = p;
            }
        }

        // dV += P^T dO (P^T as the bf16 A operand, straight from the accumulator layout).
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t p_frag[4];
            acc_to_a_fragment(p_frag, s_acc, kk);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, cdO + (kk * 16 + t_row) * S + dp * 16 + t_col);
                mma_bf16_16816(dv_acc[2 * dp], p_frag, b[0], b[1]);
                mma_bf16_16816(dv_acc[2 * dp + 1], p_frag, b[2], b[3]);
            }
        }

        // dP^T = V dO^T.
        float dp_acc[kQTiles][4];
#pragma unroll
        for (int i = 0; i < kQTiles; ++i) dp_acc[i][0] = dp_acc[i][1] = dp_acc[i][2] = dp_acc[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a[4];
            ldmatrix_x4(a, sV + a_row * S + kk * 16 + a_col);
#pragma unroll
            for (int np = 0; np < kQTiles / 2; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, cdO + (np * 16 + b_row) * S + kk * 16 + b_col);
                mma_bf16_16816(dp_acc[2 * np], a, b[0], b[1]);
                mma_bf16_16816(dp_acc[2 * np + 1], a, b[2], b[3]);
            }
        }

        // dS^T = P^T (dP^T - D), in place of dP^T; to shared memory (bf16) for the dQ product.
#pragma unroll
        for (int nt = 0; nt < kQTiles; ++nt) {
            const float2 dl = *reinterpret_cast<const float2*>(cDelta + nt * 8 + group_col);
#pragma unroll
            for (int e = 0; e < 4; ++e) dp_acc[nt][e] = s_acc[nt][e] * (dp_acc[nt][e] - (e % 2 ? dl.y : dl.x));
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + group_row + r * 8) * SD + nt * 8 + group_col) =
                    pack_bf16x2(dp_acc[nt][2 * r], dp_acc[nt][2 * r + 1]);
            }
        }

        // dK += dS^T Q.
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t ds_frag[4];
            acc_to_a_fragment(ds_frag, dp_acc, kk);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, cQ + (kk * 16 + t_row) * S + dp * 16 + t_col);
                mma_bf16_16816(dk_acc[2 * dp], ds_frag, b[0], b[1]);
                mma_bf16_16816(dk_acc[2 * dp + 1], ds_frag, b[2], b[3]);
            }
        }
        __syncthreads();  // dS^T complete

        // dQ part = dS K over the block's BN keys: warp (wm, wn) owns query rows wm * 16 .. + 16
        // and head-dim columns wn * kDqCols .. + kDqCols. dS is read transposed out of dS^T.
        if (warp < Cfg::kDqWarpsM * Cfg::kDqWarpsN) {
            constexpr int kDqTiles = Cfg::kDqCols / 8;
            const int wm = warp % Cfg::kDqWarpsM, wn = warp / Cfg::kDqWarpsM;
            float dq_acc[kDqTiles][4];
#pragma unroll
            for (int i = 0; i < kDqTiles; ++i) dq_acc[i][0] = dq_acc[i][1] = dq_acc[i][2] = dq_acc[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                uint32_t a[4];
                ldmatrix_x4_trans(a, sdS + (kk * 16 + (lane % 8) + (lane / 16) * 8) * SD + wm * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int dp = 0; dp < Cfg::kDqCols / 16; ++dp) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, sK + (kk * 16 + t_row) * S + wn * Cfg::kDqCols + dp * 16 + t_col);
                    mma_bf16_16816(dq_acc[2 * dp], a, b[0], b[1]);
                    mma_bf16_16816(dq_acc[2 * dp + 1], a, b[2], b[3]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int query = m0 + wm * 16 + group_row + r * 8;
                if (query >= seqlen) continue;
                float* row = dq_accum + ((size_t)(seq_start + query) * heads + head) * D + wn * Cfg::kDqCols + group_col;
#pragma unroll
                for (int nt = 0; nt < kDqTiles; ++nt) red_add_f32x2(row + nt * 8, dq_acc[nt][2 * r], dq_acc[nt][2 * r + 1]);
            }
        }
    }

    // Epilogue: d_k += scale dK, d_v += dV for the block's keys (read, add in fp32, round once).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = n0 + warp * 16 + group_row + r * 8;
        if (key >= seqlen) continue;
        const size_t off = (size_t)(seq_start + key) * kv_stride + (size_t)kv_head * D + group_col;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            __nv_bfloat162* dk = reinterpret_cast<__nv_bfloat162*>(d_k + off + dt * 8);
            __nv_bfloat162* dv = reinterpret_cast<__nv_bfloat162*>(d_v + off + dt * 8);
            const float2 k_old = __bfloat1622float2(*dk), v_old = __bfloat1622float2(*dv);
            *dk = __floats2bfloat162_rn(fmaf(softmax_scale, dk_acc[dt][2 * r], k_old.x),
                                        fmaf(softmax_scale, dk_acc[dt][2 * r + 1], k_old.y));
            *dv = __floats2bfloat162_rn(v_old.x + dv_acc[dt][2 * r], v_old.y + dv_acc[dt][2 * r + 1]);
        }
    }
}

#define FLASH_BWD_ENTRY(name, Cfg)                                                                                  \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)                                                 \
        name(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,                             \
             const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ d_out,                         \
             const float* __restrict__ lse_log2, const float* __restrict__ delta, float* __restrict__ dq_accum,     \
             __nv_bfloat16* __restrict__ d_k, __nv_bfloat16* __restrict__ d_v, const int* __restrict__ cu_seqlens, \
             int total_tokens, int heads, int kv_heads, float softmax_scale) {                                     \
        flash_attn_bwd<Cfg>(q, k, v, d_out, lse_log2, delta, dq_accum, d_k, d_v, cu_seqlens, total_tokens, heads,  \
                            kv_heads, softmax_scale);                                                              \
    }

FLASH_BWD_ENTRY(flash_attn_bwd_hd128, FlashBwdHd128)
FLASH_BWD_ENTRY(flash_attn_bwd_hd64, FlashBwdHd64)
FLASH_BWD_ENTRY(flash_attn_bwd_hd32, FlashBwdHd32)
FLASH_BWD_ENTRY(flash_attn_bwd_hd16, FlashBwdHd16)
