// Stand-in for NVIDIA's libcublasLt.so on the emulated CUDA device (issue 14): the subset of the
// cuBLASLt C API that src/backend/cuda/gemm.rs calls through cudarc 0.19 (dlopen + dlsym by name),
// with the enum values and struct layouts of cudarc's `cublaslt::sys` (feature cuda-13000).
//
// What it computes: a reference GEMM, column-major as cuBLAS defines it, per batch
//     D = alpha op(A) op(B) + beta C (+ bias[i] broadcast over the n columns, EPILOGUE_BIAS)
// with op(A) m x k, op(B) k x n, C and D m x n. Each output element is summed in fp32 from operands
// converted to fp32, as tensor cores accumulate in fp32, in the order the algorithm says: with a
// split-K count of s (CUBLASLT_ALGO_CONFIG_SPLITK_NUM), k is cut into s contiguous chunks of
// ceil(k / s), each chunk is summed in order (p = k0, k0 + 1, ...) from zero, and the chunk sums
// are added in chunk order; s = 1 is one in-order sum over 0..k-1. The hardware's order (MMA
// tiling) differs, so results may differ from a GPU's in the last bits of fp32, and a bf16 output
// by one ulp where that flips the rounding. The
// epilogue is fp32 (the scale type): alpha * acc, + beta * C (C is not read when beta == 0, as in
// cuBLAS), + bias, then one rounding to D's type (round-to-nearest-even for bf16, NaN kept NaN).
//
// Supported (cuBLASLt docs, cublasLtMatmul, "datatypes supported" table, CUBLAS_COMPUTE_32F rows):
// compute type CUBLAS_COMPUTE_32F with scale type CUDA_R_32F, and A/B/C/D types
// bf16/bf16/bf16/bf16, bf16/bf16/f32/f32 or f32/f32/f32/f32; column-major (CUBLASLT_ORDER_COL)
// layouts with any ld >= rows, strided batches (BATCH_COUNT, STRIDED_BATCH_OFFSET), transposes
// N and T (C for real types is T), epilogues DEFAULT and BIAS (bias type = D type, the documented
// default), host pointer mode. Anything else returns CUBLAS_STATUS_NOT_SUPPORTED or
// CUBLAS_STATUS_INVALID_VALUE and prints one stderr line "swerve emulated cuBLASLt: ..." naming
// what was refused, so an unsupported use never runs silently.
//
// Device memory is host memory in emulation (CUdeviceptr values are host addresses), so the GEMM
// dereferences A/B/C/D/bias directly. cublasLtMatmul validates everything at call time, copies
// every value it needs (dims, types, pointers, bias pointer, alpha, beta) into a heap work item
// and hands it to the emulated driver's stream with swerve_emu_stream_enqueue (emu/driver.cpp):
// the driver runs it in stream order, or records it while the stream captures a graph, so each
// replay runs it with the recorded values (and the memory's contents at replay). Descriptors may
// change or be destroyed after the call without affecting a recorded item. The driver's symbol is
// a weak reference, else looked up at call time (see find_enqueue); if no driver is in the
// process (standalone tests), the GEMM runs immediately on the calling thread.
//
// The heuristic models the one behaviour of the real library that decides bits (issue 25): its
// choice depends on the problem's size. Like cuBLASLt for a small m x n with a long k, it splits K
// when the output has too few 64 x 64 tiles to fill the (emulated) 16 SMs: s = the largest power
// of two <= min(16 / tiles, k / 32, 8). So a GEMM planned per problem sums a 1-row product in
// chunks and a 1024-row one in order: different bits for the same output row, as on a GPU. The
// preference CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = CUBLASLT_REDUCTION_SCHEME_NONE (0) rules
// split-K out (s = 1). cublasLtMatmulAlgoConfigGet/SetAttribute read and set SPLITK_NUM and
// REDUCTION_SCHEME (ID, TILE_ID, STAGES_ID read 0);
//
// A second behaviour models what issue 36's per-M choice must guard against: a library whose
// narrow-tile kernels sum K in another order. Asked for an algorithm with no workspace and no
// reduction scheme (both set explicitly: what gemm_rows.rs asks for each M), for a problem of at
// most 8 columns (token rows) whose k is a multiple of 3, the heuristic returns one that sums
// each output's k products in descending order and rounds its running sums to bf16 every 16
// products (W_KORDER): other bits than the in-order algorithm of the same class at more rows, in
// most bf16 outputs (a real kernel's other K order changes far fewer, which is why the engine's
// probe multiplies many rows), which the engine's probe must notice.
//
// cublasLtMatmulAlgoCheck checks an algo against
// a problem (types, transposes, epilogue, s <= k). cublasLtMatmul with a NULL algo runs the
// heuristic's choice for that problem, as cuBLASLt does.
//
// Single-threaded and unblocked over k: a (512, 256, 1024) GEMM takes about 10-15 ms at -O2.
// Built by build.rs: g++ -std=c++17 -O2 -fPIC -shared -Wl,-soname,libcublasLt.so. Tests:
// emu/tests/cublaslt_test.cpp, driven by tests/emu_cublaslt.rs.

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <new>
#include <vector>

// The driver's stream entry point (emu/driver.cpp): runs run(ctx) in stream order, or records it
// while the stream captures a graph (each replay runs it), and calls drop(ctx) exactly once when
// the item is no longer needed, also when it refuses the item (nonzero return): ctx is the
// driver's from the call on. Weak, so a process without the driver still links.
extern "C" int swerve_emu_stream_enqueue(void* stream, void (*run)(void*), void* ctx,
                                         void (*drop)(void*)) __attribute__((weak));

namespace {

#include "cublaslt_abi.h"  // enum values, Algo / HeuristicResult, algo words

// The opaque objects behind cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t and
// cublasLtMatmulPreference_t, with the documented defaults. The magic number is cleared on
// destroy, so a foreign or (usually) a destroyed object is refused rather than used.
struct Handle {
    static constexpr uint64_t kMagic = 0x4C54'68616E646Cull;
    uint64_t magic = kMagic;
};
struct Desc {
    static constexpr uint64_t kMagic = 0x4C54'64657363ull;
    uint64_t magic = kMagic;
    int32_t compute = 0, scale = 0, pointer_mode = POINTER_HOST;
    int32_t trans_a = OP_N, trans_b = OP_N, trans_c = OP_N, fill = FILL_FULL;
    uint32_t epilogue = EPI_DEFAULT;
    const void* bias = nullptr;
    int64_t bias_batch_stride = 0;
    int32_t bias_type = -1;  // -1: same as D (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE default)
};
struct Layout {
    static constexpr uint64_t kMagic = 0x4C54'6C61796Full;
    uint64_t magic = kMagic;
    uint32_t type = 0;
    int32_t order = ORDER_COL, batch = 1, batch_mode = BATCH_STRIDED;
    uint64_t rows = 0, cols = 0;
    int64_t ld = 0, stride = 0;
};
struct Pref {
    static constexpr uint64_t kMagic = 0x4C54'70726566ull;
    uint64_t magic = kMagic;
    uint32_t search = SEARCH_BEST_FIT;
    uint64_t max_workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256};  // MIN_ALIGNMENT_{A,B,C,D}_BYTES default 256
    uint32_t reduction_mask = RED_MASK;         // REDUCTION_SCHEME_MASK default: all schemes
};

__attribute__((format(printf, 2, 3))) int fail(int status, const char* fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "swerve emulated cuBLASLt: %s\n", line);
    return status;
}

const char* type_name(int t) {
    return t == R_32F ? "CUDA_R_32F" : t == R_16BF ? "CUDA_R_16BF" : t == 2 ? "CUDA_R_16F"
         : t == 1 ? "CUDA_R_64F" : t == 3 ? "CUDA_R_8I" : t == 28 ? "CUDA_R_8F_E4M3"
         : t == 29 ? "CUDA_R_8F_E5M2" : "an unemulated cudaDataType";
}
using ull = unsigned long long;
size_t elem_size(int t) { return t == R_32F ? 4 : 2; }

// Attribute setters: "CUBLAS_STATUS_INVALID_VALUE if buf is NULL or sizeInBytes doesn't match
// the size of the internal storage for the selected attribute" (cuBLASLt docs, *SetAttribute).
template <class T>
int read_attr(const char* fn, int attr, const void* buf, size_t size, T* out) {
    if (!buf) return fail(INVALID_VALUE, "%s: attribute %d: buf is NULL", fn, attr);
    if (size != sizeof(T))
        return fail(INVALID_VALUE, "%s: attribute %d: sizeInBytes %zu, the attribute holds %zu",
                    fn, attr, size, sizeof(T));
    memcpy(out, buf, sizeof(T));
    return OK;
}

template <class T>
T* live(const void* p) {
    auto o = static_cast<T*>(const_cast<void*>(p));
    return o && o->magic == T::kMagic ? o : nullptr;
}
template <class T>
int make(const char* fn, void** out, T** made) {
    if (!out) return fail(INVALID_VALUE, "%s: the output pointer is NULL", fn);
    *out = *made = new (std::nothrow) T;
    return *made ? OK : fail(ALLOC_FAILED, "%s: out of memory", fn);
}
template <class T>
int destroy(const char* fn, void* p) {
    if (!p) return OK;
    T* o = live<T>(p);
    if (!o) return fail(INVALID_VALUE, "%s: %p is not a live object", fn, p);
    o->magic = 0;
    delete o;
    return OK;
}

// ---- validation shared by the heuristic and the matmul --------------------------------------
struct Problem {
    int type_ab, type_cd;
    bool trans_a, trans_b, bias;
    uint64_t m, n, k;
    int32_t batch;
    // What an algorithm is chosen for (types, transposes, epilogue); shapes may vary.
    uint64_t fingerprint() const {
        return uint64_t(type_ab) | uint64_t(type_cd) << 8 | uint64_t(trans_a) << 16 |
               uint64_t(trans_b) << 17 | uint64_t(bias) << 18;
    }
};

bool is_trans(int op) { return op == OP_T || op == OP_C; }  // OP_C == OP_T for real types

int check_problem(const char* fn, const void* handle, const void* desc, const void* const lay[4],
                  Problem* pr) {
    const char* names = "ABCD";
    if (!live<Handle>(handle))
        return fail(NOT_INITIALIZED, "%s: the handle is NULL or not from cublasLtCreate", fn);
    const Desc* op = live<Desc>(desc);
    if (!op)
        return fail(INVALID_VALUE, "%s: the matmul descriptor is NULL or not a live one", fn);
    const Layout* L[4];
    for (int i = 0; i < 4; ++i) {
        if (!(L[i] = live<Layout>(lay[i])))
            return fail(INVALID_VALUE, "%s: layout %c is NULL or not a live one", fn, names[i]);
    }
    if (op->compute != COMPUTE_32F)
        return fail(NOT_SUPPORTED, "%s: compute type %d; only CUBLAS_COMPUTE_32F (68) is emulated",
                    fn, op->compute);
    if (op->scale != R_32F)
        return fail(NOT_SUPPORTED, "%s: scale type %s (%d); CUBLAS_COMPUTE_32F is emulated with "
                    "scale type CUDA_R_32F only", fn, type_name(op->scale), op->scale);
    if (op->pointer_mode != POINTER_HOST)
        return fail(NOT_SUPPORTED, "%s: pointer mode %d; only CUBLASLT_POINTER_MODE_HOST is "
                    "emulated (alpha/beta read from host memory at call time)", fn,
                    op->pointer_mode);
    for (int t : {op->trans_a, op->trans_b})
        if (t != OP_N && !is_trans(t))
            return fail(INVALID_VALUE, "%s: transpose %d is not a cublasOperation_t", fn, t);
    // CUBLASLT_MATMUL_DESC_TRANSC: "Currently only CUBLAS_OP_N is supported."
    if (op->trans_c != OP_N)
        return fail(NOT_SUPPORTED, "%s: TRANSC %d; cuBLASLt supports only CUBLAS_OP_N", fn,
                    op->trans_c);
    if (op->fill != FILL_FULL)
        return fail(NOT_SUPPORTED, "%s: fill mode %d; only CUBLAS_FILL_MODE_FULL is emulated", fn,
                    op->fill);
    if (op->epilogue != EPI_DEFAULT && op->epilogue != EPI_BIAS)
        return fail(NOT_SUPPORTED, "%s: epilogue %u; only CUBLASLT_EPILOGUE_DEFAULT (1) and "
                    "CUBLASLT_EPILOGUE_BIAS (4) are emulated", fn, op->epilogue);
    for (int i = 0; i < 4; ++i) {
        const Layout& l = *L[i];
        if (l.order != ORDER_COL)
            return fail(NOT_SUPPORTED, "%s: layout %c has order %d; only CUBLASLT_ORDER_COL is "
                        "emulated", fn, names[i], l.order);
        if (l.batch_mode != BATCH_STRIDED)
            return fail(NOT_SUPPORTED, "%s: layout %c has batch mode %d; only strided batches are "
                        "emulated", fn, names[i], l.batch_mode);
        // CUBLASLT_MATRIX_LAYOUT_ROWS/COLS: "usually only values that can be expressed as
        // int32_t are supported".
        if (l.rows > INT32_MAX || l.cols > INT32_MAX)
            return fail(NOT_SUPPORTED, "%s: layout %c is %llu x %llu, beyond int32", fn, names[i],
                        ull(l.rows), ull(l.cols));
        // CUBLASLT_MATRIX_LAYOUT_LD: non-negative and, for CUBLASLT_ORDER_COL, >= ROWS.
        if (l.ld < 0 || uint64_t(l.ld) < l.rows)
            return fail(INVALID_VALUE, "%s: layout %c has ld %lld below its %llu rows", fn,
                        names[i], (long long)l.ld, ull(l.rows));
        if (l.batch < 1)
            return fail(INVALID_VALUE, "%s: layout %c has batch count %d", fn, names[i], l.batch);
        if (l.batch != L[3]->batch)
            return fail(INVALID_VALUE, "%s: layout %c has batch count %d, D has %d (the emulator "
                        "requires equal batch counts)", fn, names[i], l.batch, L[3]->batch);
    }
    // Datatypes table of cublasLtMatmul for CUBLAS_COMPUTE_32F / CUDA_R_32F: Atype == Btype,
    // Ctype == Dtype, and (bf16, bf16), (bf16, f32) or (f32, f32) for (A/B, C/D).
    int ta = L[0]->type, tb = L[1]->type, tc = L[2]->type, td = L[3]->type;
    bool types_ok = ta == tb && tc == td && (ta == R_16BF || ta == R_32F) &&
                    (td == R_32F || td == ta);
    if (!types_ok)
        return fail(NOT_SUPPORTED, "%s: A/B/C/D types %s/%s/%s/%s; emulated with "
                    "CUBLAS_COMPUTE_32F: A/B bf16 with C/D bf16 or fp32, or all fp32", fn,
                    type_name(ta), type_name(tb), type_name(tc), type_name(td));
    pr->type_ab = ta, pr->type_cd = td, pr->batch = L[3]->batch;
    pr->trans_a = is_trans(op->trans_a), pr->trans_b = is_trans(op->trans_b);
    pr->m = L[3]->rows, pr->n = L[3]->cols, pr->k = pr->trans_a ? L[0]->rows : L[0]->cols;
    // op(A) is m x k, op(B) k x n, C m x n (cublasLtMatmul's definition of the operation).
    uint64_t a_rows = pr->trans_a ? L[0]->cols : L[0]->rows;
    uint64_t b_rows = pr->trans_b ? L[1]->cols : L[1]->rows;
    uint64_t b_cols = pr->trans_b ? L[1]->rows : L[1]->cols;
    if (a_rows != pr->m || b_rows != pr->k || b_cols != pr->n)
        return fail(INVALID_VALUE, "%s: shapes disagree: D is %llu x %llu, op(A) %llu x %llu "
                    "(TRANSA %d), op(B) %llu x %llu (TRANSB %d)", fn, ull(pr->m), ull(pr->n),
                    ull(a_rows), ull(pr->k), op->trans_a, ull(b_rows), ull(b_cols), op->trans_b);
    if (L[2]->rows != pr->m || L[2]->cols != pr->n)
        return fail(INVALID_VALUE, "%s: C is %llu x %llu, D is %llu x %llu", fn, ull(L[2]->rows),
                    ull(L[2]->cols), ull(pr->m), ull(pr->n));
    // Batches of D must not overlap (the result would depend on the order they are written).
    int64_t d_span = L[3]->ld * int64_t(pr->n);
    if (pr->batch > 1 && pr->m > 0 && pr->n > 0 && llabs(L[3]->stride) < d_span)
        return fail(INVALID_VALUE, "%s: D's batch stride %lld overlaps its %lld-element matrices",
                    fn, (long long)L[3]->stride, (long long)d_span);
    pr->bias = op->epilogue == EPI_BIAS;
    // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: default -1, "bias vector elements are the same type
    // as the elements of the output matrix (Dtype)" (the exceptions are IMMA and fp8 kernels).
    if (pr->bias && op->bias_type != -1 && op->bias_type != td)
        return fail(NOT_SUPPORTED, "%s: bias type %s with a %s D; the emulator supports the "
                    "documented default (bias type = D type) only", fn, type_name(op->bias_type),
                    type_name(td));
    return OK;
}

// The split-K count the heuristic picks for `pr` (see the header): K is split only when the
// output has fewer 64 x 64 tiles than the emulated SMs, into at most 8 chunks of >= 32.
uint64_t heuristic_splits(const Problem& pr) {
    const uint64_t tiles = (pr.m + kTile - 1) / kTile * ((pr.n + kTile - 1) / kTile) *
                           uint64_t(pr.batch);
    if (tiles == 0 || tiles >= kEmuSms) return 1;
    uint64_t want = kEmuSms / tiles;
    if (pr.k / kMinChunk < want) want = pr.k / kMinChunk;
    if (kMaxSplits < want) want = kMaxSplits;
    uint64_t s = 1;
    while (s * 2 <= want) s *= 2;
    return s;
}

// An algo handed to cublasLtMatmul or cublasLtMatmulAlgoCheck: ours, chosen for this problem
// class, and with a split-K count the problem's k allows.
int check_algo(const char* fn, const Algo& al, const Problem& pr) {
    if (al.data[W_TAG] != kAlgoTag)
        return fail(INVALID_VALUE, "%s: the algo was not returned by this library's "
                    "cublasLtMatmulAlgoGetHeuristic (tag %#llx)", fn, ull(al.data[W_TAG]));
    if (al.data[W_CLASS] != pr.fingerprint())
        return fail(INVALID_VALUE, "%s: the algo was chosen for another problem (types, "
                    "transposes or epilogue: %#llx, this call %#llx)", fn,
                    ull(al.data[W_CLASS]), ull(pr.fingerprint()));
    const uint64_t splits = al.data[W_SPLITK];
    if (splits < 1 || (pr.k > 0 && splits > pr.k))
        return fail(NOT_SUPPORTED, "%s: SPLITK_NUM %llu for k = %llu", fn, ull(splits),
                    ull(pr.k));
    if ((splits > 1) != (al.data[W_REDUCTION] != RED_NONE))
        return fail(NOT_SUPPORTED, "%s: SPLITK_NUM %llu with REDUCTION_SCHEME %llu", fn,
                    ull(splits), ull(al.data[W_REDUCTION]));
    return OK;
}

// ---- the GEMM ---------------------------------------------------------------------------------
float bf16_to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f32_to_bf16(float f) {  // round to nearest, ties to even; NaN stays (quiet) NaN
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
inline float load(const void* base, int type, int64_t i) {
    return type == R_32F ? static_cast<const float*>(base)[i]
                         : bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

struct Matrix { const char* ptr; int64_t ld, stride; };  // stride in elements

// One enqueued cublasLtMatmul, everything copied by value at call time.
struct Work {
    int type_ab, type_cd;
    bool trans_a, trans_b, read_c, bias;
    int64_t m, n, k, batch, splits;
    bool reversed_k;  // W_KORDER 1: each chunk summed from its last k down
    Matrix a, b, c, d;
    const char* bias_ptr;
    int64_t bias_stride;
    float alpha, beta;
};

typedef float v4 __attribute__((vector_size(16)));
constexpr int64_t MR = 4, NR = 8;  // register block: 4 rows x 8 columns of D (8 v4 accumulators)

void run_batch(const Work& w, int64_t batch, std::vector<float>& ap, std::vector<float>& bp) {
    const int64_t m = w.m, n = w.n, k = w.k;
    const size_t ea = elem_size(w.type_ab), ed = elem_size(w.type_cd);
    const char* A = w.a.ptr + batch * w.a.stride * int64_t(ea);
    const char* B = w.b.ptr + batch * w.b.stride * int64_t(ea);
    // Panels: ap holds op(A) in blocks of MR rows, element (i, p) at [(i/MR)*k*MR + p*MR + i%MR];
    // bp holds op(B) in blocks of NR columns, (p, j) at [(j/NR)*k*NR + p*NR + j%NR]. Rows and
    // columns past m and n stay zero and their results are never stored.
    for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p)
            ap[(i / MR) * k * MR + p * MR + i % MR] =
                load(A, w.type_ab, w.trans_a ? p + i * w.a.ld : i + p * w.a.ld);
    for (int64_t j = 0; j < n; ++j)
        for (int64_t p = 0; p < k; ++p)
            bp[(j / NR) * k * NR + p * NR + j % NR] =
                load(B, w.type_ab, w.trans_b ? j + p * w.b.ld : p + j * w.b.ld);
    const char* C = w.read_c ? w.c.ptr + batch * w.c.stride * int64_t(ed) : nullptr;
    char* D = const_cast<char*>(w.d.ptr) + batch * w.d.stride * int64_t(ed);
    const char* bias = w.bias ? w.bias_ptr + batch * w.bias_stride * int64_t(ed) : nullptr;
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
        const float* pa = &ap[(i0 / MR) * k * MR];
        for (int64_t j0 = 0; j0 < n; j0 += NR) {
            const float* pb = &bp[(j0 / NR) * k * NR];
            // Split-K: each chunk of k summed in order from zero, the chunk sums added in order.
            v4 t00 = {}, t01 = {}, t10 = {}, t11 = {}, t20 = {}, t21 = {}, t30 = {}, t31 = {};
            const int64_t chunk = (k + w.splits - 1) / w.splits;
            for (int64_t k0 = 0; k0 < k; k0 += chunk) {
                // Eight named accumulators so they stay in registers.
                v4 c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
                const int64_t k1 = k0 + chunk < k ? k0 + chunk : k;
                for (int64_t q = k0; q < k1; ++q) {  // each output's chunk sum runs over p in order
                    const int64_t p = w.reversed_k ? k0 + k1 - 1 - q : q;
                    if (w.reversed_k && (q - k0) % 16 == 0) {  // the other family's bf16 partials
                        for (v4* c : {&c00, &c01, &c10, &c11, &c20, &c21, &c30, &c31})
                            for (int e = 0; e < 4; ++e) (*c)[e] = bf16_to_f32(f32_to_bf16((*c)[e]));
                    }
                    v4 b0, b1;
                    memcpy(&b0, pb + p * NR, 16);
                    memcpy(&b1, pb + p * NR + 4, 16);
                    const float* a = pa + p * MR;
                    c00 += a[0] * b0; c01 += a[0] * b1;
                    c10 += a[1] * b0; c11 += a[1] * b1;
                    c20 += a[2] * b0; c21 += a[2] * b1;
                    c30 += a[3] * b0; c31 += a[3] * b1;
                }
                if (k0 == 0) {  // the first chunk's sum is the total so far (no 0 + x)
                    t00 = c00, t01 = c01, t10 = c10, t11 = c11;
                    t20 = c20, t21 = c21, t30 = c30, t31 = c31;
                } else {
                    t00 += c00, t01 += c01, t10 += c10, t11 += c11;
                    t20 += c20, t21 += c21, t30 += c30, t31 += c31;
                }
            }
            float acc[MR][NR];
            const v4 all[MR][2] = {{t00, t01}, {t10, t11}, {t20, t21}, {t30, t31}};
            memcpy(acc, all, sizeof acc);
            for (int64_t r = 0; r < MR && i0 + r < m; ++r)
                for (int64_t s = 0; s < NR && j0 + s < n; ++s) {
                    const int64_t i = i0 + r, j = j0 + s;
                    float v = w.alpha * acc[r][s];
                    if (C) v += w.beta * load(C, w.type_cd, i + j * w.c.ld);
                    if (bias) v += load(bias, w.type_cd, i);
                    if (w.type_cd == R_32F)
                        reinterpret_cast<float*>(D)[i + j * w.d.ld] = v;
                    else
                        reinterpret_cast<uint16_t*>(D)[i + j * w.d.ld] = f32_to_bf16(v);
                }
        }
    }
}

void run_work(void* ctx) {
    const Work& w = *static_cast<const Work*>(ctx);
    if (w.m == 0 || w.n == 0) return;
    try {
        std::vector<float> ap(size_t((w.m + MR - 1) / MR * MR * w.k));
        std::vector<float> bp(size_t((w.n + NR - 1) / NR * NR * w.k));
        for (int64_t b = 0; b < w.batch; ++b) run_batch(w, b, ap, bp);
    } catch (const std::bad_alloc&) {
        fail(0, "cublasLtMatmul: out of host memory for a %lld x %lld x %lld GEMM's panels",
             (long long)w.m, (long long)w.n, (long long)w.k);
        abort();
    }
}
void drop_work(void* ctx) { delete static_cast<Work*>(ctx); }

using EnqueueFn = int (*)(void*, void (*)(void*), void*, void (*)(void*));

// The driver's enqueue. cudarc dlopens libcuda and libcublasLt with RTLD_LOCAL, so the weak
// reference above stays NULL when both are stand-ins loaded that way: look the symbol up in the
// process and in an already loaded libcuda (RTLD_NOLOAD never loads one).
EnqueueFn find_enqueue() {
    if (swerve_emu_stream_enqueue) return swerve_emu_stream_enqueue;
    static std::atomic<EnqueueFn> found{nullptr};
    if (EnqueueFn f = found.load(std::memory_order_acquire)) return f;
    void* sym = dlsym(RTLD_DEFAULT, "swerve_emu_stream_enqueue");
    for (const char* lib : {"libcuda.so.1", "libcuda.so"}) {
        if (sym) break;
        if (void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD)) {
            sym = dlsym(h, "swerve_emu_stream_enqueue");
            dlclose(h);
        }
    }
    EnqueueFn f = reinterpret_cast<EnqueueFn>(sym);
    if (f) found.store(f, std::memory_order_release);
    return f;
}

}  // namespace

// ---- the C API ----------------------------------------------------------------------------------
#define API extern "C" __attribute__((visibility("default")))

API int cublasLtCreate(void** handle) {
    Handle* h;
    return make("cublasLtCreate", handle, &h);
}
API int cublasLtDestroy(void* handle) {  // NOT_INITIALIZED for a NULL or dead handle (docs)
    if (!live<Handle>(handle))
        return fail(NOT_INITIALIZED, "cublasLtDestroy: the handle is NULL or not a live one");
    return destroy<Handle>("cublasLtDestroy", handle);
}
API int cublasLtMatmulDescCreate(void** desc, int compute_type, int scale_type) {
    Desc* d;
    if (int st = make("cublasLtMatmulDescCreate", desc, &d)) return st;
    d->compute = compute_type;
    d->scale = scale_type;
    return OK;
}
API int cublasLtMatmulDescDestroy(void* desc) {
    return destroy<Desc>("cublasLtMatmulDescDestroy", desc);
}
API int cublasLtMatmulDescSetAttribute(void* desc, int attr, const void* buf, size_t size) {
    const char* fn = "cublasLtMatmulDescSetAttribute";
    Desc* d = live<Desc>(desc);
    if (!d)
        return fail(INVALID_VALUE, "%s: the descriptor is NULL or not a live one", fn);
    switch (attr) {
        case D_COMPUTE: return read_attr(fn, attr, buf, size, &d->compute);
        case D_SCALE: return read_attr(fn, attr, buf, size, &d->scale);
        case D_POINTER_MODE: return read_attr(fn, attr, buf, size, &d->pointer_mode);
        case D_TRANSA: return read_attr(fn, attr, buf, size, &d->trans_a);
        case D_TRANSB: return read_attr(fn, attr, buf, size, &d->trans_b);
        case D_TRANSC: return read_attr(fn, attr, buf, size, &d->trans_c);
        case D_FILL: return read_attr(fn, attr, buf, size, &d->fill);
        case D_EPILOGUE: return read_attr(fn, attr, buf, size, &d->epilogue);
        case D_BIAS_POINTER: return read_attr(fn, attr, buf, size, &d->bias);
        case D_BIAS_BATCH_STRIDE: return read_attr(fn, attr, buf, size, &d->bias_batch_stride);
        case D_BIAS_TYPE: return read_attr(fn, attr, buf, size, &d->bias_type);
        case D_SM_COUNT: { int32_t v; return read_attr(fn, attr, buf, size, &v); }  // a hint
        case D_FAST_ACCUM: { int8_t v; return read_attr(fn, attr, buf, size, &v); }  // fp8 only
        case D_AUX_LD: case D_AUX_BATCH_STRIDE: case D_ALPHA_VEC_STRIDE: {
            int64_t v;  // only read by epilogues and pointer modes that are refused anyway
            return read_attr(fn, attr, buf, size, &v);
        }
        case D_AUX_TYPE: { int32_t v; return read_attr(fn, attr, buf, size, &v); }
        case D_AUX_POINTER: case D_A_SCALE: case D_B_SCALE: case D_C_SCALE: case D_D_SCALE:
        case D_AMAX_D: case D_AUX_SCALE: case D_AUX_AMAX: {
            const void* p = nullptr;
            if (int st = read_attr(fn, attr, buf, size, &p)) return st;
            return p ? fail(NOT_SUPPORTED, "%s: attribute %d (scale/amax/aux pointer) set to "
                            "%p; the emulator supports only its default NULL", fn, attr, p)
                     : OK;
        }
        default:
            return fail(NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, attr);
    }
}

API int cublasLtMatrixLayoutCreate(void** layout, int type, uint64_t rows, uint64_t cols,
                                   int64_t ld) {
    Layout* l;
    if (int st = make("cublasLtMatrixLayoutCreate", layout, &l)) return st;
    l->type = uint32_t(type);
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    return OK;
}
API int cublasLtMatrixLayoutDestroy(void* layout) {
    return destroy<Layout>("cublasLtMatrixLayoutDestroy", layout);
}
API int cublasLtMatrixLayoutSetAttribute(void* layout, int attr, const void* buf, size_t size) {
    const char* fn = "cublasLtMatrixLayoutSetAttribute";
    Layout* l = live<Layout>(layout);
    if (!l)
        return fail(INVALID_VALUE, "%s: the layout is NULL or not a live one", fn);
    switch (attr) {
        case L_TYPE: return read_attr(fn, attr, buf, size, &l->type);
        case L_ORDER: return read_attr(fn, attr, buf, size, &l->order);
        case L_ROWS: return read_attr(fn, attr, buf, size, &l->rows);
        case L_COLS: return read_attr(fn, attr, buf, size, &l->cols);
        case L_LD: return read_attr(fn, attr, buf, size, &l->ld);
        case L_BATCH: return read_attr(fn, attr, buf, size, &l->batch);
        case L_STRIDE: return read_attr(fn, attr, buf, size, &l->stride);
        case L_BATCH_MODE: return read_attr(fn, attr, buf, size, &l->batch_mode);
        case L_PLANE_OFFSET: {
            int64_t v = 0;
            if (int st = read_attr(fn, attr, buf, size, &v)) return st;
            return v ? fail(NOT_SUPPORTED, "%s: planar complex layouts (PLANE_OFFSET %lld) are "
                            "not emulated", fn, (long long)v)
                     : OK;
        }
        default: return fail(NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, attr);
    }
}

API int cublasLtMatmulPreferenceCreate(void** pref) {
    Pref* p;
    return make("cublasLtMatmulPreferenceCreate", pref, &p);
}
API int cublasLtMatmulPreferenceDestroy(void* pref) {
    return destroy<Pref>("cublasLtMatmulPreferenceDestroy", pref);
}
API int cublasLtMatmulPreferenceSetAttribute(void* pref, int attr, const void* buf, size_t size) {
    const char* fn = "cublasLtMatmulPreferenceSetAttribute";
    Pref* p = live<Pref>(pref);
    if (!p) return fail(INVALID_VALUE, "%s: the preference is NULL or not a live one", fn);
    switch (attr) {
        case P_SEARCH: return read_attr(fn, attr, buf, size, &p->search);
        case P_MAX_WORKSPACE: return read_attr(fn, attr, buf, size, &p->max_workspace);
        case P_REDUCTION_MASK: return read_attr(fn, attr, buf, size, &p->reduction_mask);
        case P_MAX_WAVES: { float v; return read_attr(fn, attr, buf, size, &v); }
        case P_IMPL_MASK: { uint64_t v; return read_attr(fn, attr, buf, size, &v); }
        default:
            if (attr < P_ALIGN_A || attr > P_ALIGN_D)
                return fail(NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, attr);
            uint32_t v = 0;
            if (int st = read_attr(fn, attr, buf, size, &v)) return st;
            if (v == 0 || (v & (v - 1)))
                return fail(INVALID_VALUE, "%s: MIN_ALIGNMENT_%c_BYTES %u is not a power of two",
                            fn, "ABCD"[attr - P_ALIGN_A], v);
            p->align[attr - P_ALIGN_A] = v;
            return OK;
    }
}

// One algorithm: a tag, the problem it was chosen for, the alignments it was promised, and no
// workspace. cuBLASLt docs: NOT_SUPPORTED when no algorithm fits, INVALID_VALUE when
// requestedAlgoCount <= 0.
API int cublasLtMatmulAlgoGetHeuristic(void* handle, void* desc, void* a, void* b, void* c,
                                       void* d, void* pref, int requested, void* results,
                                       int* count) {
    const char* fn = "cublasLtMatmulAlgoGetHeuristic";
    if (count) *count = 0;
    if (requested <= 0 || !results || !count)
        return fail(INVALID_VALUE, "%s: requestedAlgoCount %d, results %p, returnAlgoCount %p",
                    fn, requested, results, static_cast<void*>(count));
    const Pref* p = live<Pref>(pref);
    if (!p)
        return fail(INVALID_VALUE, "%s: the preference is NULL or not a live one", fn);
    const void* lay[4] = {a, b, c, d};
    Problem pr;
    if (int st = check_problem(fn, handle, desc, lay, &pr)) return st;
    if (p->search != SEARCH_BEST_FIT)
        return fail(NOT_SUPPORTED, "%s: search mode %u; only CUBLASLT_SEARCH_BEST_FIT", fn,
                    p->search);
    uint64_t aligns = 0;
    for (int i = 0; i < 4; ++i) {
        size_t es = elem_size(i < 2 ? pr.type_ab : pr.type_cd);
        if (p->align[i] < es)
            return fail(NOT_SUPPORTED, "%s: no algorithm for MIN_ALIGNMENT_%c_BYTES %u, below "
                        "the %zu-byte elements", fn, "ABCD"[i], p->align[i], es);
        aligns |= uint64_t(p->align[i] > 256 ? 256 : p->align[i]) << (16 * i);
    }
    HeuristicResult r;
    memset(&r, 0, sizeof r);
    r.algo.data[W_TAG] = kAlgoTag;
    r.algo.data[W_CLASS] = pr.fingerprint();
    r.algo.data[W_ALIGN] = aligns;
    r.algo.data[W_WORKSPACE] = 0;  // workspace bytes needed (in-place reduction)
    // Split-K only where the mask allows a reduction scheme (NONE = 0 rules it out).
    const uint64_t splits = (p->reduction_mask & RED_MASK) ? heuristic_splits(pr) : 1;
    r.algo.data[W_SPLITK] = splits;
    r.algo.data[W_REDUCTION] = splits > 1 ? RED_INPLACE : RED_NONE;
    const bool narrow_family = p->max_workspace == 0 && (p->reduction_mask & RED_MASK) == 0;
    r.algo.data[W_KORDER] = narrow_family && pr.n <= 8 && pr.k % 3 == 0 ? 1 : 0;
    r.workspaceSize = 0;
    r.state = OK;
    r.wavesCount = 1.0f;
    memcpy(results, &r, sizeof r);
    *count = 1;
    return OK;
}

API int cublasLtMatmul(void* handle, void* desc, const void* alpha, const void* a, void* a_desc,
                       const void* b, void* b_desc, const void* beta, const void* c, void* c_desc,
                       void* d, void* d_desc, const void* algo, void* workspace,
                       size_t workspace_size, void* stream) {
    const char* fn = "cublasLtMatmul";
    const void* lay[4] = {a_desc, b_desc, c_desc, d_desc};
    Problem pr;
    if (int st = check_problem(fn, handle, desc, lay, &pr)) return st;
    const Desc& op = *static_cast<const Desc*>(desc);
    const Layout* L[4];
    for (int i = 0; i < 4; ++i) L[i] = static_cast<const Layout*>(lay[i]);
    if (!alpha || !beta)
        return fail(INVALID_VALUE, "%s: alpha %p / beta %p is NULL", fn, alpha, beta);
    float alpha_v, beta_v;  // scale type CUDA_R_32F, host pointer mode: read now
    memcpy(&alpha_v, alpha, 4);
    memcpy(&beta_v, beta, 4);
    const bool read_c = beta_v != 0.0f;  // cuBLAS: C is not read when beta == 0
    const void* ptrs[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i)
        if (!ptrs[i] && (i != 2 || read_c))
            return fail(INVALID_VALUE, "%s: %c is NULL", fn, "ABCD"[i]);
    if (pr.bias && !op.bias)
        return fail(INVALID_VALUE, "%s: CUBLASLT_EPILOGUE_BIAS with a NULL "
                    "CUBLASLT_MATMUL_DESC_BIAS_POINTER", fn);
    uint64_t splits = heuristic_splits(pr);  // a NULL algo: the heuristic's choice
    if (algo) {
        Algo al;
        memcpy(&al, algo, sizeof al);
        if (int st = check_algo(fn, al, pr)) return st;
        splits = al.data[W_SPLITK];
        // The heuristic was promised these alignments (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*).
        for (int i = 0; i < 4; ++i) {
            uint64_t need = (al.data[2] >> (16 * i)) & 0xffff;
            if (ptrs[i] && (i != 2 || read_c) && uintptr_t(ptrs[i]) % need)
                return fail(INVALID_VALUE, "%s: %c = %p is not %llu-byte aligned, as the "
                            "heuristic was told (MIN_ALIGNMENT_%c_BYTES)", fn, "ABCD"[i], ptrs[i],
                            ull(need), "ABCD"[i]);
        }
        if (workspace_size < al.data[3] || (al.data[3] && !workspace))
            return fail(INVALID_VALUE, "%s: workspace of %zu bytes, the algo needs %llu", fn,
                        workspace_size, ull(al.data[3]));
    }
    for (int i = 0; i < 4; ++i) {
        size_t es = elem_size(i < 2 ? pr.type_ab : pr.type_cd);
        if (uintptr_t(ptrs[i]) % es)
            return fail(INVALID_VALUE, "%s: %c = %p is misaligned for %zu-byte elements", fn,
                        "ABCD"[i], ptrs[i], es);
    }
    if (pr.bias && uintptr_t(op.bias) % elem_size(pr.type_cd))
        return fail(INVALID_VALUE, "%s: bias = %p is misaligned", fn, op.bias);
    // In-place (C == D) needs C and D to describe the same memory (cublasLtMatmul: ldc == ldd,
    // same order; the emulator also compares type and batch stride).
    if (c == d && (L[2]->ld != L[3]->ld || L[2]->type != L[3]->type ||
                   (pr.batch > 1 && L[2]->stride != L[3]->stride)))
        return fail(INVALID_VALUE, "%s: C == D in place but their layouts differ (ld %lld vs "
                    "%lld, batch stride %lld vs %lld)", fn, (long long)L[2]->ld,
                    (long long)L[3]->ld, (long long)L[2]->stride, (long long)L[3]->stride);

    Work* w = new (std::nothrow) Work;
    if (!w) return fail(ALLOC_FAILED, "%s: out of memory", fn);
    w->type_ab = pr.type_ab, w->type_cd = pr.type_cd;
    w->trans_a = pr.trans_a, w->trans_b = pr.trans_b, w->read_c = read_c, w->bias = pr.bias;
    w->m = int64_t(pr.m), w->n = int64_t(pr.n), w->k = int64_t(pr.k), w->batch = pr.batch;
    w->splits = int64_t(splits);
    w->reversed_k = algo && static_cast<const Algo*>(algo)->data[W_KORDER] == 1;
    const int64_t one = pr.batch > 1 ? 1 : 0;  // strides only matter for more than one batch
    w->a = {static_cast<const char*>(a), L[0]->ld, L[0]->stride * one};
    w->b = {static_cast<const char*>(b), L[1]->ld, L[1]->stride * one};
    w->c = {static_cast<const char*>(c), L[2]->ld, L[2]->stride * one};
    w->d = {static_cast<const char*>(d), L[3]->ld, L[3]->stride * one};
    w->bias_ptr = static_cast<const char*>(op.bias);
    w->bias_stride = op.bias_batch_stride * one;
    w->alpha = alpha_v, w->beta = beta_v;

    EnqueueFn enqueue = find_enqueue();
    if (!enqueue) {  // no emulated driver in this process (standalone tests): run now
        run_work(w);
        drop_work(w);
        return OK;
    }
    if (int rc = enqueue(stream, run_work, w, drop_work))  // w was dropped by the driver
        return fail(EXECUTION_FAILED, "%s: the emulated stream %p refused the GEMM (CUresult %d)",
                    fn, stream, rc);
    return OK;
}

// cuBLASLt docs: "CUBLAS_STATUS_INVALID_VALUE if the algo, returned workspace or result is not
// supported by the problem"; NOT_SUPPORTED when the algo cannot run it. The result carries the
// workspace the algo needs.
API int cublasLtMatmulAlgoCheck(void* handle, void* desc, void* a, void* b, void* c, void* d,
                                const void* algo, void* result) {
    const char* fn = "cublasLtMatmulAlgoCheck";
    if (!algo || !result)
        return fail(INVALID_VALUE, "%s: algo %p, result %p", fn, algo, result);
    const void* lay[4] = {a, b, c, d};
    Problem pr;
    if (int st = check_problem(fn, handle, desc, lay, &pr)) return st;
    Algo al;
    memcpy(&al, algo, sizeof al);
    if (int st = check_algo(fn, al, pr)) return st;
    HeuristicResult r;
    memset(&r, 0, sizeof r);
    r.algo = al;
    r.workspaceSize = al.data[W_WORKSPACE];
    r.state = OK;
    r.wavesCount = 1.0f;
    memcpy(result, &r, sizeof r);
    return OK;
}

// sizeWritten: with sizeInBytes 0 and buf NULL, the attribute's size (the documented query).
API int cublasLtMatmulAlgoConfigGetAttribute(const void* algo, int attr, void* buf, size_t size,
                                             size_t* written) {
    const char* fn = "cublasLtMatmulAlgoConfigGetAttribute";
    if (!algo) return fail(INVALID_VALUE, "%s: algo is NULL", fn);
    Algo al;
    memcpy(&al, algo, sizeof al);
    if (al.data[W_TAG] != kAlgoTag)
        return fail(INVALID_VALUE, "%s: the algo was not returned by this library", fn);
    uint32_t value;
    switch (attr) {
        case A_ID: case A_TILE_ID: case A_STAGES_ID: value = 0; break;
        case A_SPLITK_NUM: value = uint32_t(al.data[W_SPLITK]); break;
        case A_REDUCTION_SCHEME: value = uint32_t(al.data[W_REDUCTION]); break;
        default: return fail(NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, attr);
    }
    if (size == 0 && !buf && written) {
        *written = sizeof value;
        return OK;
    }
    if (!buf || size != sizeof value)
        return fail(INVALID_VALUE, "%s: attribute %d: buf %p, sizeInBytes %zu, the attribute "
                    "holds %zu", fn, attr, buf, size, sizeof value);
    memcpy(buf, &value, sizeof value);
    if (written) *written = sizeof value;
    return OK;
}

API int cublasLtMatmulAlgoConfigSetAttribute(void* algo, int attr, const void* buf, size_t size) {
    const char* fn = "cublasLtMatmulAlgoConfigSetAttribute";
    if (!algo) return fail(INVALID_VALUE, "%s: algo is NULL", fn);
    Algo al;
    memcpy(&al, algo, sizeof al);
    if (al.data[W_TAG] != kAlgoTag)
        return fail(INVALID_VALUE, "%s: the algo was not returned by this library", fn);
    uint32_t value = 0;
    if (int st = read_attr(fn, attr, buf, size, &value)) return st;
    switch (attr) {
        case A_SPLITK_NUM:
            if (value < 1) return fail(INVALID_VALUE, "%s: SPLITK_NUM 0", fn);
            al.data[W_SPLITK] = value;
            break;
        case A_REDUCTION_SCHEME:
            if (value & ~RED_MASK)
                return fail(INVALID_VALUE, "%s: REDUCTION_SCHEME %u", fn, value);
            al.data[W_REDUCTION] = value;
            break;
        default: return fail(NOT_SUPPORTED, "%s: attribute %d is not emulated", fn, attr);
    }
    memcpy(algo, &al, sizeof al);
    return OK;
}
