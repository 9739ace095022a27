// Flash attention for prefill and training: causal, GQA, packed variable-length sequences.
// Forward here; the backward (dQ/dK/dV from the saved logsumexp) arrives with the training issue,
// in this file.
//
//   flash_attn_fwd_hd{16,32,64,128}:
//     for every sequence s (rows cu_seqlens[s] .. cu_seqlens[s+1]), query head h, query row i:
//       out[i, h, :] = sum_{j <= i} softmax_j(scale * q[i, h] . k[j, h / group]) v[j, h / group, :]
//       lse[h, i]    = log sum_{j <= i} exp(scale * q[i, h] . k[j, h / group])     (natural log)
//
// Shapes: q, out [total_tokens, heads, head_dim] bf16; k, v [total_tokens, kv_heads, head_dim]
// bf16; cu_seqlens [num_seqs + 1] i32; lse [heads, total_tokens] fp32. group = heads / kv_heads.
//
// Never materialised: the [T, T] score or probability matrix. Each block owns kBlockM query rows
// of one (sequence, head) and streams the key/value tiles of that sequence through shared memory,
// keeping the running row max and row sum in fp32 registers (online softmax) and rescaling the
// fp32 output accumulator as the max grows. Scores and the output come from bf16 tensor-core MMAs
// (mma.sync m16n8k16, fp32 accumulation), with P rounded to bf16 for the second MMA, as
// FlashAttention 2 does. Each warp owns 16 query rows.
//
// Pipeline per key tile j (cp.async, single-buffered K and V, FlashAttention 2's overlap):
//   issue V(j) | wait K(j) | S = Q K(j)^T, mask, softmax | issue K(j+1) | wait V(j) | O += P V(j)
//
// Masking: keys beyond the sequence and keys after the query (causal) are -inf; rows past the end
// of the sequence are computed on zero-filled queries and never written. Tiles past the diagonal
// are never loaded. Blocks are scheduled longest-first (the last query tile has the most keys).
//
// On sm_90a the target is a wgmma + TMA version (FlashAttention 3's warp-specialised pipeline);
// this mma.sync kernel is the portable, verified baseline that version must match.

#include "common.cuh"
#include "mma.cuh"

// Tile configuration per head dim. Shared memory: (kBlockM + 2 kBlockN) rows of head_dim + 8
// bf16 (the 16-byte pad makes ldmatrix's eight 16-byte rows land in distinct bank groups).
//   hd128: 128 x 64, 8 warps: 69,632 B smem.
//   hd64:  128 x 64, 8 warps: 36,864 B smem.
// Not yet tuned on a GPU: candidates to measure are kBlockN = 128 for hd64 and 4 warps x 32 rows.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct FlashFwdConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kSmemStride = kHeadDim + 8;  // bf16 elements per shared-memory row
    static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kSmemStride * 2;
    static_assert(kBlockM == 16 * kWarps, "each warp owns 16 query rows");
    static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0, "MMA tiles are 16 wide");
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
                                               float* __restrict__ lse, const int* __restrict__ cu_seqlens,
                                               int total_tokens, int heads, int kv_heads, float softmax_scale) {
    constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kSmemStride;
    constexpr int kNTiles = BN / 8;  // 8-key MMA tiles per key tile
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

    const size_t q_stride = (size_t)heads * D, kv_stride = (size_t)kv_heads * D;
    const __nv_bfloat16* q_seq = q + (size_t)seq_start * q_stride + (size_t)head * D;
    const __nv_bfloat16* k_seq = k + (size_t)seq_start * kv_stride + (size_t)kv_head * D;
    const __nv_bfloat16* v_seq = v + (size_t)seq_start * kv_stride + (size_t)kv_head * D;

    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;
    const int group_row = lane / 4, group_col = 2 * (lane % 4);  // MMA fragment coordinates
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

        // S = Q K^T for this warp's 16 rows and the BN keys of the tile.
        float s_acc[kNTiles][4];
#pragma unroll
        for (int i = 0; i < kNTiles; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                uint32_t b[4];
                const int r = np * 16 + (lane % 8) + (lane / 16) * 8;
                const int c = kk * 16 + ((lane / 8) % 2) * 8;
                ldmatrix_x4(b, sK + r * S + c);
                mma_bf16_16816(s_acc[2 * np], q_frag[kk], b[0], b[1]);
                mma_bf16_16816(s_acc[2 * np + 1], q_frag[kk], b[2], b[3]);
            }
        }

        // Mask keys past the diagonal or the end of the sequence.
        if (n0 + BN > m0 || n0 + BN > seqlen) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int q_idx = m0 + warp * 16 + group_row + (e / 2) * 8;
                    const int k_idx = n0 + nt * 8 + group_col + (e % 2);
                    if (k_idx > q_idx || k_idx >= seqlen) s_acc[nt][e] = -INFINITY;
                }
            }
        }

        // Online softmax: new row max, rescale O and the row sums, exponentiate the scores.
        online_softmax_tile<kNTiles, kDTiles>(s_acc, o_acc, row_max, row_sum, scale_log2);

        __syncthreads();  // every warp is done reading sK
        if (j + 1 < n_blocks) load_tile<Cfg>(sK, k_seq, BN, n0 + BN, seqlen, kv_stride);
        cp_async_commit();   // possibly empty: keeps the group count uniform
        cp_async_wait<1>();  // V(j) has landed
        __syncthreads();

        // O += P V: P's accumulator layout is the A-fragment layout of the next MMA.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t p_frag[4];
            p_frag[0] = pack_bf16x2(s_acc[2 * kk][0], s_acc[2 * kk][1]);
            p_frag[1] = pack_bf16x2(s_acc[2 * kk][2], s_acc[2 * kk][3]);
            p_frag[2] = pack_bf16x2(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1]);
            p_frag[3] = pack_bf16x2(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = dp * 16 + (lane / 16) * 8;
                ldmatrix_x4_trans(b, sV + r * S + c);
                mma_bf16_16816(o_acc[2 * dp], p_frag, b[0], b[1]);
                mma_bf16_16816(o_acc[2 * dp + 1], p_frag, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done reading sV before the next V load
    }

    // Epilogue: finish the row sums, normalise, write O (bf16) and the logsumexp.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int q_idx = m0 + warp * 16 + group_row + r * 8;
        if (q_idx >= seqlen) continue;
        const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
        __nv_bfloat16* out_row = out + (size_t)(seq_start + q_idx) * q_stride + (size_t)head * D;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            *reinterpret_cast<__nv_bfloat162*>(out_row + dt * 8 + group_col) =
                __floats2bfloat162_rn(o_acc[dt][2 * r] * inv_sum, o_acc[dt][2 * r + 1] * inv_sum);
        }
        if (lane % 4 == 0) {
            lse[(size_t)head * total_tokens + seq_start + q_idx] =
                sum > 0.0f ? row_max[r] * softmax_scale + logf(sum) : -INFINITY;
        }
    }
}

#define FLASH_FWD_ENTRY(name, Cfg)                                                                                  \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)                                                 \
        name(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,                             \
             const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,         \
             const int* __restrict__ cu_seqlens, int total_tokens, int heads, int kv_heads, float softmax_scale) { \
        flash_attn_fwd<Cfg>(q, k, v, out, lse, cu_seqlens, total_tokens, heads, kv_heads, softmax_scale);        \
    }

FLASH_FWD_ENTRY(flash_attn_fwd_hd128, FlashFwdHd128)
FLASH_FWD_ENTRY(flash_attn_fwd_hd64, FlashFwdHd64)
FLASH_FWD_ENTRY(flash_attn_fwd_hd32, FlashFwdHd32)
FLASH_FWD_ENTRY(flash_attn_fwd_hd16, FlashFwdHd16)
