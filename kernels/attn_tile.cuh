// The one attention tile routine and the one segment merge that every attention path runs:
// the trainer's forward (flash_attn.cu), the engine's prefill, chunked prefill and prefix-cache
// hits, and decode (paged_attn.cu). They are what makes a rollout's logprob and the trainer's
// logprob of the same token equal bit for bit (issue 25; DESIGN.md decision 10).
//
// ---- the canonical reduction order of causal attention ---------------------------------------
// For one query row at absolute position p (one query head) over keys 0 ..= p:
//
//   keys       0 ........ 63 | 64 ...... 127 | ... | 511 | 512 ........ | ... p
//   tiles      [  tile 0     ][   tile 1     ] ...  [ 7 ] [ tile 8 ...   ]        kAttnKeyTile = 64
//   segments   [           segment 0               ]     [ segment 1 ...          segment_keys = 512
//
// 1. Tiles of kAttnKeyTile keys aligned to absolute key positions (tile t = keys 64t .. 64t+63),
//    segments of `segment_keys` keys (a constant multiple of the tile, never a number of splits:
//    SEGMENT_KEYS on the host), also aligned to absolute positions.
// 2. Inside a segment, tiles in order, each by `attn_tile` for the warp that owns the row:
//    S = Q K^T with mma.sync m16n8k16 (bf16, fp32 accumulation) over head-dim steps of 16 in
//    order; keys past p masked to -inf; `online_softmax_tile` (fp32, exp2, explicit roundings:
//    no compiler contraction can differ between kernels); P rounded to bf16 at one point; O += P V
//    with the same MMA. Each row's sum stays split over the 4 lanes that share it (the MMA
//    fragment layout) until the segment ends.
// 3. A segment ends as (max m, sum l, unnormalised O): l is the 4 lanes' sums added by
//    `quad_sum` (xor 1, then xor 2). Segments fold left to right from the empty state
//    (max -inf, sum 0, O 0) by `segment_weights` + `fold_value`:
//        M' = max(M, m);  a = 2^(M s - M' s), b = 2^(m s - M' s)  (s = scale log2 e; 0 for -inf)
//        L' = L a + l b;  O' = O a + o b                          (each product and sum rounded)
//    and the row's output is bf16(O * (1 / L)) (`attn_normalizer`).
//
// Decode parallelises over segments (one block per segment, the fold in paged_attn_merge);
// prefill and the trainer iterate the same segments in the same order and fold them in the
// kernel. Which warp, block or launch computes a segment never changes its bits: a row's result
// depends only on its query, its keys and values, and this order, never on the batch, the chunk
// it came in, the other rows of its tile, the GPU's SM count or a CUDA graph.
#pragma once

#include "common.cuh"
#include "mma.cuh"

constexpr int kAttnKeyTile = 64;

// S = Q K^T for a warp's 16 rows (`q_frag`: the A fragments of head-dim steps of 16) and the
// keys [16 np0, 16 (np0 + kNP)) of a shared-memory tile `sK` (rows of `stride` bf16): s_acc[i]
// holds the scores of keys 16 np0 + 8 i .. + 7. Each score is one MMA chain over the head-dim
// steps in order, whichever keys a call covers (paged_decode_split splits a tile's keys over warps).
template <int D, int kNP>
__device__ __forceinline__ void attn_tile_scores_cols(float (&s_acc)[2 * kNP][4], const uint32_t (&q_frag)[D / 16][4],
                                                      const __nv_bfloat16* sK, int stride, int lane, int np0) {
#pragma unroll
    for (int i = 0; i < 2 * kNP; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kNP; ++np) {
            uint32_t b[4];
            const int r = (np0 + np) * 16 + (lane % 8) + (lane / 16) * 8;
            const int c = kk * 16 + ((lane / 8) % 2) * 8;
            ldmatrix_x4(b, sK + r * stride + c);
            mma_bf16_16816(s_acc[2 * np], q_frag[kk], b[0], b[1]);
            mma_bf16_16816(s_acc[2 * np + 1], q_frag[kk], b[2], b[3]);
        }
    }
}

// S = Q K^T for a warp's 16 rows and all 64 keys of the tile.
template <int D>
__device__ __forceinline__ void attn_tile_scores(float (&s_acc)[kAttnKeyTile / 8][4], const uint32_t (&q_frag)[D / 16][4],
                                                 const __nv_bfloat16* sK, int stride, int lane) {
    attn_tile_scores_cols<D, kAttnKeyTile / 16>(s_acc, q_frag, sK, stride, lane, 0);
}

// One online-softmax update for a warp's 16 rows (FlashAttention 2's), on mma.sync fragments:
// each thread holds rows group_row and group_row + 8 (r = 0, 1) of the scores `s_acc` (raw
// q.k, -inf where masked) and of the output accumulator `o_acc`. The row max is taken over the
// 4 threads sharing a row; O and this thread's part of the row sum are rescaled by
// 2^((old max - new max) scale); the scores become 2^(s scale - max scale) in place (the P of the
// next MMA). A row with no visible key yet keeps max -inf and contributes zeros. Every rounding
// is explicit (fmaf, __fmul_rn, __fadd_rn) so that no kernel's compiler contracts differently.
template <int kNTiles, int kDTiles>
__device__ __forceinline__ void online_softmax_tile(float (&s_acc)[kNTiles][4], float (&o_acc)[kDTiles][4],
                                                    float (&row_max)[2], float (&row_sum)[2], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) tile_max = fmaxf(tile_max, fmaxf(s_acc[nt][2 * r], s_acc[nt][2 * r + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[r], tile_max);
        const float max_scaled = new_max == -INFINITY ? 0.0f : __fmul_rn(new_max, scale_log2);
        // Exactly 1 when the max did not move (a tile wholly masked for this row leaves it as it
        // was, as if the tile had not been visited: decode never visits the keys past its row).
        const float correction =
            row_max[r] == -INFINITY ? 0.0f : exp2f(__fsub_rn(__fmul_rn(row_max[r], scale_log2), max_scaled));
        row_max[r] = new_max;
        row_sum[r] = __fmul_rn(row_sum[r], correction);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            o_acc[dt][2 * r] = __fmul_rn(o_acc[dt][2 * r], correction);
            o_acc[dt][2 * r + 1] = __fmul_rn(o_acc[dt][2 * r + 1], correction);
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            const float p0 = exp2f(fmaf(s_acc[nt][2 * r], scale_log2, -max_scaled));
            const float p1 = exp2f(fmaf(s_acc[nt][2 * r + 1], scale_log2, -max_scaled));
            s_acc[nt][2 * r] = p0;
            s_acc[nt][2 * r + 1] = p1;
            row_sum[r] = __fadd_rn(row_sum[r], __fadd_rn(p0, p1));
        }
    }
}

// O += P V for a warp's 16 rows, the 64 keys of the shared-memory tile `sV` and the head-dim
// columns [16 dp0, 16 (dp0 + kDP)) (o_acc[i]: columns 16 dp0 + 8 i .. + 7): P is the score
// accumulator after `online_softmax_tile`, rounded to bf16 here (its accumulator layout is the
// A-fragment layout of the next MMA). Each output element is one MMA chain over the keys in order,
// whichever columns a call covers (paged_decode_split splits the head dim over warps).
template <int D, int kDP>
__device__ __forceinline__ void attn_tile_pv_cols(float (&o_acc)[2 * kDP][4], const float (&s_acc)[kAttnKeyTile / 8][4],
                                                  const __nv_bfloat16* sV, int stride, int lane, int dp0) {
#pragma unroll
    for (int kk = 0; kk < kAttnKeyTile / 16; ++kk) {
        uint32_t p_frag[4];
        acc_to_a_fragment(p_frag, s_acc, kk);
#pragma unroll
        for (int dp = 0; dp < kDP; ++dp) {
            uint32_t b[4];
            const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
            const int c = (dp0 + dp) * 16 + (lane / 16) * 8;
            ldmatrix_x4_trans(b, sV + r * stride + c);
            mma_bf16_16816(o_acc[2 * dp], p_frag, b[0], b[1]);
            mma_bf16_16816(o_acc[2 * dp + 1], p_frag, b[2], b[3]);
        }
    }
}

// O += P V for a warp's 16 rows, the 64 keys of `sV` and every head-dim column.
template <int D>
__device__ __forceinline__ void attn_tile_pv(float (&o_acc)[D / 8][4], const float (&s_acc)[kAttnKeyTile / 8][4],
                                             const __nv_bfloat16* sV, int stride, int lane) {
    attn_tile_pv_cols<D, D / 16>(o_acc, s_acc, sV, stride, lane, 0);
}

// Sets the scores of masked keys to -inf: `masked(r, key)` for this thread's row r = 0, 1 and
// the key's index within the tile (causal and range masks alike).
template <typename Masked>
__device__ __forceinline__ void mask_tile(float (&s_acc)[kAttnKeyTile / 8][4], int lane, Masked masked) {
    const int group_col = 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < kAttnKeyTile / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (masked(e / 2, nt * 8 + group_col + (e % 2))) s_acc[nt][e] = -INFINITY;
        }
    }
}

// One whole tile for a warp's 16 rows: scores, the mask (only when `need_mask`), the online
// softmax and O += P V. (flash_attn.cu runs the same pieces with its loads in between.)
template <int D, typename Masked>
__device__ __forceinline__ void attn_tile(float (&o_acc)[D / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                          const uint32_t (&q_frag)[D / 16][4], const __nv_bfloat16* sK,
                                          const __nv_bfloat16* sV, int stride, int lane, float scale_log2,
                                          bool need_mask, Masked masked) {
    float s_acc[kAttnKeyTile / 8][4];
    attn_tile_scores<D>(s_acc, q_frag, sK, stride, lane);
    if (need_mask) mask_tile(s_acc, lane, masked);
    online_softmax_tile<kAttnKeyTile / 8, D / 8>(s_acc, o_acc, row_max, row_sum, scale_log2);
    attn_tile_pv<D>(o_acc, s_acc, sV, stride, lane);
}

// A row's sum over the 4 lanes that share it (a segment's l).
__device__ __forceinline__ float quad_sum(float x) {
    x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// The weights of folding a segment of max `seg_max` into a fold of max `fold_max` (raw scores).
struct SegmentWeights {
    float max;   // the fold's new max
    float fold;  // a: the fold's weight
    float seg;   // b: the segment's weight
};

__device__ __forceinline__ SegmentWeights segment_weights(float fold_max, float seg_max, float scale_log2) {
    const float mx = fmaxf(fold_max, seg_max);
    const float ms = mx == -INFINITY ? 0.0f : __fmul_rn(mx, scale_log2);
    SegmentWeights w;
    w.max = mx;
    w.fold = fold_max == -INFINITY ? 0.0f : exp2f(__fsub_rn(__fmul_rn(fold_max, scale_log2), ms));
    w.seg = seg_max == -INFINITY ? 0.0f : exp2f(__fsub_rn(__fmul_rn(seg_max, scale_log2), ms));
    return w;
}

// fold' = fold a + seg b, each product and the sum rounded once (sums and output elements alike).
__device__ __forceinline__ float fold_value(float fold, float seg, SegmentWeights w) {
    return __fadd_rn(__fmul_rn(fold, w.fold), __fmul_rn(seg, w.seg));
}

// The factor that normalises a row's folded O: 1 / L (0 for a row that saw no key).
__device__ __forceinline__ float attn_normalizer(float sum) { return sum > 0.0f ? __fdiv_rn(1.0f, sum) : 0.0f; }

// Closes a segment: folds this thread's (row_max, row_sum, o_acc) for its rows r = 0, 1 into
// (fold_max, fold_sum, fold_o) and resets them for the next segment. `fold_o` holds element
// (dt * 4 + e) of the thread's O fragment at fold_o[(dt * 4 + e) * fold_stride]: shared memory
// (flash_attn.cu, the paged prefill) or a register array (stride 1).
template <int kDTiles>
__device__ __forceinline__ void fold_segment(float* fold_o, int fold_stride, float (&fold_max)[2],
                                             float (&fold_sum)[2], float (&o_acc)[kDTiles][4], float (&row_max)[2],
                                             float (&row_sum)[2], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const SegmentWeights w = segment_weights(fold_max[r], row_max[r], scale_log2);
        fold_sum[r] = fold_value(fold_sum[r], quad_sum(row_sum[r]), w);
        fold_max[r] = w.max;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
                float& f = fold_o[(dt * 4 + e) * fold_stride];
                f = fold_value(f, o_acc[dt][e], w);
                o_acc[dt][e] = 0.0f;
            }
        }
        row_max[r] = -INFINITY;
        row_sum[r] = 0.0f;
    }
}

// The forward's epilogue for this thread's rows r = 0, 1 (query positions q_idx[r] of a sequence
// of `seqlen` rows starting at packed row `seq_start`; rows past it are not written): the folded
// O (`fold_o`, as `fold_segment` left it) times 1 / L rounded to bf16 into `out` [T, heads, D],
// and the natural-log logsumexp into `lse` [T, heads]. The trainer's forwards (flash_attn.cu,
// flash_attn_sm90.cu) share it, so their rows round alike.
template <int D>
__device__ __forceinline__ void attn_store_rows(__nv_bfloat16* out, float* lse, const float* fold_o, int fold_stride,
                                                const float (&fold_max)[2], const float (&fold_sum)[2],
                                                const int (&q_idx)[2], int seq_start, int seqlen, int heads,
                                                int head, float softmax_scale, int lane) {
    const size_t q_stride = (size_t)heads * D;
    const int group_col = 2 * (lane % 4);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (q_idx[r] >= seqlen) continue;
        const float inv_sum = attn_normalizer(fold_sum[r]);
        __nv_bfloat16* out_row = out + (size_t)(seq_start + q_idx[r]) * q_stride + (size_t)head * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            *reinterpret_cast<__nv_bfloat162*>(out_row + dt * 8 + group_col) =
                __floats2bfloat162_rn(__fmul_rn(fold_o[(dt * 4 + 2 * r) * fold_stride], inv_sum),
                                      __fmul_rn(fold_o[(dt * 4 + 2 * r + 1) * fold_stride], inv_sum));
        }
        if (lane % 4 == 0) {
            lse[(size_t)(seq_start + q_idx[r]) * heads + head] =
                fold_sum[r] > 0.0f ? fold_max[r] * softmax_scale + logf(fold_sum[r]) : -INFINITY;
        }
    }
}
