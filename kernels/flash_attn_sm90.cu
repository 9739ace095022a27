// Flash attention forward for Hopper (sm_90a): the same function as flash_attn.cu's forward
// (causal, GQA, packed variable-length sequences, per-row logsumexp), the same canonical
// reduction order (attn_tile.cuh: 64-key tiles, 512-key segments folded left to right, every
// rounding explicit), on Hopper's machinery: TMA tensor loads completing on mbarriers, wgmma from
// shared-memory descriptors, and warp specialisation (a producer warp feeding two consumer
// warpgroups). The host launches it on compute capability 9.x (flash_attn.rs); other GPUs run
// flash_attn.cu.
//
// ---- the block -----------------------------------------------------------------------------------
//   warpgroup 0 (producer, 128 threads, setmaxnreg.dec to kProducerRegs): one elected thread
//     issues every TMA load: the Q tile once, then K(j) and V(j) into a ring of kStages stages,
//     each stage guarded by a full barrier (the TMA's transaction bytes) and an empty barrier (one
//     arrival per consumer warp once it has read the stage). The other producer threads exit.
//   warpgroups 1 and 2 (consumers, setmaxnreg.inc to kConsumerRegs): 64 query rows each (warp w
//     of the block's 8 consumer warps owns rows 16w .. 16w + 15, the rows flash_attn.cu's warp w
//     owns). Turn j of a warpgroup:
//       wait its turn (named barrier) | wait full K(j), V(j - 1) | one wgmma group:
//         S = Q K(j)^T: D / 16 wgmma m64n64k16 (A = Q, B = K, both K-major descriptors), and
//         O += P(j - 1) V(j - 1): 4 wgmma m64n{D}k16 (A = P in registers, B = V MN-major)
//       | hand the turn to the other warpgroup | wait the group | release K(j), V(j - 1) |
//       the fold of attn_tile.cuh if tile j opens a segment (the folded O in registers) | mask,
//       online softmax of tile j (attn_tile.cuh), P(j)
//     so one warpgroup's softmax runs under the other's GEMMs (FlashAttention 3's pingpong).
//
// ---- why the bits equal flash_attn.cu's ----------------------------------------------------------
// A wgmma's accumulator layout (per warp: 16 rows x N, mma.sync m16n8k16's C fragments side by
// side) and its register A operand (mma.sync's A fragment) are the layouts attn_tile.cuh's
// routines work on, so the mask, the online softmax, the P rounding and the fold are the same
// code on the same values. The products are the same k16 steps in the same order (head-dim steps
// for S, key steps for O), each accumulating into the fp32 accumulator: equal to the mma.sync
// chains if a wgmma k16 step rounds as an mma.sync m16n8k16 does (the emulated device models both
// alike; on a GPU, tests/gpu_exact_attention.rs compares the two kernels bit for bit).
//
// ---- shared memory -------------------------------------------------------------------------------
// Tiles arrive by TMA in the layout wgmma reads: rows of one swizzle span (kSwizzleBytes = the row's
// bytes up to 128), a tile of R rows and D columns stored as D / kAtomElems column blocks of R
// rows each, every block swizzled (128 B: the 16-byte chunk index XOR the row index mod 8).
//   hd128: Q 128 x 128 (32 KiB) + 2 stages x (K + V) 64 x 128 (64 KiB) + 9 barriers = 96 KiB + 72 B
//          (+ 1 KiB to align; sm_90: 227 KiB per block). Registers: a consumer thread holds O and
//          the folded O (head_dim / 2 fp32 each), S (32), P (16) under setmaxnreg 240; no spills.
//
// ---- tuning log (H200, hd128 28/4 heads, causal, TFLOP/s; bench/RESULTS.md) ---------------------
// 4e7c72a  one warpgroup pair in pingpong, 2 stages, folded O in shared memory: 479 at 16k
//          (portable mma.sync forward 201, SDPA flash 337, cuDNN 652 on the same card).
// e96624f  candidates in one run (16k 28/4 / 16k 32/8 / 32k / 128k): default 505 / 499 / 475 / 474;
//          3 stages 506 / 503 / 476 / 475; a warpgroup's softmax statistics under its own P V
//          (two wgmma groups per turn, O rescaled after the second) 508 / 491 / 478 / 473; both
//          506 / 485 / 477 / 477: none worth its code (dropped), so neither the loads nor the
//          warpgroup's own serialisation bound it.
// a2098b7  the folded O in registers instead of shared memory (a pass over head_dim / 2 floats per
//          thread every 8 tiles saved), same run: 8k / 16k 28/4 / 16k 32/8 / 32k / 128k: 456 / 506 /
//          509 / 477 / 479 against 433 / 485 / 469 / 460 / 457: kept (+4-9%).
// Left to try: fewer, larger turns (two canonical tiles' S in one n128 wgmma; their P V stay
// ordered by the rescale in between), and a producer that also stores O through TMA.

#include "attn_tile.cuh"
#include "hopper.cuh"

#include <type_traits>

template <int kHeadDim_>
struct FlashFwdSm90Config {
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = 128;  // query rows per block: 2 consumer warpgroups x 64
    static constexpr int kBlockN = kAttnKeyTile;
    static constexpr int kStages = 2;  // K and V tiles in flight
    static constexpr int kConsumerGroups = 2;
    static constexpr int kConsumerThreads = kConsumerGroups * 128;
    static constexpr int kConsumerWarps = kConsumerThreads / SWERVE_WARP;
    static constexpr int kThreads = 128 + kConsumerThreads;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = 240;
    // Swizzle: rows of min(128, 2 D) bytes.
    static constexpr int kSwizzleBytes = kHeadDim * 2 < 128 ? kHeadDim * 2 : 128;
    static constexpr int kAtomElems = kSwizzleBytes / 2;  // columns per swizzled column block
    static constexpr int kAtoms = kHeadDim / kAtomElems;
    static constexpr int kQBytes = kBlockM * kHeadDim * 2;
    static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or V stage
    static constexpr int kBarrierOffset = kQBytes + 2 * kStages * kKVBytes;
    static constexpr int kNumBarriers = 1 + 4 * kStages;  // Q full; K, V full and empty per stage
    static constexpr int kSmemBytes = kBarrierOffset + kNumBarriers * 8;
    // The host reserves kSmemAlign more bytes and the kernel aligns the base (swizzle atoms).
    static constexpr int kSmemAlign = 1024;
    static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "wgmma N: a multiple of 16 up to 256 here");
    static_assert(kAtoms * kAtomElems == kHeadDim, "whole swizzle column blocks");
};

using FlashFwdSm90Hd128 = FlashFwdSm90Config<128>;
using FlashFwdSm90Hd64 = FlashFwdSm90Config<64>;
using FlashFwdSm90Hd32 = FlashFwdSm90Config<32>;
using FlashFwdSm90Hd16 = FlashFwdSm90Config<16>;

#ifdef SWERVE_HOPPER

// Named barriers of the consumers' turns (0 is __syncthreads'): kTurnBarrier + warpgroup index.
constexpr int kTurnBarrier = 1;

template <typename Cfg>
__device__ __forceinline__ constexpr WgmmaSwizzle sm90_swizzle() {
    return Cfg::kSwizzleBytes == 128 ? kSwizzle128B : (Cfg::kSwizzleBytes == 64 ? kSwizzle64B : kSwizzle32B);
}

// The K-major descriptor of rows row0 .. row0 + 63 (A) or the 64 rows (B) of a tile of `rows`
// rows, at head-dim step kk (16 columns): column block kk / (kAtomElems / 16), 32 bytes per step
// inside it. 8-row groups are 8 spans apart (SBO); LBO is unused when swizzled.
template <typename Cfg>
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t tile, int rows, int row0, int kk) {
    constexpr int kStepsPerAtom = Cfg::kAtomElems / 16;
    const uint32_t addr = tile + (uint32_t)((kk / kStepsPerAtom) * rows * Cfg::kSwizzleBytes +
                                            row0 * Cfg::kSwizzleBytes + (kk % kStepsPerAtom) * 32);
    return wgmma_desc(addr, 16, 8 * Cfg::kSwizzleBytes, sm90_swizzle<Cfg>());
}

// The MN-major descriptor of V's keys 16 kk .. 16 kk + 15 (B of O += P V: K = keys, N = head
// dim): 8-key groups 8 spans apart (SBO), head-dim column blocks one block of 64 rows apart (LBO).
template <typename Cfg>
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t tile, int kk) {
    const uint32_t addr = tile + (uint32_t)(kk * 16 * Cfg::kSwizzleBytes);
    return wgmma_desc(addr, Cfg::kBlockN * Cfg::kSwizzleBytes, 8 * Cfg::kSwizzleBytes, sm90_swizzle<Cfg>());
}

// The block's mbarriers, in shared memory after the tiles: Q full, then per stage K full, V full
// (the TMA's transaction bytes), K empty and V empty (one arrival per consumer warp).
template <typename Cfg>
struct Sm90Barriers {
    uint64_t *q_full, *k_full, *v_full, *k_empty, *v_empty;
    __device__ explicit Sm90Barriers(unsigned char* smem) {
        q_full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
        k_full = q_full + 1;
        v_full = k_full + Cfg::kStages;
        k_empty = v_full + Cfg::kStages;
        v_empty = k_empty + Cfg::kStages;
    }
};

// The producer: one thread loads Q, then K and V of every tile through the stage ring.
template <typename Cfg>
__device__ __forceinline__ void sm90_produce(const TmaMap* map_q, const TmaMap* map_k, const TmaMap* map_v,
                                             unsigned char* smem, int head, int kv_head, int q_row0, int kv_row0,
                                             int n_blocks) {
    const Sm90Barriers<Cfg> bar(smem);
    uint64_t *q_full = bar.q_full, *k_full = bar.k_full, *v_full = bar.v_full;
    uint64_t *k_empty = bar.k_empty, *v_empty = bar.v_empty;
    unsigned char* sK = smem + Cfg::kQBytes;
    unsigned char* sV = sK + Cfg::kStages * Cfg::kKVBytes;
    tma_prefetch_map(map_q);
    tma_prefetch_map(map_k);
    tma_prefetch_map(map_v);
    mbarrier_arrive_expect_tx(q_full, Cfg::kQBytes);
#pragma unroll
    for (int a = 0; a < Cfg::kAtoms; ++a) {
        tma_load_3d(smem + a * Cfg::kBlockM * Cfg::kSwizzleBytes, map_q, q_full, a * Cfg::kAtomElems, head, q_row0);
    }
    for (int j = 0; j < n_blocks; ++j) {
        const int stage = j % Cfg::kStages, use = j / Cfg::kStages;
        unsigned char* k_tile = sK + stage * Cfg::kKVBytes;
        unsigned char* v_tile = sV + stage * Cfg::kKVBytes;
        if (use > 0) mbarrier_wait(&k_empty[stage], (use - 1) & 1);
        mbarrier_arrive_expect_tx(&k_full[stage], Cfg::kKVBytes);
#pragma unroll
        for (int a = 0; a < Cfg::kAtoms; ++a) {
            tma_load_3d(k_tile + a * Cfg::kBlockN * Cfg::kSwizzleBytes, map_k, &k_full[stage], a * Cfg::kAtomElems,
                        kv_head, kv_row0 + j * Cfg::kBlockN);
        }
        if (use > 0) mbarrier_wait(&v_empty[stage], (use - 1) & 1);
        mbarrier_arrive_expect_tx(&v_full[stage], Cfg::kKVBytes);
#pragma unroll
        for (int a = 0; a < Cfg::kAtoms; ++a) {
            tma_load_3d(v_tile + a * Cfg::kBlockN * Cfg::kSwizzleBytes, map_v, &v_full[stage], a * Cfg::kAtomElems,
                        kv_head, kv_row0 + j * Cfg::kBlockN);
        }
    }
}

// One turn of a consumer warpgroup at the tensor cores: S = Q K(j)^T for its 64 rows (head-dim
// steps in order into the zeroed `s_acc`) when `scores`, and O += P(j-1) V(j-1) (key steps in
// order, P the bf16 A fragments `p_frag`) when `values`, as one wgmma group.
// (The flags are template parameters: a wgmma under a branch the compiler cannot prove uniform
// is serialised, ptxas C7520.)
template <typename Cfg, bool kScores, bool kValues>
__device__ __forceinline__ void sm90_gemms(float (&s_acc)[kAttnKeyTile / 8][4], float (&o_acc)[Cfg::kHeadDim / 8][4],
                                           const uint32_t (&p_frag)[kAttnKeyTile / 16][4], uint32_t q_tile,
                                           uint32_t k_tile, uint32_t v_tile, int group_row0) {
    wgmma_fence();
    if (kScores) {
#pragma unroll
        for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
            wgmma_bf16_ss<kAttnKeyTile>(s_acc, kmajor_desc<Cfg>(q_tile, Cfg::kBlockM, group_row0, kk),
                                        kmajor_desc<Cfg>(k_tile, Cfg::kBlockN, 0, kk));
        }
    }
    if (kValues) {
#pragma unroll
        for (int kk = 0; kk < kAttnKeyTile / 16; ++kk) {
            wgmma_bf16_rs_transb<Cfg::kHeadDim>(o_acc, p_frag[kk], mnmajor_desc<Cfg>(v_tile, kk));
        }
    }
    wgmma_commit();
}

// P as the A fragments of O += P V: the softmaxed scores rounded to bf16 (as attn_tile_pv does).
__device__ __forceinline__ void sm90_pack_p(uint32_t (&p_frag)[kAttnKeyTile / 16][4],
                                            const float (&s_acc)[kAttnKeyTile / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < kAttnKeyTile / 16; ++kk) acc_to_a_fragment(p_frag[kk], s_acc, kk);
}

template <typename Cfg>
__device__ __forceinline__ void flash_attn_fwd_sm90(const TmaMap* map_q, const TmaMap* map_k, const TmaMap* map_v,
                                                    __nv_bfloat16* __restrict__ out, float* __restrict__ lse,
                                                    const int* __restrict__ cu_seqlens, int heads, int kv_heads,
                                                    int segment_keys, float softmax_scale) {
    constexpr int D = Cfg::kHeadDim, BM = Cfg::kBlockM, BN = Cfg::kBlockN;
    constexpr int kDTiles = D / 8;

    const int m_block = gridDim.x - 1 - blockIdx.x;  // longest first
    const int head = blockIdx.y;
    const int seq = blockIdx.z;
    const int seq_start = cu_seqlens[seq];
    const int seqlen = cu_seqlens[seq + 1] - seq_start;
    const int m0 = m_block * BM;
    if (m0 >= seqlen) return;
    const int kv_head = head / (heads / kv_heads);
    const int n_blocks = (min(seqlen, m0 + BM) + BN - 1) / BN;

    extern __shared__ __align__(16) unsigned char flash_sm90_smem[];
    unsigned char* smem = flash_sm90_smem + ((Cfg::kSmemAlign - smem_addr(flash_sm90_smem) % Cfg::kSmemAlign) %
                                             Cfg::kSmemAlign);
    const Sm90Barriers<Cfg> bar(smem);
    uint64_t *q_full = bar.q_full, *k_full = bar.k_full, *v_full = bar.v_full;
    uint64_t *k_empty = bar.k_empty, *v_empty = bar.v_empty;
    if (threadIdx.x == 0) {
        mbarrier_init(q_full, 1);
        for (int s = 0; s < Cfg::kStages; ++s) {
            mbarrier_init(&k_full[s], 1);
            mbarrier_init(&v_full[s], 1);
            mbarrier_init(&k_empty[s], Cfg::kConsumerWarps);
            mbarrier_init(&v_empty[s], Cfg::kConsumerWarps);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // the producer warpgroup
        setmaxnreg_dec<Cfg::kProducerRegs>();
        if (threadIdx.x == 0) {
            sm90_produce<Cfg>(map_q, map_k, map_v, smem, head, kv_head, seq_start + m0, seq_start, n_blocks);
        }
        return;
    }
    setmaxnreg_inc<Cfg::kConsumerRegs>();

    const int ctid = threadIdx.x - 128;                 // consumer thread
    const int cwarp = ctid / SWERVE_WARP, lane = ctid % SWERVE_WARP;
    const int group_row0 = (ctid / 128) * 64;           // the warpgroup's first row of the tile
    const int group_row = lane / 4;
    const float scale_log2 = softmax_scale * 1.4426950408889634f;
    const uint32_t q_tile = smem_addr(smem);
    const uint32_t k_tiles = q_tile + Cfg::kQBytes;
    const uint32_t v_tiles = k_tiles + Cfg::kStages * Cfg::kKVBytes;
    // This thread's folded O, in registers (the O fragment's layout: element dt * 4 + e).
    float fold_o[kDTiles * 4];

    float o_acc[kDTiles][4];
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    float fold_max[2] = {-INFINITY, -INFINITY}, fold_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kDTiles * 4; ++i) fold_o[i] = 0.0f;
    int q_idx[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) q_idx[r] = m0 + cwarp * 16 + group_row + r * 8;

    // Turn j of a warpgroup issues S(j) and O += P(j-1) V(j-1) together, then hands the tensor
    // cores to the other warpgroup (named barrier kTurnBarrier + its index: 128 arrivals from the
    // other group, 128 waits) while it waits for its results and runs the softmax of tile j: the
    // two warpgroups alternate (pingpong), one's softmax under the other's GEMMs. The operations
    // on a row's O stay in the canonical order: softmax(j - 1) (its correction), P(j - 1) V(j - 1),
    // the fold when tile j opens a segment, softmax(j).
    const int group = ctid / 128;
    if (group == 1) named_barrier_arrive(kTurnBarrier, Cfg::kConsumerThreads);
    mbarrier_wait(q_full, 0);
    float s_acc[BN / 8][4];
    uint32_t p_frag[BN / 16][4];
    // Turn j; `scores` (j < n_blocks) and `values` (j > 0) as constants: the first turn, the
    // steady ones and the last are separate code (see sm90_gemms).
    auto turn = [&](auto scores_flag, auto values_flag, int j) {
        constexpr bool scores = decltype(scores_flag)::value, values = decltype(values_flag)::value;
        const int stage = j % Cfg::kStages, prev = (j + Cfg::kStages - 1) % Cfg::kStages;
        named_barrier_sync(kTurnBarrier + group, Cfg::kConsumerThreads);
        if (scores) {
#pragma unroll
            for (int i = 0; i < BN / 8; ++i) s_acc[i][0] = s_acc[i][1] = s_acc[i][2] = s_acc[i][3] = 0.0f;
            mbarrier_wait(&k_full[stage], (j / Cfg::kStages) & 1);
        }
        if (values) mbarrier_wait(&v_full[prev], ((j - 1) / Cfg::kStages) & 1);
        sm90_gemms<Cfg, scores, values>(s_acc, o_acc, p_frag, q_tile, k_tiles + stage * Cfg::kKVBytes,
                                        v_tiles + prev * Cfg::kKVBytes, group_row0);
        // (the second group's last turn hands nothing on: the first has no turn left)
        if (group == 0 || scores) named_barrier_arrive(kTurnBarrier + 1 - group, Cfg::kConsumerThreads);
        wgmma_wait<0>();
        __syncwarp();
        if (lane == 0) {
            if (scores) mbarrier_arrive(&k_empty[stage]);
            if (values) mbarrier_arrive(&v_empty[prev]);
        }
        if (!scores) return;
        const int n0 = j * BN;
        if (j > 0 && n0 % segment_keys == 0) {
            fold_segment<kDTiles>(fold_o, 1, fold_max, fold_sum, o_acc, row_max, row_sum,
                                  scale_log2);
        }
        if (n0 + BN > m0 || n0 + BN > seqlen) {
            mask_tile(s_acc, lane, [&](int r, int key) { return n0 + key > q_idx[r] || n0 + key >= seqlen; });
        }
        online_softmax_tile<BN / 8, kDTiles>(s_acc, o_acc, row_max, row_sum, scale_log2);
        sm90_pack_p(p_frag, s_acc);
    };
    using Yes = std::true_type;
    using No = std::false_type;
    turn(Yes(), No(), 0);
    for (int j = 1; j < n_blocks; ++j) turn(Yes(), Yes(), j);
    turn(No(), Yes(), n_blocks);
    fold_segment<kDTiles>(fold_o, 1, fold_max, fold_sum, o_acc, row_max, row_sum, scale_log2);

    attn_store_rows<D>(out, lse, fold_o, 1, fold_max, fold_sum, q_idx, seq_start, seqlen, heads, head,
                       softmax_scale, lane);
}

#endif  // SWERVE_HOPPER

// The tensor maps: q [T, heads, D], k and v [T, kv_heads, D] as 3-D maps (D, heads, T) with boxes
// (kAtomElems, 1, rows) and the swizzle of kSwizzleBytes (flash_attn.rs encodes them).
#ifdef SWERVE_HOPPER
#define FLASH_FWD_SM90_BODY(Cfg)                                                                             \
    flash_attn_fwd_sm90<Cfg>(&map_q, &map_k, &map_v, out, lse, cu_seqlens, heads, kv_heads, segment_keys, \
                             softmax_scale);
#else
#define FLASH_FWD_SM90_BODY(Cfg) __trap();
#endif

#define FLASH_FWD_SM90_ENTRY(name, Cfg)                                                                         \
    extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)                                             \
        name(const __grid_constant__ TmaMap map_q, const __grid_constant__ TmaMap map_k,                      \
             const __grid_constant__ TmaMap map_v, __nv_bfloat16* __restrict__ out, float* __restrict__ lse,   \
             const int* __restrict__ cu_seqlens, int heads, int kv_heads, int segment_keys, float softmax_scale) { \
        FLASH_FWD_SM90_BODY(Cfg)                                                                               \
    }

FLASH_FWD_SM90_ENTRY(flash_attn_fwd_sm90_hd128, FlashFwdSm90Hd128)
FLASH_FWD_SM90_ENTRY(flash_attn_fwd_sm90_hd64, FlashFwdSm90Hd64)
FLASH_FWD_SM90_ENTRY(flash_attn_fwd_sm90_hd32, FlashFwdSm90Hd32)
FLASH_FWD_SM90_ENTRY(flash_attn_fwd_sm90_hd16, FlashFwdSm90Hd16)
