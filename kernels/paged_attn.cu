// Paged attention for serving: writes of new K/V rows into the paged cache, and causal GQA
// attention of one engine step's query rows (decode rows and chunked-prefill rows alike) over
// their sequences' cached context, read through block tables, in the canonical reduction order of
// attn_tile.cuh (the trainer's flash_attn.cu follows it too: a token's logprob is the same bits
// whether it was sampled in a decode step or scored by the trainer).
//
//   write_kv_bf16: k_cache[slot_mapping[t]] = k[t], v_cache[slot_mapping[t]] = v[t]
//     k, v [T, kv_heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim] seen as
//     [num_blocks * block_size, kv_heads * head_dim] rows; slot = block * block_size + offset.
//     16-byte vectors; slots outside the cache are skipped (the host checks them).
//
//   paged_attn_{decode,prefill}_hd{16,32,64,128}: for every query row r of sequence s (rows
//   cu_query[s] .. cu_query[s+1]) at context position p = context_lens[s] - (cu_query[s+1] - r),
//   and every query head h (kv head h / group, group = heads / kv_heads):
//       out[r, h, :] = sum_{j <= p} softmax_j(scale q[r, h] . K[s, j, h / group]) V[s, j, h / group]
//     where key j of sequence s lives in cache row
//       block_tables[s * max_blocks_per_seq + j / block_size] * block_size + j % block_size.
//   paged_attn_merge_hd*: folds the segments of rows whose keys were split, left to right.
//
// Shapes: q, out [rows, heads, head_dim] bf16; cu_query [num_seqs + 1], context_lens [num_seqs],
// block_tables [num_seqs, max_blocks_per_seq] i32. Scratch (only for split rows) fp32:
// part_o [scratch_rows, heads, head_dim] (a segment's unnormalised O) and part_stats
// [scratch_rows, heads] float2 (its raw max and sum).
//
// Work decomposition (the host builds it, src/backend/cuda/paged_attn.rs):
//   * GQA grouping: the M dimension of the MMAs is the flattened (query row, head of the group)
//     pair, m = local_row * group + g, so each K/V tile is read from HBM once per group, never
//     once per query head. Which MMA row a (row, head) lands in never changes its bits.
//   * Segments: keys in segments of `segment_keys` (the canonical segment of attn_tile.cuh, fixed:
//     never chosen from the batch or the GPU). A row whose context spans one segment is finished
//     by the kernel that computed it; a split row leaves one partial per segment in the scratch
//     (row_plan[r] = {first scratch row, segments}) and paged_attn_merge folds them in order.
//   * decode kernel: sequences with rows * group <= 16 (decode, short speculative chunks). One
//     BLOCK of up to 4 warps per work item (sequence, 16 flat rows, a run of consecutive
//     segments: each segment's partial written as if it were alone), sharing one cp.async
//     ring (paged_decode_split, issue 36): warp w scores keys 16w .. 16w + 15 of each 64-key tile,
//     every warp runs the tile's softmax on the whole score tile (the same arithmetic in each), and
//     warp w multiplies P V for its slice of the head dim. Each value goes through attn_tile's
//     operations in attn_tile's order, so a row's bits are those of one warp walking the tiles
//     (the earlier kernel, paged_decode: one WARP per item with its own ring, kWarps independent
//     items per block, kept to compare against). A lone 131k-token decode row is 256 items per kv
//     head at 512 keys per segment.
//   * prefill kernel: longer chunks. kWarps warps x 16 flat rows walk every key tile together
//     (one ring, one barrier per tile); whole-context items (segment -1) fold their segments in
//     the kernel like flash_attn.cu (the folded O thread-private in shared memory); the host
//     splits a step's prefill items per segment instead when they are too few to fill the GPU.
//
// Inside a warp, per 64-key tile (kStages-deep cp.async ring of K and V tiles):
//   wait tile t | issue tile t + kStages - 1 | attn_tile (attn_tile.cuh): S = Q K^T, mask,
//   online softmax, O += P V | at a segment boundary (prefill): fold_segment
//
// Never materialised: the [rows, context] score or probability matrix, a gathered contiguous
// copy of a sequence's K/V, or per-query-head copies of a kv head's K/V.
//
// Bytes (decode, per layer): every cached K and V byte of every sequence is read once (per kv
// head, for the whole group), plus q and out, plus for split rows (head_dim + 2) x 4 x 2 bytes per
// (row, head, segment) of scratch written and read: about 2 group / segment_keys of the K/V
// traffic (3% at group 8 and 512 keys).

#include "attn_tile.cuh"

// ---- tile configurations -----------------------------------------------------------------------
// Rows of head_dim + 8 bf16 in shared memory (the 16-byte pad puts ldmatrix's eight rows in
// distinct bank groups). Not yet measured on a GPU.
//   decode hd128: per warp Q (16 rows) + 2 stages x (K and V tiles of 64 rows) = 73,984 B;
//                 2 warps per block: 147,968 B (sm_80: 163 KiB, sm_90: 227 KiB opt-in), one
//                 block per SM with 4 tiles (128 KB) in flight, far above the ~30 KB per SM
//                 Little's law asks for at 3.3-4.8 TB/s. `_1warp` (73,984 B) for sm_86 / sm_89
//                 (99 KiB per block).
//   decode hd64:  39,168 B per warp: 4 warps 156,672 B; `_2warp` 78,336 B for 99 KiB GPUs.
//   decode hd32 / hd16: 4 warps: 87,040 / 52,224 B.
//   prefill hd128: 4 warps x 16 rows: Q 17,408 + 2 stages 69,632 + fold 32,768 = 119,808 B;
//                 `_2warp` (2 x 16 rows: 94,464 B) for 99 KiB GPUs: the same per-warp
//                 arithmetic, so the same bits.
// Measured on an H100 (bench/RESULTS.md, 2026-11-27): the split kernel with 3 or 4 stages (one
// block per SM) runs 25-30% slower than 2 stages at two blocks per SM: per-tile work, not bytes
// in flight, bounds it; they stay compiled as the decode benchmark's candidates.
template <int kHeadDim_, int kWarps_, int kStages_>
struct PagedDecodeConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kWarps = kWarps_;  // independent work items per block
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kBlockN = kAttnKeyTile;
    static constexpr int kStages = kStages_;
    static constexpr int kSmemStride = kHeadDim + 8;
    static constexpr int kQElems = 16 * kSmemStride;
    static constexpr int kTileElems = kBlockN * kSmemStride;  // one K or V tile
    static constexpr int kWarpElems = kQElems + kStages * 2 * kTileElems;
    static constexpr int kSmemBytes = kWarps * kWarpElems * 2;
    static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
    static constexpr int kCopyThreads = SWERVE_WARP;
    static_assert(kHeadDim % 16 == 0 && SWERVE_WARP % kChunks == 0, "whole rows per copy pass");
    static_assert(kStages >= 2, "at least double buffering");
};

// Decode, kWarps warps per item (paged_decode_split): Q (16 rows), kStages x (K and V tiles)
// and two fp32 score tiles [16, 64 + 8] (the pad spreads a row's float2 stores over the banks).
// hd128, 4 warps, 2 stages: 4,352 + 69,632 + 9,216 = 83,200 B: two blocks (8 warps, two tiles
// of 34.8 KB in flight) per sm_90 SM, one per sm_80 / sm_86 / sm_89 SM. 3 stages (one block of
// 118 KB per SM) measured slower; unmeasured: 8 warps (2 key columns of 8 per warp: more barrier
// time per tile).
template <int kHeadDim_, int kWarps_, int kStages_>
struct PagedDecodeSplitConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kWarps = kWarps_;  // warps of one item
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kBlockN = kAttnKeyTile;
    static constexpr int kStages = kStages_;
    static constexpr int kSmemStride = kHeadDim + 8;
    static constexpr int kQElems = 16 * kSmemStride;
    static constexpr int kTileElems = kBlockN * kSmemStride;
    static constexpr int kScoreStride = kBlockN + 8;
    static constexpr int kScoresOffset = (kQElems + kStages * 2 * kTileElems) * 2;
    static constexpr int kSmemBytes = kScoresOffset + 2 * 16 * kScoreStride * 4;
    static constexpr int kChunks = kHeadDim / 8;
    static constexpr int kCopyThreads = kThreads;
    static_assert(kHeadDim % 16 == 0 && kThreads % kChunks == 0, "whole rows per copy pass");
    static_assert((kBlockN / 16) % kWarps == 0 && (kHeadDim / 16) % kWarps == 0, "whole MMA steps per warp");
    static_assert(kStages >= 2, "at least double buffering");
};

template <int kHeadDim_, int kWarps_, int kStages_>
struct PagedPrefillConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kWarps = kWarps_;  // 16 flat rows each
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kBlockM = 16 * kWarps;
    static constexpr int kBlockN = kAttnKeyTile;
    static constexpr int kStages = kStages_;
    static constexpr int kSmemStride = kHeadDim + 8;
    static constexpr int kQElems = kBlockM * kSmemStride;
    static constexpr int kTileElems = kBlockN * kSmemStride;
    static constexpr int kFoldFloats = kHeadDim / 2;  // folded O per thread
    static constexpr int kFoldOffset = (kQElems + kStages * 2 * kTileElems) * 2;
    static constexpr int kSmemBytes = kFoldOffset + kThreads * kFoldFloats * 4;
    static constexpr int kChunks = kHeadDim / 8;
    static constexpr int kCopyThreads = kThreads;
    static_assert(kHeadDim % 16 == 0 && kThreads % kChunks == 0, "whole rows per copy pass");
    static_assert(kStages >= 2, "at least double buffering");
};

template <int D>
using PagedDecode = PagedDecodeConfig<D, (D >= 128 ? 2 : 4), 2>;
template <int D>
using PagedDecodeSmall = PagedDecodeConfig<D, (D >= 128 ? 1 : 2), 2>;  // for GPUs with 99 KiB per block
template <int D, int kStages>
using PagedDecodeSplitStages = PagedDecodeSplitConfig<D, (D / 16 < 4 ? D / 16 : 4), kStages>;
template <int D>
using PagedDecodeSplit = PagedDecodeSplitStages<D, 2>;
// Deeper rings (issue 36): hd128 3 stages 118,016 B, 4 stages 152,832 B (one block per sm_90 or
// sm_80 SM; too large for 99 KiB GPUs): 25-30% slower than 2 stages on an H100, benchmark
// candidates only.
template <int D>
using PagedDecodeSplit3 = PagedDecodeSplitStages<D, 3>;
template <int D>
using PagedDecodeSplit4 = PagedDecodeSplitStages<D, 4>;
template <int D>
using PagedPrefill = PagedPrefillConfig<D, 4, 2>;
template <int D>
using PagedPrefillSmall = PagedPrefillConfig<D, 2, 2>;  // for GPUs with 99 KiB per block

// The merge: one block of kMergeThreads per (row, head); thread d folds element d.
constexpr int kMergeThreads = 128;
constexpr int kMergeBatch = 16;  // partials loaded before folding

// ---- write_kv ----------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(256)
    write_kv_bf16(__nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,
                  const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                  const uint32_t* __restrict__ slot_mapping, int rows, int row_elems, int num_slots) {
    const int chunks = row_elems / 8;
    const long long total = (long long)rows * chunks;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int row = (int)(i / chunks);
        const int c = (int)(i % chunks) * 8;
        const uint32_t slot = __ldg(slot_mapping + row);
        if (slot >= (uint32_t)num_slots) continue;
        const size_t src = (size_t)row * row_elems + c, dst = (size_t)slot * row_elems + c;
        const uint4 kv = __ldg(reinterpret_cast<const uint4*>(k + src));
        const uint4 vv = __ldg(reinterpret_cast<const uint4*>(v + src));
        *reinterpret_cast<uint4*>(k_cache + dst) = kv;
        *reinterpret_cast<uint4*>(v_cache + dst) = vv;
    }
}

// ---- paged attention ---------------------------------------------------------------------------

// Everything a warp knows about its work item.
struct PagedWork {
    int seq, kv_head, group;
    int segment;        // the one segment of a split item, -1: every key (fold in the kernel)
    int row_start;      // first packed query row of the sequence
    int first_pos;      // context position of the sequence's first query row
    int m0, m_end;      // flat rows [m0, m_end) of this item (flat = local_row * group + g)
    int n_begin, n_end;  // keys of the item, cut at its last row's position
    int item_keys;      // the item's fourth field: its keys (a decode run: of all its segments)
    const int* table;   // the sequence's block table
};

// Reads item `index` and cuts its keys; false when the item has no key (a CUDA graph's item past
// its sequence's context).
__device__ __forceinline__ bool paged_work(PagedWork& w, const int4* items, int index, int kv_head, int block_m,
                                           const int* cu_query, const int* context_lens, const int* block_tables,
                                           int max_blocks_per_seq, int heads, int kv_heads, int segment_keys) {
    const int4 item = items[index];
    w.seq = item.x;
    w.m0 = item.y;
    w.segment = item.z;
    w.item_keys = item.w;
    w.kv_head = kv_head;
    w.group = heads / kv_heads;
    w.row_start = cu_query[w.seq];
    const int rows = cu_query[w.seq + 1] - w.row_start;
    w.first_pos = context_lens[w.seq] - rows;
    w.m_end = min(w.m0 + block_m, rows * w.group);
    const int p_last = w.first_pos + (w.m_end - 1) / w.group;
    w.n_begin = w.segment < 0 ? 0 : w.segment * segment_keys;
    w.n_end = w.segment < 0 ? p_last + 1 : min(w.n_begin + segment_keys, p_last + 1);
    w.table = block_tables + (size_t)w.seq * max_blocks_per_seq;
    return w.m0 < w.m_end && w.n_begin < w.n_end;
}

// Copies the K and V rows of the tile at key n0 into one ring stage (cp.async, 16 bytes each),
// split over kCopyThreads threads (`tid` is this thread's index among them); keys past the item
// are zero-filled.
template <typename Cfg>
__device__ __forceinline__ void issue_tile(__nv_bfloat16* sK, __nv_bfloat16* sV, const __nv_bfloat16* k_cache,
                                           const __nv_bfloat16* v_cache, const PagedWork& w, int n0, int block_size,
                                           int kv_heads, int tid) {
    constexpr int D = Cfg::kHeadDim, S = Cfg::kSmemStride, kRowsPerPass = Cfg::kCopyThreads / Cfg::kChunks;
    const int r0 = tid / Cfg::kChunks, c = (tid % Cfg::kChunks) * 8;
#pragma unroll 4
    for (int r = r0; r < Cfg::kBlockN; r += kRowsPerPass) {
        const int j = n0 + r;
        const bool valid = j < w.n_end;
        size_t off = 0;
        if (valid) {
            const size_t slot = (size_t)__ldg(w.table + j / block_size) * block_size + (j % block_size);
            off = (slot * kv_heads + w.kv_head) * D + c;
        }
        cp_async_16(sK + r * S + c, k_cache + off, valid);
        cp_async_16(sV + r * S + c, v_cache + off, valid);
    }
}

// Copies the item's 16 flat query rows starting at `m` (gathered from [rows, heads, D]: a group's
// heads are adjacent) into sQ, split over `threads` threads.
template <int D>
__device__ __forceinline__ void issue_q(__nv_bfloat16* sQ, const __nv_bfloat16* q, const PagedWork& w, int m_first,
                                        int m_count, int heads, int tid, int threads) {
    constexpr int S = D + 8, kChunks = D / 8;
    for (int i = tid; i < m_count * kChunks; i += threads) {
        const int m = i / kChunks, c = (i % kChunks) * 8;
        const int flat = m_first + m;
        const bool valid = flat < w.m_end;
        const __nv_bfloat16* src = q;
        if (valid) {
            src = q + (size_t)(w.row_start + flat / w.group) * heads * D + (size_t)(w.kv_head * w.group + flat % w.group) * D + c;
        }
        cp_async_16(sQ + m * S + c, src, valid);
    }
}

// What a warp does with its rows once its keys are done: rows whose whole context was folded
// here (`whole`, or a context of one segment) are normalised and written to `out`; a split row
// writes this segment's raw (max, sum, O) to the scratch for paged_attn_merge. `m_warp`: the
// warp's first flat row. Every lane must call this (quad sums).
// `o_acc` holds head-dim columns [d0, d0 + 8 kDTiles) (paged_decode_split: one warp's slice; the
// row statistics are every warp's, and only the warp with `write_stats` stores them).
template <int D, int kDTiles = D / 8>
__device__ __forceinline__ void finish_rows(const PagedWork& w, int m_warp, bool whole, float* fold_o, int fold_stride,
                                            float (&fold_max)[2], float (&fold_sum)[2], float (&o_acc)[kDTiles][4],
                                            float (&row_max)[2], float (&row_sum)[2], __nv_bfloat16* out,
                                            float* part_o, float2* part_stats, const int2* row_plan, int heads,
                                            int segment_keys, float scale_log2, int lane, int d0 = 0,
                                            bool write_stats = true) {
    const int group_row = lane / 4, group_col = 2 * (lane % 4);
    float seg_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) seg_sum[r] = quad_sum(row_sum[r]);
    // Split rows first: fold_segment below consumes the segment's state.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int flat = m_warp + group_row + r * 8;
        const int pos = w.first_pos + flat / w.group;
        if (whole || flat >= w.m_end || pos < segment_keys || pos < w.n_begin) continue;
        const int row = w.row_start + flat / w.group, head = w.kv_head * w.group + flat % w.group;
        const size_t idx = (size_t)(row_plan[row].x + w.segment) * heads + head;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            *reinterpret_cast<float2*>(part_o + idx * D + d0 + dt * 8 + group_col) =
                make_float2(o_acc[dt][2 * r], o_acc[dt][2 * r + 1]);
        }
        if (write_stats && lane % 4 == 0) part_stats[idx] = make_float2(row_max[r], seg_sum[r]);
    }
    fold_segment<kDTiles>(fold_o, fold_stride, fold_max, fold_sum, o_acc, row_max, row_sum, scale_log2);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int flat = m_warp + group_row + r * 8;
        const int pos = w.first_pos + flat / w.group;
        // (A split item finishes only the rows of one segment, and only from segment 0.)
        if (flat >= w.m_end || (!whole && (pos >= segment_keys || w.segment != 0))) continue;
        const int row = w.row_start + flat / w.group, head = w.kv_head * w.group + flat % w.group;
        const float inv = attn_normalizer(fold_sum[r]);
        __nv_bfloat16* out_row = out + ((size_t)row * heads + head) * D + d0;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            *reinterpret_cast<__nv_bfloat162*>(out_row + dt * 8 + group_col) =
                __floats2bfloat162_rn(__fmul_rn(fold_o[(dt * 4 + 2 * r) * fold_stride], inv),
                                      __fmul_rn(fold_o[(dt * 4 + 2 * r + 1) * fold_stride], inv));
        }
    }
}

// The arguments every paged-attention kernel takes.
#define PAGED_ATTN_PARAMS                                                                                          \
    const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k_cache,                              \
        const __nv_bfloat16 *__restrict__ v_cache, __nv_bfloat16 *__restrict__ out, float *__restrict__ part_o,   \
        float2 *__restrict__ part_stats, const int *__restrict__ cu_query, const int *__restrict__ context_lens,  \
        const int *__restrict__ block_tables, const int4 *__restrict__ items, int num_items,                     \
        const int2 *__restrict__ row_plan, int max_blocks_per_seq, int block_size, int heads, int kv_heads,      \
        int segment_keys, float softmax_scale
#define PAGED_ATTN_ARGS                                                                                       \
    q, k_cache, v_cache, out, part_o, part_stats, cu_query, context_lens, block_tables, items, num_items, row_plan, \
        max_blocks_per_seq, block_size, heads, kv_heads, segment_keys, softmax_scale

// Decode: each warp one item (one segment of <= 16 flat rows), blocks of kWarps items of one kv
// head: blockIdx.x = item_block * kv_heads + kv_head.
template <typename Cfg>
__device__ __forceinline__ void paged_decode(PAGED_ATTN_PARAMS) {
    constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN, S = Cfg::kSmemStride, kStages = Cfg::kStages;
    constexpr int kDTiles = D / 8;
    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;
    const int index = (blockIdx.x / kv_heads) * Cfg::kWarps + warp;
    if (index >= num_items) return;  // warps are independent: no block barrier below
    PagedWork w;
    if (!paged_work(w, items, index, blockIdx.x % kv_heads, 16, cu_query, context_lens, block_tables,
                    max_blocks_per_seq, heads, kv_heads, segment_keys)) {
        return;
    }
    const int n_tiles = (w.n_end - w.n_begin + BN - 1) / BN;
    const float scale_log2 = softmax_scale * 1.4426950408889634f;

    extern __shared__ __align__(16) unsigned char paged_smem[];
    __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(paged_smem) + warp * Cfg::kWarpElems;
    auto stage_k = [&](int stage) { return sQ + Cfg::kQElems + stage * 2 * Cfg::kTileElems; };

    issue_q<D>(sQ, q, w, w.m0, 16, heads, lane, SWERVE_WARP);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_tiles) {
            issue_tile<Cfg>(stage_k(s), stage_k(s) + Cfg::kTileElems, k_cache, v_cache, w, w.n_begin + s * BN,
                            block_size, kv_heads, lane);
        }
        cp_async_commit();
    }

    const int group_row = lane / 4;
    int pos[2];  // this thread's rows' positions; padding rows see every key and are never written
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int flat = w.m0 + group_row + r * 8;
        pos[r] = flat < w.m_end ? w.first_pos + flat / w.group : 0x7fffffff;
    }
    const int mask_from = min(w.n_end, w.first_pos + w.m0 / w.group + 1);

    uint32_t q_frag[D / 16][4];
    float o_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<kStages - 2>();  // tile t (and Q) have landed for this lane...
        __syncwarp();                  // ...and for the warp; stage (t - 1) % kStages is free again
        const int t_next = t + kStages - 1;
        if (t_next < n_tiles) {
            __nv_bfloat16* sK_next = stage_k(t_next % kStages);
            issue_tile<Cfg>(sK_next, sK_next + Cfg::kTileElems, k_cache, v_cache, w, w.n_begin + t_next * BN,
                            block_size, kv_heads, lane);
        }
        cp_async_commit();  // possibly empty: keeps the group count uniform
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                ldmatrix_x4(q_frag[kk], sQ + ((lane % 8) + ((lane / 8) % 2) * 8) * S + kk * 16 + (lane / 16) * 8);
            }
        }
        const __nv_bfloat16* sK = stage_k(t % kStages);
        const int n0 = w.n_begin + t * BN;
        attn_tile<D>(o_acc, row_max, row_sum, q_frag, sK, sK + Cfg::kTileElems, S, lane, scale_log2,
                     n0 + BN > mask_from,
                     [&](int r, int key) { return n0 + key >= w.n_end || n0 + key > pos[r]; });
    }
    cp_async_wait<0>();

    float fold_o[kDTiles * 4];
#pragma unroll
    for (int i = 0; i < kDTiles * 4; ++i) fold_o[i] = 0.0f;
    float fold_max[2] = {-INFINITY, -INFINITY}, fold_sum[2] = {0.0f, 0.0f};
    finish_rows<D>(w, w.m0, false, fold_o, 1, fold_max, fold_sum, o_acc, row_max, row_sum, out, part_o, part_stats,
                   row_plan, heads, segment_keys, scale_log2, lane);
}

// Decode with kWarps warps per item (issue 36): one block per work item (a run of consecutive
// segments of <= 16 flat rows of one kv head; blockIdx.x = item * kv_heads + kv_head), its warps
// sharing one cp.async ring that streams the run's keys without a break at segment boundaries.
// Per 64-key tile, warp w computes the scores of keys [w 64 / kWarps, (w + 1) 64 / kWarps) with
// attn_tile's MMA chain and stores them; after a barrier every warp reads the whole score tile
// back in the fragment layout, masks it and runs online_softmax_tile (the same arithmetic in every
// warp, so all hold the same P, maxima and sums), then accumulates O += P V for its head-dim
// columns [w D / kWarps, (w + 1) D / kWarps). At the end of each segment the block writes that
// segment's partial (or its finished rows) and starts the next from a fresh state. Every score,
// sum and output element goes through the same operations in the same order as attn_tile in one
// warp walking one segment: the bits of paged_decode, whatever the run length (the host picks it
// from the batch and the GPU, src/backend/cuda/paged_attn.rs) or the ring depth.
//
//   item keys:  [ segment k         ][ segment k + 1     ][ ... ]     (the run: item.w keys)
//   ring:        t0 t1 t2 ... t7      t8 t9 ...                       (64-key tiles, prefetched
//   per tile:    S (split by keys) | barrier | softmax (every warp) | P V (split by head dim)
//   at a segment's last tile: finish_rows (partial to the scratch; O and the statistics reset)
template <typename Cfg>
__device__ __forceinline__ void paged_decode_split(PAGED_ATTN_PARAMS) {
    constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN, S = Cfg::kSmemStride, kStages = Cfg::kStages;
    constexpr int kW = Cfg::kWarps, kNP = (BN / 16) / kW, kDP = (D / 16) / kW, kDSlice = 2 * kDP;
    constexpr int kSS = Cfg::kScoreStride;
    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;
    const int index = blockIdx.x / kv_heads;
    if (index >= num_items) return;  // the whole block
    PagedWork w;
    if (!paged_work(w, items, index, blockIdx.x % kv_heads, 16, cu_query, context_lens, block_tables,
                    max_blocks_per_seq, heads, kv_heads, segment_keys)) {
        return;  // the same for every thread of the block
    }
    // The run: from the first segment's start over item.w keys, cut at the last row's position.
    // Loads see the run's end; each segment's rows are finished with the segment's own bounds.
    const int run_begin = w.n_begin;
    const int run_end = min(run_begin + max(w.item_keys, 1), w.first_pos + (w.m_end - 1) / w.group + 1);
    PagedWork load = w;
    load.n_end = run_end;
    const int n_tiles = (run_end - run_begin + BN - 1) / BN;
    const int tiles_per_segment = segment_keys / BN;
    const float scale_log2 = softmax_scale * 1.4426950408889634f;

    extern __shared__ __align__(16) unsigned char paged_smem[];
    __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(paged_smem);
    auto stage_k = [&](int stage) { return sQ + Cfg::kQElems + stage * 2 * Cfg::kTileElems; };
    float* sScores = reinterpret_cast<float*>(paged_smem + Cfg::kScoresOffset);  // [2][16][kSS]

    issue_q<D>(sQ, q, w, w.m0, 16, heads, threadIdx.x, Cfg::kThreads);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_tiles) {
            issue_tile<Cfg>(stage_k(s), stage_k(s) + Cfg::kTileElems, k_cache, v_cache, load, run_begin + s * BN,
                            block_size, kv_heads, threadIdx.x);
        }
        cp_async_commit();
    }

    const int group_row = lane / 4, group_col = 2 * (lane % 4);
    int pos[2];  // this thread's rows' positions; padding rows see every key and are never written
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int flat = w.m0 + group_row + r * 8;
        pos[r] = flat < w.m_end ? w.first_pos + flat / w.group : 0x7fffffff;
    }
    const int mask_from = min(run_end, w.first_pos + w.m0 / w.group + 1);

    uint32_t q_frag[D / 16][4];
    float o_acc[kDSlice][4];
#pragma unroll
    for (int i = 0; i < kDSlice; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_tiles; ++t) {
        // Tile t has landed for every thread; every warp is done with stage (t - 1) % kStages
        // (its P V) and with score buffer t % 2 (read two tiles ago).
        cp_async_wait<kStages - 2>();
        __syncthreads();
        const int t_next = t + kStages - 1;
        if (t_next < n_tiles) {
            __nv_bfloat16* sK_next = stage_k(t_next % kStages);
            issue_tile<Cfg>(sK_next, sK_next + Cfg::kTileElems, k_cache, v_cache, load, run_begin + t_next * BN,
                            block_size, kv_heads, threadIdx.x);
        }
        cp_async_commit();  // possibly empty: keeps the group count uniform
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                ldmatrix_x4(q_frag[kk], sQ + ((lane % 8) + ((lane / 8) % 2) * 8) * S + kk * 16 + (lane / 16) * 8);
            }
        }
        const __nv_bfloat16* sK = stage_k(t % kStages);
        float* scores = sScores + (t % 2) * 16 * kSS;
        {
            float s_part[2 * kNP][4];
            attn_tile_scores_cols<D, kNP>(s_part, q_frag, sK, S, lane, warp * kNP);
#pragma unroll
            for (int i = 0; i < 2 * kNP; ++i) {
                const int col = (warp * 2 * kNP + i) * 8 + group_col;
                *reinterpret_cast<float2*>(scores + group_row * kSS + col) = make_float2(s_part[i][0], s_part[i][1]);
                *reinterpret_cast<float2*>(scores + (group_row + 8) * kSS + col) =
                    make_float2(s_part[i][2], s_part[i][3]);
            }
        }
        __syncthreads();  // the whole score tile is in shared memory
        float s_acc[BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
            const float2 lo = *reinterpret_cast<const float2*>(scores + group_row * kSS + nt * 8 + group_col);
            const float2 hi = *reinterpret_cast<const float2*>(scores + (group_row + 8) * kSS + nt * 8 + group_col);
            s_acc[nt][0] = lo.x;
            s_acc[nt][1] = lo.y;
            s_acc[nt][2] = hi.x;
            s_acc[nt][3] = hi.y;
        }
        const int n0 = run_begin + t * BN;
        if (n0 + BN > mask_from) {
            mask_tile(s_acc, lane, [&](int r, int key) { return n0 + key >= run_end || n0 + key > pos[r]; });
        }
        online_softmax_tile<BN / 8, kDSlice>(s_acc, o_acc, row_max, row_sum, scale_log2);
        attn_tile_pv_cols<D, kDP>(o_acc, s_acc, sK + Cfg::kTileElems, S, lane, warp * kDP);
        if ((t + 1) % tiles_per_segment == 0 || t + 1 == n_tiles) {
            // The segment is done (segments are whole tiles: segment_keys is a multiple of BN).
            PagedWork seg = w;
            seg.segment = w.segment + t / tiles_per_segment;
            seg.n_begin = seg.segment * segment_keys;
            seg.n_end = min(seg.n_begin + segment_keys, run_end);
            float fold_o[kDSlice * 4];
#pragma unroll
            for (int i = 0; i < kDSlice * 4; ++i) fold_o[i] = 0.0f;
            float fold_max[2] = {-INFINITY, -INFINITY}, fold_sum[2] = {0.0f, 0.0f};
            // (finish_rows' fold_segment leaves O and the statistics reset for the next segment.)
            finish_rows<D, kDSlice>(seg, w.m0, false, fold_o, 1, fold_max, fold_sum, o_acc, row_max, row_sum, out,
                                    part_o, part_stats, row_plan, heads, segment_keys, scale_log2, lane,
                                    warp * (D / kW), warp == 0);
        }
    }
    cp_async_wait<0>();
}

// Prefill: a block of kWarps x 16 flat rows walks the item's keys (all of them, folding segments
// here, or one segment of a split item); blockIdx.x = item * kv_heads + kv_head.
template <typename Cfg>
__device__ __forceinline__ void paged_prefill(PAGED_ATTN_PARAMS) {
    constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kSmemStride;
    constexpr int kStages = Cfg::kStages, kDTiles = D / 8;
    const int index = blockIdx.x / kv_heads;
    if (index >= num_items) return;
    PagedWork w;
    if (!paged_work(w, items, index, blockIdx.x % kv_heads, BM, cu_query, context_lens, block_tables,
                    max_blocks_per_seq, heads, kv_heads, segment_keys)) {
        return;  // the same for every thread of the block
    }
    const bool whole = w.segment < 0;
    const int n_tiles = (w.n_end - w.n_begin + BN - 1) / BN;
    const float scale_log2 = softmax_scale * 1.4426950408889634f;
    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;

    extern __shared__ __align__(16) unsigned char paged_smem[];
    __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(paged_smem);
    auto stage_k = [&](int stage) { return sQ + Cfg::kQElems + stage * 2 * Cfg::kTileElems; };
    float* fold_o = reinterpret_cast<float*>(paged_smem + Cfg::kFoldOffset) + threadIdx.x;

    issue_q<D>(sQ, q, w, w.m0, BM, heads, threadIdx.x, Cfg::kThreads);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_tiles) {
            issue_tile<Cfg>(stage_k(s), stage_k(s) + Cfg::kTileElems, k_cache, v_cache, w, w.n_begin + s * BN,
                            block_size, kv_heads, threadIdx.x);
        }
        cp_async_commit();
    }

    const int m_warp = w.m0 + warp * 16, group_row = lane / 4;
    int pos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int flat = m_warp + group_row + r * 8;
        pos[r] = flat < w.m_end ? w.first_pos + flat / w.group : 0x7fffffff;
    }
    const int mask_from = min(w.n_end, w.first_pos + w.m0 / w.group + 1);

    uint32_t q_frag[D / 16][4];
    float o_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    float fold_max[2] = {-INFINITY, -INFINITY}, fold_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < Cfg::kFoldFloats; ++i) fold_o[i * Cfg::kThreads] = 0.0f;

    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        const int t_next = t + kStages - 1;
        if (t_next < n_tiles) {
            __nv_bfloat16* sK_next = stage_k(t_next % kStages);
            issue_tile<Cfg>(sK_next, sK_next + Cfg::kTileElems, k_cache, v_cache, w, w.n_begin + t_next * BN,
                            block_size, kv_heads, threadIdx.x);
        }
        cp_async_commit();
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const int r = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                ldmatrix_x4(q_frag[kk], sQ + r * S + kk * 16 + (lane / 16) * 8);
            }
        }
        const int n0 = w.n_begin + t * BN;
        if (t > 0 && n0 % segment_keys == 0) {
            fold_segment<kDTiles>(fold_o, Cfg::kThreads, fold_max, fold_sum, o_acc, row_max, row_sum, scale_log2);
        }
        const __nv_bfloat16* sK = stage_k(t % kStages);
        attn_tile<D>(o_acc, row_max, row_sum, q_frag, sK, sK + Cfg::kTileElems, S, lane, scale_log2,
                     n0 + BN > mask_from,
                     [&](int r, int key) { return n0 + key >= w.n_end || n0 + key > pos[r]; });
    }
    cp_async_wait<0>();
    finish_rows<D>(w, m_warp, whole, fold_o, Cfg::kThreads, fold_max, fold_sum, o_acc, row_max, row_sum, out, part_o,
                   part_stats, row_plan, heads, segment_keys, scale_log2, lane);
}

#define PAGED_DECODE_ENTRY(name, Cfg)                                                  \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)                      \
        name(PAGED_ATTN_PARAMS) {                                                       \
        paged_decode<Cfg>(PAGED_ATTN_ARGS);                                                  \
    }
#define PAGED_DECODE_SPLIT_ENTRY(name, Cfg)                                            \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 2)                      \
        name(PAGED_ATTN_PARAMS) {                                                       \
        paged_decode_split<Cfg>(PAGED_ATTN_ARGS);                                            \
    }
#define PAGED_PREFILL_ENTRY(name, Cfg)                                                  \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)                      \
        name(PAGED_ATTN_PARAMS) {                                                       \
        paged_prefill<Cfg>(PAGED_ATTN_ARGS);                                                  \
    }

PAGED_DECODE_ENTRY(paged_attn_decode_hd128, PagedDecode<128>)
PAGED_DECODE_ENTRY(paged_attn_decode_hd128_small, PagedDecodeSmall<128>)  // sm_86 / sm_89
PAGED_DECODE_ENTRY(paged_attn_decode_hd64, PagedDecode<64>)
PAGED_DECODE_ENTRY(paged_attn_decode_hd64_small, PagedDecodeSmall<64>)  // sm_86 / sm_89
PAGED_DECODE_ENTRY(paged_attn_decode_hd32, PagedDecode<32>)  // small test models
PAGED_DECODE_ENTRY(paged_attn_decode_hd16, PagedDecode<16>)  // small test models
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd128, PagedDecodeSplit<128>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd128_s3, PagedDecodeSplit3<128>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd128_s4, PagedDecodeSplit4<128>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd64, PagedDecodeSplit<64>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd64_s3, PagedDecodeSplit3<64>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd64_s4, PagedDecodeSplit4<64>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd32, PagedDecodeSplit<32>)
PAGED_DECODE_SPLIT_ENTRY(paged_attn_decode_split_hd16, PagedDecodeSplit<16>)
PAGED_PREFILL_ENTRY(paged_attn_prefill_hd128, PagedPrefill<128>)
PAGED_PREFILL_ENTRY(paged_attn_prefill_hd128_small, PagedPrefillSmall<128>)  // sm_86 / sm_89
PAGED_PREFILL_ENTRY(paged_attn_prefill_hd64, PagedPrefill<64>)
PAGED_PREFILL_ENTRY(paged_attn_prefill_hd32, PagedPrefill<32>)
PAGED_PREFILL_ENTRY(paged_attn_prefill_hd16, PagedPrefill<16>)

// ---- merge of split rows -----------------------------------------------------------------------

// out[r, h] = the left-to-right fold (attn_tile.cuh) of the row's segments k = 0 .. parts - 1,
// normalised. One block per (split row, head): row split_rows[blockIdx.x / heads], head
// blockIdx.x % heads (rows written directly get no block, or return at once in a CUDA graph's
// fixed plan); thread d folds element d, every thread the sums (the same arithmetic, redundantly).
template <int D>
__device__ __forceinline__ void paged_attn_merge(__nv_bfloat16* __restrict__ out, const float* __restrict__ part_o,
                                                 const float2* __restrict__ part_stats,
                                                 const int2* __restrict__ row_plan,
                                                 const int* __restrict__ split_rows, int heads, float softmax_scale) {
    const int row = split_rows[blockIdx.x / heads], head = blockIdx.x % heads;
    const int2 plan = row_plan[row];
    if (plan.y <= 1) return;  // one segment: written straight to `out`
    const float scale_log2 = softmax_scale * 1.4426950408889634f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float fold_max = -INFINITY, fold_sum = 0.0f, fold_o = 0.0f;
        // Batches of kMergeBatch partials: every load of a batch is in flight before the first
        // fold (a 131k-token row has 256), then the batch is folded in order.
        for (int k0 = 0; k0 < plan.y; k0 += kMergeBatch) {
            float2 stats[kMergeBatch];
            float part[kMergeBatch];
#pragma unroll
            for (int i = 0; i < kMergeBatch; ++i) {
                if (k0 + i < plan.y) {
                    const size_t idx = (size_t)(plan.x + k0 + i) * heads + head;
                    stats[i] = __ldg(part_stats + idx);
                    part[i] = __ldg(part_o + idx * D + d);
                }
            }
#pragma unroll
            for (int i = 0; i < kMergeBatch; ++i) {
                if (k0 + i < plan.y) {
                    const SegmentWeights w = segment_weights(fold_max, stats[i].x, scale_log2);
                    fold_sum = fold_value(fold_sum, stats[i].y, w);
                    fold_o = fold_value(fold_o, part[i], w);
                    fold_max = w.max;
                }
            }
        }
        out[((size_t)row * heads + head) * D + d] = f32_to_bf16(__fmul_rn(fold_o, attn_normalizer(fold_sum)));
    }
}

#define PAGED_MERGE_ENTRY(name, D)                                                                                   \
    extern "C" __global__ void __launch_bounds__(kMergeThreads)                                                     \
        name(__nv_bfloat16* __restrict__ out, const float* __restrict__ part_o, const float2* __restrict__ part_stats, \
             const int2* __restrict__ row_plan, const int* __restrict__ split_rows, int heads, float softmax_scale) { \
        paged_attn_merge<D>(out, part_o, part_stats, row_plan, split_rows, heads, softmax_scale);                   \
    }

PAGED_MERGE_ENTRY(paged_attn_merge_hd128, 128)
PAGED_MERGE_ENTRY(paged_attn_merge_hd64, 64)
PAGED_MERGE_ENTRY(paged_attn_merge_hd32, 32)
PAGED_MERGE_ENTRY(paged_attn_merge_hd16, 16)
