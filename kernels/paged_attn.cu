// Paged attention for serving: writes of new K/V rows into the paged cache, and causal GQA
// attention of one engine step's query rows (decode rows and chunked-prefill rows alike) over
// their sequences' cached context, read through block tables. Long contexts are split along the
// keys (flash-decoding) and the partial results merged by logsumexp.
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
//   paged_attn_merge_hd*: combines the partitions of rows whose keys were split.
//   paged_attn_decode_hd128_2stage: the decode kernel with a 2-stage ring, for GPUs whose
//   shared memory per block cannot hold the 3-stage one (see the tile configurations).
//
// Shapes: q, out [rows, heads, head_dim] bf16; cu_query [num_seqs + 1], context_lens [num_seqs],
// block_tables [num_seqs, max_blocks_per_seq] i32. Scratch (only for split rows) fp32:
// part_o [scratch_rows, heads, head_dim] and part_lse [scratch_rows, heads] (log2 units).
//
// Work decomposition (the host builds it, src/backend/cuda/paged_attn.rs):
//   * GQA grouping: the M dimension of the MMAs is the flattened (query row, head of the group)
//     pair, m = local_row * group + g, so one block holds every query head that shares a kv head
//     and each K/V tile is read from HBM once per group, never once per query head.
//   * A work item is (sequence, tile of kBlockM flat rows, key partition); the grid is one block
//     per (item, kv head), kv heads adjacent: blockIdx.x = item * kv_heads + kv_head. A partition
//     is `partition_keys` keys, a multiple of kBlockN chosen on the host: 512, doubled while the
//     grid still has about 4 blocks per SM, so one 131k-token decode row becomes 256 blocks per
//     kv head while a large batch is not split at all. Items are sorted longest first.
//   * A row whose whole context fits one partition (p < partition_keys) is written straight to
//     `out`; a split row writes, per partition, its normalised partial output and logsumexp to
//     the scratch (row_plan[r] = {first scratch row, partitions}), and paged_attn_merge (one block
//     per split row and head) adds the partitions up weighted by exp(lse - max lse).
//   * decode kernel: sequences with rows * group <= 16 (decode, short speculative chunks): one
//     16-row MMA tile; the block's 4 warps split each 64-key tile four ways (16 keys each) and
//     their running (max, sum, O) are merged through shared memory at the end. Tensor-core MMAs
//     even here: 7 of 16 rows used for group 7, but the kernel is bound by HBM, not by the MMAs.
//   * prefill kernel: longer chunks (e.g. a new turn over a long cached history): 4 warps x 16
//     flat rows, each warp sees the whole 64-key tile, like flash_attn.cu.
//
// Inside a block, per 64-key tile (kStages-deep cp.async ring of K and V tiles, one barrier per
// tile; the block-table entries of the tile after next are fetched into registers one tile ahead,
// so the paged address never stalls the copy):
//   wait tile t | issue tile t + kStages - 1 | S = Q K^T (mma.sync m16n8k16 bf16, fp32 acc) |
//   causal / range mask | online softmax in fp32 (exp2, running max and sum) | O += P V (P bf16)
//
// Never materialised: the [rows, context] score or probability matrix (scores live in registers,
// one tile at a time), a gathered contiguous copy of a sequence's K/V, or per-query-head copies of
// a kv head's K/V.
//
// Bytes (decode, per layer): every cached K and V byte of every sequence is read once (per kv
// head, for the whole group), plus q and out, plus for split rows 2 x (head_dim + 1) x 4 bytes per
// (row, head, partition) of scratch: about 2 group / partition_keys of the K/V traffic (3% at
// group 8, 512 keys).

#include "common.cuh"
#include "mma.cuh"

// ---- tile configurations -----------------------------------------------------------------------
// Shared memory: Q (kBlockM rows) + kStages x (K and V tiles of kBlockN rows), rows of head_dim + 8
// bf16 (16-byte pad: ldmatrix rows land in distinct bank groups); the fp32 epilogue (per-warp O,
// rows of head_dim + 8 floats) reuses the ring.
//   decode  hd128: 16 x 64 keys, 4 warps (1 x 4), 3 stages: 109,312 B -> 2 blocks (8 warps) per SM
//                  with 2 tiles (64 KB) in flight per block: far above the ~30 KB per SM that
//                  Little's law asks for at 3.3-4.8 TB/s. Above the 101,376 B (99 KiB) a block
//                  may opt into on sm_86 / sm_89 (A10, L4, L40S, RTX 30/40, which run the compute_80
//                  PTX): there the host picks paged_attn_decode_hd128_2stage, 2 stages: 74,496 B
//                  (one tile in flight; ~1 block per SM of their 100 KB). The host reads the
//                  device's opt-in limit and takes the first variant that fits (paged_attn.rs).
//   decode  hd64:  same shape, 58,112 B -> 3 blocks per SM (fits every sm_80+ opt-in limit).
//   prefill hd128: 64 x 64 keys, 4 warps (4 x 1), 2 stages: 87,552 B -> 2 blocks per SM.
// Not yet measured on a GPU. Candidates: decode with kBlockN = 128 and 8 warps (1 x 8); 4 stages
// for hd <= 64; prefill with 8 warps x 16 rows (as flash_attn.cu) for chunks of thousands of rows.
template <int kHeadDim_, int kWarpsM_, int kWarpsN_, int kBlockN_, int kStages_>
struct PagedAttnConfig {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kWarpsM = kWarpsM_;  // warps along the flat rows (16 each)
    static constexpr int kWarpsN = kWarpsN_;  // warps along the keys of a tile
    static constexpr int kWarps = kWarpsM * kWarpsN;
    static constexpr int kThreads = kWarps * SWERVE_WARP;
    static constexpr int kBlockM = 16 * kWarpsM;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kWarpKeys = kBlockN / kWarpsN;
    static constexpr int kStages = kStages_;
    static constexpr int kSmemStride = kHeadDim + 8;  // bf16 per shared-memory row
    static constexpr int kOStride = kHeadDim + 8;     // fp32 per epilogue row
    static constexpr int kQBytes = kBlockM * kSmemStride * 2;
    static constexpr int kStatsBytes = 2 * kWarpsN * kBlockM * 4;
    static constexpr int kTileElems = kBlockN * kSmemStride;  // one K or V tile
    static constexpr int kRingBytes = kStages * 2 * kTileElems * 2;
    static constexpr int kEpilogueBytes = kWarpsN * kBlockM * kOStride * 4;
    static constexpr int kSmemBytes =
        kQBytes + kStatsBytes + (kRingBytes > kEpilogueBytes ? kRingBytes : kEpilogueBytes);
    static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
    static constexpr int kRowsPerPass = kThreads / kChunks;
    static constexpr int kPasses = kBlockN / kRowsPerPass;  // rows of a tile each thread copies
    static_assert(kWarpKeys % 16 == 0, "each warp's keys form whole 16-key MMA steps");
    static_assert(kHeadDim % 16 == 0, "MMA tiles are 16 wide");
    static_assert(kThreads % kChunks == 0 && kBlockN % kRowsPerPass == 0, "whole rows per copy pass");
    static_assert(kStages >= 2, "at least double buffering");
    static_assert(kQBytes % 16 == 0 && kStatsBytes % 16 == 0, "16-byte aligned regions");
};

template <int D>
using PagedDecode = PagedAttnConfig<D, 1, 4, 64, 3>;
template <int D>
using PagedDecode2Stage = PagedAttnConfig<D, 1, 4, 64, 2>;  // for GPUs with 99 KiB per block
template <int D>
using PagedPrefill = PagedAttnConfig<D, 4, 1, 64, 2>;

// The merge: one block of kMergeThreads per (row, head); threads split the partitions.
constexpr int kMergeThreads = 256;

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

// Everything a block knows about its work item.
struct PagedWork {
    int seq, kv_head, group, part;
    int row_start;  // first packed query row of the sequence
    int first_pos;  // context position of the sequence's first query row
    int m0, m_end;  // flat rows [m0, m_end) of this tile (flat = local_row * group + g)
    int n_begin, n_end;  // keys of this partition, already cut at the tile's last position
    const int* table;    // the sequence's block table
};

// Physical cache blocks of the kPasses rows this thread copies for the tile at key n0 (-1: past
// the partition, zero-filled). Loaded a tile ahead of their use.
template <typename Cfg>
__device__ __forceinline__ void lookup_blocks(int ids[Cfg::kPasses], const PagedWork& w, int n0, int block_size) {
    const int r0 = threadIdx.x / Cfg::kChunks;
#pragma unroll
    for (int i = 0; i < Cfg::kPasses; ++i) {
        const int j = n0 + r0 + i * Cfg::kRowsPerPass;
        ids[i] = j < w.n_end ? __ldg(w.table + j / block_size) : -1;
    }
}

// Copies the K and V rows of the tile at key n0 into one ring stage (cp.async, 16 bytes each).
template <typename Cfg>
__device__ __forceinline__ void issue_tile(__nv_bfloat16* sK, __nv_bfloat16* sV, const __nv_bfloat16* k_cache,
                                           const __nv_bfloat16* v_cache, const int ids[Cfg::kPasses],
                                           const PagedWork& w, int n0, int block_size, int kv_heads) {
    constexpr int D = Cfg::kHeadDim, S = Cfg::kSmemStride;
    const int r0 = threadIdx.x / Cfg::kChunks, c = (threadIdx.x % Cfg::kChunks) * 8;
#pragma unroll
    for (int i = 0; i < Cfg::kPasses; ++i) {
        const int r = r0 + i * Cfg::kRowsPerPass;
        const int j = n0 + r;
        const bool valid = ids[i] >= 0;
        size_t off = 0;
        if (valid) {
            const size_t slot = (size_t)ids[i] * block_size + (j % block_size);
            off = (slot * kv_heads + w.kv_head) * D + c;
        }
        cp_async_16(sK + r * S + c, k_cache + off, valid);
        cp_async_16(sV + r * S + c, v_cache + off, valid);
    }
}

template <typename Cfg>
__device__ __forceinline__ void paged_attn(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                                           const __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ out,
                                           float* __restrict__ part_o, float* __restrict__ part_lse,
                                           const int* __restrict__ cu_query, const int* __restrict__ context_lens,
                                           const int* __restrict__ block_tables, const int4* __restrict__ items,
                                           const int2* __restrict__ row_plan, int max_blocks_per_seq, int block_size,
                                           int heads, int kv_heads, int partition_keys, float softmax_scale) {
    constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kSmemStride;
    constexpr int WN = Cfg::kWarpsN, kStages = Cfg::kStages;
    constexpr int kNTiles = Cfg::kWarpKeys / 8;  // 8-key MMA tiles per warp per key tile
    constexpr int kDTiles = D / 8;

    // ---- the work item
    // The kv heads of one item are adjacent blocks: they read neighbouring bytes of the same
    // cache blocks at about the same time.
    const int4 item = items[blockIdx.x / kv_heads];
    PagedWork w;
    w.seq = item.x;
    w.m0 = item.y;
    w.part = item.z;
    w.kv_head = blockIdx.x % kv_heads;
    w.group = heads / kv_heads;
    w.row_start = cu_query[w.seq];
    const int rows = cu_query[w.seq + 1] - w.row_start;
    w.first_pos = context_lens[w.seq] - rows;
    w.m_end = min(w.m0 + BM, rows * w.group);
    const int p_first = w.first_pos + w.m0 / w.group;
    const int p_last = w.first_pos + (w.m_end - 1) / w.group;
    w.n_begin = w.part * partition_keys;
    w.n_end = min(w.n_begin + partition_keys, p_last + 1);
    w.table = block_tables + (size_t)w.seq * max_blocks_per_seq;
    const int n_tiles = (w.n_end - w.n_begin + BN - 1) / BN;
    const int mask_from = min(w.n_end, p_first + 1);  // a tile reaching past this key needs a mask

    extern __shared__ __align__(16) unsigned char paged_smem[];
    __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(paged_smem);
    float* sMax = reinterpret_cast<float*>(paged_smem + Cfg::kQBytes);  // [WN][BM], log2 units
    float* sSum = sMax + WN * BM;                                        // [WN][BM]
    unsigned char* ring = paged_smem + Cfg::kQBytes + Cfg::kStatsBytes;
    auto stage_k = [&](int stage) { return reinterpret_cast<__nv_bfloat16*>(ring) + stage * 2 * Cfg::kTileElems; };

    const int warp = threadIdx.x / SWERVE_WARP, lane = threadIdx.x % SWERVE_WARP;
    const int warp_m = warp / WN, warp_n = warp % WN;
    const int group_row = lane / 4, group_col = 2 * (lane % 4);  // MMA fragment coordinates
    const float scale_log2 = softmax_scale * 1.4426950408889634f;

    // ---- Q: the tile's flat rows, gathered from [rows, heads, D] (a group's heads are adjacent)
    const size_t q_stride = (size_t)heads * D;
    for (int i = threadIdx.x; i < BM * Cfg::kChunks; i += Cfg::kThreads) {
        const int m = i / Cfg::kChunks, c = (i % Cfg::kChunks) * 8;
        const int flat = w.m0 + m;
        const bool valid = flat < w.m_end;
        const __nv_bfloat16* src = q;
        if (valid) {
            src = q + (size_t)(w.row_start + flat / w.group) * q_stride +
                  (size_t)(w.kv_head * w.group + flat % w.group) * D + c;
        }
        cp_async_16(sQ + m * S + c, src, valid);
    }

    // ---- prologue: tiles 0 .. kStages - 2 in flight (Q rides with tile 0)
    int ids[Cfg::kPasses];
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_tiles) {
            lookup_blocks<Cfg>(ids, w, w.n_begin + s * BN, block_size);
            issue_tile<Cfg>(stage_k(s), stage_k(s) + Cfg::kTileElems, k_cache, v_cache, ids, w, w.n_begin + s * BN,
                            block_size, kv_heads);
        }
        cp_async_commit();
    }
    if (kStages - 1 < n_tiles) lookup_blocks<Cfg>(ids, w, w.n_begin + (kStages - 1) * BN, block_size);

    // This thread's two flat rows (group_row, group_row + 8 of its warp) and their positions;
    // padding rows past the tile see every key of the partition and are never written.
    int pos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int flat = w.m0 + warp_m * 16 + group_row + r * 8;
        pos[r] = flat < w.m_end ? w.first_pos + flat / w.group : 0x7fffffff;
    }

    uint32_t q_frag[D / 16][4];
    float o_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};  // raw scores
    float row_sum[2] = {0.0f, 0.0f};            // this thread's part of each row's sum
    const int key0 = warp_n * Cfg::kWarpKeys;   // this warp's keys within a tile

    for (int t = 0; t < n_tiles; ++t) {
        cp_async_wait<kStages - 2>();  // tile t (and Q) have landed for this thread...
        __syncthreads();               // ...and for all; stage (t - 1) % kStages is free again
        const int t_next = t + kStages - 1;
        if (t_next < n_tiles) {
            __nv_bfloat16* sK_next = stage_k(t_next % kStages);
            issue_tile<Cfg>(sK_next, sK_next + Cfg::kTileElems, k_cache, v_cache, ids, w, w.n_begin + t_next * BN,
                            block_size, kv_heads);
            if (t_next + 1 < n_tiles) lookup_blocks<Cfg>(ids, w, w.n_begin + (t_next + 1) * BN, block_size);
        }
        cp_async_commit();  // possibly empty: keeps the group count uniform

        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const int r = warp_m * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = kk * 16 + (lane / 16) * 8;
                ldmatrix_x4(q_frag[kk], sQ + r * S + c);
            }
        }
        const __nv_bfloat16* sK = stage_k(t % kStages);
        const __nv_bfloat16* sV = sK + Cfg::kTileElems;
        const int n0 = w.n_begin + t * BN;

        // S = Q K^T for this warp's 16 rows and its kWarpKeys keys.
        float s_acc[kNTiles][4];
#pragma unroll
        for (int i = 0; i < kNTiles; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                uint32_t b[4];
                const int r = key0 + np * 16 + (lane % 8) + (lane / 16) * 8;
                const int c = kk * 16 + ((lane / 8) % 2) * 8;
                ldmatrix_x4(b, sK + r * S + c);
                mma_bf16_16816(s_acc[2 * np], q_frag[kk], b[0], b[1]);
                mma_bf16_16816(s_acc[2 * np + 1], q_frag[kk], b[2], b[3]);
            }
        }

        // Causal and partition-end mask, only on tiles that reach past the first row's position.
        if (n0 + BN > mask_from) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int k_idx = n0 + key0 + nt * 8 + group_col + (e % 2);
                    if (k_idx >= w.n_end || k_idx > pos[e / 2]) s_acc[nt][e] = -INFINITY;
                }
            }
        }

        // Online softmax over the 4 threads sharing a row.
        online_softmax_tile<kNTiles, kDTiles>(s_acc, o_acc, row_max, row_sum, scale_log2);

        // O += P V over this warp's keys: the score accumulator is the next MMA's A fragment.
#pragma unroll
        for (int kk = 0; kk < Cfg::kWarpKeys / 16; ++kk) {
            uint32_t p_frag[4];
            p_frag[0] = pack_bf16x2(s_acc[2 * kk][0], s_acc[2 * kk][1]);
            p_frag[1] = pack_bf16x2(s_acc[2 * kk][2], s_acc[2 * kk][3]);
            p_frag[2] = pack_bf16x2(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1]);
            p_frag[3] = pack_bf16x2(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                const int r = key0 + kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = dp * 16 + (lane / 16) * 8;
                ldmatrix_x4_trans(b, sV + r * S + c);
                mma_bf16_16816(o_acc[2 * dp], p_frag, b[0], b[1]);
                mma_bf16_16816(o_acc[2 * dp + 1], p_frag, b[2], b[3]);
            }
        }
    }

    // ---- epilogue: per-warp (max, sum, O) to shared memory, merged across the key-split warps
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float sum = row_sum[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (lane % 4 == 0) {
            const int m = warp_m * 16 + group_row + r * 8;
            sMax[warp_n * BM + m] = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale_log2;
            sSum[warp_n * BM + m] = sum;
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring and no copy is still landing in it
    float* sO = reinterpret_cast<float*>(ring);  // [WN][BM][kOStride]
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int m = warp_m * 16 + group_row + r * 8;
            *reinterpret_cast<float2*>(sO + (warp_n * BM + m) * Cfg::kOStride + dt * 8 + group_col) =
                make_float2(o_acc[dt][2 * r], o_acc[dt][2 * r + 1]);
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < BM * (D / 4); i += Cfg::kThreads) {
        const int m = i / (D / 4), c = (i % (D / 4)) * 4;
        const int flat = w.m0 + m;
        if (flat >= w.m_end) continue;
        const int local_row = flat / w.group;
        const int p = w.first_pos + local_row;
        if (p < w.n_begin) continue;  // this row's context ends before the partition
        float mx = -INFINITY;
#pragma unroll
        for (int wn = 0; wn < WN; ++wn) mx = fmaxf(mx, sMax[wn * BM + m]);
        float sum = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int wn = 0; wn < WN; ++wn) {
            const float wm = sMax[wn * BM + m];
            const float f = wm == -INFINITY ? 0.0f : exp2f(wm - mx);
            sum += f * sSum[wn * BM + m];
            const float4 o = *reinterpret_cast<const float4*>(sO + (wn * BM + m) * Cfg::kOStride + c);
            acc.x += f * o.x;
            acc.y += f * o.y;
            acc.z += f * o.z;
            acc.w += f * o.w;
        }
        const float inv = 1.0f / sum;  // > 0: key n_begin <= p is in this partition
        const int row = w.row_start + local_row;
        const int head = w.kv_head * w.group + flat % w.group;
        if (p < partition_keys) {
            // The row's whole context is this one partition: the final output.
            __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
            __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
            uint2 packed;
            packed.x = *reinterpret_cast<uint32_t*>(&lo);
            packed.y = *reinterpret_cast<uint32_t*>(&hi);
            *reinterpret_cast<uint2*>(out + ((size_t)row * heads + head) * D + c) = packed;
        } else {
            const size_t idx = (size_t)(row_plan[row].x + w.part) * heads + head;
            *reinterpret_cast<float4*>(part_o + idx * D + c) =
                make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
            if (c == 0) part_lse[idx] = mx + __log2f(sum);
        }
    }
}

#define PAGED_ATTN_ENTRY(name, Cfg)                                                                               \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 2)                                               \
        name(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,                     \
             const __nv_bfloat16* __restrict__ v_cache, __nv_bfloat16* __restrict__ out, float* __restrict__ part_o, \
             float* __restrict__ part_lse, const int* __restrict__ cu_query, const int* __restrict__ context_lens, \
             const int* __restrict__ block_tables, const int4* __restrict__ items,                                \
             const int2* __restrict__ row_plan, int max_blocks_per_seq, int block_size, int heads, int kv_heads,  \
             int partition_keys, float softmax_scale) {                                                           \
        paged_attn<Cfg>(q, k_cache, v_cache, out, part_o, part_lse, cu_query, context_lens, block_tables, items,  \
                        row_plan, max_blocks_per_seq, block_size, heads, kv_heads, partition_keys, softmax_scale); \
    }

PAGED_ATTN_ENTRY(paged_attn_decode_hd128, PagedDecode<128>)
PAGED_ATTN_ENTRY(paged_attn_decode_hd128_2stage, PagedDecode2Stage<128>)  // sm_86 / sm_89
PAGED_ATTN_ENTRY(paged_attn_decode_hd64, PagedDecode<64>)
PAGED_ATTN_ENTRY(paged_attn_decode_hd32, PagedDecode<32>)  // small test models
PAGED_ATTN_ENTRY(paged_attn_decode_hd16, PagedDecode<16>)  // small test models
PAGED_ATTN_ENTRY(paged_attn_prefill_hd128, PagedPrefill<128>)
PAGED_ATTN_ENTRY(paged_attn_prefill_hd64, PagedPrefill<64>)
PAGED_ATTN_ENTRY(paged_attn_prefill_hd32, PagedPrefill<32>)
PAGED_ATTN_ENTRY(paged_attn_prefill_hd16, PagedPrefill<16>)

// ---- merge of split rows -----------------------------------------------------------------------

__device__ __forceinline__ float block_max(float x, float* scratch) {
    const int lane = threadIdx.x % SWERVE_WARP, warp = threadIdx.x / SWERVE_WARP;
    const int warps = blockDim.x / SWERVE_WARP;
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < warps ? scratch[lane] : -INFINITY;
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

// out[r, h] = sum_k 2^(lse_k - L) o_k, L = log2 sum_k 2^lse_k, over the row's partitions k.
// One block per (split row, head): row split_rows[blockIdx.x / heads], head blockIdx.x % heads
// (rows written directly get no block). kMergeThreads threads: thread t adds up the 4-float chunk
// t % (D / 4) of the partitions k = t / (D / 4) (mod kLanes), then the lanes are summed.
template <int D>
__device__ __forceinline__ void paged_attn_merge(__nv_bfloat16* __restrict__ out, const float* __restrict__ part_o,
                                                 const float* __restrict__ part_lse,
                                                 const int2* __restrict__ row_plan,
                                                 const int* __restrict__ split_rows, int heads) {
    constexpr int kChunks = D / 4, kLanes = kMergeThreads / kChunks;
    const int row = split_rows[blockIdx.x / heads], head = blockIdx.x % heads;
    const int2 plan = row_plan[row];
    const int parts = plan.y;
    // A row of one partition was written straight to `out` (CUDA-graph plans list every row here
    // and say per step which ones were split).
    if (parts <= 1) return;
    __shared__ float scratch[kMergeThreads / SWERVE_WARP];
    __shared__ __align__(16) float acc_smem[kLanes][D];
    const float* lse = part_lse + (size_t)plan.x * heads + head;  // partition k at lse[k * heads]

    float mx = -INFINITY;
    for (int k = threadIdx.x; k < parts; k += kMergeThreads) mx = fmaxf(mx, lse[(size_t)k * heads]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int k = threadIdx.x; k < parts; k += kMergeThreads) sum += exp2f(lse[(size_t)k * heads] - mx);
    sum = block_sum(sum, scratch);

    const int c = (threadIdx.x % kChunks) * 4, lane_k = threadIdx.x / kChunks;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int k = lane_k; k < parts; k += kLanes) {
        const float wk = exp2f(lse[(size_t)k * heads] - mx);
        const float4 o = __ldg(reinterpret_cast<const float4*>(part_o + ((size_t)(plan.x + k) * heads + head) * D + c));
        acc.x += wk * o.x;
        acc.y += wk * o.y;
        acc.z += wk * o.z;
        acc.w += wk * o.w;
    }
    *reinterpret_cast<float4*>(&acc_smem[lane_k][c]) = acc;
    __syncthreads();
    if (threadIdx.x < D) {
        float total = 0.0f;
#pragma unroll
        for (int l = 0; l < kLanes; ++l) total += acc_smem[l][threadIdx.x];
        out[((size_t)row * heads + head) * D + threadIdx.x] = f32_to_bf16(total / sum);
    }
}

#define PAGED_MERGE_ENTRY(name, D)                                                                                 \
    extern "C" __global__ void __launch_bounds__(kMergeThreads)                                                   \
        name(__nv_bfloat16* __restrict__ out, const float* __restrict__ part_o, const float* __restrict__ part_lse, \
             const int2* __restrict__ row_plan, const int* __restrict__ split_rows, int heads) {                   \
        paged_attn_merge<D>(out, part_o, part_lse, row_plan, split_rows, heads);                                  \
    }

PAGED_MERGE_ENTRY(paged_attn_merge_hd128, 128)
PAGED_MERGE_ENTRY(paged_attn_merge_hd64, 64)
PAGED_MERGE_ENTRY(paged_attn_merge_hd32, 32)
PAGED_MERGE_ENTRY(paged_attn_merge_hd16, 16)
