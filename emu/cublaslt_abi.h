// The cuBLASLt ABI the stand-in libcublasLt (emu/cublaslt.cpp) implements: cudarc 0.19's
// `cublaslt::sys` enum values and struct layouts (feature cuda-13000), and how the stand-in's
// algorithm words are laid out. Included once, by emu/cublaslt.cpp, inside its anonymous
// namespace.
#pragma once

#include <stddef.h>
#include <stdint.h>

// ---- cudarc 0.19 cublaslt::sys values (cuda-13000) -------------------------------------------
enum : int { OK = 0, NOT_INITIALIZED = 1, ALLOC_FAILED = 3, INVALID_VALUE = 7,
             EXECUTION_FAILED = 13, NOT_SUPPORTED = 15 };
enum : int { R_32F = 0, R_16BF = 14 };                       // cudaDataType_t
enum : int { COMPUTE_32F = 68 };                             // cublasComputeType_t
enum : int { OP_N = 0, OP_T = 1, OP_C = 2 };                 // cublasOperation_t
enum : int { FILL_FULL = 2 };                                // cublasFillMode_t
enum : uint32_t { EPI_DEFAULT = 1, EPI_BIAS = 4 };           // cublasLtEpilogue_t
enum : int { ORDER_COL = 0, POINTER_HOST = 0, BATCH_STRIDED = 0, SEARCH_BEST_FIT = 0 };
enum DescAttr : int { D_COMPUTE = 0, D_SCALE = 1, D_POINTER_MODE = 2, D_TRANSA = 3, D_TRANSB = 4,
    D_TRANSC = 5, D_FILL = 6, D_EPILOGUE = 7, D_BIAS_POINTER = 8, D_BIAS_BATCH_STRIDE = 10,
    D_AUX_POINTER = 11, D_AUX_LD = 12, D_AUX_BATCH_STRIDE = 13, D_ALPHA_VEC_STRIDE = 14,
    D_SM_COUNT = 15, D_A_SCALE = 17, D_B_SCALE = 18, D_C_SCALE = 19, D_D_SCALE = 20,
    D_AMAX_D = 21, D_AUX_TYPE = 22, D_AUX_SCALE = 23, D_AUX_AMAX = 24, D_FAST_ACCUM = 25,
    D_BIAS_TYPE = 26 };
enum LayoutAttr : int { L_TYPE = 0, L_ORDER = 1, L_ROWS = 2, L_COLS = 3, L_LD = 4, L_BATCH = 5,
    L_STRIDE = 6, L_PLANE_OFFSET = 7, L_BATCH_MODE = 8 };
enum PrefAttr : int { P_SEARCH = 0, P_MAX_WORKSPACE = 1, P_REDUCTION_MASK = 3, P_ALIGN_A = 5,
    P_ALIGN_D = 8, P_MAX_WAVES = 9, P_IMPL_MASK = 12 };
enum AlgoAttr : int { A_ID = 0, A_TILE_ID = 1, A_SPLITK_NUM = 2, A_REDUCTION_SCHEME = 3,
    A_STAGES_ID = 6 };                                       // cublasLtMatmulAlgoConfigAttributes_t
enum : uint32_t { RED_NONE = 0, RED_INPLACE = 1, RED_MASK = 7 };  // cublasLtReductionScheme_t

// cublasLtMatmulAlgo_t and cublasLtMatmulHeuristicResult_t, byte for byte.
struct Algo { uint64_t data[8]; };
struct HeuristicResult {
    Algo algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
};
static_assert(sizeof(Algo) == 64, "cublasLtMatmulAlgo_t is 8 u64");
static_assert(sizeof(HeuristicResult) == 96 && offsetof(HeuristicResult, state) == 72,
              "cublasLtMatmulHeuristicResult_t layout");

constexpr uint64_t kAlgoTag = 0x544C4556'52455753ull;  // "SWERVELT" in memory: our algorithm
// Our algorithm's words: data[0] the tag, [1] the problem class (Problem::fingerprint), [2] the
// promised alignments (16 bits each, A B C D), [3] workspace bytes, [4] SPLITK_NUM,
// [5] REDUCTION_SCHEME, [6] the K order (0: ascending; 1: descending, a narrow-tile kernel family
// that sums K the other way: see kReversedK in cublaslt.cpp).
enum : int { W_TAG = 0, W_CLASS = 1, W_ALIGN = 2, W_WORKSPACE = 3, W_SPLITK = 4, W_REDUCTION = 5, W_KORDER = 6 };
constexpr uint64_t kEmuSms = 16, kTile = 64, kMinChunk = 32, kMaxSplits = 8;
